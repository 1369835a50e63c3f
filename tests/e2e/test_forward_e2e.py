"""Each line a task prints is stored once, in its task run, on a real Slurm 22.05 cluster as
real users: srun's copy of it (which reaches the batch script's pty) goes to the job's output
file through the SPANK plugin's pipes (logcapture.slurm.forward) and is not stored again with
the batch script, while the job's output file stays byte for byte what it is for a user who
did not opt in."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from .conftest import Cluster, Job

pytestmark = pytest.mark.slurm

U1, U2 = "lcuser1", "lcuser2"

# Each rank prints a line and a JSON line per step, waiting its turn (so the output file's
# order does not depend on scheduling: the same job must give the same bytes with and
# without capture); the JSON lines are the training job's metadata.
PRINTS = r"""python3 -c '
import json, os, sys, time
r, s = int(os.environ["SLURM_PROCID"]), os.environ["SLURM_STEP_ID"]
time.sleep(0.5 * r)
for i in range(3):
    print(f"rank {r} step {s} line {i}", flush=True)
    print(json.dumps({"step": i, "loss": round(1 / (i + 1), 3), "rank": r, "s": int(s)}),
          flush=True)
print(f"err of rank {r} step {s}", file=sys.stderr, flush=True)
time.sleep(0.3)
'"""

SEQUENTIAL = f"""#!/bin/bash
#SBATCH -n 2
echo "batch starts"
srun {PRINTS}
echo "between the steps"
srun --label {PRINTS}
echo "srun said $?"
srun -n 1 bash -c 'echo "step $SLURM_STEP_ID fails"; sleep 0.3; exit 3'
echo "srun said $?"
srun -n 1 --pty bash -c 'echo "step $SLURM_STEP_ID asked for a pty"; sleep 0.3'
srun -n 1 -u bash -c 'echo "step $SLURM_STEP_ID unbuffered"; [ -t 1 ] && echo "on a tty"; sleep 0.3'
echo "batch ends $?"
"""
# (srun reports a task's exit and forwards its output on separate paths: a task that waits a
# moment before it exits keeps the order of the two in the output file the same every time.)

# A step in the background while the script prints: how the two writers interleave is the
# scheduler's, with or without logcapture; each writer's own order is not.
BACKGROUND = r"""#!/bin/bash
#SBATCH -n 2
echo "batch starts"
srun python3 -c '
import os, time
r = os.environ["SLURM_PROCID"]
for i in range(8):
    print(f"bg rank {r} line {i}", flush=True)
    time.sleep(0.07)
' &
for i in $(seq 1 8); do echo "batch line $i"; sleep 0.05; done
wait
echo "batch ends"
"""


# srun's word that it waits for the job's CPUs, which the step before still held a moment:
# the controller's timing (it comes and goes between two runs of the same job, with or
# without logcapture), left out of the comparison of two jobs' output files.
WAITED = re.compile(rb"^srun: (Job \d+ step creation temporarily disabled, retrying .*"
                    rb"|Step created for job \d+)\n", re.M)


def _output(job: Job) -> bytes:
    return WAITED.sub(b"", job.out.read_bytes())


def _texts(records: list[dict]) -> list[str]:
    return [r["text"] for r in records if r["kind"] == "line"]


def _metadata(records: list[dict]) -> list[dict]:
    return [r["fields"] for r in records if r["kind"] == "metadata"]


def _runs(lc: Cluster, job: Job) -> dict[str, list[dict]]:
    """Every run of the job: {run id: records}, the batch run under the job id."""
    runs = {job.id: lc.records(job)}
    for run in lc.task_run_dirs(job):
        runs[run] = lc.records(job, run)
    return runs


