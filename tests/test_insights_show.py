"""Insights where people see them: `logcapture show` (spool and store), stored at ship time,
never with text a mode dropped. Real runs through the real CLI and the embedded store."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import lc

from logcapture.insights.report import diagnose_stored
from logcapture.store import Identity, open_store

FAILING = '''
import sys
print("epoch 1", flush=True)
print('{"step": 1, "loss": 0.5}', flush=True)
def load(path):
    return open(path).read()
try:
    load("/nonexistent/secret-config")
except OSError:
    import traceback
    traceback.print_exc()   # caught and printed: not the cause
for i in range(3):
    print(f"step {i}", flush=True)
def step(batch):
    raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.90 GiB "
                       "total capacity; 14.71 GiB already allocated; 19.75 MiB free; 14.86 GiB "
                       "reserved in total by PyTorch)")
step(1)
'''


def _run(lc_env: dict[str, str], tmp_path: Path, body: str, run_id: str,
         *extra: str) -> None:
    script = tmp_path / f"{run_id}.py"
    script.write_text(body)
    lc(["run", "--no-sample", "--run-id", run_id, *extra, "--", sys.executable,
            str(script)], lc_env)


def test_show_lists_insights_first_from_the_spool_and_the_store(
        lc_env: dict[str, str], tmp_path: Path) -> None:
    _run(lc_env, tmp_path, FAILING, "fail-1")
    out = lc(["show", "fail-1", "--source", "spool"], lc_env).stdout.decode()
    assert out.startswith("insights:\n  cuda-oom: CUDA out of memory on GPU 0: tried to "
                          "allocate 20.00 MiB"), out
    # the exception is the OOM: listed once, where the user's code raised it
    assert "python-exception" not in out
    assert f"at {tmp_path}/fail-1.py:15 in step" in out
    spool_json = json.loads(lc(["show", "fail-1", "--json", "--source", "spool"],
                                   lc_env).stdout)
    assert list(spool_json)[0] == "insights"
    kinds = [i["kind"] for i in spool_json["insights"]]
    assert kinds == ["cuda-oom"]
    oom = spool_json["insights"][0]
    assert oom["details"]["function"] == "step"  # the last traceback, not the caught one
    assert oom["details"]["exception"] == "RuntimeError"
    assert all({"kind", "message", "evidence"} <= set(i) for i in spool_json["insights"])

    store = f"chdb://{tmp_path}/store"
    up = lc(["upload", "--store", store, "fail-1"], lc_env)
    assert up.returncode == 0, up.stderr
    store_json = json.loads(lc(["show", "fail-1", "--json", "--store", store],
                                   lc_env).stdout)
    assert store_json["stored_in"].startswith("chdb://")
    assert [(i["kind"], i["message"]) for i in store_json["insights"]] == \
        [(i["kind"], i["message"]) for i in spool_json["insights"]]
    # stored by the shipper, with the same evidence
    with open_store(store, must_exist=True) as st:
        stored = st.insights("fail-1")
        assert [i["kind"] for i in stored] == kinds
        # (show adds each line's number when it reads them: the same from the store)
        assert [{**e, "line": None} for e in stored[0]["evidence"]] == [
            {**e, "line": None} for e in spool_json["insights"][0]["evidence"]]
        assert [e["line"] for e in store_json["insights"][0]["evidence"]] == [
            e["line"] for e in spool_json["insights"][0]["evidence"]]
        assert all(e["line"] for e in spool_json["insights"][0]["evidence"] if e["text"])
        n = st.client.command("SELECT count() FROM insights FINAL WHERE kind = 'cuda-oom' "
                              "AND numbers['size_bytes'] = 20 * 1048576")
        assert int(n) == 1


def test_a_run_that_ended_well_has_no_insights(lc_env: dict[str, str], tmp_path: Path) -> None:
    _run(lc_env, tmp_path, "print('ERROR: not really, all fine')\n", "ok-1")
    show = json.loads(lc(["show", "ok-1", "--json"], lc_env).stdout)
    assert show["insights"] == []
    out = lc(["show", "ok-1"], lc_env).stdout.decode()
    assert not out.startswith("insights")


def test_text_a_mode_dropped_never_appears_in_an_insight(lc_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    secret = "SECRET-TOKEN-4711"
    body = (f'import sys\nprint("RuntimeError: CUDA out of memory {secret}", file=sys.stderr)\n'
            f'raise SystemExit(3)\n')
    _run(lc_env, tmp_path, body, "meta-1", "--mode", "metadata")
    out = lc(["show", "meta-1", "--json"], lc_env).stdout.decode()
    assert secret not in out
    show = json.loads(out)
    assert [i["kind"] for i in show["insights"]] == ["failed"]
    assert "no error message found in the stored output" in show["insights"][0]["message"]
    store = f"chdb://{tmp_path}/store"
    lc(["upload", "--store", store, "meta-1"], lc_env)
    with open_store(store, must_exist=True) as st:
        rows = st.client.query("SELECT * FROM insights").result_rows
        assert rows and secret not in repr(rows)


def test_the_store_diagnosis_reads_only_candidates(tmp_path: Path) -> None:
    """diagnose_stored finds the lines with the engine; the answer equals the spool's."""
    with open_store(f"chdb://{tmp_path}/store") as st:
        lines = [{"kind": "line", "run": "r1", "stream": "stdout", "seq": i, "ts": 1.7e9 + i,
                  "text": f"step {i} loss 0.1"} for i in range(5000)]
        tb = ["Traceback (most recent call last):",
              '  File "/home/u/train.py", line 9, in <module>', "    main()",
              '  File "/home/u/train.py", line 5, in main', '    raise KeyError("lr")',
              "KeyError: 'lr'"]
        lines += [{"kind": "line", "run": "r1", "stream": "stderr", "seq": i, "ts": 1.8e9 + i,
                   "text": t} for i, t in enumerate(tb)]
        start = {"kind": "start", "run": "r1", "stream": "run", "seq": 0, "ts": 1.7e9,
                 "command": ["python"]}
        end = {"kind": "end", "run": "r1", "stream": "run", "seq": 1, "ts": 1.9e9,
               "exit_status": 1, "state": "FAILED", "duration": 10.0}
        st.insert_records([start, *lines, end], Identity("r1", "alice", 1000))
        found = diagnose_stored(st, "r1")
        assert [(i.kind, i.message) for i in found] == [
            ("python-exception", "KeyError: 'lr' at /home/u/train.py:5 in main")]
        assert [e.seq for e in found[0].evidence] == [0, 3, 5]


