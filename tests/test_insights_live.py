"""While a job runs: stalled and nan-metric found by the agent as it ships, and the one message
per job and event a user asked for, delivered through a real mail program to a local mailbox
and posted to a local HTTP server."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from helpers import lc

from logcapture.insights.live import LiveWatch
from logcapture.insights.notify import Notifier, compose, wanted
from logcapture.records import Line, Metadata, Sample, Start, dumps


def _ndjson(*records: object) -> bytes:
    return b"".join(dumps(r.to_dict()).encode() + b"\n" for r in records)  # type: ignore[attr-defined]


START = Start("r1", "run", 0, 100.0, command=["python", "train.py"],
              config={"mode": "enabled", "notify": {"events": ["stalled", "nan-metric"],
                                                     "mail": "me@example.org"}})


def test_nan_metric_with_key_and_step_once() -> None:
    w = LiveWatch()
    data = _ndjson(START, Metadata("r1", "stdout", 0, 101.0, {"step": 10, "loss": 0.5}),
                   Metadata("r1", "stdout", 1, 102.0, {"step": 20, "loss": float("nan"),
                                                       "grad": float("inf")}))
    found = w.observe(("r1", 1000), data, 103.0)
    assert sorted((i.kind, i.message) for i in found) == [
        ("nan-metric", "metric grad became Infinity at step 20"),
        ("nan-metric", "metric loss became NaN at step 20")]
    assert found[0].evidence[0].seq == 1 and found[0].details["step"] == 20
    again = _ndjson(Metadata("r1", "stdout", 2, 104.0, {"step": 30, "loss": float("nan")}))
    assert w.observe(("r1", 1000), again, 105.0) == []  # once per key


def test_a_string_that_merely_says_nan_elsewhere_is_not_a_metric() -> None:
    w = LiveWatch()
    data = _ndjson(START, Line("r1", "stdout", 0, 101.0, 'loss "NaN" was avoided'),
                   Metadata("r1", "stdout", 1, 102.0, {"step": 1, "note": "no NaN here"}))
    assert w.observe(("r1", 1000), data, 103.0) == []


def test_stalled_idle_or_busy_and_reported_once_per_stall() -> None:
    w = LiveWatch(stall_seconds=60)
    key = ("r1", 1000)
    idle = Sample("r1", "sample:n1", 0, 150.0, node="n1",
                  gpus=[{"uuid": "G0", "utilization_gpu_percent": 0.0}],
                  job={"cpu_percent": 0.5})
    w.observe(key, _ndjson(START, Line("r1", "stdout", 0, 110.0, "epoch 1"), idle), 150.0)
    assert w.check(key, 160.0, running=True) is None  # quiet 50 s
    assert w.check(key, 200.0, running=False) is None  # the job is not running
    st = w.check(key, 200.0, running=True)
    assert st is not None and st.kind == "stalled"
    assert st.message == ("no new output for 1.5 min while the job runs; last sample: CPU 0 %, "
                          "GPU 0 % (idle)")
    assert w.check(key, 300.0, running=True) is None  # once per stall
    busy = Sample("r1", "sample:n1", 1, 310.0, node="n1",
                  gpus=[{"uuid": "G0", "utilization_gpu_percent": 97.0}],
                  job={"cpu_percent": 101.0})
    w.observe(key, _ndjson(Line("r1", "stdout", 1, 305.0, "epoch 2"), busy), 310.0)
    assert w.check(key, 320.0, running=True) is None  # output resumed
    again = w.check(key, 400.0, running=True)
    assert again is not None and "(busy)" in again.message


def test_compose_quotes_only_stored_evidence() -> None:
    insight = {"kind": "cuda-oom", "message": "CUDA out of memory", "hint": "smaller batch",
               "evidence": [{"stream": "stderr", "seq": 7, "text": "RuntimeError: CUDA out"},
                            {"stream": "stderr", "seq": 8, "text": None}]}
    subject, body = compose("failed", "123", "123", [insight])
    assert subject == "logcapture: job 123 failed: CUDA out of memory"
    assert "stderr line 7: RuntimeError: CUDA out" in body and "line 8" not in body
    assert wanted(START.to_dict(), "stalled") == {"events": ["stalled", "nan-metric"],
                                                  "mail": "me@example.org"}
    assert wanted(START.to_dict(), "failed") is None


@pytest.fixture
def mailprog(tmp_path: Path) -> tuple[Path, Path]:
    """A mail program as Slurm's MailProg is called (-s SUBJECT ADDRESS, body on stdin) that
    delivers to a local mbox file."""
    mbox = tmp_path / "mbox"
    prog = tmp_path / "fakemail"
    prog.write_text(f"""#!{sys.executable}