def test_each_task_line_is_stored_once_and_the_output_file_is_untouched(lc: Cluster) -> None:
    lc.optin(U1, "")
    captured, plain = lc.submit(U1, SEQUENTIAL, name="fwd"), lc.submit(U2, SEQUENTIAL,
                                                                         name="fwd")
    states = lc.wait(captured, plain, timeout=120)
    assert states[captured.id] == states[plain.id] == ("COMPLETED", "0:0")
    want = _output(plain)
    assert b"0: rank 0 step 1 line 0\n" in want and b"srun said 3" in want  # --label's
    # srun --pty in a batch script: srun's stdout is no terminal (a file without logcapture,
    # the batch capture's pipe with it), so srun runs the step without one, the same way.
    assert b"disregarding --pty" in want and b"step 3 asked for a pty\n" in want
    assert _output(captured) == want

    j = captured.id
    runs = _runs(lc, captured)
    assert sorted(runs) == sorted([j, f"{j}.0.0", f"{j}.0.1", f"{j}.1.0", f"{j}.1.1",
                                   f"{j}.2.0", f"{j}.3.0", f"{j}.4.0"])
    # The batch run: the script's own prints and srun's own messages, no task line.
    batch = _texts(runs[j])
    assert [t for t in batch if not t.startswith("srun: ")] == [  # (srun's own: kept)
        "batch starts", "between the steps", "srun said 0", "srun said 3", "batch ends 0"]
    assert "srun: error: Not using a pseudo-terminal, disregarding --pty option" in batch
    assert any(t.startswith("srun: error: ") and "task 0: Exited with exit code 3" in t
               for t in batch), batch
    assert _metadata(runs[j]) == []
    # Every task line exactly once, in its own task's run.
    everywhere = Counter(t for records in runs.values() for t in _texts(records))
    for step in (0, 1):
        for rank in (0, 1):
            mine = runs[f"{j}.{step}.{rank}"]
            lines = [text for i in range(3) for text in (
                f"rank {rank} step {step} line {i}",
                json.dumps({"step": i, "loss": round(1 / (i + 1), 3), "rank": rank, "s": step}))]
            assert _texts(mine) == [*lines, f"err of rank {rank} step {step}"]
            assert all(everywhere[t] == 1 for t in _texts(mine)), everywhere
            assert [(m["step"], m["rank"], m["s"]) for m in _metadata(mine)] == [
                (i, rank, step) for i in range(3)]
    assert _texts(runs[f"{j}.2.0"]) == ["step 2 fails"]
    assert everywhere["step 2 fails"] == 1
    assert _texts(runs[f"{j}.3.0"]) == ["step 3 asked for a pty"]
    assert everywhere["step 3 asked for a pty"] == 1
    # srun -u: slurmstepd gives the task a terminal; the task is captured all the same (on a
    # terminal of logcapture's, as it was on one of slurmstepd's).
    assert _texts(runs[f"{j}.4.0"]) == ["step 4 unbuffered", "on a tty"]
    assert everywhere["step 4 unbuffered"] == 1
    all_metadata = [m for records in runs.values() for m in _metadata(records)]
    assert len(all_metadata) == 12


def test_a_background_step_keeps_each_writers_order_and_is_stored_once(lc: Cluster) -> None:
    lc.optin(U1, "")
    captured, plain = lc.submit(U1, BACKGROUND, name="bg"), lc.submit(U2, BACKGROUND, name="bg")
    states = lc.wait(captured, plain, timeout=120)
    assert states[captured.id] == states[plain.id] == ("COMPLETED", "0:0")
    got, want = _output(captured), _output(plain)
    # The same bytes, line for line; the interleaving of the step and the script is the
    # scheduler's (it differs between two runs without logcapture too), each one's order not.
    assert len(got) == len(want) and sorted(got.splitlines()) == sorted(want.splitlines())
    for out in (got, want):
        lines = out.decode().splitlines()
        assert lines[0] == "batch starts" and lines[-1] == "batch ends"
        for prefix, n in (("bg rank 0 ", 8), ("bg rank 1 ", 8), ("batch line", 8)):
            mine = [ln for ln in lines if ln.startswith(prefix)]
            assert mine == sorted(mine, key=lambda ln: int(ln.split()[-1])) and len(mine) == n
    runs = _runs(lc, captured)
    j = captured.id
    assert _texts(runs[j]) == ["batch starts", *[f"batch line {i}" for i in range(1, 9)],
                               "batch ends"]
    for rank in (0, 1):
        assert _texts(runs[f"{j}.0.{rank}"]) == [f"bg rank {rank} line {i}" for i in range(8)]


