"""The classify stage: ``/LOGCOMMAND`` lines, modes and JSON-line metadata.

It consumes what the filter produced for both output streams (``Rendered`` lines and
``Dropped`` notes), and produces numbered records: ``Line``, ``Note``, ``Command`` and
``Metadata``. The rules (docs/user.md tells them to users):

- A **command** is a whole line: ``/LOGCOMMAND``, one space, a JSON object whose keys are
  ``mode`` and ``mask`` (a value the redact stage masks from that line on: it has replaced the
  value by ``***`` in the line before this stage reads it). It is accepted on stdout and
  stderr and applies to both streams from that line on.
  A line that starts with ``/LOGCOMMAND`` but is not such a command (bad JSON, not an object,
  an unknown key, a bad mode, two spaces, leading spaces) changes nothing and becomes a warning
  note. Valid commands are kept in every mode (``disabled`` keeps only them).
- **Metadata** is a stdout line that is exactly one JSON object: ``{`` first, ``}`` last, no
  other text, no surrounding spaces. Nested objects are flattened to dotted keys
  (``{"a": {"b": 1}}`` -> ``a.b``). What Python's ``json.dumps`` writes is accepted, including
  its ``NaN``, ``Infinity`` and ``-Infinity``. A printed Python dict (single quotes, ``True``,
  ``None``) is not JSON, so it is an ordinary line. Behind the labels a launcher puts before
  each line of several processes sharing one terminal (``ranklabel``: torchrun ``--tee``'s
  ``[default0]:``, ``srun --label``'s ``0: ``, Open MPI's ``[1,0]<stdout>:``), the object is
  metadata too, its record ``label`` naming whose it is (``rank 1``, ``local rank 1``): each
  process's rows are a series of their own, as a task run's are (``xaxis``).
- **Modes**: ``enabled`` keeps lines and metadata (a metadata line is kept as a ``Line`` too),
  ``metadata`` keeps only ``Metadata`` records, ``disabled`` only the commands.

The privacy rule: text a mode drops is never written anywhere, so nothing derived
from it is returned either: no cut notes, no repeat or blank notes, and a warning about a
malformed command says only where it was and what was wrong (stream and place in the log, JSON error
and column, the offending key or value only when it is plainly a typo of a valid word). It
never quotes the line, which may hold the secret the user meant to hide.

``seq`` counts from 0 per ``(run, stream)`` and is shared by every record of that stream.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from operator import itemgetter

from . import ranklabel
from .errors import typo_of
from .records import (
    DISABLED,
    ENABLED,
    METADATA,
    MODE_CHANGED,
    MODES,
    NOTE_BLANK,
    NOTE_CUT,
    NOTE_MODE,
    NOTE_REPEAT,
    NOTE_SECTION,
    NOTE_SECTION_END,
    NOTE_SECTION_EXPAND,
    NOTE_WARNING,
    OUTPUT_STREAMS,
    STDOUT,
    Command,
    Dropped,
    Line,
    Lines,
    Metadata,
    Note,
    Record,
    Rendered,
    new_metadata,
)
from .redact import COMMAND_PREFIX, MIN_MASK, mask_accepted
from .sections import EXPAND, Marker, Sections, marker, may_hold_marker

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any

    Style = tuple[tuple[int, int, str], ...]

_STYLE = itemgetter(2)  # Rendered.style

COMMAND_OPTIONS = ("mode", "mask")

# The two streams are two ptys: which of two lines on different streams came first is known
# only to within a round of the reader (its 10 ms linger). The pipeline hands both streams'
# lines over in the order of their read times, a command first among the lines of its round,
# so a command that makes the mode stricter applies to the other stream's lines read in its
# round and after. When a command relaxes the mode (disabled -> metadata -> enabled), lines of
# the other stream read up to HOLD seconds after it may have been printed before it, so they
# are taken in the old, stricter mode: text a mode drops must never be kept because of how the
# reads fell.
HOLD = 0.05
_STRICTNESS = {DISABLED: 0, METADATA: 1, ENABLED: 2}  # lower keeps less

COUNT_KEYS = ("lines", "metadata", "commands", "warnings", "dropped_by_mode",
              "repeats_dropped", "blanks_dropped")


def flatten(obj: dict[str, Any]) -> dict[str, Any]:
    """Nested objects to dotted keys: ``{"a": {"b": 1}, "c": [1]}`` -> ``{"a.b": 1, "c": [1]}``.
    Lists stay lists; an empty nested object stays as ``{}`` under its key. Iterative, so any
    depth the JSON parser accepted is fine. On a clash (``{"a.b": 1, "a": {"b": 2}}``) the value
    written later in the line wins."""
    if set(map(type, obj)) <= {str} \
            and not any(issubclass(t, dict) for t in set(map(type, obj.values()))):
        return dict(obj)  # already flat: the loop below would copy it as it is
    out: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = [("", obj)]
    # Depth-first, keeping the order of keys as written.
    while stack:
        prefix, value = stack.pop()
        if isinstance(value, dict) and (value or not prefix):
            for key, item in reversed(list(value.items())):
                stack.append((f"{prefix}.{key}" if prefix else str(key), item))
        else:
            out.pop(prefix, None)  # a later duplicate goes to the end, like json.loads
            out[prefix] = value
    return out


# The C scanner json.loads uses, called directly: the same parser and the same errors without
# loads' Python layers (a metadata line's hot path; tests/test_classify.py holds the two equal).
# A JSON object's keys are always strings, so flat means: no value is an object.
_scan_once = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__


# ClickHouse reads a JSON integer in 64 bits (Int64 or UInt64,
# https://clickhouse.com/docs/sql-reference/functions/json-functions); with a larger one in
# it, an object is unreadable to the JSON functions of some engines (ClickHouse 26.5: no key
# of it at all), so a graph would lose every field of that record. Such an integer is kept as
# its decimal text, as non-finite floats are kept as strings (records.dumps): it is no number
# a graph could plot either way. Only text with a run of 19 digits can hold one.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_LONG_DIGITS = re.compile(r"\d{19}")


def big_ints_as_text(value: Any) -> Any:
    """``value`` with every integer beyond 64 bits in it as its decimal text."""
    if type(value) is int and not _INT_MIN <= value <= _INT_MAX:
        return str(value)
    if isinstance(value, dict):
        return {k: big_ints_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [big_ints_as_text(v) for v in value]
    return value


def parse_metadata(text: str) -> dict[str, Any] | None:
    """The flattened fields if ``text`` is exactly one JSON object, else None. An integer
    beyond 64 bits becomes its decimal text (``_LONG_DIGITS``)."""
    if len(text) < 2 or text[0] != "{" or text[-1] != "}":
        return None
    try:
        obj, end = _scan_once(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    if end != len(text) or type(obj) is not dict:  # pragma: no branch - "{...}" is a dict
        return None
    if _LONG_DIGITS.search(text):
        try:
            obj = big_ints_as_text(obj)
        except RecursionError:  # nested nearly as deep as the parser allows: kept as a line
            return None
    if dict in set(map(type, obj.values())):
        return flatten(obj)
    return obj


def _candidate(text: str) -> bool:
    """Whether a stdout line may be a metadata line (``metadata_of``): the cheap test."""
    return text[:1] == "{" or text[-1:] == "}" and text[:1] in ranklabel.STARTS


def metadata_of(text: str) -> tuple[dict[str, Any], str] | None:
    """``parse_metadata`` of a stdout line, or of the object behind its launcher labels, with
    whose it is (``ranklabel.Labelled.describe``; "" for an unlabelled line: the module
    docstring); None when it is no metadata line."""
    if text[:1] == "{":
        fields = parse_metadata(text)
        return None if fields is None else (fields, "")
    if not _candidate(text):
        return None
    labelled = ranklabel.split(text)
    if labelled.key is None:
        return None
    fields = parse_metadata(labelled.text)
    return None if fields is None else (fields, labelled.describe())


def _is_command_attempt(text: str) -> bool:
    """Does this line try to be a command? ``/LOGCOMMAND`` at the start (after any spaces),
    then the end of the line, a space or a brace: ``/LOGCOMMANDS`` is ordinary text."""
    stripped = text.lstrip()
    if not stripped.startswith(COMMAND_PREFIX):
        return False
    rest = stripped[len(COMMAND_PREFIX):]
    return not rest or not (rest[0].isalnum() or rest[0] in "_-/.")


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


class _Malformed(Exception):
    """Why a command line is not a valid command, in words that never quote the line."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            if key in COMMAND_OPTIONS:
                raise _Malformed(f"the key {key!r} is given twice")
            raise _Malformed("a key is given twice")
        seen[key] = value
    return seen