import sys, time
args = sys.argv[1:]
assert args[0] == "-s", args
subject, rcpt = args[1], args[2]
body = sys.stdin.read()
with open({str(mbox)!r}, "a") as f:
    f.write(f"From logcapture {{time.asctime()}}\\nTo: {{rcpt}}\\n"
            f"Subject: {{subject}}\\n\\n{{body}}\\n")
""")
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return prog, mbox


class _Hook(BaseHTTPRequestHandler):
    got: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802
        n = int(self.headers["Content-Length"])
        _Hook.got.append(json.loads(self.rfile.read(n)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> object:
    _Hook.got = []
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", _Hook.got
    server.shutdown()
    server.server_close()


def test_one_mail_and_one_post_per_job_and_event(tmp_path: Path, mailprog: tuple[Path, Path],
                                                  webhook: tuple[str, list]) -> None:
    prog, mbox = mailprog
    url, got = webhook
    n = Notifier(tmp_path / "notified", mail_prog=str(prog), webhook=url)
    insight = {"kind": "stalled", "message": "no new output for 31 min", "hint": "",
               "evidence": []}
    assert n.send("stalled", "42", "alice", 1000, "42", [insight], {"mail": "a@x.org"}) == []
    assert n.send("stalled", "42", "alice", 1000, "42", [insight], {"mail": "a@x.org"}) == []
    text = mbox.read_text()
    assert text.count("Subject: logcapture: job 42 stalled: no new output for 31 min") == 1
    assert "To: a@x.org" in text
    assert len(got) == 1 and got[0]["event"] == "stalled" and got[0]["run"] == "42"
    # another event of the same job is another message
    n.send("nan-metric", "42", "alice", 1000, "42", [insight], {})
    assert mbox.read_text().count("Subject:") == 2 and "To: alice" in mbox.read_text()


def test_an_unreachable_webhook_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    n = Notifier(tmp_path / "n", webhook="http://127.0.0.1:9/secret-token")
    problems = n.send("failed", "1", "u", 1, "", [], {})
    assert problems and "secret-token" not in problems[0]


def _write_spool(spool: Path, run: str, records: list) -> Path:
    d = spool / run
    d.mkdir(parents=True, mode=0o700)
    (d / "seg-000000.ndjson").write_bytes(_ndjson(*records))
    return d


def test_the_agent_finds_a_nan_metric_and_a_stall_while_the_job_runs(
        tmp_path: Path, mailprog: tuple[Path, Path], webhook: tuple[str, list]) -> None:
    from logcapture.ship import Agent
    from logcapture.store import open_store

    prog, mbox = mailprog
    url, got = webhook
    spool = tmp_path / "spool"
    now = time.time()
    start = START._replace(ts=now - 100)
    run_dir = _write_spool(spool, "r1", [
        start, Line("r1", "stdout", 0, now - 99, "epoch 1"),
        Metadata("r1", "stdout", 1, now - 98, {"step": 5, "loss": float("nan")})])
    store = f"chdb://{tmp_path}/store"
    agent = Agent(spool, store, batch_interval=0.0, stall_seconds=60.0,
                  notifier=Notifier(spool / ".notified", mail_prog=str(prog), webhook=url))
    assert agent.due()
    agent.flush()
    assert "Subject: logcapture: run r1 a metric became NaN: metric loss became NaN at step 5" \
        in mbox.read_text()
    agent.check_live(now=now)  # 99 s quiet, more than 60: stalled
    agent.check_live(now=now + 10)  # once
    text = mbox.read_text()
    assert text.count("Subject:") == 2 and "run r1 stalled: no new output for" in text
    assert [g["event"] for g in got] == ["nan-metric", "stalled"]
    with open_store(store, must_exist=True) as st:
        kinds = {i["kind"]: i for i in st.insights("r1")}
    assert set(kinds) == {"nan-metric", "stalled"}
    assert kinds["nan-metric"]["category"] == "live"
    assert run_dir.is_dir()


def test_an_agent_started_afresh_watches_the_runs_an_earlier_one_began_to_ship(
        tmp_path: Path) -> None:
    """The agent starts afresh in place (docs/admin.md) or is restarted while a job runs: the
    new one never sees the run's Start record shipped, yet still finds the run's stall
    (its Start record read back from the spool) and does not report the metric already
    reported NaN again (the store says which)."""
    from logcapture.ship import Agent
    from logcapture.store import open_store

    spool, store = tmp_path / "spool", f"chdb://{tmp_path}/store"
    now = time.time()
    run_dir = _write_spool(spool, "r1", [
        START._replace(ts=now - 100), Line("r1", "stdout", 0, now - 99, "epoch 1"),
        Metadata("r1", "stdout", 1, now - 98, {"step": 5, "loss": float("nan")})])
    first = Agent(spool, store, batch_interval=0.0, stall_seconds=60.0)
    assert first.due()
    first.flush()
    with open(run_dir / "seg-000000.ndjson", "ab") as f:  # the job goes on, still NaN
        f.write(_ndjson(Metadata("r1", "stdout", 2, now - 97,
                                 {"step": 6, "loss": float("nan")})))
    again = Agent(spool, store, batch_interval=0.0, stall_seconds=60.0)
    assert again.due()
    again.flush()
    # quiet since its last line (now - 97), as the store says, not since this agent began
    assert again.check_live(now=now - 97 + 59) == 0
    assert again.check_live(now=now - 97 + 61) == 1
    with open_store(store, must_exist=True) as st:
        kinds = {i["kind"]: i for i in st.insights("r1")}
    assert set(kinds) == {"nan-metric", "stalled"}
    assert kinds["nan-metric"]["message"] == "metric loss became NaN at step 5"
    # a third start: that stall is reported already (nothing printed since)
    third = Agent(spool, store, batch_interval=0.0, stall_seconds=60.0)
    with open(run_dir / "seg-000000.ndjson", "ab") as f:
        f.write(_ndjson(Sample("r1", "sample:n1", 0, now - 20, node="n1")))
    assert third.due()
    third.flush()
    assert third.check_live(now=now + 600) == 0


def test_a_stall_and_a_nan_found_while_a_real_job_runs(lc_env: dict[str, str], tmp_path: Path,
                                                       mailprog: tuple[Path, Path]) -> None:
    """logcapture run with a job that prints a NaN metric, then goes quiet; the real agent
    (its own process) finds both while the job still runs and mails them."""
    prog, mbox = mailprog
    optin = tmp_path / "logoptin"
    optin.write_text("notify: [stalled, nan-metric]\nmail: me@example.org\n")
    os.chmod(optin, 0o600)
    env = {**lc_env, "LOGCAPTURE_OPTIN": str(optin), "LOGCAPTURE_STALL_SECONDS": "3",
           "LOGCAPTURE_MAIL_PROG": str(prog), "LOGCAPTURE_FLUSH_INTERVAL": "0.2"}
    job = tmp_path / "job.py"
    flag = tmp_path / "stop"
    job.write_text(f"""import json, os, time
