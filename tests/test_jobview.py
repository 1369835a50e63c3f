"""A job of several ranks as `show` and `export` give it: each task captured for real (ptys,
capture worker, spool) as the run `J.S.R` with its rank and node, as the SPANK plugin's
`logcapture slurm task` captures it; then the real CLI, from the spool and from the store."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import lc

from logcapture.insights.ranks import job_insights
from logcapture.jobview import node_figures

JOB = "77"
RANK = '''
import json, sys
r = int(sys.argv[1])
for s in range(4):
    print(f"rank {r} step {s}", flush=True)
    print(json.dumps({"step": s, "loss": round(1 / (s + 1) + r, 4), "rank": r}), flush=True)
    if r == 1 and s == 2:
        raise ValueError("shard 7 is corrupt on this rank")
if r == 0:
    raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset "
                       "by peer")
'''
# capture.capture_command with a task's identity, as slurm.task.task_main prepares it
CAPTURE = '''
import os, sys
from pathlib import Path
from logcapture.capture import capture_command
run, argv = sys.argv[1], sys.argv[3:]
slurm = dict(kv.split("=", 1) for kv in sys.argv[2].split(","))
sys.exit(capture_command(argv, spool_root=Path(os.environ["LOGCAPTURE_SPOOL"]), run_id=run,
                         warn=lambda m: print(m, file=sys.stderr), slurm=slurm, sample=False))
'''


def _capture(env: dict[str, str], run: str, slurm: str, *argv: str) -> int:
    return subprocess.run([sys.executable, "-c", CAPTURE, run, slurm, *argv], env=env,
                          capture_output=True, timeout=60).returncode


@pytest.fixture
def job(lc_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """Job 77: a batch run, and two tasks of step 0 on nodes n1 and n3; rank 0's consequence
    (gloo's connection reset) ends before rank 1's ValueError, the cause."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    ident = f"job_id={JOB},nodelist=n[1-3],job_name=train"
    assert _capture(lc_env, JOB, ident, "sh", "-c", "echo batch starts; exit 1") == 1
    for rank, node in ((0, "n1"), (1, "n3")):
        code = _capture(lc_env, f"{JOB}.0.{rank}",
                        f"job_id={JOB},step=0,rank={rank},local_rank=0,node={node},"
                        f"cuda_visible_devices={rank}",
                        sys.executable, str(script), str(rank))
        assert code == 1
    return lc_env


def _show(env: dict[str, str], *args: str) -> dict:
    done = lc(["show", JOB, "--json", *args], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_show_names_the_rank_that_failed_first_and_its_node(job: dict[str, str]) -> None:
    info = _show(job)
    first, other = info["insights"][:2]
    assert first["kind"] == "python-exception"
    assert first["message"].startswith("ValueError on rank 1 (node n3): shard 7 is corrupt")
    assert (first["details"]["rank"], first["details"]["node"]) == (1, "n3")
    assert other["kind"] == "other-ranks"
    assert other["message"].startswith("also failed after rank 1: RuntimeError on rank 0 "
                                       "(node n1): ")
    assert other["message"].endswith("(a consequence)")
    assert "failed" not in [i["kind"] for i in info["insights"]]  # the batch's exit 1
    assert [(r["rank"], r["node"], r["step"], r["gpus"], r["state"]) for r in info["ranks"]] \
        == [(0, "n1", "0", "0", "FAILED"), (1, "n3", "0", "1", "FAILED")]
    text = lc(["show", JOB], job).stdout.decode()
    assert text.startswith("insights:\n  python-exception: ValueError on rank 1 (node n3)")
    assert "  rank 1  node n3  step 0  GPU 1  FAILED  1  ValueError on rank 1" in text


def test_the_x_axis_is_the_step_of_each_rank_rank_0_by_default(job: dict[str, str]) -> None:
    info = _show(job)
    assert (info["metadata_ranks"], info["x_axis"]) == ("0", "step")
    assert info["metadata_keys"] == ["loss", "rank", "step"]
    # all ranks: step still increases on each, although the merged rows read 0, 0, 1, 1, ...
    assert _show(job, "--rank", "all")["x_axis"] == "step"
    assert _show(job, "--rank", "1")["metadata_ranks"] == "1"
    text = lc(["show", JOB, "--rank", "all"], job).stdout.decode()
    assert "x axis (rank all):" in text and "step" in text


def test_export_of_a_job_carries_node_step_and_rank(job: dict[str, str]) -> None:
    done = lc(["export", JOB, "--what", "metadata"], job)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout.decode())))
    # the task's own columns; the program's own "rank" and "step" keys kept beside them
    assert {"node", "step", "rank", "metadata.rank", "metadata.step", "loss"} <= set(rows[0])
    by_rank = {(r["rank"], r["node"], r["step"]) for r in rows}
    assert by_rank == {("0", "n1", "0"), ("1", "n3", "0")}
    assert [r["metadata.step"] for r in rows if r["rank"] == "1"] == ["0", "1", "2"]
    assert all(r["metadata.rank"] == r["rank"] for r in rows)
    one = lc(["export", JOB, "--what", "lines", "--rank", "1", "--format", "ndjson"], job)
    lines = [json.loads(x) for x in one.stdout.decode().splitlines()]
    assert lines and {x["rank"] for x in lines} == {1}
    assert any("ValueError: shard 7" in x["text"] for x in lines)
    bad = lc(["export", JOB, "--rank", "5"], job)
    assert bad.returncode != 0 and b"no such rank" in bad.stderr


