"""The Reader over the store alone (``StoreReader``), as one owner or, for an administrator,
every owner: what the read service answers its clients with, one per request, and what
``LocalReader`` asks of the caller's own store.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from ..errors import NotFound
from ..logview import just_before, parse_cursor
from ..records import OUTPUT_STREAMS
from ..search import Found, Request, answer
from ..store import Store, export_rows
from .interface import FOLLOW_POLL, LOG_PAGE, entry_json, page_limit
from .show import describe, store_facts
from .summaries import summary_of_store

# After the end record is in the store, the batch that carried it may still be inserting its
# lines (the shipper inserts the other records first, store.Store.insert_many): a follower
# reads on until a read finds nothing this long after it saw the end.
FOLLOW_SETTLE = 3.0
# A follower asks the store only for records at most this much older than the newest it has
# seen (the store's key begins with the run and the time, so the read stays small); records
# reach the store in spool order, each within seconds of its time stamp.
FOLLOW_LOOKBACK = 300.0
FOLLOW_PAGE = 10_000  # records per read of a follower (a long log is read in pages)

# Opens the store for one question (``with session() as st``): ``held_store.HeldStore`` for a
# command, ``reader.sessions`` for the read service.
StoreSession = Callable[[], AbstractContextManager[Store]]


def _check_run(st: Store, run: str, owner: str | None) -> None:
    """NotFound unless the run is in the store as the owner's (one row of the runs table;
    ``run_info`` would also count every table's rows)."""
    if not st.has_run(run, owner):
        raise NotFound(f"run {run!r} is not in the store")


