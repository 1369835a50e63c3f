"""What a job's log shows, decided once: for records read from a spool (Python) and for rows
read from the store (ClickHouse SQL), so ``logcapture logs``, the job page and the Grafana
Output panel show the same entries.

The rules:

- A rendered line and a ``/LOGCOMMAND`` line show as the job printed them.
- A metadata record shows as its JSON text only when the line itself was not logged. In
  mode ``enabled`` the classifier keeps a metadata line twice: the printed ``Line`` (seq N)
  and the flattened ``Metadata`` record right after it (seq N+1, same stream); showing both
  would print every metadata line twice. In mode ``metadata`` only the record is kept, and
  it is the only trace of that line, so it shows.
- A note shows as logcapture's own words in brackets (:func:`note_text`), so it stands
  apart from the job's output. A mode change is noted in both output streams (it applies to
  both); the log shows the stdout copy (the stderr copy when stderr alone is shown), so it
  is seen once whichever streams are shown.
- Run-level notes (stream ``run``) show whatever streams are chosen.
- A line keeps its style (``logcapture.sgr`` spans, read back through ``sgr.spans``) beside
  its text; everything else is plain. The Grafana Output panel shows the text alone.

Entries are ordered by ``(ts, stream, seq)``, the store's sort key, so a spool reader and a
store reader page through the same order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, NamedTuple

from .records import (
    NOTE_BLANK,
    NOTE_CUT,
    NOTE_MODE,
    NOTE_REPEAT,
    NOTE_WARNING,
    RUN,
    STDERR,
    STDOUT,
    Command,
    Line,
    Metadata,
    Note,
    Record,
    dumps,
)
from .sgr import Span, spans

LINE = "line"
COMMAND = "command"
NOTE = "note"
METADATA = "metadata"


class Entry(NamedTuple):
    """One entry of a log view: ``kind`` is line, command, note or metadata; ``style`` a
    line's colour spans (``logcapture.sgr``), empty when plain."""

    ts: float
    stream: str
    seq: int
    kind: str
    text: str
    style: tuple[Span, ...] = ()


def note_text(note: str, count: int, text: str) -> str:
    """A note in logcapture's words, bracketed so it never reads as the job's output."""
    s = "" if count == 1 else "s"
    if note == NOTE_REPEAT:
        return f"[logcapture: previous line repeated {count} more time{s}, dropped]"
    if note == NOTE_BLANK:
        return f"[logcapture: {count} more blank line{s} dropped]"
    if note == NOTE_CUT:
        return f"[logcapture: line cut, {count} characters dropped]"
    if note == NOTE_MODE:
        return f"[logcapture: {text}]"
    if note == NOTE_WARNING:
        return f"[logcapture: warning: {text}]"
    return f"[logcapture: {note}: {text}]"


def streams_of(stderr: bool) -> tuple[str, ...]:
    return (STDOUT, STDERR) if stderr else (STDOUT,)


class LogView:
    """The log entries of one run's records fed in spool order, in pieces (a running job's
    new records): :meth:`feed` returns the entries of the records given, stdout only or
    with stderr (``streams``, when given, names the output streams shown: ``logs --stream
    stderr``). Remembers across calls which line a metadata record may repeat."""

    def __init__(self, stderr: bool = False, streams: tuple[str, ...] | None = None) -> None:
        self.shown = streams_of(stderr) if streams is None else streams
        self._printed: dict[str, int] = {}  # stream -> seq of its last logged Line

    def feed(self, records: Iterable[Record]) -> list[Entry]:
        shown, printed = self.shown, self._printed
        out = []
        for rec in records:
            stream = rec.stream
            if isinstance(rec, Line):
                printed[stream] = rec.seq
                if stream in shown:
                    out.append(Entry(rec.ts, stream, rec.seq, LINE, rec.text,
                                     spans(rec.style) if rec.style else ()))
            elif isinstance(rec, Metadata):
                if stream in shown and printed.get(stream) != rec.seq - 1:
                    out.append(Entry(rec.ts, stream, rec.seq, METADATA,
                                     dumps(dict(rec.fields))))
            elif isinstance(rec, Command):
                if stream in shown:
                    out.append(Entry(rec.ts, stream, rec.seq, COMMAND, rec.text))
            elif isinstance(rec, Note):
                if stream == RUN or (stream in shown and not (
                        rec.note == NOTE_MODE and stream != STDOUT and STDOUT in shown)):
                    out.append(Entry(rec.ts, stream, rec.seq, NOTE,
                                     note_text(rec.note, rec.count, rec.text)))
        return out


def entries(records: Iterable[Record], stderr: bool = False) -> list[Entry]:
    """The log entries of ``records`` (one run, spool order), stdout only or with stderr,
    in spool order; :func:`sort_key` orders them as the store does."""
    return LogView(stderr).feed(records)


def sort_key(e: Entry) -> tuple[float, str, int]:
    return (e.ts, e.stream, e.seq)


def entry_from_row(row: dict[str, Any]) -> Entry:
    """An entry from a row of :func:`log_sql` (columns ts, stream, seq, kind, text, and
    style when asked for)."""
    return Entry(row["ts"], row["stream"], int(row["seq"]), row["kind"], row["text"],
                 spans(row.get("style")))


# --- The same rules in ClickHouse SQL ------------------------------------------------------

def _note_text_sql() -> str:
    s = "if(count = 1, '', 's')"
    return f"""multiIf(
        note = '{NOTE_REPEAT}', concat('[logcapture: previous line repeated ', toString(count),
                                ' more time', {s}, ', dropped]'),
        note = '{NOTE_BLANK}', concat('[logcapture: ', toString(count), ' more blank line', {s},
                               ' dropped]'),
        note = '{NOTE_CUT}', concat('[logcapture: line cut, ', toString(count),
                             ' characters dropped]'),
        note = '{NOTE_MODE}', concat('[logcapture: ', text, ']'),
        note = '{NOTE_WARNING}', concat('[logcapture: warning: ', text, ']'),
        concat('[logcapture: ', note, ': ', text, ']'))"""


