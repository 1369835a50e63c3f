"""Reading on the cluster as its users do: through the read service the dev cluster runs, with
the agent shipping running jobs, as two real users (lcuser1, lcuser2) whose identity the
kernel gives the service. One user reads nothing of the other's jobs through any command or
any hand-made request; `logs -f` follows a running job from its start to its end; a secret
printed in `disabled` mode is found by no read command."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Cluster, Job

pytestmark = pytest.mark.slurm

U1, U2 = "lcuser1", "lcuser2"
SECRET = "S3CR3T-e2e-5d1c9a"


@pytest.fixture
def rd(lc: Cluster) -> Iterator[Cluster]:
    """The cluster with its store on and an agent shipping running jobs every second (unless
    the dev cluster runs one already)."""
    lc.set_store(True)
    agent = None
    pid_file = lc.dir / "pids" / "agent"
    if not (pid_file.exists() and _alive(int(pid_file.read_text() or 0))):
        with open(lc.dir / "log" / "e2e-agent.log", "ab") as log:
            agent = subprocess.Popen(
                [lc.env["LOGCAPTURE_BIN"] + "/logcapture", "agent", "--interval", "1"],
                env={**lc.env, "LOGCAPTURE_CONFIG": str(lc.dir / "etc" / "config.yaml")},
                stdout=subprocess.DEVNULL, stderr=log)
    try:
        yield lc
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(60)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return pid > 0
    except OSError:
        return False


def socket_path(lc: Cluster) -> str:
    return lc.env["LOGCAPTURE_READER_SOCKET"]


def read_as(lc: Cluster, user: str, *args: str, timeout: float = 120
            ) -> subprocess.CompletedProcess:
    """``logcapture ARGS`` as ``user`` on the login node: the read service's socket and no
    access to the spool root's job records or the store."""
    return lc.as_user(user, ["env", f"LOGCAPTURE_READER_SOCKET={socket_path(lc)}",
                             lc.env["LOGCAPTURE_BIN"] + "/logcapture", *args], timeout=timeout)


def wait_in_store(lc: Cluster, user: str, job: Job, timeout: float = 90) -> None:
    """Until the job's end is in the store, as its user sees it."""
    deadline = time.monotonic() + timeout
    while True:
        r = read_as(lc, user, "ls", "--json")
        runs = {d["run"]: d for d in map(json.loads, r.stdout.splitlines())}
        if job.id in runs and runs[job.id]["state"] != "RUNNING":
            return
        assert time.monotonic() < deadline, (r.stdout, r.stderr, lc.slurm_log())
        time.sleep(0.5)


JOB1 = f"""#!/bin/bash
echo "u1 visible line"
echo '{{"epoch": 1, "u1_metric": 0.5}}'
echo '/LOGCOMMAND {{"mode": "disabled"}}'
echo "{SECRET} printed while disabled"
echo '{{"secret_metric": "{SECRET}"}}'
echo "{SECRET} on stderr" >&2
echo '/LOGCOMMAND {{"mode": "enabled"}}'
echo "u1 after the secret"
"""

JOB2 = """#!/bin/bash
echo "u2 private line"
echo '{"epoch": 7, "u2_metric": 0.25}'
"""


def one_job_each(rd: Cluster) -> tuple[Job, Job]:
    """Both users opted in, JOB1 run by U1 and JOB2 by U2, each completed and in the store."""
    rd.optin(U1, "")
    rd.optin(U2, "")
    j1 = rd.submit(U1, JOB1, name="mine")
    j2 = rd.submit(U2, JOB2, name="theirs")
    assert rd.wait(j1, j2) == {j1.id: ("COMPLETED", "0:0"), j2.id: ("COMPLETED", "0:0")}
    wait_in_store(rd, U1, j1)
    wait_in_store(rd, U2, j2)
    return j1, j2