def parse_command(text: str) -> dict[str, Any]:
    """The options of a valid command line; raises ``_Malformed`` saying what is wrong."""
    if text != text.lstrip():
        raise _Malformed("/LOGCOMMAND must start the line (there are spaces before it)")
    rest = text[len(COMMAND_PREFIX):]
    if not rest or not rest.strip():
        raise _Malformed("/LOGCOMMAND must be followed by one space and a JSON object")
    if rest[0] != " ":
        raise _Malformed("/LOGCOMMAND must be followed by exactly one space, then a JSON object")
    body = rest[1:]
    if body[:1].isspace():
        raise _Malformed("/LOGCOMMAND must be followed by exactly one space, not several")
    column0 = len(COMMAND_PREFIX) + 1  # 0-based column of the JSON in the line
    try:
        options = json.loads(body, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        # e.msg is one of json's fixed phrases ("Expecting ',' delimiter"): safe to repeat.
        raise _Malformed(f"invalid JSON at column {column0 + e.pos + 1}: {e.msg}") from None
    except (ValueError, RecursionError):
        raise _Malformed("invalid JSON (a number too long or nesting too deep)") from None
    if not isinstance(options, dict):
        raise _Malformed(f"the JSON must be an object like {{\"mode\": \"disabled\"}}, "
                         f"not {_json_kind(options)}")
    unknown = [key for key in options if key not in COMMAND_OPTIONS]
    if unknown:
        typos = [(key, typo_of(key, COMMAND_OPTIONS)) for key in unknown]
        shown = [f"{key!r} (did you mean {typo!r}?)" for key, typo in typos if typo]
        hidden = len(unknown) - len(shown)
        parts = []
        if shown:
            parts.append("unknown key " + ", ".join(shown))
        if hidden:
            parts.append(f"{hidden} unknown key(s) (not repeated here in case they are secret)")
        raise _Malformed("; ".join(parts) + "; the options are "
                         + ", ".join(map(repr, COMMAND_OPTIONS)))
    _check_values(options)
    return options


def _check_values(options: dict[str, Any]) -> None:
    """Raises ``_Malformed`` when a known option's value is not one it takes."""
    if "mode" in options:
        mode = options["mode"]
        listed = ", ".join(MODES)
        if not isinstance(mode, str):
            raise _Malformed(f"'mode' must be one of {listed}, not {_json_kind(mode)}")
        if mode not in MODES:
            typo = typo_of(mode, MODES)
            if typo:
                raise _Malformed(f"'mode' must be one of {listed}, not {mode!r} "
                                 f"(did you mean {typo!r}?)")
            raise _Malformed(f"'mode' must be one of {listed}; the value given is not one of "
                             "them (not repeated here in case it is secret)")
    if "mask" in options and not (isinstance(options["mask"], str)
                                  and mask_accepted(options["mask"])):
        # The redact stage has replaced an accepted value by *** before this sees the line.
        raise _Malformed(f"'mask' must be a string of at least {MIN_MASK} characters")


def strictness(texts: list[str]) -> int:
    """How strict the mode set by the first valid mode command among ``texts`` is: 0 for
    disabled, 1 metadata, 2 enabled, 3 when none sets a mode. The pipeline orders the two
    streams' lines of one round of the reader by it (``Pipeline._release``): the other
    stream's lines of the round then follow the stricter of the two commands. A mask
    protects what follows it as disabling does, so a mask command counts as 0."""
    for text in texts:
        if text.startswith(COMMAND_PREFIX):
            try:
                options = parse_command(text)
            except _Malformed:
                continue
            if "mask" in options:
                return _STRICTNESS[DISABLED]
            if "mode" in options:
                return _STRICTNESS[options["mode"]]
    return 3


class Classifier:
    """Commands, modes and metadata for the two output streams of one run.

    ``feed(stream, item, ts)`` takes one filter output of one stream and returns the records to
    keep; ``note(...)`` numbers a warning from another stage into a stream. ``mode`` is the
    current mode (shared by both streams); ``counts`` counts, per stream, what was kept and
    dropped. Safe to call from several threads.
    """

    def __init__(self, run: str, mode: str = ENABLED, noted: tuple[str, ...] = OUTPUT_STREAMS):
        """``noted``: the streams the run's output has, where mode changes are noted (stdout
        alone when both streams share one terminal: there is no stderr to note it in)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.run = run
        self.mode = mode
        self._initial = mode
        self._noted = noted
        self.counts: dict[str, dict[str, int]] = {
            stream: dict.fromkeys(COUNT_KEYS, 0) for stream in OUTPUT_STREAMS
        }
        self._seq = dict.fromkeys(OUTPUT_STREAMS, 0)
        # Was the stream's last line kept? A repeat or blank note describes the line before it,
        # so it is emitted only when that line was kept, whatever the mode is now.
        self._last_kept = dict.fromkeys(OUTPUT_STREAMS, True)
        # stream -> (mode, ts): its lines read up to ts are taken in at least that strict a
        # mode (HOLD); _commands counts mode commands applied, so a held batch can tell
        # whether a command inside it set the mode.
        self._hold: dict[str, tuple[str, float]] = {}
        self._commands = 0
        self._outer: str | None = None  # the mode a held batch stands in for
        # Sections (sections.py): the open ones, and each stream's last kept line when it was
        # a marker (a repeat of it, which the filter drops, is that marker again).
        self.sections = Sections()
        self._last_marker: dict[str, Marker | None] = dict.fromkeys(OUTPUT_STREAMS)
        self._changes: list[tuple[float, str]] = []  # (ts, mode) of each mode change
        self._lock = threading.RLock()

    # ------------------------------------------------------------------------------ numbering

    def _next(self, stream: str) -> int:
        seq = self._seq[stream]
        self._seq[stream] = seq + 1
        return seq

    def _note(self, stream: str, note: str, text: str, ts: float, count: int = 0) -> Note:
        if note == NOTE_WARNING:
            self.counts[stream]["warnings"] += 1
        return Note(run=self.run, stream=stream, seq=self._next(stream), ts=ts, note=note,
                    count=count, text=text)

    @staticmethod
    def _check_stream(stream: str) -> None:
        if stream not in OUTPUT_STREAMS:
            raise ValueError(f"stream must be one of {', '.join(OUTPUT_STREAMS)}, "
                             f"not {stream!r}")

    # ---------------------------------------------------------------------------- entry points

    def note(self, stream: str, note: str, text: str, ts: float, count: int = 0) -> Note:
        """A note from another stage (a renderer fault, a spool problem), numbered in
        ``stream``'s sequence. ``text`` must be logcapture's own words."""
        self._check_stream(stream)
        with self._lock:
            return self._note(stream, note, text, ts, count)

    def feed(self, stream: str, item: Rendered | Dropped, ts: float) -> list[Record]:
        """The records to keep for one item of ``stream``'s filter output."""
        self._check_stream(stream)
        with self._lock:
            held = self._held(stream, ts) if self._hold else None
            if held is not None:
                return self._under(held, lambda: self._one(stream, item, ts))
            return self._one(stream, item, ts)

    def keeps_progress(self, ts: float) -> bool:
        """May a progress point read at ``ts`` be kept? Only where the mode keeps the text
        it was read from: ``enabled`` all through ``HOLD`` seconds before ``ts`` up to ``ts``
        (a bar redrawn across a command in one read may belong to either side of it). The
        caller asks once every line read up to ``ts`` has been classified."""
        with self._lock:
            before = self._initial
            for at, mode in self._changes:
                if at > ts:
                    break
                if at > ts - HOLD and before != ENABLED:
                    return False
                before = mode
            return before == ENABLED

    def _held(self, stream: str, ts: float) -> str | None:
        """The stricter mode a hold puts on ``stream``'s lines read at ``ts``, or None."""
        hold = self._hold.get(stream)
        if hold is None:
            return None
        mode, until = hold
        if ts > until:
            del self._hold[stream]
            return None
        return mode if _STRICTNESS[mode] < _STRICTNESS[self.mode] else None

    def _under(self, mode: str, work: Callable[[], list[Record]]) -> list[Record]:
        """``work()`` in ``mode``; the mode is put back unless a command in it set one."""
        saved, commands = self.mode, self._commands
        self.mode, self._outer = mode, saved
        try:
            return work()
        finally:
            self._outer = None
            if self._commands == commands:
                self.mode = saved

    def feed_many(self, stream: str, items: list[Rendered | Dropped],
                  ts: float) -> list[Record]:
        """The records to keep for ``items`` of ``stream``'s filter output, in order: the same
        records as ``feed`` on each item (tests/test_pipeline.py holds them equal), except
        that runs of plain lines come as one ``Lines`` record each. A plain line is an uncut
        ``Rendered`` in mode ``enabled`` that is neither a command attempt nor (on stdout) a
        metadata candidate: it becomes a ``Line`` and nothing else, so it needs no per-line
        work beyond the check."""
        self._check_stream(stream)
        with self._lock:
            def each() -> list[Record]:  # item by item, as feed() would
                return [rec for item in items for rec in self._one(stream, item, ts)]

            held = self._held(stream, ts) if self._hold else None
            if held is not None:
                return self._under(held, each)
            if self.mode != ENABLED:
                return each()
            fast = self._all_plain(stream, items, ts)
            return fast if fast is not None else self._run_by_run(stream, items, ts)

    def feed_plain(self, stream: str, items: list[Rendered | Dropped],
                   spans: list[tuple[float, int]]) -> list[Record] | None:
        """The records of ``items`` read at several times (``spans``: ``(ts, count)`` runs of
        them, in order) when they are all plain lines in mode ``enabled`` with no hold on
        ``stream``: one ``Lines`` record, each line keeping its read time, exactly what
        ``feed_many`` would give for each run at its time, joined. None otherwise (nothing
        is changed): then the caller feeds each run to ``feed_many``."""
        self._check_stream(stream)
        with self._lock:
            if self.mode != ENABLED or stream in self._hold:
                return None
            found = self._uncut_texts(stream, items)
            if found is None or found[2]:
                return None
            texts = found[0]
            if not texts:
                return []
            record = self._lines(stream, texts, spans[0][0])
            if isinstance(record, Lines) and len(spans) > 1:
                record = record._replace(spans=tuple(spans))
            return [record]

    @staticmethod
    def _uncut_texts(stream: str, items: list[Rendered | Dropped]
                     ) -> tuple[list[str], str, bool] | None:
        """The texts of ``items`` and their join by newlines when all are uncut lines without
        a command prefix, found with C-level operations on the joined texts (a command prefix
        or a "{" opening a line cannot hide from these checks), and whether one opens a
        metadata candidate (``{`` on stdout); None otherwise, and for a stdout batch with a
        labelled object (``[default0]:{``), which goes line by line."""
        try:
            uncut = not any([item.cut for item in items])  # type: ignore[union-attr]
        except AttributeError:  # a Dropped among them
            return None
        if not uncut or any(map(_STYLE, items)):  # coloured lines go line by line
            return None
        texts = [item.text for item in items]  # type: ignore[union-attr]
        joined = "\n".join(texts)
        if COMMAND_PREFIX in joined or may_hold_marker(joined):
            return None
        if stream == STDOUT and ("}\n" in joined or joined[-1:] == "}") \
                and ranklabel.has_labelled_object(joined):
            return None  # a labelled object: line by line (``metadata_of``)
        return texts, joined, stream == STDOUT and (joined[:1] == "{" or "\n{" in joined)

    def _all_plain(self, stream: str, items: list[Rendered | Dropped],
                   ts: float) -> list[Record] | None:
        """The usual batch in mode enabled: all lines, all plain (or plain and metadata)
        (``_uncut_texts``); None sends the batch through ``_run_by_run`` (a false alarm costs
        only that)."""
        found = self._uncut_texts(stream, items)
        if found is None:
            return None
        texts, joined, metadata = found
        if not metadata:
            return [self._lines(stream, texts, ts)] if texts else []
        if joined.count("\n") == len(texts) - 1:  # (a line holds no newline)
            return self._with_metadata(stream, texts, joined, ts)
        return None

    def _run_by_run(self, stream: str, items: list[Rendered | Dropped],
                    ts: float) -> list[Record]:
        """A batch in mode enabled, runs of plain lines as one ``Lines`` record each and every
        other item as ``feed`` takes it; once a command changes the mode, the rest one by one."""
        json_stream = stream == STDOUT
        out: list[Record] = []
        run: list[str] = []  # texts of the current run of plain lines
        styles: list[Style] = []  # their styles, as long as one has any
        for i, item in enumerate(items):
            if type(item) is Rendered and not item.cut:
                text = item.text
                if COMMAND_PREFIX not in text:
                    found = marker(text)
                    if found is not None:
                        if run:
                            out.append(self._lines(stream, run, ts, styles))
                            run, styles = [], []
                        out += self._section(stream, found, ts)
                        continue
                    if item.style or styles:  # the run's styles, from its first styled line
                        styles += [()] * (len(run) - len(styles))
                        styles.append(item.style)
                    run.append(text)
                    if not (json_stream and _candidate(text)):
                        continue
                    # A metadata candidate: kept as a line in any case (mode enabled),
                    # followed by its Metadata record when it is one JSON object (the plain
                    # text: a style is beside it).
                    found_metadata = metadata_of(text)
                    if found_metadata is None:
                        continue
                    out += self._lines_then_metadata(stream, run, *found_metadata, ts, styles)
                    run, styles = [], []
                    continue
            if run:
                out.append(self._lines(stream, run, ts, styles))
                run, styles = [], []
            out += self._one(stream, item, ts)
            if self.mode != ENABLED:  # a command changed it: the rest one by one
                for rest in items[i + 1:]:
                    out += self._one(stream, rest, ts)
                return out
        if run:
            out.append(self._lines(stream, run, ts, styles))
        return out

    def _with_metadata(self, stream: str, texts: list[str], joined: str, ts: float
                       ) -> list[Record]:
        """``feed_many``'s loop for a batch of plain stdout lines (mode enabled, uncut, no
        command) some of which open with ``{``: only those candidates are looked at, found
        with ``str.find`` in ``joined`` (the texts joined by newlines; a text holds no
        newline). Each is kept as a line, followed by its Metadata record when it is one JSON
        object (the same records as the loop: tests/test_pipeline.py)."""
        out: list[Record] = []
        s = "\n" + joined  # the k-th newline of s opens text k
        find, count = s.find, s.count
        k = 0  # the text opened by the newline at ``at``
        at = 0
        start = 0  # the first text of the current run of lines
        pos = find("\n{")
        while pos >= 0:
            k += count("\n", at, pos)
            at = pos
            fields = parse_metadata(texts[k])
            if fields is not None:
                out += self._lines_then_metadata(stream, texts[start:k + 1], fields, "", ts)
                start = k + 1
            pos = find("\n{", pos + 1)
        if start < len(texts):
            out.append(self._lines(stream, texts[start:], ts))
        return out

    def _lines_then_metadata(self, stream: str, texts: list[str], fields: dict[str, Any],
                             label: str, ts: float, styles: list[Style] | None = None
                             ) -> list[Record]:
        """A run of plain lines whose last is a metadata line, then its Metadata record."""
        lines = self._lines(stream, texts, ts, styles)
        self.counts[stream]["metadata"] += 1
        return [lines, new_metadata(self.run, stream, self._next(stream), ts, fields, label)]

    def _lines(self, stream: str, texts: list[str], ts: float,
               styles: list[Style] | None = None) -> Lines | Line:
        """Lines ``texts`` (with ``styles``, one a text, when any has one)."""
        n = len(texts)
        seq = self._seq[stream]
        self._seq[stream] = seq + n
        self._last_kept[stream] = True
        self._last_marker[stream] = None
        self.counts[stream]["lines"] += n
        if n == 1:
            return Line(run=self.run, stream=stream, seq=seq, ts=ts, text=texts[0],
                        style=styles[0] if styles else ())
        return Lines(run=self.run, stream=stream, seq=seq, ts=ts, texts=tuple(texts),
                     styles=tuple(styles) if styles else ())

    def _one(self, stream: str, item: Rendered | Dropped, ts: float) -> list[Record]:
        if isinstance(item, Dropped):
            return self._dropped(stream, item, ts)
        return self._rendered(stream, item, ts)

    # ------------------------------------------------------------------------------- internals

    def _dropped(self, stream: str, item: Dropped, ts: float) -> list[Record]:
        counts = self.counts[stream]
        if self.mode != ENABLED or not self._last_kept[stream]:
            # The repeated line was dropped by the mode (now or when it was printed): no note
            # may mention its repetitions.
            counts["dropped_by_mode"] += item.count
            return []
        again = self._last_marker[stream]
        if item.note == NOTE_REPEAT and again is not None:  # the same marker again
            return [rec for _ in range(item.count) for rec in self._section(stream, again, ts)]
        if item.note == NOTE_BLANK:
            counts["blanks_dropped"] += item.count
            text = (f"{item.count} more blank line{'s' if item.count != 1 else ''} "
                    "dropped (a run of blank lines is kept as one)")
        elif item.note == NOTE_REPEAT:
            counts["repeats_dropped"] += item.count
            text = (f"the line above was repeated {item.count} more "
                    f"time{'s' if item.count != 1 else ''} (repetitions dropped)")
        else:
            text = f"{item.count} line{'s' if item.count != 1 else ''} dropped"
        return [self._note(stream, item.note, text, ts, item.count)]

    def _rendered(self, stream: str, item: Rendered, ts: float) -> list[Record]:
        text = item.text
        if _is_command_attempt(text):
            out = self._command(stream, item, ts)
            self._last_kept[stream] = any(isinstance(r, (Line, Command)) for r in out)
            return out
        self._last_kept[stream] = self.mode == ENABLED
        counts = self.counts[stream]
        found_metadata = None
        if stream == STDOUT and not item.cut and self.mode != DISABLED:
            found_metadata = metadata_of(text)
        out = []
        if self.mode == ENABLED:
            found = marker(text) if not item.cut else None
            if found is not None:
                return self._section(stream, found, ts)
            self._last_marker[stream] = None
            counts["lines"] += 1
            out.append(Line(run=self.run, stream=stream, seq=self._next(stream), ts=ts,
                            text=text, style=item.style))
            if item.cut:
                out.append(self._note(stream, NOTE_CUT, (
                    f"the line above was longer than the line limit: its last {item.cut} "
                    f"character{'s' if item.cut != 1 else ''} were dropped"), ts, item.cut))
        elif found_metadata is None:
            counts["dropped_by_mode"] += 1
        if found_metadata is not None:
            counts["metadata"] += 1
            fields, label = found_metadata
            out.append(Metadata(run=self.run, stream=stream, seq=self._next(stream), ts=ts,
                                fields=fields, label=label))
        return out

    def _section(self, stream: str, found: Marker, ts: float) -> list[Record]:
        """A marker line (mode enabled): the notes of the sections it ends, then of the one
        it starts (sections.py), in place of the line."""
        self._last_kept[stream] = True
        self._last_marker[stream] = found
        if found.what == EXPAND:
            title = self.sections.innermost()
            return [] if title is None else [self._note(stream, NOTE_SECTION_EXPAND, title, ts)]
        out: list[Record] = [self._note(stream, NOTE_SECTION_END, title, ts, ms)
                             for title, ms in self.sections.apply(found, ts)]
        if found.what == "start":
            out.append(self._note(stream, NOTE_SECTION, found.title, ts, int(found.collapsed)))
        return out

    def close_sections(self, ts: float) -> list[Record]:
        """The end notes of the sections still open when the run ends (on stdout)."""
        with self._lock:
            return [self._note(STDOUT, NOTE_SECTION_END, title, ts, ms)
                    for title, ms in self.sections.close(ts)]

    def _command(self, stream: str, item: Rendered, ts: float) -> list[Record]:
        self._last_marker[stream] = None
        counts = self.counts[stream]
        # Where: the note follows the command (or, in mode enabled, the malformed line) in
        # the log, whose line number says where it was (logview.py): a count of this
        # stream's own lines would be a second, different number.
        where = stream
        out: list[Record] = []
        try:
            if item.cut:
                raise _Malformed("the line was longer than the line limit and was cut")
            options = parse_command(item.text)
        except _Malformed as e:
            if self.mode == ENABLED:
                # Enabled keeps all output, the malformed line included, as ordinary text.
                counts["lines"] += 1
                out.append(Line(run=self.run, stream=stream, seq=self._next(stream), ts=ts,
                                text=item.text, style=item.style))
            else:
                counts["dropped_by_mode"] += 1
            out.append(self._note(stream, NOTE_WARNING, (
                f"malformed /LOGCOMMAND on {where} ignored: {e}; "
                f"mode stays {self.mode}"), ts))
            return out
        counts["commands"] += 1
        out.append(Command(run=self.run, stream=stream, seq=self._next(stream), ts=ts,
                           text=item.text, options=options))
        new = options.get("mode", self.mode)
        if "mode" in options:
            self._commands += 1
            # What this stream prints after its own mode command follows that command: a hold
            # a command of the other stream put on it (below) ends here.
            self._hold.pop(stream, None)
        before = self._outer or self.mode  # both streams' mode until this command
        if _STRICTNESS[new] > _STRICTNESS[before]:  # relaxed: hold the other stream
            for other in OUTPUT_STREAMS:
                if other != stream:
                    mode, until = self._hold.get(other, (before, ts + HOLD))
                    if _STRICTNESS[before] < _STRICTNESS[mode]:
                        mode = before
                    self._hold[other] = (mode, max(until, ts + HOLD))
        self.mode = new
        if new != before:
            self._changes.append((ts, new))
            old = before
            # The mode applies to both streams: say so in both, so a reader of either stream
            # (dashboards show stdout only) sees why output stops or starts.
            for target in (stream, *(s for s in self._noted if s != stream)):
                out.append(self._note(target, NOTE_MODE, (
                    f"{MODE_CHANGED} {old} to {new} by /LOGCOMMAND on {where}: "
                    f"{_MODE_MEANS[new]}"), ts))
        return out


_MODE_MEANS = {
    ENABLED: "all output is logged from here on",
    METADATA: "only metadata lines are logged from here on",
    DISABLED: "only /LOGCOMMAND lines are logged from here on",
}
