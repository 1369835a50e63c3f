"""A job of two ranks read by rank on a real Slurm 22.05 cluster, as real users: `logs JOB`
merges the tasks' lines labelled with their ranks and folds the line both ranks printed,
`--rank` keeps each rank's own line, `search --rank` looks in that rank only, and another user
reads none of it; each srun step is a section of the job's log, in `logs -f` as in `logs`."""

from __future__ import annotations

import re

import pytest

from .conftest import Cluster

pytestmark = pytest.mark.slurm

U1, U2 = "lcuser1", "lcuser2"

# Both ranks print the same line at once; rank 1 prints its own line a moment later.
RANKS = r"""#!/bin/bash
#SBATCH -n 2
echo "batch starts"
srun python3 -c '
import os, time
r = os.environ["SLURM_PROCID"]
print("identical line from every rank", flush=True)
time.sleep(1.5 + 0.2 * int(r))
print(f"rank {r} is done", flush=True)
'
"""


def test_a_job_of_two_ranks_read_merged_folded_and_by_rank(lc: Cluster) -> None:
    lc.optin(U1, "")
    job = lc.submit(U1, RANKS, name="ranks")
    assert lc.wait(job, timeout=90)[job.id] == ("COMPLETED", "0:0")
    j = job.id
    bin_ = lc.env["LOGCAPTURE_BIN"] + "/logcapture"
    own = ["--spool", str(lc.spool_root / j), "--source", "spool"]

    r = lc.as_user(U1, [bin_, "logs", *own, j])
    assert r.returncode == 0, r.stderr
    got = r.stdout.splitlines()
    # Shown once, with the label of whichever rank printed it first (the two ranks print it
    # within milliseconds of each other), then the note naming both.
    common = [k for k, line in enumerate(got)
              if line in ("0: identical line from every rank", "1: identical line from every rank")]
    assert len(common) == 1, got
    assert got[common[0] + 1] == "[logcapture: same line from 2 ranks (0-1)]", got
    assert got.index("0: rank 0 is done") < got.index("1: rank 1 is done"), got
    # The step is a section, from its first line to its last, titled with its tasks and its
    # command (a script's newlines as spaces), with its duration.
    assert got[0] == "batch starts", got
    assert got[1].startswith("[logcapture: section srun step 0 (2 tasks: python3 -c ' import "
                             "os, time r = os.environ"), got
    assert re.fullmatch(r"\[logcapture: end of section srun step 0 \(2 tasks: .*\), "
                        r"\d\.\d s\]", got[-1]), got
    assert got[-2] == "1: rank 1 is done", got
    # One number a line in the job's merged log, before the rank's label; notes have none.
    r = lc.as_user(U1, [bin_, "logs", *own, j, "-n"])
    assert r.returncode == 0, r.stderr
    numbered = [line.partition("\t") for line in r.stdout.splitlines()]
    assert [text for _, _, text in numbered] == got
    assert [int(n) for n, _, text in numbered if not text.startswith("[logcapture:")] == list(
        range(1, len([t for t in got if not t.startswith("[logcapture:")]) + 1)), numbered
    assert all(not n.strip() for n, _, text in numbered if text.startswith("[logcapture:"))

    r = lc.as_user(U1, [bin_, "logs", *own, j, "--rank", "1"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["identical line from every rank", "rank 1 is done"]

    r = lc.as_user(U1, [bin_, "search", *own, "done", "--job", j, "--rank", "1"])
    assert r.returncode == 0, r.stderr
    assert "rank 1 is done" in r.stdout and "rank 0 is done" not in r.stdout, r.stdout
    assert f"== {j}.0.1 " in r.stdout

    # Another user sees none of it, by job or by rank.
    for args in (["logs", *own, j], ["logs", *own, j, "--rank", "0"],
                 ["search", *own, "done", "--job", j, "--rank", "0"]):
        r = lc.as_user(U2, [bin_, *args])
        assert r.returncode != 0 and "identical" not in r.stdout + r.stderr, (args, r)


# Two steps: the second starts seconds after the first ended, while `logs -f` follows.
STEPS = r"""#!/bin/bash
#SBATCH -n 2
echo "batch starts"
sleep 2
srun python3 -c '
import os, time
r = os.environ["SLURM_PROCID"]
print("identical line from every rank", flush=True)
time.sleep(1 + 0.3 * int(r))
print(f"rank {r} of step 0", flush=True)
'
sleep 3
srun python3 -c '
import os
print("step 1 rank " + os.environ["SLURM_PROCID"], flush=True)
'
echo "batch ends"
"""


def test_logs_follow_of_a_job_follows_its_steps_as_logs_shows_them(lc: Cluster) -> None:
    import threading

    lc.optin(U1, "")
    job = lc.submit(U1, STEPS, name="follow")
    lc.wait_running(job, "batch starts", timeout=60)
    j = job.id
    bin_ = lc.env["LOGCAPTURE_BIN"] + "/logcapture"
    own = ["--spool", str(lc.spool_root / j), "--source", "spool"]
    followed: list = []
    follower = threading.Thread(target=lambda: followed.append(
        lc.as_user(U1, [bin_, "logs", "-f", *own, j], timeout=120)))
    follower.start()
    assert lc.wait(job, timeout=90)[job.id] == ("COMPLETED", "0:0")
    follower.join(60)
    assert followed, "logs -f did not return once the job had ended"
    r = followed[0]
    assert r.returncode == 0, r.stderr
    whole = lc.as_user(U1, [bin_, "logs", *own, j])
    assert whole.returncode == 0, whole.stderr
    assert r.stdout.splitlines() == whole.stdout.splitlines()
    got = r.stdout.splitlines()
    assert got[0] == "batch starts" and got[-1] == "batch ends", got
    # the first rank to print it labels it (either: they print at once)
    i = [n for n, line in enumerate(got) if line.endswith(": identical line from every rank")]
    assert len(i) == 1 and got[i[0] + 1] == "[logcapture: same line from 2 ranks (0-1)]", got
    assert got.index("0: rank 0 of step 0") < got.index("1: rank 1 of step 0") < got.index(
        "0: step 1 rank 0"), got
    assert "1: step 1 rank 1" in got
    # Each step a section, closed after its last line whenever its tasks' End records came
    # (after the batch script's next line, maybe): the same places in `logs -f` and `logs`.
    marks = [(n, line) for n, line in enumerate(got) if "section srun step" in line]
    assert [line.split(" (")[0] for _, line in marks] == [
        "[logcapture: section srun step 0", "[logcapture: end of section srun step 0",
        "[logcapture: section srun step 1", "[logcapture: end of section srun step 1"], got
    assert [n for n, _ in marks] == [1, got.index("1: rank 1 of step 0") + 1,
                                     got.index("1: rank 1 of step 0") + 2, len(got) - 2], got
    assert marks[2][1].startswith("[logcapture: section srun step 1 (2 tasks: python3 -c"), got
    r = lc.as_user(U1, [bin_, "logs", "-f", *own, j, "--rank", "1"])
    assert r.stdout.splitlines() == ["identical line from every rank", "rank 1 of step 0",
                                     "step 1 rank 1"], r
