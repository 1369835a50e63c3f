"""A job's insights across its ranks: the rank that failed first is the root cause.

Each task of a job's ``srun`` steps is a run of its own (``slurm.task``) and is diagnosed alone
(``Diagnoser.result`` names its rank and node). ``job_insights`` reads those diagnoses together:

- the **root cause** is the failed task whose error is not a consequence of another rank's
  (``matchers.CONSEQUENCE``: its peer went away, a collective waited for it, it was stopped by
  a signal), the first by the time it ended; ties by rank. Its failure insights come first,
  each naming the rank and node;
- the other failed tasks are said once after it (``other-ranks``), each with its first error;
- a rendezvous timeout names the ranks of the world that no task of the job ran as
  (``absent``), an NCCL watchdog timeout the ranks whose tasks did not report it;
- the job's own insights (its batch script's: Slurm's state, efficiency) follow, those of a
  kind already said left out (and its catch-all ``failed`` once a rank's failure is said); a
  note about some nodes' GPUs names the ranks that ran on each (``(on n1: rank 0-3)``).

Pure functions of insight dicts (``Insight.to_dict``) and task facts: the callers read them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..jobref import format_ranks
from . import matchers as M
from .model import FAILURE


def _text(insight: Mapping[str, Any]) -> str:
    evidence = " ".join(str(e.get("text") or "") for e in insight.get("evidence") or ())
    return f"{insight.get('message', '')} {evidence}"


def is_consequence(insight: Mapping[str, Any]) -> bool:
    """Whether a failure insight says an error a rank gets because another failed first."""
    details = insight.get("details") or {}
    if insight.get("kind") == "signal" and details.get("signal") in ("SIGTERM", "SIGKILL"):
        return True
    if insight.get("kind") == "other-ranks":
        return True
    return M.CONSEQUENCE.search(_text(insight)) is not None


def _failures(task: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(i) for i in task.get("insights") or ()
            if i.get("category", FAILURE) == FAILURE and i.get("kind") != "other-ranks"]


def _named(insight: dict[str, Any], rank: int, node: str) -> dict[str, Any]:
    """The insight with its task's rank and node, said in its message when it does not."""
    details = dict(insight.get("details") or {})
    if "rank" not in details:
        where = f"rank {rank}" + (f" (node {node})" if node else "")
        insight = {**insight, "message": f"{where}: {insight.get('message', '')}"}
    details.setdefault("rank", rank)
    if node:
        details.setdefault("node", node)
    return {**insight, "details": details}


def root_order(task: Mapping[str, Any]) -> tuple[bool, float, int]:
    """How a failed task sorts as root cause candidate: not a consequence first, then by
    the time it ended, then by rank."""
    failures = _failures(task)
    consequence = all(is_consequence(i) for i in failures)
    end = task.get("end")
    return consequence, float(end) if isinstance(end, (int, float)) else float("inf"), \
        int(task.get("rank") or 0)


def job_insights(tasks: Sequence[Mapping[str, Any]],
                 own: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """A job's insights from its ``tasks`` (each ``rank``, ``node``, ``end`` (epoch seconds
    or None) and ``insights``, dicts) and the job's ``own`` (the batch run's)."""
    failed = sorted((t for t in tasks if _failures(t)), key=root_order)
    out: list[dict[str, Any]] = []
    if failed:
        root = failed[0]
        rank, node = int(root.get("rank") or 0), str(root.get("node") or "")
        out = [_named(i, rank, node) for i in _failures(root)]
        others = []
        for t in failed[1:]:
            first = _failures(t)[0]
            then = " (a consequence)" if all(is_consequence(i) for i in _failures(t)) else ""
            msg = _named(first, int(t.get("rank") or 0), str(t.get("node") or ""))["message"]
            others.append(f"{msg}{then}")
        if others:
            out.append({"kind": "other-ranks", "category": FAILURE,
                        "message": f"also failed after rank {rank}: " + "; ".join(others[:8])
                        + (f"; and {len(others) - 8} more" if len(others) > 8 else ""),
                        "hint": "the first error above is the root cause; the others "
                                "usually follow from it",
                        "evidence": [], "details": {"ranks": [t.get("rank") for t in failed[1:]]}})
        _across(out, tasks)
    # the batch script's catch-all ("exited with status 1") says nothing the ranks do not
    kinds = {i["kind"] for i in out} | ({"failed"} if out else set())
    return out + [_beside_ranks(dict(i), tasks) for i in own if i.get("kind") not in kinds]


def _beside_ranks(insight: dict[str, Any], tasks: Sequence[Mapping[str, Any]]
                  ) -> dict[str, Any]:
    """A note about some nodes (``details.nodes``: idle GPUs, unused GPU memory) with the
    ranks that ran on each."""
    nodes = (insight.get("details") or {}).get("nodes")
    if not isinstance(nodes, list) or not nodes:
        return insight
    on = []
    for node in nodes:
        ranks = [int(t["rank"]) for t in tasks if t.get("node") == node
                 and str(t.get("rank", "")).isdigit()]
        on.append(f"{node}: rank {format_ranks(ranks)}" if ranks else str(node))
    return {**insight, "message": f"{insight.get('message', '')} (on {'; '.join(on)})"}


def _rank_set(value: Any) -> set[int]:
    """The ranks an insight's ``details.rank`` names: a list (the ranks a watchdog timeout
    was reported by) or one rank (the task's own, or the label of the lines it read)."""
    values = value if isinstance(value, (list, tuple)) else (value,)
    return {int(r) for r in values if str(r).isdigit()}


def _across(out: list[dict[str, Any]], tasks: Sequence[Mapping[str, Any]]) -> None:
    """What only the job's tasks together say: the ranks a rendezvous or a watchdog missed."""
    ranks = {int(t["rank"]) for t in tasks if str(t.get("rank", "")).isdigit()}
    reported: set[int] = set()
    for t in tasks:
        for i in t.get("insights") or ():
            if i.get("kind") == "nccl-error":
                reported |= _rank_set((i.get("details") or {}).get("rank"))
    for n, insight in enumerate(out):
        details = dict(insight.get("details") or {})
        if insight.get("kind") == "rendezvous-timeout" and str(details.get("world")).isdigit():
            absent = sorted(set(range(int(details["world"]))) - ranks)
            if absent:
                details["absent"] = absent
                out[n] = {**insight, "details": details, "message": insight["message"]
                          + f" (no task of the job ran as rank {format_ranks(absent)})"}
        elif insight.get("kind") == "nccl-error" and reported and isinstance(
                details.get("rank"), list):
            silent = sorted(ranks - reported)
            details.update(reported=sorted(reported), silent=silent)
            said = f"reported by rank(s) {format_ranks(sorted(reported))}" + (
                f", not by rank(s) {format_ranks(silent)}" if silent else "")
            message = str(insight["message"]).split(", reported by", 1)[0]
            out[n] = {**insight, "details": details, "message": f"{message}, {said}"}