print(json.dumps({{"step": 1, "loss": 0.7}}), flush=True)
print('{{"step": 2, "loss": NaN}}', flush=True)
t = time.time()
while not os.path.exists({str(flag)!r}) and time.time() - t < 60:
    time.sleep(0.2)
""")
    store = f"chdb://{tmp_path}/store"
    import subprocess

    from helpers import LOGCAPTURE
    runner = subprocess.Popen([*LOGCAPTURE, "run", "--no-sample", "--run-id", "live-1", "--",
                               sys.executable, str(job)], env=env, stdout=subprocess.DEVNULL)
    agent = subprocess.Popen([*LOGCAPTURE, "agent", "--store", store, "--interval", "0.5",
                              "--live-every", "1"], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 50
        while time.time() < deadline:
            text = mbox.read_text() if mbox.exists() else ""
            if "stalled" in text and "NaN" in text:
                break
            time.sleep(0.5)
        assert runner.poll() is None, "the job should still run"
        text = mbox.read_text()
        assert "Subject: logcapture: run live-1 a metric became NaN: metric loss became NaN " \
               "at step 2" in text
        assert "Subject: logcapture: run live-1 stalled: no new output for" in text
        assert "To: me@example.org" in text
    finally:
        flag.write_text("")
        runner.wait(timeout=30)
        agent.terminate()
        _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    show = json.loads(lc(["show", "live-1", "--json", "--store", store], env).stdout)
    kinds = [i["kind"] for i in show["insights"]]
    assert "nan-metric" in kinds and "stalled" in kinds


def test_the_webhook_url_never_reaches_the_jobs_copy_of_the_config(tmp_path: Path) -> None:
    from logcapture.config.admin import load_admin, public_config

    path = tmp_path / "config.yaml"
    path.write_text("store: chdb:///x\nnotify_webhook: https://hooks.example.org/T0/SECRET\n"
                    "stall_seconds: 600\nmail_prog: /usr/sbin/sendmail-wrapper\n")
    text = public_config(load_admin(path, env={})).decode()
    assert "SECRET" not in text and "chdb" not in text
    assert '"stall_seconds": 600.0' in text and "mail_prog" in text
