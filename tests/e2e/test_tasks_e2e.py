"""Each task of a job's srun steps, captured by the SPANK plugin (slurm/spank) on a real
Slurm 22.05 cluster, as real users: one run per task with its node, step and rank, the job's
output files untouched, and a task whose capture cannot start running all the same."""

from __future__ import annotations

import json
import socket
import time

import pytest

from .conftest import Cluster, Job

pytestmark = pytest.mark.slurm

U1, U2 = "lcuser1", "lcuser2"

# Two steps: two tasks, then one that fails. Each rank waits its turn, stderr comes a moment
# after stdout, and the failing task waits before it exits (srun reports an exit and forwards
# output on separate paths), so the order of the output file does not depend on scheduling:
# the same job must give the same bytes with and without capture.
TASKS = r"""#!/bin/bash
#SBATCH -n 2
echo "batch starts"
srun python3 -c '
import os, sys, time
r, s = os.environ["SLURM_PROCID"], os.environ["SLURM_STEP_ID"]
time.sleep(0.6 * int(r))
print(f"rank {r} step {s}", flush=True)
sys.stdout.write(f"\rprogress {r}\r\n")
sys.stdout.flush()
time.sleep(0.2)
print(f"err of rank {r}", file=sys.stderr, flush=True)
'
srun -n 1 bash -c 'echo "step $SLURM_STEP_ID says bye"; sleep 0.3; exit 3'
echo "srun said $?"
"""


def _lines(records: list[dict], stream: str = "stdout") -> list[str]:
    return [r["text"] for r in records if r["kind"] == "line" and r["stream"] == stream]