def test_each_user_reads_only_their_own_jobs_through_every_command(rd: Cluster) -> None:
    j1, j2 = one_job_each(rd)

    for me, mine, theirs, my_text, their_texts in (
            (U1, j1, j2, "u1 visible line", ("u2 private", "u2_metric")),
            (U2, j2, j1, "u2 private line", ("u1 visible", "u1_metric", "u1 after"))):
        ls = read_as(rd, me, "ls", "--json")
        runs = [json.loads(x) for x in ls.stdout.splitlines()]
        assert mine.id in {d["run"] for d in runs} and theirs.id not in {d["run"] for d in runs}
        assert {d["owner"] for d in runs} == {me}
        assert not [t for t in their_texts if t in ls.stdout + ls.stderr]
        assert my_text in read_as(rd, me, "logs", mine.id).stdout
        for args in (["logs", theirs.id], ["logs", "-f", theirs.id], ["show", theirs.id],
                     ["show", "--json", theirs.id],
                     ["export", theirs.id, "--what", "lines", "--format", "ndjson"],
                     ["export", theirs.id, "--what", "metadata", "--format", "ndjson"],
                     ["export", theirs.id, "--what", "samples", "--format", "ndjson"]):
            r = read_as(rd, me, *args)
            assert r.returncode == 1, (args, r.stdout, r.stderr)
            assert r.stdout == "", (args, r.stdout)
            assert f"no job or run '{theirs.id}' of yours" in r.stderr, (args, r.stderr)
            assert not [t for t in their_texts if t in r.stderr], (args, r.stderr)
        # Their run is "not found", also by the newest-run shortcut.
        latest = read_as(rd, me, "show", "--json", "latest")
        assert json.loads(latest.stdout)["run"] != theirs.id

    # The secret printed in disabled mode: found by no read command, as its user or as root.
    outputs = []
    for user in (U1, "root"):
        for args in (["ls", "--json"], ["logs", j1.id], ["logs", "-f", j1.id],
                     ["show", "--json", j1.id],
                     *[["export", j1.id, "--what", w, "--format", f]
                       for w in ("lines", "metadata", "samples") for f in ("csv", "ndjson")]):
            if user == "root":
                r = subprocess.run([rd.env["LOGCAPTURE_BIN"] + "/logcapture", *args],
                                   env=rd.env, capture_output=True, text=True, timeout=120)
            else:
                r = read_as(rd, user, *args)
            assert r.returncode == 0, (user, args, r.stderr)
            outputs.append(r.stdout + r.stderr)
    assert sum(o.count(SECRET) for o in outputs) == 0
    assert "u1 after the secret" in "".join(outputs)  # and the rest of the job is there
    lines = read_as(rd, U1, "logs", j1.id).stdout.splitlines()
    assert lines[0] == "u1 visible line" and lines[-1] == "u1 after the secret"


# Ticks until the test, having seen tick 2 through `logs -f`, lets the job end: the follower can
# only have seen it live (the cap ends a job whose follower saw nothing).
TICKS = """#!/bin/bash
i=0
while [ ! -e "$HOME/ticks-may-end" ] && [ $i -lt 600 ]; do
    i=$((i + 1)); echo "tick $i"; sleep 0.2
done
echo "last line"
"""


def test_logs_follow_reads_a_running_job_from_its_start_to_its_end(rd: Cluster) -> None:
    rd.optin(U1, "")
    gate = rd.home(U1) / "ticks-may-end"
    gate.unlink(missing_ok=True)
    job = rd.submit(U1, TICKS, name="ticks")
    rd.wait_running(job)
    pw_cmd = ["env", f"HOME={rd.home(U1)}", "PATH=/usr/bin:/bin", "LANG=C.UTF-8",
              f"LOGCAPTURE_READER_SOCKET={socket_path(rd)}",
              rd.env["LOGCAPTURE_BIN"] + "/logcapture", "logs", "-f", job.id]
    # Another user cannot follow it, even while it runs.
    deadline = time.monotonic() + 60
    while True:  # the job reaches the store with the agent's first batch
        r = read_as(rd, U1, "show", "--json", job.id)
        if r.returncode == 0:
            break
        assert time.monotonic() < deadline, r.stderr
        time.sleep(0.2)
    other = read_as(rd, U2, "logs", "-f", job.id)
    assert other.returncode == 1 and other.stdout == "" and "of yours" in other.stderr
    texts: list[str] = []
    pw = pwd.getpwnam(U1)
    with subprocess.Popen(
            ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
             "--reset-env", *pw_cmd],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/") as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            texts.append(line.rstrip("\n"))
            if texts[-1] == "tick 2":
                # Seen while the job runs: only now may it end.
                assert rd.state(job.id) == "RUNNING", texts
                rd.write_as(U1, gate, "")
        err = proc.stderr.read()
        proc.wait(60)
    assert proc.returncode == 0, err
    assert gate.exists(), f"the follower never showed tick 2: {texts[:5]} {err}"
    ticks = [t for t in texts if t.startswith("tick ")]
    assert ticks == [f"tick {i}" for i in range(1, len(ticks) + 1)] and len(ticks) < 600
    assert texts[-1] == "last line"
    assert rd.wait(job)[job.id] == ("COMPLETED", "0:0")