def test_ls_flags_runs_that_ended_badly(lc_env: dict[str, str], tmp_path: Path) -> None:
    _run(lc_env, tmp_path, "import os\nos.kill(os.getpid(), 11)\n", "segv-1")
    _run(lc_env, tmp_path, "print('fine')\n", "fine-1")
    rows = {json.loads(line)["run"]: json.loads(line)
            for line in lc(["ls", "--json"], lc_env).stdout.decode().splitlines()}
    assert rows["segv-1"]["insights"] == ["signal"]
    assert rows["fine-1"]["insights"] == []
    table = lc(["ls"], lc_env).stdout.decode().splitlines()
    assert "INSIGHTS" in table[0]
    assert any(line.startswith("segv-1") and "!signal" in line for line in table)


def test_a_diagnosis_made_again_replaces_the_whole_answer(tmp_path: Path) -> None:
    """The epilog saw SIGTERM (Slurm said COMPLETING); once the final state is CANCELLED the
    answer is `cancelled`, and the `signal` row of the first diagnosis is gone."""
    from logcapture.ship import UploadResult, diagnose_run

    with open_store(f"chdb://{tmp_path}/store") as st:
        ident = Identity("77", "alice", 1000, job_id="77")
        st.insert_records([
            {"kind": "start", "run": "77", "stream": "run", "seq": 0, "ts": 1.7e9,
             "command": ["bash", "job.sh"]},
            {"kind": "line", "run": "77", "stream": "stdout", "seq": 0, "ts": 1.7e9 + 1,
             "text": "before the cancel"},
            {"kind": "end", "run": "77", "stream": "run", "seq": 1, "ts": 1.7e9 + 9,
             "signal": 15, "state": "SIGNALED", "duration": 9.0}], ident)
        diagnose_run(st, ident, {}, UploadResult())
        assert [i["kind"] for i in st.insights("77")] == ["signal"]
        diagnose_run(st, ident, {"slurm_state": "CANCELLED"}, UploadResult())
        assert [i["kind"] for i in st.insights("77")] == ["cancelled"]