def test_each_task_is_a_run_of_its_job_with_rank_node_and_step(lc: Cluster) -> None:
    lc.optin(U1, "")
    captured, plain = lc.submit(U1, TASKS, name="tasks"), lc.submit(U2, TASKS, name="tasks")
    states = lc.wait(captured, plain, timeout=90)
    assert states[captured.id] == states[plain.id] == ("COMPLETED", "0:0")

    # The job's output file: the same bytes as the same job of a user who did not opt in.
    want = plain.out.read_bytes()
    assert b"rank 1 step 0\n\rprogress 1\r\n" in want and b"srun said 3" in want
    assert captured.out.read_bytes() == want

    runs = lc.task_run_dirs(captured)
    j = captured.id
    assert sorted(runs) == [f"{j}.0.0", f"{j}.0.1", f"{j}.1.0"]
    host = socket.gethostname().split(".")[0]
    for run, (rank, step) in {f"{j}.0.0": ("0", "0"), f"{j}.0.1": ("1", "0"),
                              f"{j}.1.0": ("0", "1")}.items():
        records = lc.records(captured, run)
        start = next(r for r in records if r["kind"] == "start")
        assert (start["slurm"]["rank"], start["slurm"]["step"], start["slurm"]["local_rank"],
                start["slurm"]["node"], start["slurm"]["job_id"]) == (rank, step, rank if
                                                                       step == "0" else "0",
                                                                       host, j)
        end = next(r for r in records if r["kind"] == "end")
        if step == "0":
            # Rendered as a terminal shows it: the bar's last state, no carriage returns.
            assert _lines(records) == [f"rank {rank} step 0", f"progress {rank}"]
            assert _lines(records, "stderr") == [f"err of rank {rank}"]
            assert (end["exit_status"], end["state"]) == (0, "COMPLETED")
        else:
            assert _lines(records) == ["step 1 says bye"]
            assert (end["exit_status"], end["state"]) == (3, "FAILED")
    assert not (lc.spool_root / plain.id).exists()

    # Read by rank and by node, as the job's user.
    bin_ = lc.env["LOGCAPTURE_BIN"] + "/logcapture"
    own = ["--spool", str(lc.spool_root / j), "--source", "spool"]
    r = lc.as_user(U1, [bin_, "logs", *own, j, "--rank", "1"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["rank 1 step 0", "progress 1", "err of rank 1"]
    r = lc.as_user(U1, [bin_, "logs", *own, j, "--rank", "0-1", "--node", host,
                        "--stream", "stdout"])
    assert r.returncode == 0, r.stderr
    got = r.stdout.splitlines()
    assert {"0: rank 0 step 0", "1: rank 1 step 0", "0: step 1 says bye"} <= set(got)
    assert got.index("0: rank 0 step 0") < got.index("1: rank 1 step 0")
    r = lc.as_user(U1, [bin_, "ls", *own, j])
    assert r.returncode == 0, r.stderr
    assert sorted(ln.split()[0] for ln in r.stdout.splitlines()[1:]) == sorted(
        [j, f"{j}.0.0", f"{j}.0.1", f"{j}.1.0"])
    r = lc.as_user(U1, [bin_, "logs", *own, j])  # J is still the batch script's run
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "batch starts"
    steps_are_sections(r.stdout.splitlines())


def steps_are_sections(got: list[str]) -> None:
    """Each srun step of ``TASKS`` is a section of the job's log around its tasks' lines,
    titled with its number of tasks (SLURM_STEP_NUM_TASKS) and its command."""
    marks = [line for line in got if "section srun step" in line]
    assert [m.split(" (")[0] for m in marks] == [
        "[logcapture: section srun step 0", "[logcapture: end of section srun step 0",
        "[logcapture: section srun step 1", "[logcapture: end of section srun step 1"], got
    assert marks[0].startswith("[logcapture: section srun step 0 (2 tasks: python3 -c"), got
    assert marks[2].startswith("[logcapture: section srun step 1 (1 task: bash -c 'echo"), got
    at = got.index
    assert at(marks[0]) < at("0: rank 0 step 0") < at("1: err of rank 1") < at(marks[1]) < at(
        marks[2]) < at("0: step 1 says bye") < at(marks[3]) < at("srun said 3"), got


FAILS = r"""#!/bin/bash
#SBATCH -n 2
srun bash -c 'echo "rank $SLURM_PROCID runs"; exit $((SLURM_PROCID + 4))'
rc=$?
echo "srun said $rc"
exit $rc
"""


def test_a_task_whose_capture_cannot_start_runs_uncaptured_with_its_exit_status(
        lc: Cluster) -> None:
    lc.optin(U1, "")
    lc.optin(U2, None)
    # No logcapture where the plugin looks for it: each task runs as without the plugin.
    lc.set_task_python("/nonexistent/python3")
    try:
        missing = lc.submit(U1, FAILS, name="fails")
        plain = lc.submit(U2, FAILS, name="fails")
        states = lc.wait(missing, plain, timeout=90)
    finally:
        lc.set_task_python(None)
    # A job whose own script points the tasks at a spool that is not there.
    nospool = lc.submit(U1, FAILS.replace("srun bash", "export LOGCAPTURE_TASKS=/nonexistent\n"
                                          "srun bash", 1), name="fails")
    states.update(lc.wait(nospool, timeout=90))
    assert states[missing.id] == states[plain.id] == states[nospool.id]
    assert states[plain.id] == ("FAILED", "5:0")
    for job in (missing, nospool):
        out = job.out.read_text()
        assert "rank 0 runs" in out and "rank 1 runs" in out and "srun said 5" in out, out
        assert lc.task_run_dirs(job) == {}
        assert lc.records(job)  # the batch script itself is captured as before
    assert "not captured" in lc.slurmd_log()
    assert "not captured" in nospool.out.read_text()  # the one warning, in the task's stderr


EMPTY4 = """#!/bin/bash
#SBATCH -n 4
srun python3 -c pass
"""


def test_no_capture_process_is_left_in_a_step_when_its_tasks_have_ended(lc: Cluster) -> None:
    # Once a step's tasks have ended, slurmstepd SIGKILLs what is left in the step's cgroup
    # and looks again only a second later (logging each kill at debug2). The plugin returns
    # from a task's exit only once its capture process has exited, so nothing of
    # logcapture's is left there, however the exiting processes and slurmstepd are scheduled.
    lc.optin(U1, "")
    lc.set_slurmd_debug("debug2")
    try:
        jobs = [lc.submit(U1, EMPTY4, name="empty") for _ in range(4)]
        states = lc.wait(*jobs, timeout=120)
    finally:
        lc.set_slurmd_debug(None)
    log = lc.slurmd_log().splitlines()
    for job in jobs:
        assert states[job.id] == ("COMPLETED", "0:0")
        assert len(lc.task_run_dirs(job)) == 4
        step = [ln for ln in log if f"[{job.id}.0]" in ln]
        assert sum("task_exit = 0" in ln for ln in step) == 4, step  # logged at debug2
        assert not [ln for ln in step if "killing process" in ln], step


GPUS = r"""#!/bin/bash
#SBATCH -n 2 --gres=gpu:2
srun --gpus-per-task=1 bash -c 'echo "rank $SLURM_PROCID sees GPU $CUDA_VISIBLE_DEVICES"'
"""


def test_show_gives_the_gpu_slurm_bound_each_rank_to(lc: Cluster) -> None:
    """The dev cluster's two (fake) GPUs, one a task: each rank's run records the GPUs Slurm
    gave it (CUDA_VISIBLE_DEVICES), and `show JOB` puts them beside the rank."""
    lc.set_store(True)
    lc.optin(U1, "")
    job = lc.submit(U1, GPUS, name="gpus")
    assert lc.wait(job, timeout=90)[job.id] == ("COMPLETED", "0:0")
    seen = dict(ln.split(" sees GPU ") for ln in job.out.read_text().splitlines())
    assert sorted(seen.values()) == ["0", "1"]
    r = lc.root_cli("show", job.id, "--json")
    assert r.returncode == 0, r.stderr
    ranks = json.loads(r.stdout)["ranks"]
    assert {f"rank {x['rank']}": x["gpus"] for x in ranks} == seen


def test_the_epilog_ships_the_task_runs_with_the_job_and_logs_reads_them_by_rank(
        lc: Cluster) -> None:
    lc.set_store(True)
    lc.optin(U1, "")
    job = lc.submit(U1, TASKS, name="tasks")
    assert lc.wait(job, timeout=90)[job.id] == ("COMPLETED", "0:0")
    assert not (lc.spool_root / job.id).exists(), lc.slurm_log()  # shipped, then removed
    j = job.id
    out = lc.store_query(
        "runs = {r['run']: r for r in store.runs()}\n"
        "for run in sys.argv[2:]:\n"
        "    r = runs[run]\n"
        "    print(json.dumps([r['owner'], r['job_id'], r['exit_status']]))",
        j, f"{j}.0.0", f"{j}.0.1", f"{j}.1.0")
    assert [json.loads(x) for x in out.splitlines()] == [
        [U1, j, 0], [U1, j, 0], [U1, j, 0], [U1, j, 3]]
    r = lc.root_cli("logs", j, "--rank", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["rank 1 step 0", "progress 1", "err of rank 1"]
    r = lc.root_cli("logs", j)  # the job is its batch script's run
    assert r.returncode == 0 and r.stdout.startswith("batch starts\n"), r.stderr
    steps_are_sections(r.stdout.splitlines())  # read from the store


# Two ranks printing progress and metadata; rank 1 raises at step 2, rank 0 goes on.
RANKS = r"""#!/bin/bash
#SBATCH -n 2
srun python3 -c '
import json, os, time
r = int(os.environ["SLURM_PROCID"])
for s in range(4):
    print(f"rank {r} step {s}", flush=True)
    print(json.dumps({"step": s, "loss": round(1 / (s + 1) + r, 4), "rank": r}), flush=True)
    if r == 1 and s == 2:
        raise ValueError("shard 7 is corrupt on this rank")
    time.sleep(0.1)
'
"""


def test_show_names_the_failed_rank_and_its_node_and_the_x_axis_is_the_step(
        lc: Cluster) -> None:
    lc.optin(U1, "")
    job = lc.submit(U1, RANKS, name="ranks")
    assert lc.wait(job, timeout=90)[job.id][0] == "FAILED"
    j = job.id
    host = socket.gethostname().split(".")[0]
    bin_ = lc.env["LOGCAPTURE_BIN"] + "/logcapture"
    own = ["--spool", str(lc.spool_root / j), "--source", "spool"]
    r = lc.as_user(U1, [bin_, "show", *own, j, "--json"])
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    first = info["insights"][0]
    assert first["kind"] == "python-exception", info["insights"]
    assert first["message"].startswith(f"ValueError on rank 1 (node {host}): shard 7 is "
                                       "corrupt on this rank")
    assert [(x["rank"], x["node"], x["state"]) for x in info["ranks"]] == [
        (0, host, "COMPLETED"), (1, host, "FAILED")]
    # the merged rows read step 0, 0, 1, 1, ...: per rank, step is the X axis
    assert (info["metadata_ranks"], info["x_axis"]) == ("0", "step")
    r = lc.as_user(U1, [bin_, "show", *own, j, "--rank", "all", "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["x_axis"] == "step"
    r = lc.as_user(U1, [bin_, "show", *own, j])
    assert f"  rank 1  node {host}  step 0  FAILED" in r.stdout, r.stdout



# A heterogeneous job of two components (one task, then two), and a step that runs both
# (`srun --het-group=0,1`): Slurm places the components on different nodes (the dev cluster's
# second node, partition `two`), makes each a job of its own (ids J and J+1) whose task ids
# count from 0, and gives the tasks SLURM_PROCID 0, 1, 2 across them.
HET = r"""#!/bin/bash
#SBATCH -p two -n 1
#SBATCH hetjob
#SBATCH -p two -n 2
echo "batch starts"
srun --het-group=0,1 bash -c 'sleep 0.$((3 * SLURM_PROCID))
echo "task $SLURM_PROCID on $SLURMD_NODENAME"; sleep 0.1; echo "err $SLURM_PROCID" >&2'
echo "srun said $?"
echo "batch ends"
"""


def _both(lc: Cluster, script: str, name: str, timeout: float) -> tuple[Job, Job]:
    """``script`` run by U1 (opted in) and by U2 (not): both completed, and the output file
    of the captured job has the same bytes as the other's (nothing added, lost or moved)."""
    lc.optin(U1, "")
    captured, plain = lc.submit(U1, script, name=name), lc.submit(U2, script, name=name)
    states = lc.wait(captured, plain, timeout=timeout)
    assert states[captured.id] == states[plain.id] == ("COMPLETED", "0:0")
    assert captured.out.read_bytes() == plain.out.read_bytes()
    return captured, plain


def _starts(lc: Cluster, job: str) -> dict[str, dict]:
    """{task run: its Start record's slurm} of the job's task runs."""
    return {run: next(r for r in lc.records(job, run) if r["kind"] == "start")["slurm"]
            for run in lc.task_run_dirs(job)}


def test_a_heterogeneous_step_is_captured_per_task_with_distinct_ranks(lc: Cluster) -> None:
    captured, plain = _both(lc, HET, "het", timeout=150)
    assert b"task 2 on " in plain.out.read_bytes()
    j = captured.id
    starts = _starts(lc, j)
    assert sorted(starts) == [f"{j}.0.0", f"{j}.0.1", f"{j}.0.2"], lc.slurmd_log()[-2000:]
    ident = {run: (s["rank"], s["step"], s["het_group"], s["local_rank"], s["job_id"])
             for run, s in starts.items()}
    assert ident == {f"{j}.0.0": ("0", "0", "0", "0", j), f"{j}.0.1": ("1", "0", "1", "0", j),
                     f"{j}.0.2": ("2", "0", "1", "1", j)}
    nodes = {run: s["node"] for run, s in starts.items()}
    assert nodes[f"{j}.0.1"] == nodes[f"{j}.0.2"] != nodes[f"{j}.0.0"]
    # each component's tasks in the directory its node's prolog made for that component
    # (job J+1 to Slurm): a node of component 1 alone has no directory of job J
    where = {run: path.parent.name for run, path in lc.task_run_dirs(j).items()}
    assert where == {f"{j}.0.0": j, f"{j}.0.1": str(int(j) + 1), f"{j}.0.2": str(int(j) + 1)}
    for run, s in starts.items():
        rank = s["rank"]
        records = lc.records(j, run)
        assert _lines(records) == [f"task {rank} on {s['node']}"]
        assert _lines(records, "stderr") == [f"err {rank}"]
    # Read as the job's user: the three ranks, labelled
    bin_ = lc.env["LOGCAPTURE_BIN"] + "/logcapture"
    own = ["--spool", str(lc.spool_root), "--source", "spool"]
    r = lc.as_user(U1, [bin_, "logs", *own, j])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # one step of three tasks across the components, a section of the job's log
    assert lines[1].startswith("[logcapture: section srun step 0 (3 tasks: bash -c "), lines
    assert lines[8].startswith("[logcapture: end of section srun step 0 (3 tasks: "), lines
    assert lines[:1] + lines[2:8] + lines[9:] == [
        "batch starts", f"0: task 0 on {nodes[f'{j}.0.0']}", "0: err 0",
        f"1: task 1 on {nodes[f'{j}.0.1']}", "1: err 1", f"2: task 2 on {nodes[f'{j}.0.2']}",
        "2: err 2", "srun said 0", "batch ends"]


def test_a_heterogeneous_jobs_components_are_shipped_as_one_job(lc: Cluster) -> None:
    """Each node's epilog ships what its component's tasks wrote (component 1's runs from the
    directory of job J+1), all as rows of job J, which its user reads as one job."""
    lc.set_store(True)
    lc.optin(U1, "")
    job = lc.submit(U1, HET, name="het-store")
    assert lc.wait(job, timeout=150)[job.id] == ("COMPLETED", "0:0")
    j, k = job.id, str(int(job.id) + 1)
    # each component's epilog ships, then removes its directory; J's state can be final
    # while J+1's epilog still runs
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any((lc.spool_root / d).exists() for d in (j, k)):
        time.sleep(0.2)
    for d in (j, k):
        assert not (lc.spool_root / d).exists(), lc.slurm_log()  # shipped, then removed
    out = lc.store_query(
        "runs = {r['run']: r for r in store.runs()}\n"
        "print(json.dumps(sorted([r['run'], r['job_id'], r['owner']] for r in runs.values()\n"
        "                        if r['run'].split('.')[0] in sys.argv[2:])))", j, k)
    assert json.loads(out) == [[j, j, U1], [f"{j}.0.0", j, U1], [f"{j}.0.1", j, U1],
                               [f"{j}.0.2", j, U1]]
    r = lc.root_cli("logs", j)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("[logcapture")]
    nodes = [ln.rsplit(" on ", 1)[1] for ln in lines if " on " in ln]
    assert nodes[1] == nodes[2] != nodes[0], lines
    assert lines == ["batch starts", *(f"{n}: {t}" for n in range(3) for t in (
        f"task {n} on {nodes[n]}", f"err {n}")), "srun said 0", "batch ends"]


TWO_NODES = r"""#!/bin/bash
#SBATCH -p two -N 2 -n 2
echo "batch on $SLURMD_NODENAME"
srun bash -c 'sleep 0.$((3 * SLURM_PROCID)); echo "rank $SLURM_PROCID on $SLURMD_NODENAME"'
echo "srun said $?"
"""


def test_a_step_on_two_nodes_names_each_ranks_node(lc: Cluster) -> None:
    captured, _ = _both(lc, TWO_NODES, "two", timeout=90)
    j, host = captured.id, socket.gethostname().split(".")[0]
    starts = _starts(lc, j)
    assert {run: (s["rank"], s["node"]) for run, s in starts.items()} == {
        f"{j}.0.0": ("0", host), f"{j}.0.1": ("1", host + "2")}
    bin_ = lc.env["LOGCAPTURE_BIN"] + "/logcapture"
    own = ["--spool", str(lc.spool_root / j), "--source", "spool"]
    r = lc.as_user(U1, [bin_, "logs", *own, j, "--node", host + "2"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"rank 1 on {host}2"]
    r = lc.as_user(U1, [bin_, "show", *own, j, "--json"])
    assert [(x["rank"], x["node"]) for x in json.loads(r.stdout)["ranks"]] == [
        (0, host), (1, host + "2")]
