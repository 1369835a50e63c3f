"""A finished spool run's insights without parsing every line (what ``ls`` lists and ``show``
explains): the diagnosis reads only the candidate lines, found by their needles in each
segment's bytes, and a run's kinds are kept in its directory by its owner.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import SpoolError
from ..insights import Diagnoser, Insight, run_insights
from ..insights.efficiency import admin_thresholds
from ..insights.matchers import LOWERED_NEEDLES
from ..records import OUTPUT_STREAMS, kind_suffix
from ..spool.layout import segments
from ..spool.reading import records_of_kinds, segment_data


def spool_insights(run_dir: Path, start: Any, end: Any, thresholds: Any = None
                   ) -> list[Insight]:
    """What ``show`` lists for a finished run in the spool (``show.spool_facts``), without parsing
    every line: the diagnosis reads only the candidates (``Diagnoser``), found by their
    needles in each segment's bytes (``matchers.LOWERED_NEEDLES``), with the lines of a
    traceback that follow one, and the metadata and samples by their kind
    (``spool.reading.records_of_kinds``). ``ls`` lists its first kind."""
    diagnoser = Diagnoser()
    samples: list[dict[str, Any]] = []
    metadata: list[dict[str, Any]] = []
    missing = 0
    for seg in segments(run_dir):
        try:
            data, _ = segment_data(seg)
        except SpoolError:
            missing += 1
            continue
        _feed_candidates(diagnoser, data)
        found = records_of_kinds(data, ("metadata", "sample"))
        samples += filter(None, map(_record_dict, found["sample"]))
        metadata += filter(None, map(_record_dict, found["metadata"]))
    return run_insights(diagnoser, start, end, samples, metadata=metadata,
                        thresholds=thresholds or admin_thresholds(), missing_segments=missing)


# A finished run's insight kinds, kept in its directory by its owner's `ls`: reading them
# means reading every segment (~2.7 s for a 1M-line run, bench_insights), and a finished
# run's segments change only when the shipper removes them (the key then differs).
KINDS_CACHE = ".logcapture-insights.json"


def spool_insight_kinds(run_dir: Path, start: Any, end: Any, thresholds: Any = None
                        ) -> list[str]:
    """The kinds ``spool_insights`` gives, from the run's cache when its segments are the
    ones it was made from. Only the directory's owner reads or writes it (root never
    trusts a file a user could have written: userfiles.py)."""
    try:
        mine = os.stat(run_dir, follow_symlinks=False).st_uid == os.geteuid()
        key = [[seg.path.name, st.st_size, st.st_mtime_ns] for seg in segments(run_dir)
               for st in [os.stat(seg.path, follow_symlinks=False)]]
    except (OSError, SpoolError):
        mine, key = False, []
    cache = run_dir / KINDS_CACHE
    if mine:
        try:
            with open(cache, "rb") as f:
                kept = json.loads(f.read(1 << 16))
            if kept.get("key") == key and isinstance(kept.get("kinds"), list):
                return [str(k) for k in kept["kinds"]]
        except (OSError, ValueError, AttributeError):
            pass
    kinds = [i.kind for i in spool_insights(run_dir, start, end, thresholds)]
    if mine:
        tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps({"key": key, "kinds": kinds}))
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only spool: computed again next time
    return kinds


def _record_dict(raw: bytes) -> dict[str, Any] | None:
    try:
        d = json.loads(raw)
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


_LINE_END = kind_suffix("line")  # a record's kind is its last key


def _feed_candidates(diagnoser: Diagnoser, data: bytes) -> None:
    """Feed ``diagnoser`` the candidate lines of one segment's bytes, and every line after a
    traceback's head until it ends; then the last sequence number of each stream."""
    pos = _feed_from(diagnoser, data, 0) if diagnoser.in_traceback else 0
    lowered = data.lower()
    starts: set[int] = set()
    for needle in LOWERED_NEEDLES:
        at = lowered.find(needle, pos)
        while at >= 0:
            start = lowered.rfind(b"\n", 0, at) + 1
            eol = lowered.find(b"\n", at)
            if lowered.find(b',"text":', start, at) < 0:
                # in the record's identity (a run named "failed"), not its text
                at = lowered.find(needle, at + len(needle))
                continue
            starts.add(start)
            at = lowered.find(needle, eol) if eol >= 0 else -1
    for start in sorted(starts):
        if start >= pos:
            pos = _feed_from(diagnoser, data, start)
    for stream in OUTPUT_STREAMS:
        head = b'"stream":"' + stream.encode() + b'","seq":'
        at = data.rfind(head)
        while at >= 0:
            end = data.find(b"\n", at)
            if end >= 0 and data.endswith(_LINE_END, at, end):
                digits = data[at + len(head):data.find(b",", at + len(head))]
                if digits.isdigit():
                    diagnoser.note_last_seq(stream, int(digits))
                break
            at = data.rfind(head, 0, at)


def _feed_from(diagnoser: Diagnoser, data: bytes, at: int) -> int:
    """Feed the line record at byte ``at`` and, while a traceback is read, those after it;
    the offset after the last line fed (a torn last line is left)."""
    while True:
        end = data.find(b"\n", at)
        if end < 0:
            return len(data)
        if data.endswith(_LINE_END, at, end):
            d = _record_dict(data[at:end])
            if d is not None and isinstance(d.get("text"), str):
                diagnoser.feed(str(d.get("stream")), int(d.get("seq") or 0), d["text"])
        at = end + 1
        if not diagnoser.in_traceback:
            return at