# Two tasks tick until the test, having seen tick 2 of both through `logs -f`, lets them end.
RANK_TICKS = r"""#!/bin/bash
#SBATCH -n 2
echo "batch starts"
srun python3 -c '
import os, time
r, i = os.environ["SLURM_PROCID"], 0
while not os.path.exists(os.path.expanduser("~/ranks-may-end")) and i < 300:
    i += 1
    print(f"rank {r} tick {i}", flush=True)
    time.sleep(0.5)
'
echo "batch ends"
"""


def test_logs_follow_reads_every_task_of_a_running_job_through_the_service(
        rd: Cluster) -> None:
    """On the login node, `logs -f JOB` of a job with an srun step follows its tasks too
    (read from the store through the service as the agent ships them), labelled as `logs
    JOB` prints the ended job, line for line."""
    rd.optin(U1, "")
    gate = rd.home(U1) / "ranks-may-end"
    gate.unlink(missing_ok=True)
    job = rd.submit(U1, RANK_TICKS, name="rank-ticks")
    rd.wait_running(job)
    deadline = time.monotonic() + 60
    while read_as(rd, U1, "show", "--json", job.id).returncode != 0:  # the agent's first batch
        assert time.monotonic() < deadline
        time.sleep(0.2)
    pw = pwd.getpwnam(U1)
    texts: list[str] = []
    with subprocess.Popen(
            ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
             "--reset-env", "env", f"HOME={rd.home(U1)}", "PATH=/usr/bin:/bin",
             "LANG=C.UTF-8", f"LOGCAPTURE_READER_SOCKET={socket_path(rd)}",
             rd.env["LOGCAPTURE_BIN"] + "/logcapture", "logs", "-f", job.id],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/") as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            texts.append(line.rstrip("\n"))
            if {"0: rank 0 tick 2", "1: rank 1 tick 2"} <= set(texts) and not gate.exists():
                assert rd.state(job.id) == "RUNNING", texts  # seen live
                rd.write_as(U1, gate, "")
        err = proc.stderr.read()
        proc.wait(60)
    assert proc.returncode == 0, err
    assert gate.exists(), f"the follower never showed both ranks' tick 2: {texts[:8]} {err}"
    assert rd.wait(job)[job.id] == ("COMPLETED", "0:0")
    assert texts[0] == "batch starts" and texts[-1] == "batch ends"
    for r in (0, 1):
        ticks = [t for t in texts if t.startswith(f"{r}: rank {r} tick ")]
        assert ticks == [f"{r}: rank {r} tick {i}" for i in range(1, len(ticks) + 1)], texts
        assert len(ticks) >= 2
    wait_in_store(rd, U1, job)
    assert texts == read_as(rd, U1, "logs", job.id).stdout.splitlines()


