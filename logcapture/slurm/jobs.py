"""A Slurm job as logcapture sees it: who it is (``JobInfo``, ``run_id_for``, from the
environment slurmd sets) and how it ended (``slurm_job`` asks slurmctld; ``end_state`` decides
the final state from the exit status and what Slurm says).
"""

from __future__ import annotations

import os


def run_id_for(env: dict[str, str] | os._Environ[str]) -> str | None:
    """The run id of a Slurm job: its job id; ``<job id>.<n>`` for its n-th requeue."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return None
    restarts = env.get("SLURM_RESTART_COUNT", "")
    if restarts.isdigit() and int(restarts) > 0:
        return f"{job_id}.{int(restarts)}"
    return job_id


class JobInfo:
    """A job as Slurm describes it to the prolog and epilog (their environment is set by
    slurmd, not by the user, so it is trusted)."""

    __slots__ = ("job_id", "user", "uid", "gid", "array_job_id", "array_task_id",
                 "partition", "nodes", "node", "cluster", "restart_count", "het_job_id")

    def __init__(self, env: dict[str, str] | os._Environ[str]):
        from ..errors import UsageError

        self.job_id = env.get("SLURM_JOB_ID", "")
        if not self.job_id.isdigit():
            raise UsageError("SLURM_JOB_ID is missing or not a number: run this from Slurm's "
                             "Prolog/Epilog")
        try:
            self.uid = int(env.get("SLURM_JOB_UID", ""))
        except ValueError:
            raise UsageError("SLURM_JOB_UID is missing or not a number") from None
        try:
            self.gid = int(env.get("SLURM_JOB_GID", ""))
        except ValueError:
            import pwd
            try:
                self.gid = pwd.getpwuid(self.uid).pw_gid
            except KeyError:
                self.gid = self.uid
        self.user = env.get("SLURM_JOB_USER", "") or str(self.uid)
        self.array_job_id = env.get("SLURM_ARRAY_JOB_ID", "")
        self.array_task_id = env.get("SLURM_ARRAY_TASK_ID", "")
        self.partition = env.get("SLURM_JOB_PARTITION", "")
        self.nodes = env.get("SLURM_JOB_NODELIST", "") or env.get("SLURM_NODELIST", "")
        self.node = env.get("SLURMD_NODENAME", "")
        self.cluster = env.get("SLURM_CLUSTER_NAME", "")
        self.restart_count = (env.get("SLURM_JOB_RESTART_COUNT", "")
                              or env.get("SLURM_RESTART_COUNT", ""))
        # A later component of a heterogeneous job: a job of its own to Slurm, whose tasks
        # are the first component's job's to its user (slurm.task.job_spool)
        het = env.get("SLURM_HET_JOB_ID", "")
        self.het_job_id = het if het.isdigit() and het != self.job_id else ""

    def record(self) -> dict[str, object]:
        return {"cluster": self.cluster, "job_id": self.job_id, "user": self.user,
                "uid": self.uid, "gid": self.gid, "array_job_id": self.array_job_id,
                "array_task_id": self.array_task_id, "partition": self.partition,
                "nodes": self.nodes, "node": self.node,
                **({"het_job_id": self.het_job_id} if self.het_job_id else {})}


def slurm_job(job_id: str, timeout: float = 10.0) -> dict[str, str]:
    """The job's fields as slurmctld reports them (``scontrol show job -o``; the first record
    when there are several), or {} when Slurm cannot be asked."""
    import subprocess

    for scontrol in ("/usr/bin/scontrol", "/usr/local/bin/scontrol", "scontrol"):
        try:
            out = subprocess.run([scontrol, "show", "job", "-o", job_id], capture_output=True,
                                 timeout=timeout, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        first = out.decode("utf-8", "replace").split("\n", 1)[0]
        fields: dict[str, str] = {}
        for token in first.split():
            key, sep, value = token.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields
    return {}


# Slurm's states of a job that has not ended yet (squeue's, https://slurm.schedmd.com/squeue.html)
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                           "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING",
                           "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})
# The states sacct reports for a job that has ended (Slurm's job_state_string of the job's base
# state, https://slurm.schedmd.com/sacct.html#SECTION_JOB-STATE-CODES), and the ones only
# Slurm can know: a job that was cancelled, timed out, preempted or requeued, or whose node
# failed, ended by a signal or an exit status that says none of it.
END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
              "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REQUEUED")
_DECIDED_BY_SLURM = frozenset(END_STATES) - {"COMPLETED", "FAILED"}
# Slurm's Reason for a job that is still COMPLETING (its final state comes only after the
# epilogs, ``_record_final_state_later``) or PENDING again after a requeue, as the final
# state it announces.
_REASON_STATES = {"TimeLimit": "TIMEOUT", "Deadline": "DEADLINE", "OutOfMemory": "OUT_OF_MEMORY",
                  "NodeDown": "NODE_FAIL", "Preempted": "PREEMPTED", "Prolog": "FAILED",
                  "JobHeldUser": "REQUEUED", "JobHeldAdmin": "REQUEUED",
                  "BeginTime": "REQUEUED"}


def end_state(exit_status: int | None, signal: int | None, job: dict[str, str],
              restarts: int = 0) -> str:
    """The state sacct gives a job that ended with ``exit_status`` or ``signal``, from what
    slurmctld said of it at that moment, while the job's wrapper still ran (``scontrol show
    job -o`` fields; {} when it could not be asked): a state only Slurm decides (CANCELLED,
    TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY, a requeue) as Slurm says it, else COMPLETED
    for exit status 0 and FAILED for any other exit or a signal (sacct's FAILED: "terminated
    with non-zero exit code or other failure condition").

    A job slurmctld is ending shows as COMPLETING until its last process and epilog are gone
    (``scontrol`` prints the COMPLETING flag instead of the state under it, and the wrapper is
    one of those processes), so the state is read from ``Reason``: TimeLimit, NodeDown,
    Preempted... as the state they announce. With no Reason the job was ended on request:
    ``scancel`` (sacct's CANCELLED). A job that is still RUNNING ended by itself. A requeued
    job is PENDING again (reason BeginTime) or counts more ``Restarts`` than ``restarts``, the
    count this run started with."""
    state = job.get("JobState", "")
    counted = job.get("Restarts", "")
    if counted.isdigit() and int(counted) > restarts:
        return "REQUEUED"
    if state in _DECIDED_BY_SLURM:
        return state
    if state in ("REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT"):
        return "REQUEUED"
    reason = job.get("Reason", "")
    if state in ("COMPLETING", "PENDING") and reason in _REASON_STATES:
        return _REASON_STATES[reason]
    if state == "COMPLETING" and reason in ("", "None"):
        return "CANCELLED"
    if signal is None and exit_status == 0:
        return "COMPLETED"
    return "FAILED"


def job_end_state(exit_status: int | None, signal: int | None,
                  env: dict[str, str] | os._Environ[str], timeout: float = 3.0,
                  task: bool = False) -> str:
    """``end_state`` of the job in ``env`` (SLURM_JOB_ID), asking slurmctld now: the job
    wrapper calls it when the job's script has ended, before its End record is written. For
    a ``task`` of a step that exited by itself (no signal) slurmctld is not asked: only a
    signal can be Slurm's doing (scancel, a time limit, the OOM killer), and a step of many
    tasks would otherwise send it one request per task at the moment the step ends."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id.isdigit() or task and signal is None:
        return end_state(exit_status, signal, {})
    restarts = env.get("SLURM_RESTART_COUNT", "")
    return end_state(exit_status, signal, slurm_job(job_id, timeout),
                     int(restarts) if restarts.isdigit() else 0)


def slurm_state(job_id: str, timeout: float = 10.0) -> str:
    """The job's state as slurmctld reports it, or "". During the epilog it is COMPLETING."""
    return slurm_job(job_id, timeout).get("JobState", "")


def job_insight_info(record: dict[str, object] | None) -> dict[str, object]:
    """What the diagnosis of a job's run needs from its trusted record: Slurm's state (final,
    or announced by its Reason) and the job's request (``insights.efficiency``)."""
    if not record:
        return {}
    state = str(record.get("slurm_state") or "")
    if state in ("", "COMPLETING"):
        state = _REASON_STATES.get(str(record.get("slurm_reason") or ""), "")
    request = record.get("request")
    return {"slurm_state": state, "request": request if isinstance(request, dict) else None}


def _request(info: dict[str, str]) -> dict[str, float]:
    """What the job asked Slurm for, from ``scontrol show job`` (TRES as ``cpu=2,mem=4000M,
    node=1,gres/gpu=2``; TimeLimit as ``[days-]hh:mm:ss``)."""
    from ..insights.efficiency import parse_time_limit

    out: dict[str, float] = {}
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    for item in info.get("ReqTRES", info.get("TRES", "")).split(","):
        key, _, value = item.partition("=")
        try:
            if key == "cpu":
                out["cpus"] = float(value)
            elif key == "mem" and value:
                out["memory_bytes"] = float(value[:-1]) * units.get(value[-1], 1) \
                    if value[-1] in units else float(value) * 2**20
            elif key in ("gres/gpu", "gpu"):
                out["gpus"] = float(value)
        except ValueError:
            continue
    limit = parse_time_limit(info.get("TimeLimit", ""))
    if limit:
        out["time_limit_seconds"] = limit
    return out
