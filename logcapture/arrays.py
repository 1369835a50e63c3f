"""An array job (``sbatch --array``) or sweep at a glance: its tasks counted by state and, for
the states other than COMPLETED, by the first insight each task's run has (the kind ``ls``
flags and ``show`` lists first). One definition, used by ``ls JOB`` and by the pages:

    40 tasks: 37 COMPLETED, 3 FAILED (cuda-oom 2, nccl-error 1)

A task counts once, by its latest run (a requeued task's earlier runs, and the runs of its
``srun`` steps' tasks, are not tasks of the array). States are listed most tasks first; a
failed task without an insight is counted in its state and not in the parentheses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from . import jobref

#: The state whose tasks' insights are not listed (efficiency notes of runs that worked).
COMPLETED = "COMPLETED"


def array_summary(summaries: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The summary of the array job whose runs ``summaries`` are (as ``ls JOB`` lists them:
    run summaries with ``state`` and ``insights``, the kinds in order), or None when none of
    them is an array task. ``{"array_job_id", "tasks", "states": [{"state", "count",
    "insights": [{"kind", "count"}]}]}``, most tasks first."""
    runs = [jobref.job_fields(s) | dict(s) for s in summaries]
    latest = jobref.latest_runs(runs)
    tasks = [s for s in runs if s["run"] in latest and s.get("array_task_id") is not None
             and s.get("rank") is None]
    if not tasks:
        return None
    by_state: Counter[str] = Counter(str(s.get("state") or "UNKNOWN") for s in tasks)
    kinds: dict[str, Counter[str]] = {}
    for s in tasks:
        state = str(s.get("state") or "UNKNOWN")
        found = s.get("insights") or []
        if state != COMPLETED and found:
            kinds.setdefault(state, Counter())[str(found[0])] += 1
    states = []
    for state, count in sorted(by_state.items(), key=lambda kv: (-kv[1], kv[0])):
        states.append({"state": state, "count": count, "insights": [
            {"kind": k, "count": n}
            for k, n in sorted(kinds.get(state, Counter()).items(),
                               key=lambda kv: (-kv[1], kv[0]))]})
    return {"array_job_id": str(tasks[0]["array_job_id"]), "tasks": len(tasks),
            "states": states}


def summary_for(ref: str, summaries: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``array_summary`` of the runs ``ref`` names when it names an array job as a whole
    (``J``, not one task ``J_T``), else None."""
    parsed = jobref.parse(ref)
    if parsed is None or parsed.task is not None:
        return None
    return array_summary(jobref.select(ref, summaries))


def summary_text(summary: Mapping[str, Any]) -> str:
    """``40 tasks: 37 COMPLETED, 3 FAILED (cuda-oom 2, nccl-error 1)``."""
    parts = []
    for s in summary["states"]:
        why = ", ".join(f"{i['kind']} {i['count']}" for i in s["insights"])
        parts.append(f"{s['count']} {s['state']}" + (f" ({why})" if why else ""))
    n = summary["tasks"]
    return f"{n} task{'s' if n != 1 else ''}: " + ", ".join(parts)


def first_insight(summary: Mapping[str, Any]) -> str | None:
    """A run summary's first insight kind (the one a group of ``array_summary`` counts)."""
    found = summary.get("insights") or []
    return str(found[0]) if found else None
