"""An MPI hello world from Debian's Open MPI (mpi4py), on a real Slurm 22.05 cluster as real
users: started by ``srun --mpi=pmix`` each rank is a task of the step and is captured as a
run of its own with its rank and node; started by ``mpirun`` inside the allocation, the ranks
are mpirun's children and their output (``--tag-output`` labels it) is mpirun's, captured with
the batch script. The job's output file is byte for byte what a user who did not opt in gets.

Needs Open MPI, mpi4py and the PMIx library that Slurm's mpi/pmix plugin loads (slurm/ci-setup.sh
installs them); without them the tests skip with the reason."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

from .conftest import Cluster

pytestmark = pytest.mark.slurm

U1, U2 = "lcuser1", "lcuser2"

# Each rank waits its turn before it prints, so that the order of the output file does not
# depend on scheduling (the same job must give the same bytes with and without capture); the
# barrier after it keeps every rank alive until all have printed.
HELLO = r"""from mpi4py import MPI
import time
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
time.sleep(0.5 * rank)
print(f"hello from rank {rank} of {size} on {MPI.Get_processor_name()}", flush=True)
print("the same line from every rank", flush=True)
world.Barrier()
time.sleep(0.3)
"""

JOB = r"""#!/bin/bash
#SBATCH -n 4
echo "batch starts"
srun --mpi=pmix python3 hello.py
echo "srun said $?"
mpirun --tag-output python3 hello.py
echo "mpirun said $?"
mpirun --mca ras_base_launch_orted_on_hn 1 --tag-output python3 hello.py
echo "mpirun with orted said $?"
"""
# (On one node mpirun forks the ranks itself; on the other nodes of an allocation it starts
# its daemon, orted, as a one-task-per-node srun step, and orted forks the ranks there.
# ras_base_launch_orted_on_hn makes it do that on its own node too, as on a multi-node job.)


def _why_not() -> str | None:
    if not shutil.which("mpirun"):
        return "Open MPI's mpirun missing: run slurm/ci-setup.sh (openmpi-bin)"
    r = subprocess.run(["/usr/bin/python3", "-c", "import mpi4py"], capture_output=True)
    if r.returncode != 0:
        return "mpi4py missing for /usr/bin/python3: run slurm/ci-setup.sh (python3-mpi4py)"
    if not any(os.path.exists(f"/usr/lib/{arch}/pmix2/lib/libpmix.so")
               for arch in os.listdir("/usr/lib") if arch.endswith("-linux-gnu")):
        return "libpmix.so (which mpi/pmix loads) missing: run slurm/ci-setup.sh (libpmix-dev)"
    return None


def _lines(records: list[dict]) -> list[str]:
    return [r["text"] for r in records if r["kind"] == "line" and r["stream"] == "stdout"]


def test_mpi_ranks_are_captured_per_rank_and_the_output_file_is_untouched(
        lc: Cluster) -> None:
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    lc.optin(U1, "")
    for user in (U1, U2):
        lc.write_as(user, lc.home(user) / "hello.py", HELLO)
    captured, plain = lc.submit(U1, JOB, name="mpi"), lc.submit(U2, JOB, name="mpi")
    states = lc.wait(captured, plain, timeout=120)
    assert states[captured.id] == states[plain.id] == ("COMPLETED", "0:0")

    want = plain.out.read_bytes()
    host = socket.gethostname().split(".")[0]
    assert b"hello from rank 3 of 4 on " in want and b"srun said 0" in want, want
    assert b"[1,2]<stdout>:hello from rank 2 of 4" in want and b"mpirun said 0" in want, want
    assert captured.out.read_bytes() == want

    # srun --mpi=pmix: one run per rank, with its rank and node, holding its own lines.
    j = captured.id
    runs = lc.task_run_dirs(captured)
    assert sorted(runs) == [*(f"{j}.0.{r}" for r in range(4)), f"{j}.1.0"], runs
    for rank in range(4):
        records = lc.records(captured, f"{j}.0.{rank}")
        start = next(r for r in records if r["kind"] == "start")
        assert (start["slurm"]["rank"], start["slurm"]["step"], start["slurm"]["node"]) == (
            str(rank), "0", host)
        assert _lines(records) == [f"hello from rank {rank} of 4 on {host}",
                                   "the same line from every rank"]
        end = next(r for r in records if r["kind"] == "end")
        assert (end["exit_status"], end["state"]) == (0, "COMPLETED")

    # mpirun: its ranks are its own (or orted's) children, not tasks of a step; what they
    # print is mpirun's output (orted forwards it to mpirun), kept with the batch script,
    # labelled by --tag-output. orted's step is a task run of its own, with none of it.
    batch = _lines(lc.records(captured))
    assert batch[0] == "batch starts" and "srun said 0" in batch, batch
    assert "mpirun said 0" in batch and batch[-1] == "mpirun with orted said 0", batch
    assert not any(t.startswith("hello from rank") for t in batch), batch  # stored once
    for rank in range(4):
        tagged = f"[1,{rank}]<stdout>:hello from rank {rank} of 4 on {host}"
        assert batch.count(tagged) == 2, batch
    orted = lc.records(captured, f"{j}.1.0")
    start = next(r for r in orted if r["kind"] == "start")
    assert start["command"][0] == "orted" and start["slurm"]["rank"] == "0", start
    assert _lines(orted) == []
    assert not (lc.spool_root / plain.id).exists()