NAN = """
import json
for step in range(1, 6):
    loss = float("nan") if step >= 4 else 1.0 / step
    print(json.dumps({"step": step, "loss": loss, "acc": float("inf") if step == 5 else 0.5}),
          flush=True)
"""
NAN_AND_CRASH = NAN + "raise KeyError('lr')\n"


def test_ls_shows_the_first_kind_show_shows_from_the_spool_and_the_store(
        lc_env: dict[str, str], tmp_path: Path) -> None:
    """ls lists the kinds show lists, whichever source each reads; a metric that became NaN
    is found in a finished run's metadata with no agent."""
    for run_id, body in (("oom-1", FAILING), ("nan-1", NAN), ("nancrash-1", NAN_AND_CRASH),
                         ("fine-2", "print('fine')\n")):
        _run(lc_env, tmp_path, body, run_id)

    def kinds(*args: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        ls = {d["run"]: d["insights"] for d in map(json.loads, lc(
            ["ls", "--json", *args], lc_env).stdout.decode().splitlines())}
        show = {run: [i["kind"] for i in json.loads(lc(
            ["show", run, "--json", *args], lc_env).stdout)["insights"]] for run in ls}
        return ls, show

    ls, show = kinds("--source", "spool")
    assert ls == show
    assert show == {"oom-1": ["cuda-oom"], "nan-1": ["nan-metric"],
                    "nancrash-1": ["python-exception", "nan-metric"], "fine-2": []}
    nan = json.loads(lc(["show", "nan-1", "--json"], lc_env).stdout)["insights"][0]
    assert nan["message"] == "metric loss became NaN at step 4 (then acc)"
    assert nan["details"]["step"] == 4 and nan["details"]["keys"] == ["loss", "acc"]

    store = f"chdb://{tmp_path}/store"
    assert lc(["upload", "--store", store, "--all"], lc_env).returncode == 0
    assert kinds("--source", "store", "--store", store) == (show, show)


def test_ls_diagnosis_reads_candidates_only_and_agrees_with_shows(tmp_path: Path) -> None:
    """query.spool_insights (ls: candidates found in the segments' bytes) gives what
    spool_facts (show: every line) gives, also for a run whose name is an error word and a
    traceback that spans segments."""
    from logcapture.query.show import spool_facts
    from logcapture.query.spool_insights import spool_insights
    from logcapture.records import End, Line, Metadata, Start
    from logcapture.spool.layout import create_run_dir, segments
    from logcapture.spool.writer import SpoolWriter

    run = "failed-error"
    w = SpoolWriter(create_run_dir(tmp_path, run), fsync=False, segment_bytes=4096)
    t = 1.7e9
    recs: list = [Start(run, "run", 0, t, command=["python", "train.py"])]
    recs += [Line(run, "stdout", i, t + i, f"step {i} loss 0.{i}") for i in range(200)]
    recs.append(Metadata(run, "stdout", 200, t + 200, {"step": 200, "loss": "NaN"}))
    tb = ["Traceback (most recent call last):",
          *[f'  File "/home/u/m{i}.py", line {i}, in f{i}\n    g()'.split("\n")[j]
            for i in range(40) for j in (0, 1)],
          "RuntimeError: CUDA error: out of memory"]
    recs += [Line(run, "stderr", j, t + 201, text) for j, text in enumerate(tb)]
    recs.append(End(run, "run", 1, t + 300, exit_status=1, state="FAILED", duration=300.0))
    w.write(recs)
    w.close()
    assert len(segments(tmp_path / run)) > 2
    show = spool_facts(tmp_path / run, "u", 1000).insights
    ls = [i.to_dict() for i in spool_insights(tmp_path / run, recs[0], recs[-1])]
    # show numbers the evidence lines (the log's: 200 stdout lines before the traceback)
    assert [e.pop("line") for i in show for e in i["evidence"]] == [280, 282, None]  # NaN: metadata
    assert ls == show
    assert [i["kind"] for i in ls] == ["cuda-oom", "nan-metric"]
    assert ls[0]["message"].endswith("at /home/u/m39.py:39 in f39")
