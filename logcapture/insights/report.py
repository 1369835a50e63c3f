"""A run's insights as its readers get them: stored ones, else diagnosed now.

The shipper stores the insights of every finished run it ships (``diagnose_stored``), and the
agent those it finds while a job runs; a reader (``logcapture show``, the job page) takes the
stored ones, and for a run shipped without them diagnoses it from the store: the engine finds
the candidate lines (``Store.diagnosis_lines``), so only a handful reach Python. The store is
a parameter (any object with the ``Store`` methods used here): this package reads nothing by
itself.
"""

from __future__ import annotations

from typing import Any

from . import matchers as M
from .diagnose import MAX_TRACEBACK_LINES, TRAILING_LINES, Diagnoser
from .efficiency import Thresholds, admin_thresholds
from .model import LIVE, Insight


def _records(store: Any, run: str, owner: str | None
             ) -> tuple[Any, Any, list[dict[str, Any]]]:
    info = store.run_info(run, owner, counts=False)
    return info["start_record"], info["end_record"], store.samples(run, owner)


def diagnose_stored(store: Any, run: str, start: Any = None, end: Any = None,
                    samples: list[dict[str, Any]] | None = None, *, slurm_state: str = "",
                    thresholds: Thresholds | None = None,
                    request: dict[str, float] | None = None,
                    owner: str | None = None, missing_segments: int = 0) -> list[Insight]:
    """Diagnose a run that is in the store (its failure and its efficiency), of ``owner``
    (None: the only one); ``missing_segments``: its spool segments the store could not take."""
    from . import run_insights

    if start is None and end is None:
        start, end, samples = _records(store, run, owner)
    if end is None:
        return []
    lines, last = store.diagnosis_lines(run, M.NEEDLES, M.ERROR_WORDS, M.TRACEBACK_HEAD,
                                        MAX_TRACEBACK_LINES, TRAILING_LINES, owner)
    d = Diagnoser()
    for stream, seq, text in lines:
        d.feed(stream, seq, text)
    for stream, seq in last.items():
        d.note_last_seq(stream, seq)
    metadata = sorted(store.metadata(run, owner), key=lambda r: (r["ts"], r["seq"]))
    return run_insights(d, start, end, samples if samples is not None else
                        store.samples(run, owner), metadata=metadata, slurm_state=slurm_state,
                        thresholds=thresholds or admin_thresholds(), request=request,
                        missing_segments=missing_segments)


def store_insights(store: Any, run: str, start: Any, end: Any,
                   samples: list[dict[str, Any]] | None, owner: str | None = None
                   ) -> list[dict[str, Any]]:
    """What ``show`` lists for a stored run: its stored insights when the shipper diagnosed
    it, else a diagnosis made now, with what the agent found while it ran."""
    stored = store.insights(run, owner)
    if end is None or any(i["category"] != LIVE for i in stored):
        return stored
    found = [i.to_dict() for i in diagnose_stored(store, run, start, end, samples,
                                                  owner=owner)]
    kinds = {i["kind"] for i in found}  # nan-metric: found again in the metadata
    return found + [i for i in stored if i["category"] == LIVE and i["kind"] not in kinds]
