"""What a job's log shows, decided once: for records read from a spool (Python) and for rows
read from the store (ClickHouse SQL), so ``logcapture logs``, the job page and the Grafana
Output panel show the same entries.

The rules:

- A rendered line and a ``/LOGCOMMAND`` line show as the job printed them.
- A metadata record shows as its JSON text only when the line itself was not logged (after
  its launcher's label in brackets, ``[local rank 1] {...}``, when it had one). In
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

Line numbers: every stored line of a run (a rendered line or a ``/LOGCOMMAND`` line: the
``lines`` table's rows) has one number, 1-based, its place among the run's lines of both
output streams in this order, whichever streams are shown (:class:`LogView` counts them in
Python, :func:`line_numbers_sql` in SQL; a test holds the two equal). Notes and metadata
records have none (they are not lines the job printed: a note is logcapture's words, a
metadata record the fields of a line). The pipeline writes a run's records in this order
(pipeline.py, "Read times and order"), so a running job's new lines only add numbers after
the last.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any, NamedTuple

from .records import (
    MODE_CHANGED,
    NOTE_BLANK,
    NOTE_CUT,
    NOTE_MODE,
    NOTE_REPEAT,
    NOTE_SECTION,
    NOTE_SECTION_END,
    NOTE_SECTION_EXPAND,
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
    kind_suffix,
)
from .sections import duration_text
from .sgr import Span, spans

LINE = "line"
COMMAND = "command"
NOTE = "note"
METADATA = "metadata"
# A section's start and end (sections.py): notes, whose entries say which, so that a page
# folds what lies between; and the job's ask to expand the section it is in.
SECTION = "section"
SECTION_END = "section_end"
SECTION_EXPAND = "section_expand"
_NOTE_KIND = {NOTE_SECTION: SECTION, NOTE_SECTION_END: SECTION_END,
              NOTE_SECTION_EXPAND: SECTION_EXPAND}


NUMBERED = (LINE, COMMAND)  # the entries that have a line number: the lines table's kinds


class Entry(NamedTuple):
    """One entry of a log view: ``kind`` is line, command, note (section, section_end and
    section_expand for a section's notes) or metadata; ``style`` a line's colour spans
    (``logcapture.sgr``), empty when plain; ``line`` its line number (0: none, a note or
    metadata)."""

    ts: float
    stream: str
    seq: int
    kind: str
    text: str
    style: tuple[Span, ...] = ()
    line: int = 0


def metadata_text(fields: Mapping[str, Any], label: str) -> str:
    """A metadata record as the log shows it where its line is not (mode ``metadata``): its
    JSON, after whose it was (``[local rank 1] {...}``) when a launcher's label stood before
    it (records.Metadata ``label``), so that workers sharing a terminal stay apart. In SQL:
    :func:`log_sql`."""
    text = dumps(dict(fields))
    return f"[{label}] {text}" if label else text


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
    if note == NOTE_SECTION:
        return f"[logcapture: section {text}{' (folded)' if count else ''}]"
    if note == NOTE_SECTION_END:
        return f"[logcapture: end of section {text}, {duration_text(count)}]"
    if note == NOTE_SECTION_EXPAND:
        return f"[logcapture: section {text} expanded]"
    return f"[logcapture: {note}: {text}]"


def is_mode_change(e: Entry) -> bool:
    """Whether ``e`` is a mode change's note (``note_text`` of a NOTE_MODE note written by
    classify), which a log of one stream shows from that stream's copy."""
    return e.kind == NOTE and e.text.startswith(note_text(NOTE_MODE, 1, MODE_CHANGED)[:-1])


def streams_of(stderr: bool) -> tuple[str, ...]:
    return (STDOUT, STDERR) if stderr else (STDOUT,)


