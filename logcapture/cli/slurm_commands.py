"""``logcapture slurm``: what the prolog, the epilog, the SPANK plugin and the node sampler run
on a job's nodes (not for interactive use).
"""

from __future__ import annotations

import os
import sys

import click


@click.group(name="slurm")
def slurm_group() -> None:
    """Slurm integration: what the prolog and epilog run, as root, on every node of a job.

    Installed by docs/admin.md; try it on one machine with slurm/dev-cluster.
    """


@slurm_group.command(name="prolog")
def slurm_prolog() -> None:
    """Prepare this node for the job in SLURM_JOB_ID: its spool directory (owned by the
    job's user, mode 0700) and its trusted job record. Exits 1 after a problem, which is
    logged; the prolog script still exits 0."""
    from ..slurm.hooks import prolog_main

    sys.exit(prolog_main())


@slurm_group.command(name="epilog")
def slurm_epilog() -> None:
    """Record the end of the job in SLURM_JOB_ID (exit status from the wrapper's End record,
    Slurm's state), ship its runs or leave them to the agent, and clean up. Exits 1 after a
    problem, which is logged; the epilog script still exits 0."""
    from ..slurm.hooks import epilog_main

    sys.exit(epilog_main())


@slurm_group.command(name="task", context_settings={"allow_interspersed_args": False})
@click.option("--socket", "sock_fd", type=int, required=True, metavar="FD",
              help="The plugin's socket, where the task's pty slaves are sent.")
@click.option("--step", required=True, help="The step id (S_JOB_STEPID).")
@click.option("--rank", required=True,
              help="The task's global id (S_TASK_GLOBAL_ID; in a heterogeneous step, in its "
                   "component).")
@click.option("--job", default="", help="The job id (S_JOB_ID; in a heterogeneous job, the "
              "component's).")
@click.option("--local-rank", required=True, help="The task's id on this node (S_TASK_ID).")
@click.option("--task-pid", type=int, required=True, help="The task's pid.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def slurm_task(sock_fd: int, step: str, rank: str, job: str, local_rank: str, task_pid: int,
               command: tuple[str, ...]) -> None:
    """Capture one task of a job step as a run of its job (run id JOB.STEP.RANK). Started
    by the logcapture_task SPANK plugin in each task of an opted-in job's steps, as the
    job's user (docs/admin.md); not for interactive use."""
    from ..slurm.interactive import task_capture

    capture = task_capture(os.environ)
    sys.exit(capture(sock_fd, step, rank, local_rank, task_pid, list(command), job))


@slurm_group.command(name="sampler")
@click.option("--job", "job_id", required=True, metavar="ID",
              help="The job id; must equal SLURM_JOB_ID (it names the process for the epilog).")
def slurm_sampler(job_id: str) -> None:
    """The node sampler the prolog starts detached for an opted-in job: samples the job's
    cgroup and GPUs on this node every sample_interval seconds into the root-owned
    <spool root>/.samples/ until the epilog stops it (TERM). Not for interactive use."""
    from ..slurm.nodesampler import sampler_main

    sys.exit(sampler_main(job_id))