FAILS = r"""#!/bin/bash
#SBATCH -n 2
echo "batch starts"
# Rank 1's run directory cannot be made: its capture fails, the task runs all the same.
[ -n "$LOGCAPTURE_TASKS" ] && touch "$LOGCAPTURE_TASKS/$SLURM_JOB_ID.0.1"
srun bash -c 'echo "rank $SLURM_PROCID runs"; sleep $SLURM_PROCID; exit $((SLURM_PROCID + 4))'
rc=$?
echo "srun said $rc"
exit $rc
"""


def test_a_task_whose_capture_fails_runs_with_its_status_and_its_warning_is_kept(
        lc: Cluster) -> None:
    lc.optin(U1, "")
    captured, plain = lc.submit(U1, FAILS, name="fwdfail"), lc.submit(U2, FAILS,
                                                                      name="fwdfail")
    states = lc.wait(captured, plain, timeout=120)
    assert states[captured.id] == states[plain.id] == ("FAILED", "5:0")
    out = captured.out.read_text()
    assert "rank 0 runs" in out and "rank 1 runs" in out and "srun said 5" in out, out
    j = captured.id
    assert sorted(lc.task_run_dirs(captured)) == [f"{j}.0.0"]
    assert _texts(lc.records(captured, f"{j}.0.0")) == ["rank 0 runs"]
    batch = _texts(lc.records(captured))
    # The one warning the task gave reaches the batch run, as srun's own messages do.
    assert any(t.startswith("logcapture: ") for t in batch), batch
    assert "rank 0 runs" not in batch
    assert json.dumps(batch)  # (readable records)


# The batch script's stderr apart (#SBATCH -e): two ptys, so srun gets a pipe for each; and a
# step whose output goes to files of its own (srun --output), which srun never sees.
APART = r"""#!/bin/bash
#SBATCH -n 2
echo "batch starts"
echo "batch err" >&2
srun bash -c 'sleep $SLURM_PROCID; echo "rank $SLURM_PROCID out"; echo "rank $SLURM_PROCID err" >&2'
srun --output="$HOME/fwdapart-$SLURM_JOB_ID-%t.txt" bash -c 'echo "rank $SLURM_PROCID to a file"'
echo "batch ends"
"""


def test_stderr_apart_and_a_step_with_files_of_its_own(lc: Cluster) -> None:
    lc.optin(U1, "")
    jobs = {user: lc.submit(user, APART, f"--error={lc.home(user)}/fwdapart-%j.err",
                            name="fwdapart") for user in (U1, U2)}
    states = lc.wait(*jobs.values(), timeout=120)
    assert {states[j.id] for j in jobs.values()} == {("COMPLETED", "0:0")}
    captured, plain = jobs[U1], jobs[U2]

    def files(job: Job) -> list[bytes]:
        home = lc.home(job.user)
        return [_output(job), (home / f"fwdapart-{job.id}.err").read_bytes(),
                *[(home / f"fwdapart-{job.id}-{t}.txt").read_bytes() for t in (0, 1)]]

    want = files(plain)
    assert want[0] == b"batch starts\nrank 0 out\nrank 1 out\nbatch ends\n"
    assert want[1] == b"batch err\nrank 0 err\nrank 1 err\n"
    assert want[2:] == [b"rank 0 to a file\n", b"rank 1 to a file\n"]
    assert files(captured) == want
    j = captured.id
    runs = _runs(lc, captured)
    assert sorted(runs) == sorted([j, f"{j}.0.0", f"{j}.0.1", f"{j}.1.0", f"{j}.1.1"])
    batch = runs[j]
    assert [r["text"] for r in batch if r["kind"] == "line" and r["stream"] == "stdout"] == [
        "batch starts", "batch ends"]
    assert [r["text"] for r in batch if r["kind"] == "line" and r["stream"] == "stderr"] == [
        "batch err"]
    for rank in (0, 1):
        records = runs[f"{j}.0.{rank}"]
        assert [(r["stream"], r["text"]) for r in records if r["kind"] == "line"] == [
            ("stdout", f"rank {rank} out"), ("stderr", f"rank {rank} err")]
        assert _texts(runs[f"{j}.1.{rank}"]) == [f"rank {rank} to a file"]
