"""Insights at ship time: a run's diagnosis and efficiency notes once the store has its last
line, and the messages its user asked for."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import LogcaptureError
from ..insights.notify import Notifier
from ..store import Identity, Store
from .result import UploadResult

JobInfo = Callable[[Path], dict[str, Any]]


def diagnose_run(store: Store, identity: Identity, info: dict[str, Any],
                 result: UploadResult, notifier: Notifier | None = None,
                 missing_segments: int = 0) -> int:
    """Store the insights of a run whose last line the store just took (its diagnosis when
    it ended badly, its efficiency notes): ``info`` is what Slurm said of the job
    (``slurm_state``, ``request``; ``{}`` outside Slurm). A run that failed, of a user who
    asked for it (``notify: [failed]``), gets its message through ``notifier``. A failure
    here is a warning: the run is shipped all the same."""
    from ..insights import EFFICIENCY, FAILURE
    from ..insights.efficiency import admin_thresholds
    from ..insights.report import diagnose_stored

    try:
        rec = store.run_info(identity.run, identity.user, counts=False)
        start, end = rec["start_record"], rec["end_record"]
        found = diagnose_stored(store, identity.run, start, end,
                                store.samples(identity.run, identity.user),
                                slurm_state=str(info.get("slurm_state") or ""),
                                thresholds=admin_thresholds(), request=info.get("request"),
                                owner=identity.user, missing_segments=missing_segments)
        dicts = [i.to_dict() for i in found]
        n = store.insert_insights(identity, dicts, time.time(),
                                  replace=(FAILURE, EFFICIENCY))
    except LogcaptureError as e:
        result.warnings.append(f"run {identity.run}: no diagnosis: {e.message}")
        return 0
    result.insights += n
    failures = [d for d in dicts if d["category"] == FAILURE]
    if notifier is not None and failures:
        result.warnings += notify_event(notifier, "failed", identity, start, failures)
    return n


def notify_event(notifier: Notifier, event: str, identity: Identity, start: Any,
                 insights: list[dict[str, Any]]) -> list[str]:
    """Send ``event``'s message when the run's user asked for it (its Start record's
    ``config.notify``); the problems, as warnings."""
    from ..insights.notify import wanted

    notify = wanted(start, event)
    if notify is None:
        return []
    try:
        problems = notifier.send(event, identity.run, identity.user, identity.uid,
                                 identity.job_id, insights, notify)
    except OSError as e:
        problems = [f"no message: {e.strerror or type(e).__name__}"]
    return [f"run {identity.run}: {p}" for p in problems]