def test_export_by_node_as_logs_and_search_take_it(job: dict[str, str]) -> None:
    def export(*args: str) -> list[dict]:
        done = lc(["export", JOB, "--what", "lines", "--format", "ndjson", *args], job)
        assert done.returncode == 0, done.stderr
        return [json.loads(x) for x in done.stdout.decode().splitlines()]

    # only the tasks on n3 (rank 1): the batch script's lines are left out, as with --rank
    on_n3 = export("--node", "n3")
    assert on_n3 and {(x["rank"], x["node"], x["step"]) for x in on_n3} == {(1, "n3", "0")}
    assert on_n3 == export("--rank", "1")
    # repeatable; with --rank, a task must match both
    both = export("--node", "n1", "--node", "n3")
    assert {x["rank"] for x in both} == {0, 1} and "batch" not in {x["step"] for x in both}
    assert export("--node", "n1", "--node", "n3", "--rank", "0-1") == both
    meta = lc(["export", JOB, "--what", "metadata", "--node", "n1"], job)
    rows = list(csv.DictReader(io.StringIO(meta.stdout.decode())))
    assert rows and {(r["rank"], r["node"], r["step"]) for r in rows} == {("0", "n1", "0")}
    for args in (("--node", "n2"), ("--node", "n1", "--rank", "1")):
        bad = lc(["export", JOB, *args], job)
        assert bad.returncode != 0, args
        assert b"no such rank or node among the tasks of 77 (ranks 0-1; nodes n1, n3)" in \
            bad.stderr
    plain = lc(["export", f"{JOB}.0.1", "--what", "samples", "--node", "n3"], job)
    assert plain.returncode != 0 and b"--node n3 reads the lines or metadata" in plain.stderr


def test_show_of_a_plain_run_is_unchanged(job: dict[str, str]) -> None:
    info = json.loads(lc(["show", f"{JOB}.0.1", "--json"], job).stdout)
    assert "ranks" not in info and info["rank"] == 1
    assert info["insights"][0]["message"].startswith("ValueError on rank 1 (node n3):")
    bad = lc(["show", f"{JOB}.0.1", "--rank", "0"], job)
    assert bad.returncode != 0 and b"--rank" in bad.stderr


def test_the_store_gives_the_same_job(job: dict[str, str], tmp_path: Path) -> None:
    store = f"chdb://{tmp_path}/store"
    for run in (JOB, f"{JOB}.0.0", f"{JOB}.0.1"):
        assert lc(["upload", "--store", store, run], job).returncode == 0
    spool = _show(job, "--source", "spool")
    stored = _show(job, "--store", store)
    assert [i["message"] for i in stored["insights"]] == [i["message"] for i in spool["insights"]]
    assert stored["x_axis"] == "step"
    assert [r["rank"] for r in stored["ranks"]] == [0, 1]


def _task(rank: int, end: float, *insights: dict) -> dict:
    return {"rank": rank, "node": f"n{rank}", "end": end, "insights": list(insights)}


def _exc(message: str, **details: object) -> dict:
    return {"kind": "python-exception", "category": "failure", "message": message,
            "evidence": [], "details": details}


def test_the_first_rank_that_failed_by_time_is_the_root_cause() -> None:
    found = job_insights([_task(0, 20.0, _exc("KeyError on rank 0 (node n0): 'lr'", rank=0)),
                          _task(1, 10.0, _exc("OSError on rank 1 (node n1): disk", rank=1)),
                          _task(2, 5.0)])
    assert found[0]["message"].startswith("OSError on rank 1")
    assert found[1]["message"] == "also failed after rank 1: KeyError on rank 0 (node n0): 'lr'"


def test_a_consequence_that_ended_first_is_not_the_root_cause() -> None:
    killed = {"kind": "signal", "category": "failure", "message": "killed by SIGTERM (signal 15)",
              "evidence": [], "details": {"signal": "SIGTERM"}}
    found = job_insights([_task(0, 1.0, killed), _task(3, 9.0, _exc("ValueError: x"))])
    assert found[0]["message"] == "rank 3 (node n3): ValueError: x"  # named by job_insights
    assert found[1]["message"].endswith("killed by SIGTERM (signal 15) (a consequence)")


def test_a_rendezvous_timeout_names_the_ranks_no_task_ran_as() -> None:
    rdzv = {"kind": "rendezvous-timeout", "category": "failure", "evidence": [],
            "message": "rendezvous timed out after 16 s: 2 of 4 ranks joined, 2 ranks never came",
            "details": {"joined": "2", "world": "4"}}
    found = job_insights([_task(0, 1.0, rdzv), _task(1, 2.0)])
    assert found[0]["message"].endswith("2 ranks never came (no task of the job ran as rank "
                                        "2-3)")
    assert found[0]["details"]["absent"] == [2, 3]