def log_sql(db: str, run_cond: str, stderr: str, where: str = "1", order: str = "DESC",
            limit: str = "10000", ts: str = "ts", final: bool = True, runs: bool = False,
            style: bool = False) -> str:
    """ClickHouse SQL for a run's log entries: columns ``ts`` (DateTime64), ``stream``,
    ``seq``, ``kind``, ``text``, ordered by ``(ts, stream, seq)`` in ``order``, at most
    ``limit``. The printed twin of a metadata record shares its time stamp (one classifier
    call makes both), so only lines at those times are looked up (without FINAL: a row
    shipped twice changes no membership). ``run_cond`` selects the run's rows
    (``run = {run:String}``, with its owner; or a Grafana variable) and ``stderr`` is an SQL
    expression, 1 to show stderr, both with bound parameters or Grafana variables, never
    values. ``where`` is more conditions on the result's columns (a page's cursor). ``db``
    is a database identifier chosen by the administrator (empty: the connection's); ``ts``
    is the expression returned as ``ts``. Without ``final`` the tables are read without
    FINAL: a record shipped twice and not yet merged comes twice, for the caller to drop
    (FINAL merges the parts of the range first: right after a large upload, several times
    the time). With ``runs`` (``run_cond`` selects several runs: a job's tasks) each entry
    also carries its ``run``, and a metadata record's twin is looked up in its own run. With
    ``style``, a last column ``style``: a line's spans as JSON text ('' for every other entry;
    the Grafana panels show plain text and do not ask)."""
    db = f"{db}." if db else ""
    key = "run, " if runs else ""
    st, no_st = (", style", ", '' AS style") if style else ("", "")
    fin = "FINAL" if final else ""
    shown = f"(stream = '{STDOUT}' OR ({stderr} = 1 AND stream = '{STDERR}'))"
    # Each branch is ordered and limited by the tables' sort key (run, ts, stream, seq), so
    # a page reads its rows in key order and stops: a page of a 2M-line log costs one page.
    page = f"{where} ORDER BY ts {order}, stream {order}, seq {order} LIMIT {limit}"
    lines = (f"SELECT {key}ts, stream, seq, kind, text{st} FROM {db}lines {fin} "
             f"WHERE {run_cond} AND {shown} AND {page}")
    # A page full of lines ends at its last line's time: older (newer) metadata cannot be
    # on it, and a metadata record's printed twin is looked up only among the page's times.
    if order == "DESC":
        bound = (f"ts >= (SELECT if(count() >= {limit}, min(ts), toDateTime64(0, 9)) "
                 f"FROM ({lines}))")
    else:
        bound = (f"ts <= (SELECT if(count() >= {limit}, max(ts), "
                 f"toDateTime64('2262-01-01 00:00:00', 9, 'UTC')) FROM ({lines}))")
    metadata = (f"SELECT {key}ts, stream, seq, fields FROM {db}metadata {fin} "
                f"WHERE {run_cond} AND {shown} AND {bound} AND {page}")
    return f"""
SELECT {key}{ts} AS ts, stream, seq, kind, text{st} FROM (
    SELECT * FROM ({lines})
    UNION ALL
    SELECT * FROM (
        SELECT {key}ts, stream, seq, '{NOTE}' AS kind, {_note_text_sql()} AS text{no_st}
        FROM {db}notes {fin}
        WHERE {run_cond}
          AND (stream = '{RUN}'
               OR ({shown} AND NOT (note = '{NOTE_MODE}' AND stream != '{STDOUT}')))
          AND {page})
    UNION ALL
    SELECT {key}ts, stream, seq, '{METADATA}' AS kind, fields AS text{no_st} FROM ({metadata})
    WHERE ({key}stream, seq) NOT IN (
        SELECT {key}stream, seq + 1 FROM {db}lines
        WHERE {run_cond} AND kind = '{LINE}' AND ts IN (SELECT ts FROM ({metadata})))
)
ORDER BY ts {order}, stream {order}, seq {order}
LIMIT {limit}
"""


def metadata_text(fields_json: str) -> str:
    """A metadata row's JSON as the spool reader writes it (records.dumps), so both readers
    show the same text whatever spacing the store kept."""
    try:
        return dumps(json.loads(fields_json))
    except ValueError:
        return fields_json


# --- Cursors: where a page of entries starts or ends -------------------------------------

def ts_ns(ts: float) -> int:
    """A time stamp in ns as the store holds it: the spool writes a float as its shortest
    decimal text (``repr``), which the store's DateTime64(9) parses exactly; ``ts * 1e9``
    would be off by up to ~128 ns at today's epoch (a float's precision), and a cursor made
    so would fall on the wrong side of its own entry."""
    return int(Decimal(repr(float(ts))).scaleb(9))


def cursor_of(ts: float, stream: str, seq: int) -> str:
    """An entry's place in the order, as text: ``"<ts in ns>:<stream>:<seq>"``."""
    return f"{ts_ns(ts)}:{stream}:{seq}"


def parse_cursor(cursor: str) -> tuple[int, str, int]:
    """``(ts in ns, stream, seq)`` of a cursor; UsageError for anything else."""
    from .errors import UsageError

    try:
        ns, stream, seq = cursor.split(":")
        return int(ns), stream, int(seq)
    except ValueError:
        raise UsageError(f"bad cursor {cursor[:80]!r}") from None
