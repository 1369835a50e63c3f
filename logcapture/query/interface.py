"""The read layer's interface: the questions every reader asks (``Reader``), the keys of a run
summary, and the size of a page of a log.

Answered by ``store_reader.StoreReader`` (the store as one owner), ``local_reader.LocalReader``
(the caller's own spool and store) and ``logcapture.reader.client.ServiceReader`` (the read
service, over its Unix socket). Everything a Reader returns is plain JSON data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from ..jobref import JOB_KEYS
from ..logview import cursor_of

# The keys of a run summary (``Reader.runs``), the same from the spool and from the store.
SUMMARY_KEYS = ("run", "owner", "uid", "job_id", "cluster", "host", "state", "exit_status",
                "signal", "start", "end", "last", "duration", "lines", "redactions", "command",
                "slurm", "source", "insights", *JOB_KEYS)
FOLLOW_POLL = 0.5  # seconds between a follower's reads of the store
LOG_PAGE = 1000  # entries in a page of a log (``Reader.log``) unless asked otherwise
LOG_PAGE_MAX = 5000


class Reader(Protocol):
    """The questions every reader asks. RUN arguments are run ids as ``resolve`` returns them;
    ``resolve`` takes what a user types (a run id, a Slurm job id, ``latest`` or None)."""

    def runs(self) -> list[dict[str, Any]]:
        """Run summaries (``SUMMARY_KEYS``), newest first."""
        ...

    def resolve(self, ref: str | None) -> str:
        """The run id REF names; NotFound when none of the caller's runs matches."""
        ...

    def summary(self, run: str) -> dict[str, Any]:
        """One run's summary (as in ``runs``), without listing every run."""
        ...

    def lines(self, run: str, stream: str | None = None, tail: int | None = None
              ) -> list[dict[str, Any]]:
        """The run's output records (line, command, note, metadata) in order, run-level notes
        included when ``stream`` is None; ``tail`` keeps the last N."""
        ...

    def follow(self, run: str) -> Iterator[dict[str, Any]]:
        """Every record of the run, then new ones as they come, until its end record (the last
        one yielded)."""
        ...

    def log(self, run: str, stderr: bool = False, before: str | None = None,
            after: str | None = None, limit: int = LOG_PAGE, line: int | None = None
            ) -> dict[str, Any]:
        """One page of the run's log as ``logview`` shows it (the job page's question):
        ``entries``, each ``{cursor, stream, kind, text, ts, line}`` in order, the newest
        ``limit`` before the cursor ``before`` (default: the newest) or the oldest after
        ``after``, or from the line numbered ``line`` on (``#L123``; NotFound when there is
        none); ``more``: entries lie beyond the page; ``ended``: the run's end record is in."""
        ...

    def describe(self, run: str) -> dict[str, Any]:
        """What ``logcapture show`` prints (``describe``)."""
        ...

    def metadata(self, run: str) -> list[dict[str, Any]]:
        """Metadata records, newest first."""
        ...

    def samples(self, run: str) -> list[dict[str, Any]]:
        """Resource sample records, oldest first."""
        ...

    def export_rows(self, run: str, what: str) -> list[dict[str, Any]]:
        """The rows of ``lines``, ``metadata`` or ``samples`` that ``export`` writes."""
        ...

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        """The lines of the caller's runs that match a search (``search.Request.to_dict``),
        as ``search.answer`` gives them: newest first, grouped by run, with context."""
        ...

    def close(self) -> None:
        ...



def page_limit(limit: int) -> int:
    """A page's number of entries, within 1 and ``LOG_PAGE_MAX``."""
    return max(1, min(int(limit), LOG_PAGE_MAX))


def entry_json(ts: float, stream: str, seq: int, kind: str, text: str,
               style: tuple[Any, ...] = (), line: int = 0) -> dict[str, Any]:
    """An entry as the page and the read service carry it (``Reader.log``): named fields, so
    a field added later (a rank) breaks no reader. ``style``: a line's colour spans
    ``[start, end, "sgr"]`` (code points, ``logcapture.sgr``), only when it has any;
    ``line``: its line number, null for none."""
    d = {"cursor": cursor_of(ts, stream, seq), "stream": stream, "kind": kind, "text": text,
         "ts": ts, "line": line or None}
    if style:
        d["style"] = [list(s) for s in style]
    return d