class StoreReader:
    """The Reader over the store alone, as ``owner`` (None: every owner). ``session`` opens
    the store for one question (``with session() as st``): an embedded store is one process's
    at a time, so it is held only while a question is answered."""

    def __init__(self, session: StoreSession, owner: str | None):
        self.session = session
        self.owner = owner

    def runs(self) -> list[dict[str, Any]]:
        with self.session() as st:
            return [summary_of_store(r) for r in st.runs(self.owner)]

    def resolve(self, ref: str | None) -> str:
        with self.session() as st:
            return st.resolve_run(ref, self.owner)

    def summary(self, run: str) -> dict[str, Any]:
        with self.session() as st:
            rows = st.runs(self.owner, run)
        if not rows:
            raise NotFound(f"run {run!r} is not in the store")
        return summary_of_store(rows[0])

    def lines(self, run: str, stream: str | None = None, tail: int | None = None
              ) -> list[dict[str, Any]]:
        with self.session() as st:
            _check_run(st, run, self.owner)
            return st.lines(run, stream, tail, owner=self.owner)

    def iter_lines(self, run: str, stream: str | None = None, page: int = 50_000
                   ) -> Iterator[list[dict[str, Any]]]:
        """``lines(run, stream)`` in batches: at once for a run of up to ``page`` records, else
        read a page at a time with the store released between pages (the read service sends
        a long log without holding it all in memory)."""
        with self.session() as st:
            _check_run(st, run, self.owner)  # NotFound when it is not the caller's
            if st.record_count(run, self.owner) <= page:
                small = st.lines(run, stream, owner=self.owner)
            else:
                small = None
        if small is not None:
            yield small
            return
        nexts: dict[str, int] = {}
        while True:
            with self.session() as st:
                recs = st.lines(run, stream, owner=self.owner, after=nexts, head=page)
            yield recs
            if len(recs) < page:
                return
            for d in recs:
                nexts[d["stream"]] = max(nexts.get(d["stream"], 0), int(d["seq"]) + 1)

    def follow(self, run: str, poll: float = FOLLOW_POLL, settle: float = FOLLOW_SETTLE,
               sleep: Callable[[float], None] = time.sleep,
               on_idle: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:
        """Every record of the run, then new ones as the shipper brings them, until the end
        record (``follow_batches``, one record at a time)."""
        for batch in self.follow_batches(run, poll, settle, sleep, on_idle):
            yield from batch

    def follow_batches(self, run: str, poll: float = FOLLOW_POLL,
                       settle: float = FOLLOW_SETTLE,
                       sleep: Callable[[float], None] = time.sleep,
                       on_idle: Callable[[], None] | None = None,
                       resume: Mapping[str, int] | None = None, started: bool = False
                       ) -> Iterator[list[dict[str, Any]]]:
        """Every record of the run, then new ones as the shipper brings them, a read every
        ``poll`` seconds (``on_idle`` is called after a read that found nothing), until the
        end record: once every record the end record counts is read, or a read finds nothing
        ``settle`` seconds after it. A follow cut off resumes with ``resume`` (each stream's
        next seq not read) and ``started`` (its Start record was read); its end then comes
        ``settle`` seconds after the end record (what was read before is not counted)."""
        nexts: dict[str, int] = dict(resume or {})  # stream -> the next seq not yet read
        newest: float | None = None
        ended_at: float | None = None
        end: dict[str, Any] | None = None
        lines: Counter[tuple[str, str]] = Counter()  # records read per stream and kind
        while True:
            with self.session() as st:
                # NotFound when it is not the caller's
                info = st.run_info(run, self.owner, counts=False)
                since = newest - FOLLOW_LOOKBACK if newest is not None else None
                recs = st.lines(run, owner=self.owner, after=nexts, since=since,
                                head=FOLLOW_PAGE)
            if not started and info["start_record"] is not None:
                started = True
                yield [info["start_record"]]
            for d in recs:
                nexts[d["stream"]] = max(nexts.get(d["stream"], 0), int(d["seq"]) + 1)
                newest = d["ts"] if newest is None else max(newest, d["ts"])
                lines[d["stream"], d["kind"]] += 1
            if recs:
                yield recs
            if len(recs) == FOLLOW_PAGE:
                continue  # more is waiting: read on at once
            now = time.monotonic()
            if info["end_record"] is not None and ended_at is None:
                ended_at, end = now, info["end_record"]
            if end is not None and ((not resume and _all_lines_read(end, lines)) or (
                    not recs and now - ended_at >= settle)):  # type: ignore[operator]
                yield [end]
                return
            if not recs and on_idle is not None:
                on_idle()
            sleep(poll)

    def log(self, run: str, stderr: bool = False, before: str | None = None,
            after: str | None = None, limit: int = LOG_PAGE, line: int | None = None
            ) -> dict[str, Any]:
        limit = page_limit(limit)
        with self.session() as st:
            if line is not None:
                after = just_before(st.line_key(run, self.owner, line), run, line)
            rows, more, ended = st.log_page(run, self.owner, stderr,
                                            parse_cursor(before) if before else None,
                                            parse_cursor(after) if after else None, limit)
        return {"entries": [entry_json(*r) for r in rows], "more": more, "ended": ended}

    def describe(self, run: str) -> dict[str, Any]:
        with self.session() as st:
            return describe(store_facts(st, run, self.owner))

    def metadata(self, run: str) -> list[dict[str, Any]]:
        with self.session() as st:
            _check_run(st, run, self.owner)
            return st.metadata(run, self.owner)

    def samples(self, run: str) -> list[dict[str, Any]]:
        with self.session() as st:
            _check_run(st, run, self.owner)
            return st.samples(run, self.owner)

    def export_rows(self, run: str, what: str) -> list[dict[str, Any]]:
        with self.session() as st:
            _check_run(st, run, self.owner)
            if what == "lines":
                recs = st.lines(run, owner=self.owner)
            elif what == "metadata":
                recs = st.metadata(run, self.owner)
            elif what == "progress":
                recs = st.progress(run, self.owner)
            else:
                recs = st.samples(run, self.owner)
        return export_rows(what, recs)

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        return answer(self.found(Request.from_dict(request)))

    def found(self, req: Request) -> Found:
        with self.session() as st:
            return st.search(req, self.owner)

    def close(self) -> None:
        pass


_COUNTED = (("line", "lines"), ("metadata", "metadata"), ("command", "commands"))


def _all_lines_read(end: dict[str, Any], read: Counter[tuple[str, str]]) -> bool:
    """Whether a follower has read every line, metadata and command record the run's end
    record counts, per stream."""
    counts = end.get("counts") or {}
    return all(read[s, kind] >= int((counts.get(s) or {}).get(key, 0))
               for s in OUTPUT_STREAMS for kind, key in _COUNTED)

