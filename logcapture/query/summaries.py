"""Run summaries (``Reader.runs``): one dict with the keys of ``interface.SUMMARY_KEYS``,
whether the run is read from the spool (``summary_of_spool``) or the store
(``summary_of_store``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import jobref
from ..insights import Diagnoser, Outcome, incomplete
from ..records import redactions_by_kind
from ..runs import RunSummary
from .interface import SUMMARY_KEYS
from .spool_insights import spool_insight_kinds


def summary_of_spool(s: RunSummary, owner: str, uid: int, run_dir: Path | None = None,
                     thresholds: Any = None) -> dict[str, Any]:
    """A spool run's summary, with the keys of a store run's (``SUMMARY_KEYS``): with
    ``run_dir``, the kinds of its insights (``spool_insights``: those ``show`` lists), else
    those its End record says alone."""
    start, end = s.start, s.end
    slurm = dict(start.slurm or {}) if start else {}  # null in a hand-made start record
    out = {"run": s.run_id, "owner": owner, "uid": uid,
            "job_id": str(slurm.get("job_id", "")), "cluster": str(slurm.get("cluster", "")),
            "host": (start.host or "") if start else "", "state": s.state,
            "exit_status": end.exit_status if end else None,
            "signal": end.signal if end else None,
            "start": start.ts if start else None, "end": end.ts if end else None,
            "last": s.last,
            "duration": end.duration if end else None, "lines": s.lines,
            "redactions": sum(redactions_by_kind(end.counts).values()) if end else None,
            "command": list(start.command or ()) if start else [], "slurm": slurm,
            "source": "spool",
            "insights": [] if end is None else (
                spool_insight_kinds(run_dir, start, end, thresholds) if run_dir is not None
                else [i.kind for i in (*Diagnoser().result(Outcome.of(end)),
                                       *filter(None, [incomplete(end)]))])}
    out.update(jobref.job_fields(out))
    return out


def summary_of_store(row: dict[str, Any]) -> dict[str, Any]:
    """A store run's summary (a ``Store.runs`` row) with the keys of ``SUMMARY_KEYS``."""
    out = {k: row.get(k) for k in SUMMARY_KEYS}
    out["start"] = row["start"] if row["start"] is not None else row["last"]
    out["slurm"] = row.get("slurm") or {}
    out["command"] = list(row.get("command") or [])
    out["source"] = "store"
    out["insights"] = list(row.get("insights") or [])
    out.update(jobref.job_fields(out))
    return out


def newest_first(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(summaries, key=lambda d: (d["start"] is not None, d["start"] or 0.0,
                                            d["run"]), reverse=True)

