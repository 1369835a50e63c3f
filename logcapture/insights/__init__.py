"""Answers, not just logs: why a run failed, how well it used what it held, what it does now.

- ``matchers``: the wordings of real programs' failures, as data (pattern, kind, message, hint)
- ``diagnose``: ``Diagnoser`` reads a run's lines once; ``result(Outcome)`` says why it failed
- ``efficiency``: notes from the run's resource samples and its Slurm request
- ``live``: ``LiveWatch``, what the agent finds while a job runs (stalled, nan-metric);
  ``nan_metric``, the same finding in a finished run's metadata
- ``notify``: the one message per job and event a user asked for (mail, webhook)
- ``model``: ``Insight`` and ``Evidence``

Pure functions of records: nothing here reads a spool or a store (the callers do), so the
same diagnosis runs at ship time, in ``logcapture show`` and on the job page.
"""

from collections.abc import Iterable
from typing import Any

from .diagnose import Diagnoser, Outcome, diagnose
from .model import EFFICIENCY, FAILURE, LIVE, Evidence, Insight

__all__ = ["EFFICIENCY", "FAILURE", "LIVE", "Diagnoser", "Evidence", "Insight", "Outcome",
           "diagnose", "incomplete", "run_insights"]


def run_insights(diagnoser: Diagnoser, start: Any, end: Any, samples: list[Any], *,
                 metadata: Iterable[Any] = (), slurm_state: str = "", thresholds: Any = None,
                 request: dict[str, float] | None = None,
                 missing_segments: int = 0) -> list[Insight]:
    """Every insight of a finished run, in the order every reader lists them (the store's
    ``insights`` query, ``ls``'s first kind): the diagnosis (when it ended badly) from
    ``diagnoser`` (fed with its lines) and ``incomplete``, then the efficiency notes from its
    samples, then a metric that became NaN in its ``metadata`` (record dicts in order).
    ``start`` and ``end`` are records or record dicts (None when absent); a run without an
    end gets none. ``missing_segments``: spool segments of the run that could not be read or
    stored (``incomplete``)."""
    from .efficiency import efficiency_notes, slurm_request
    from .live import nan_metric

    if end is None:
        return []
    get_end = end.get if isinstance(end, dict) else (lambda k: getattr(end, k, None))
    slurm = (start.get("slurm") if isinstance(start, dict) else getattr(start, "slurm", None)
             ) or {}
    rank = str(slurm.get("rank", ""))  # a task of a job step (slurm.task): its rank, node
    out = diagnoser.result(Outcome.of(end, slurm_state),
                           int(rank) if rank.isdigit() else None,
                           str(slurm.get("node", "")) if rank.isdigit() else "")
    gap = incomplete(end, missing_segments)
    if gap is not None:
        out.append(gap)
    if request is None and start is not None:
        slurm = start.get("slurm") if isinstance(start, dict) else start.slurm
        ts = start.get("ts") if isinstance(start, dict) else start.ts
        request = slurm_request(slurm, ts)
    out += efficiency_notes(samples, get_end("duration"), request, thresholds)
    nan = nan_metric(metadata)
    return out + [nan] if nan is not None else out


def incomplete(end: Any, missing_segments: int = 0) -> Insight | None:
    """The record is not whole: lines the spool's disk refused (the end record's
    ``counts["spool"]["records_lost"]``), the output limit left out (``counts["limit"]``), or
    that were in ``missing_segments`` spool segments that could not be read or stored; the
    log (or ``show``'s spool problems) says where each happened."""
    get_end = end.get if isinstance(end, dict) else (lambda k: getattr(end, k, None))
    counts = get_end("counts") or {}
    if not isinstance(counts, dict):
        return None

    def count(group: str, key: str) -> int:
        n = (counts.get(group) or {}).get(key)
        return n if isinstance(n, int) and n > 0 else 0

    lost, cut = count("spool", "records_lost"), count("limit", "lines_left_out")
    meta = count("limit", "metadata_left_out")
    why = [*([f"{lost} lines the spool's disk refused"] if lost else []),
           *([f"{cut} lines past job_output_limit (the last ones are kept)"] if cut else []),
           *([f"{meta} metadata rows past job_metadata_limit"] if meta else []),
           *([f"the lines of {missing_segments} spool segment(s) that could not be read "
              "or stored"] if missing_segments else [])]
    if not why:
        return None
    return Insight("incomplete", "not everything was stored: " + "; ".join(why) + " (a note "
                   "in the log says where); the job's own output is complete", (),
                   "free space on the node's spool disk, print less, or ask the "
                   "administrators (spool_keep_free, job_output_limit)", FAILURE,
                   {"lines": lost + cut, "metadata": meta, "segments": missing_segments})