class LogView:
    """The log entries of one run's records fed in spool order, in pieces (a running job's
    new records): :meth:`feed` returns the entries of the records given, stdout only or
    with stderr (``streams``, when given, names the output streams shown: ``logs --stream
    stderr``). Remembers across calls which line a metadata record may repeat, and numbers
    the lines: ``lines`` is the number of the run's lines before the first record fed (fed
    in the log's order, both streams: lines of a stream not shown are counted too)."""

    def __init__(self, stderr: bool = False, streams: tuple[str, ...] | None = None,
                 lines: int = 0) -> None:
        self.shown = streams_of(stderr) if streams is None else streams
        self._printed: dict[str, int] = {}  # stream -> seq of its last logged Line
        self.lines = lines  # the run's lines fed so far: the last line's number

    def feed(self, records: Iterable[Record]) -> list[Entry]:
        shown, printed = self.shown, self._printed
        out = []
        for rec in records:
            stream = rec.stream
            if isinstance(rec, Line):
                printed[stream] = rec.seq
                self.lines += 1
                if stream in shown:
                    out.append(Entry(rec.ts, stream, rec.seq, LINE, rec.text,
                                     spans(rec.style) if rec.style else (), line=self.lines))
            elif isinstance(rec, Metadata):
                if stream in shown and printed.get(stream) != rec.seq - 1:
                    out.append(Entry(rec.ts, stream, rec.seq, METADATA,
                                     metadata_text(rec.fields, rec.label)))
            elif isinstance(rec, Command):
                self.lines += 1
                if stream in shown:
                    out.append(Entry(rec.ts, stream, rec.seq, COMMAND, rec.text, line=self.lines))
            elif isinstance(rec, Note):
                if stream == RUN or (stream in shown and not (
                        rec.note == NOTE_MODE and stream != STDOUT and STDOUT in shown)):
                    out.append(Entry(rec.ts, stream, rec.seq, _NOTE_KIND.get(rec.note, NOTE),
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
    style when asked for) and its line number (``line``, from :func:`line_numbers_sql`; 0 or
    absent: none)."""
    return Entry(row["ts"], row["stream"], int(row["seq"]), row["kind"], row["text"],
                 spans(row.get("style")), int(row.get("line") or 0))


def entry_from_json(d: dict[str, Any]) -> Entry:
    """An entry from its JSON form (``query.interface.entry_json``: a page of ``Reader.log``,
    from the spool, the store or the read service alike)."""
    return Entry(float(d["ts"]), str(d["stream"]), parse_cursor(str(d["cursor"]))[2],
                 str(d["kind"]), str(d["text"]), spans(d.get("style")), int(d.get("line") or 0))


def numbered_text(shown: Callable[[Entry], str]) -> Callable[[Entry], str]:
    """What ``logs -n`` prints of an entry: what ``shown`` prints of it, after its line number,
    as ``cat -n`` writes it (a note, which has none, after as many spaces)."""
    def text(e: Entry) -> str:
        return line_prefix(e.line) + shown(e)
    return text


def line_prefix(line: int) -> str:
    """What ``logs -n`` prints before an entry of line number ``line`` (0: none)."""
    return f"{line:6}\t" if line else f"{'':6}\t"


def numbered_lines(raw: Iterable[bytes]) -> int:
    """How many of a spool segment's lines (NDJSON records, without their newline) are
    numbered lines: a record's kind is its last key (``records.Record.to_dict``), so a line
    or command record ends with its kind, and no other record does (a metadata record's own
    fields end before its ``"kind":"metadata"``)."""
    return sum(1 for r in raw if r.endswith(NUMBERED_ENDS))


# How a numbered record's JSON ends (its kind last: records.kind_suffix).
NUMBERED_ENDS = tuple(kind_suffix(kind) for kind in NUMBERED)


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
        note = '{NOTE_SECTION}', concat('[logcapture: section ', text,
                                if(count != 0, ' (folded)', ''), ']'),
        note = '{NOTE_SECTION_END}', concat('[logcapture: end of section ', text, ', ',
                                            {_duration_sql()}, ']'),
        note = '{NOTE_SECTION_EXPAND}', concat('[logcapture: section ', text, ' expanded]'),
        concat('[logcapture: ', note, ': ', text, ']'))"""


def _duration_sql() -> str:
    """``sections.duration_text`` of ``count`` (ms) in SQL."""
    two = "leftPad(toString({}), 2, '0')"
    return f"""multiIf(
            count < 1000, concat(toString(count), ' ms'),
            count < 60000, concat(toString(intDiv(count, 1000)), '.',
                                  toString(intDiv(count % 1000, 100)), ' s'),
            count < 3600000, concat(toString(intDiv(count, 60000)), ' min ',
                                    {two.format("intDiv(count, 1000) % 60")}, ' s'),
            concat(toString(intDiv(count, 3600000)), ' h ',
                   {two.format("intDiv(count, 60000) % 60")}, ' min'))"""


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
    metadata = (f"SELECT {key}ts, stream, seq, fields, label FROM {db}metadata {fin} "
                f"WHERE {run_cond} AND {shown} AND {bound} AND {page}")
    return f"""
SELECT {key}{ts} AS ts, stream, seq, kind, text{st} FROM (
    SELECT * FROM ({lines})
    UNION ALL
    SELECT * FROM (
        SELECT {key}ts, stream, seq, multiIf(note = '{NOTE_SECTION}', '{SECTION}',
            note = '{NOTE_SECTION_END}', '{SECTION_END}',
            note = '{NOTE_SECTION_EXPAND}', '{SECTION_EXPAND}', '{NOTE}') AS kind,
            {_note_text_sql()} AS text{no_st}
        FROM {db}notes {fin}
        WHERE {run_cond}
          AND (stream = '{RUN}'
               OR ({shown} AND NOT (note = '{NOTE_MODE}' AND stream != '{STDOUT}')))
          AND {page})
    UNION ALL
    SELECT {key}ts, stream, seq, '{METADATA}' AS kind,
        if(label != '', concat('[', label, '] ', fields), fields) AS text{no_st}
    FROM ({metadata})
    WHERE ({key}stream, seq) NOT IN (
        SELECT {key}stream, seq + 1 FROM {db}lines
        WHERE {run_cond} AND kind = '{LINE}' AND ts IN (SELECT ts FROM ({metadata})))
)
ORDER BY ts {order}, stream {order}, seq {order}
LIMIT {limit}
"""


def line_numbers_sql(db: str, run_cond: str) -> str:
    """ClickHouse SQL for the line numbers of some rows of ``lines`` of the run ``run_cond``
    selects (with its owner, in bound parameters): columns ``stream``, ``seq``, ``line`` for
    the rows whose ``(stream, seq)`` is in the bound parameter ``{keys:Array(Tuple(String,
    UInt64))}``, each its place among the run's rows of ``lines`` (both streams) in the order
    of :func:`log_sql`, 1-based, as :class:`LogView` numbers them. The rows between
    ``{lo:Int64}`` and ``{upto:Int64}`` (ns: the earliest and the latest key's time) are
    numbered in order after a count of the run's rows before ``lo``: a line's number depends
    only on the lines before it, and the count reads the key's columns alone."""
    db = f"{db}." if db else ""
    rows = f"{db}lines FINAL WHERE {run_cond} AND stream IN ('{STDOUT}', '{STDERR}')"
    return f"""
SELECT stream, seq, line + (SELECT count() FROM {rows}
    AND ts < fromUnixTimestamp64Nano({{lo:Int64}}, 'UTC')) AS line
FROM (
    SELECT CAST(stream AS String) AS stream, seq,
        row_number() OVER (ORDER BY ts, stream, seq) AS line
    FROM {rows}
      AND ts >= fromUnixTimestamp64Nano({{lo:Int64}}, 'UTC')
      AND ts <= fromUnixTimestamp64Nano({{upto:Int64}}, 'UTC'))
WHERE has({{keys:Array(Tuple(String, UInt64))}}, (stream, seq))
"""


def stored_metadata_text(text: str) -> str:
    """A metadata row's text from :func:`log_sql` with its JSON as the spool reader writes it
    (records.dumps, after the label: :func:`metadata_text`), so both readers show the same
    text whatever spacing the store kept."""
    label, brace, rest = text.partition("{")
    try:
        return label + dumps(json.loads(brace + rest))
    except ValueError:
        return text


def numbered_evidence(insights: list[dict[str, Any]], numbers: Callable[
        [list[tuple[str, int]]], dict[tuple[str, int], int]]) -> list[dict[str, Any]]:
    """``insights`` (``Insight.to_dict``) with each evidence line's ``line``: its line number
    (logview.py) as ``numbers`` gives it for ``(stream, seq)`` keys; null for none."""
    quoted = [e for i in insights for e in i.get("evidence") or ()]
    found = numbers([(e["stream"], int(e["seq"])) for e in quoted]) if quoted else {}
    for e in quoted:
        e["line"] = found.get((e["stream"], int(e["seq"])))
    return insights


def just_before(key: tuple[int, str, int] | None, run: str, line: int) -> str:
    """A cursor just before the line of ``key``, so a page ``after`` it begins with that
    line (or, for a stream's first record, with what shares its time stamp); NotFound when
    there is no such line."""
    from .errors import NotFound

    if key is None:
        raise NotFound(f"run {run!r} has no line {line}")
    ns, stream, seq = key
    return f"{ns}:{stream}:{seq - 1}" if seq else f"{ns - 1}:{stream}:{seq}"


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
