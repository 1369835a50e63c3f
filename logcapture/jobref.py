"""Slurm job ids as users write them, and the job a run belongs to.

One rule, used by every reader (the spool's ``runs.find_run``, the store's
``Store.resolve_run``, ``query``'s summaries and ``logcapture ls``):

``J``
    Job J's latest run. When J is an array job (``sbatch --array``), J names all its tasks: a
    command that reads one run asks for ``J_T`` (the error lists the tasks); ``ls J`` lists
    them. When J is the own job id of one array task (``scontrol show job`` shows it as
    ``JobId``), and no array job J was captured, J names that task.
``J_T``
    Task T of array job J (``SLURM_ARRAY_JOB_ID``, ``SLURM_ARRAY_TASK_ID``), its latest run.
``J.N``, ``J_T.N``
    The run after the job's N-th requeue (``SLURM_RESTART_COUNT``; ``J.0`` is the first run).
    A requeued job keeps its job id; each start is captured as a run of its own whose run id
    is ``J.N`` (``slurm.run_id_for``).
anything else
    A run id as ``ls --json`` prints it (``run``), or ``latest``.

Each task of a job's ``srun`` steps is a run of its own (``slurm.task``: run id
``<job run>.<step>.<rank>``, a ``rank`` in its Start record's ``slurm``): a task run. ``J``
names the job's batch run as before; ``ls J`` lists the task runs with it, and ``tasks``
picks them by rank and node (``logs J --rank N --node NAME``).

A run's job fields (``job_fields``) come from the Start record's Slurm identity, which the job
wrapper takes from the job's environment, and from the run id.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .errors import NotFound, UsageError
from .summary_row import run_name

# The job columns ``job_fields`` adds to a run summary.
JOB_KEYS = ("job", "job_name", "nodes", "array_job_id", "array_task_id", "restart", "step",
            "rank")
_REF = re.compile(r"(\d{1,18})(?:_(\d{1,9}))?(?:\.(\d{1,6}))?")
_RUN_RESTART = re.compile(r"\d+\.(\d+)")


class JobRef(NamedTuple):
    job: str  # the job id, or the array job id when ``task`` is given
    task: str | None  # the array task id
    restart: int | None  # None: the latest run


def parse(text: str | None) -> JobRef | None:
    """The job reference ``text`` is, or None when it is not one (a run id, ``latest``)."""
    if not text:
        return None
    m = _REF.fullmatch(text)
    if m is None:
        return None
    return JobRef(str(int(m.group(1))), str(int(m.group(2))) if m.group(2) else None,
                  int(m.group(3)) if m.group(3) else None)


def restart_of(run: str, slurm: Mapping[str, Any]) -> int:
    """How many times the job had been requeued when this run started."""
    n = str(slurm.get("restart_count", ""))
    if n.isdigit():
        return int(n)
    m = _RUN_RESTART.fullmatch(run)
    return int(m.group(1)) if m else 0


def job_fields(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The job columns of a run summary (``run``, ``job_id``, ``slurm``, ``host``,
    ``command``): ``job`` (the id as ``sacct`` shows it: ``J`` or ``J_T``; the run id when the
    run is not a Slurm job), ``job_name`` (the run's name: ``summary_row.run_name``),
    ``nodes``, ``array_job_id``, ``array_task_id``, ``restart``."""
    slurm = summary.get("slurm") or {}
    run = str(summary.get("run", ""))
    raw = str(summary.get("job_id") or slurm.get("job_id") or "")
    array_job, task = str(slurm.get("array_job_id", "")), str(slurm.get("array_task_id", ""))
    if array_job and task:
        job = f"{array_job}_{task}"
    else:
        job, array_job, task = raw or run, "", ""
    name = run_name(slurm, summary.get("command"))
    rank = str(slurm.get("rank", ""))
    rank_of = int(rank) if rank.isdigit() else None
    nodes = str(slurm.get("nodelist", "")) if rank_of is None else ""  # a task's is its node
    return {"job": job, "job_name": name,
            "nodes": nodes or str(slurm.get("node", "")) or str(summary.get("host", "")),
            "array_job_id": array_job or None, "array_task_id": task or None,
            "restart": restart_of(run, slurm) if raw else 0,
            "step": str(slurm.get("step", "")) if rank_of is not None else None,
            "rank": rank_of}


def is_task(summary: Mapping[str, Any]) -> bool:
    """Whether the run is one task of a job step (not the job's batch script)."""
    return _fields(summary)["rank"] is not None


def _fields(s: Mapping[str, Any]) -> Mapping[str, Any]:
    return s if "job" in s and "rank" in s else {**s, **job_fields(s)}