def test_hand_made_requests_on_the_clusters_socket(rd: Cluster) -> None:
    rd.optin(U1, "")
    job = rd.submit(U1, "#!/bin/bash\necho 'u1 socket secret line'\n", name="sock")
    assert rd.wait(job)[job.id] == ("COMPLETED", "0:0")
    wait_in_store(rd, U1, job)
    code = f"""
import json, socket, sys, time
SOCK = {socket_path(rd)!r}
def raw(data, read=True):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(SOCK)
    try:
        s.sendall(data)
    except BrokenPipeError:
        pass
    buf = b""
    while read and (chunk := s.recv(65536)):
        buf += chunk
    s.close()
    return buf.decode()
job = {job.id!r}
out = {{}}
out["forged_uid"] = raw(json.dumps({{"op": "lines", "run": job, "uid": 0}}).encode() + b"\\n")
out["forged_user"] = raw(json.dumps({{"op": "lines", "run": job, "user": "lcuser1"}}).encode()
                         + b"\\n")
out["sql"] = raw(json.dumps({{"op": "lines", "run": job + "' OR owner != '"}}).encode() + b"\\n")
out["path"] = raw(json.dumps({{"op": "lines", "run": "../" + job}}).encode() + b"\\n")
out["like"] = raw(json.dumps({{"op": "resolve", "ref": "%"}}).encode() + b"\\n")
out["huge"] = raw(b'{{"op": "runs", "x": "' + b"A" * (8 << 20) + b'"}}\\n')
out["plain"] = raw(json.dumps({{"op": "lines", "run": job}}).encode() + b"\\n")
# A client that asks and never reads, and one that never asks: others are served meanwhile.
idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); idle.connect(SOCK)
slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); slow.connect(SOCK)
slow.sendall(json.dumps({{"op": "runs"}}).encode() + b"\\n")
t0 = time.monotonic()
out["whoami"] = raw(b'{{"op": "whoami"}}\\n')
out["whoami_s"] = time.monotonic() - t0
print(json.dumps(out))
"""
    r = rd.as_user(U2, ["env", f"PYTHONPATH={Path(__file__).resolve().parents[2]}",
                        rd.env["LOGCAPTURE_BIN"] + "/python3", "-c", code], timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("forged_uid", "forged_user", "sql", "path", "like", "huge", "plain"):
        assert "u1 socket secret line" not in out[key], key
        assert '"error"' in out[key] and '"items"' not in out[key], (key, out[key])
    assert "identity from the operating system" in out["forged_uid"]
    assert "longer than" in out["huge"]
    assert '"NotFound"' in out["sql"] and '"NotFound"' in out["plain"]
    assert json.loads(out["whoami"].splitlines()[0])["value"]["user"] == U2
    # The service is still there for everyone.
    assert "u1 socket secret line" in read_as(rd, U1, "logs", job.id).stdout


def test_serve_as_a_user_shows_their_jobs_through_the_read_service(rd: Cluster) -> None:
    """`logcapture serve` on the login node, started by a user: the page reads the store
    through the read service, so it shows that user's jobs and nothing of another's."""
    import httpx

    j1, j2 = one_job_each(rd)
    pw = pwd.getpwnam(U1)
    with subprocess.Popen(
            ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
             "--reset-env", "env", f"HOME={rd.home(U1)}", "PATH=/usr/bin:/bin", "LANG=C.UTF-8",
             f"LOGCAPTURE_READER_SOCKET={socket_path(rd)}",
             rd.env["LOGCAPTURE_BIN"] + "/logcapture", "serve", "--no-browser", "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
            start_new_session=True) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:"), proc.stderr.read()  # type: ignore[union-attr]
            base, token = url.split("/?")[0], url.split("token=")[1]

            def get(path: str, **kw: str) -> httpx.Response:
                return httpx.get(base + path, params={"token": token, **kw}, timeout=60)

            runs = get("/api/runs").json()
            assert j1.id in {r["job_id"] for r in runs}
            assert j2.id not in {r["job_id"] for r in runs} and "theirs" not in str(runs)
            texts = [e["text"] for e in get(f"/api/runs/{j1.id}/log", stderr="1").json()["entries"]]
            assert "u1 visible line" in texts and "u1 after the secret" in texts
            meta = get(f"/api/runs/{j1.id}/metadata").json()
            assert [r["fields"] for r in meta["rows"]] == [{"epoch": 1, "u1_metric": 0.5}]
            for path in (f"/api/runs/{j2.id}", f"/api/runs/{j2.id}/log",
                         f"/api/runs/{j2.id}/metadata", f"/api/runs/{j2.id}/export"):
                r = get(path)
                assert r.status_code == 404 and "u2" not in r.text, (path, r.text)
            found = get("/api/search", q="private").json()
            assert found["matches"] == 0 and "u2 private" not in str(found)
            everything = " ".join(get(p).text for p in (
                "/api/runs", f"/api/runs/{j1.id}/log", f"/api/runs/{j1.id}/metadata"))
            assert SECRET not in everything + str(get("/api/search", q=SECRET).json())
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(30)