def test_a_watchdog_timeout_lists_the_ranks_whose_tasks_did_not_report() -> None:
    def watchdog(rank: int) -> dict:
        return {"kind": "nccl-error", "category": "failure", "evidence": [],
                "message": f"NCCL collective timeout: ALLREDUCE (SeqNum 9) ran for 10.0 min "
                           f"(timeout 10.0 min), reported by rank(s) {rank}",
                "details": {"rank": [str(rank)], "op": "ALLREDUCE"}}
    found = job_insights([_task(r, 5.0 + r, watchdog(r)) for r in (0, 1, 3)] + [_task(2, 9.0)])
    assert found[0]["message"].endswith("reported by rank(s) 0-1, 3, not by rank(s) 2")
    assert found[0]["details"]["silent"] == [2]


def test_a_note_about_idle_gpus_names_the_ranks_of_their_nodes() -> None:
    idle = {"kind": "gpu-idle", "category": "efficiency", "evidence": [],
            "message": "1 of 2 GPU(s) held for 2.0 h were idle: mean utilisation 3 %",
            "details": {"nodes": ["n1"]}}
    tasks = [_task(0, 1.0), _task(1, 1.0), _task(2, 1.0)]
    for t in tasks:
        t["node"] = "n1" if t["rank"] < 2 else "n2"
    (note,) = job_insights(tasks, [idle])
    assert note["message"].endswith("were idle: mean utilisation 3 % (on n1: rank 0-1)")


def test_node_figures_stand_beside_the_ranks_of_the_node() -> None:
    def sample(node: str, ts: float, cpu: float, util: float) -> dict:
        return {"kind": "sample", "stream": f"sample:{node}", "seq": int(ts), "ts": ts,
                "node": node, "job": {"cpu_seconds_total": cpu, "cpus_allocated": 2,
                                      "memory_rss_bytes": 1 << 30},
                "gpus": [{"uuid": f"GPU-{node}", "index": 0, "utilization_gpu_percent": util,
                          "memory_used_bytes": 1 << 33}]}
    samples = [sample("n1", 0.0, 0.0, 90.0), sample("n1", 10.0, 20.0, 70.0),
               sample("n3", 0.0, 0.0, 10.0), sample("n3", 10.0, 2.0, 10.0)]
    rows = [{"rank": 0, "node": "n1"}, {"rank": 1, "node": "n1"}, {"rank": 2, "node": "n3"}]
    figures = node_figures(samples, rows)
    assert [(f["node"], f["ranks"]) for f in figures] == [("n1", "0-1"), ("n3", "2")]
    assert figures[0]["cpu_efficiency"] == pytest.approx(1.0)
    assert figures[0]["gpu_utilization_mean_percent"] == pytest.approx(80.0)
    assert figures[1]["cpu_efficiency"] == pytest.approx(0.1)


def test_the_page_shows_rank_0_and_every_rank_on_request(job: dict[str, str]) -> None:
    """The job page's metadata (web.reads.Pages, over the same Reader as the CLI)."""
    from logcapture.query import LocalReader
    from logcapture.web.reads import Pages

    pages = Pages(LocalReader(Path(job["LOGCAPTURE_SPOOL"]), source="spool"))
    try:
        first = pages.metadata(JOB)
        assert (first["ranks"], first["rank"]) == ([0, 1], "0")
        assert {r["rank"] for r in first["rows"]} == {0} and first["total"] == 4
        assert first["by_x"]["key"] == "step"
        assert set(first["by_x"]["series"]) == {"loss (rank 0)", "rank (rank 0)"}
        every = pages.metadata(JOB, "all")
        assert every["by_x"]["key"] == "step" and every["total"] == 7
        assert set(every["by_time"]["series"]) == {f"{k} (rank {r})" for k in (
            "loss", "rank", "step") for r in (0, 1)}
        loss1 = [(x, v) for x, v in zip(every["by_x"]["x"], every["by_x"]["series"][
            "loss (rank 1)"], strict=True) if v is not None]
        assert loss1 == [(0, 2.0), (1, 1.5), (2, 1.3333)]
        assert pages.metadata(f"{JOB}.0.1").get("ranks") is None  # one task: its own rows
        kinds = [i["kind"] for i in pages.insights(JOB)["insights"]]
        assert kinds == ["python-exception", "other-ranks"]  # as `show 77`
    finally:
        pages.close()


def test_the_ranks_table_has_a_gpu_column_only_when_a_rank_saw_gpus() -> None:
    from logcapture.views import rank_lines

    row = {"rank": 0, "node": "n1", "step": "0", "state": "COMPLETED", "exit_status": 0}
    assert rank_lines({"ranks": [row]})[1].split() == ["rank", "0", "node", "n1", "step", "0",
                                                       "COMPLETED", "0"]
    lines = rank_lines({"ranks": [{**row, "gpus": "2,3"}, {**row, "rank": 1}]})
    assert [ln.split()[6:8] for ln in lines[1:]] == [["GPU", "2,3"], ["GPU", "-"]]