def select(text: str, summaries: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Every run ``text`` names (all tasks of an array job, all runs of a requeued job),
    newest first as given."""
    runs = [_fields(s) for s in summaries]
    ref = parse(text)
    if ref is None:
        return [s for s in runs if s["run"] == text]
    if ref.task is not None:
        found = [s for s in runs if s["array_job_id"] == ref.job
                 and s["array_task_id"] == ref.task]
    else:
        found = [s for s in runs if s["array_job_id"] == ref.job]
        if not found:  # a plain job, or one array task by its own job id
            found = [s for s in runs if str(s.get("job_id") or "") == ref.job]
    if not found:  # a run id that only looks like a job id (logcapture run --run-id 42)
        return [s for s in runs if s["run"] == text]
    if ref.restart is not None:
        found = [s for s in found if s["restart"] == ref.restart]
    return found


def not_found(text: str) -> NotFound:
    """The error for ``text`` naming none of the user's runs (``choose``, ``ls JOB``)."""
    return NotFound(f"no job or run {text!r} of yours (see `logcapture ls`)")


def choose(text: str, summaries: Iterable[Mapping[str, Any]]) -> str:
    """The run id of the one run ``text`` names: the latest run of its job. NotFound when
    none; a UsageError naming the tasks when ``text`` is an array job of several tasks."""
    found = select(text, summaries)
    if not found:
        raise not_found(text)
    # The job's batch run, not one of its tasks (a task starts later, but J is the job)
    found = [s for s in found if not is_task(s)] or found
    jobs = sorted({s["job"] for s in found}, key=_job_order)
    if len(jobs) > 1:
        shown = ", ".join(jobs[:10]) + (", ..." if len(jobs) > 10 else "")
        raise UsageError(f"{text} is an array job of {len(jobs)} tasks: name one as "
                         f"{text}_TASK ({shown}; `logcapture ls {text}` lists them)")
    best = max(found, key=lambda s: (s["restart"], s.get("start") or 0.0))
    return str(best["run"])


def _job_order(job: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in job.split("_"))


def label(summary: Mapping[str, Any], latest: bool) -> str:
    """What ``ls`` prints in its JOBID column: the reference that names exactly this run
    (``J``, ``J_T``; ``J.N`` for a requeued job's earlier runs)."""
    s = _fields(summary)
    if s["rank"] is not None:
        return str(s["run"])  # J.S.R: the task run's own id, which names it
    if latest or s["job"] == s["run"] and not parse(str(s["run"])):
        return str(s["job"])
    return f"{s['job']}.{s['restart']}"


def latest_runs(summaries: Iterable[Mapping[str, Any]]) -> set[str]:
    """The run ids that are their job's latest run (the others were requeued)."""
    best: dict[str, Mapping[str, Any]] = {}
    for s in map(_fields, summaries):
        if s["rank"] is not None:
            continue
        key = str(s["job"])
        if key not in best or (s["restart"], s.get("start") or 0.0) > (
                best[key]["restart"], best[key].get("start") or 0.0):
            best[key] = s
    return {str(s["run"]) for s in best.values()}


def parse_ranks(values: Iterable[str]) -> set[int]:
    """The ranks ``--rank`` names: each value a rank, a range ``0-3`` or a comma list of
    both (``0-3,8``). A UsageError names a value that is none of these."""
    ranks: set[int] = set()
    for value in values:
        for part in value.split(","):
            first, dash, last = part.strip().partition("-")
            if not first.isdigit() or (dash and not last.isdigit()):
                raise UsageError(f"--rank {value!r}: a rank is a number or a range like 0-3")
            lo, hi = int(first), int(last) if dash else int(first)
            if hi < lo or hi - lo > 1_000_000:
                raise UsageError(f"--rank {value!r}: the range is empty or too large")
            ranks.update(range(lo, hi + 1))
    return ranks


def format_ranks(ranks: Iterable[int]) -> str:
    """Ranks as ``--rank`` takes them back (``parse_ranks``): ``0-3, 8`` for 0, 1, 2, 3, 8."""
    parts: list[str] = []
    run: list[int] = []
    for r in sorted(set(ranks)):
        if run and r != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(r)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(parts)


def tasks(text: str, summaries: Iterable[Mapping[str, Any]], ranks: set[int] | None = None,
          nodes: set[str] | None = None) -> list[Mapping[str, Any]]:
    """The task runs of the job ``text`` names (its latest run unless ``J.N`` names an earlier
    one) with one of ``ranks`` and on one of ``nodes`` (None: any), by step and rank. NotFound
    when ``text`` names no job of the caller's."""
    found = select(text, summaries)
    if not found:
        raise not_found(text)
    ref = parse(text)
    if ref is not None and ref.restart is None:  # a requeued job: the tasks of its last run
        last = max(s["restart"] for s in found)
        found = [s for s in found if s["restart"] == last]
    picked = [s for s in found if s["rank"] is not None
              and (ranks is None or s["rank"] in ranks)
              and (nodes is None or s["nodes"] in nodes)]
    return sorted(picked, key=lambda s: (_step_order(s["step"]), s["rank"]))


def _step_order(step: str | None) -> tuple[int, str]:
    return (int(step), "") if step and step.isdigit() else (1 << 62, step or "")
