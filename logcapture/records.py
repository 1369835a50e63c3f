"""The record types every stage shares, and their NDJSON encoding.

A record is one line of a spool segment: a JSON object whose ``kind`` names its type.
Every record carries a deterministic identity ``(run, stream, seq)``: ``run`` is the run id
(a Slurm job id for Slurm jobs), ``stream`` is ``stdout``, ``stderr``, ``run`` (records about
the run as a whole: start, end, run-level notes) or ``sample:<node>`` (resource samples of one
node), and ``seq`` counts from 0 within that stream. Re-shipping a record therefore can never
produce a second row: the store deduplicates on that identity.

Stages exchange these types and nothing else. Encoding is
``record.to_dict()`` -> ``json.dumps``; decoding is ``from_dict(obj)``, which raises
``RecordError`` naming the field that was wrong.

A record's kind is its last key (``kind_suffix``): every encoded record ends with
``"kind":"<kind>"}``, so a reader can pick records of a kind out of a segment's bytes without
parsing JSON. ``kind_suffix`` is the one place that spells those bytes; the writers here and
every byte-level test of a kind elsewhere (spool reading, shipping, live checks, the read
layer, the store's ingest) use it.

The records are named tuples (``collections.namedtuple``): immutable, made at C speed, and
cheap to define. Every job pays for this module's import twice over (the wrapper and the capture
worker start with it): frozen dataclasses cost ~10-18 ms of CPU more at each start here
(``dataclasses`` imports ``inspect``, and each class is built by ``exec``) and ``typing``
another ~8 ms, most of a training job's 2 % capture budget (docs/performance.md). A default
that is a container is one shared object, so it is an immutable one: ``()`` for a list field,
an empty read-only mapping for a dict field (``dumps`` writes it as ``{}``).
"""

from __future__ import annotations

import json
import math
from collections import namedtuple
from collections.abc import Iterable, Mapping
from functools import partial
from itertools import repeat
from types import MappingProxyType

from .errors import RecordError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~8 ms at every start)
if TYPE_CHECKING:
    from typing import Any

STDOUT = "stdout"
STDERR = "stderr"
RUN = "run"
OUTPUT_STREAMS = (STDOUT, STDERR)

# Modes a job switches with /LOGCOMMAND: what is kept of the job's output.
ENABLED = "enabled"
METADATA = "metadata"
DISABLED = "disabled"
MODES = (ENABLED, METADATA, DISABLED)

# The state of a run whose writer went away before the command's outcome was known (the
# wrapper killed, its node crashed or rebooted) and that Slurm did not close: its end is its
# last output (spool.abandoned.close_abandoned, Pipeline.finish_lost).
LOST = "LOST"

# Note kinds.
NOTE_REPEAT = "repeat"  # consecutive identical lines dropped; count = lines dropped
NOTE_BLANK = "blank"  # a run of blank lines collapsed to one; count = lines dropped
NOTE_CUT = "cut"  # a line longer than the limit was cut; count = characters dropped
NOTE_WARNING = "warning"  # something went wrong (bad command, bad config, internal fault)
NOTE_MODE = "mode"  # the mode changed (from .logoptin or a /LOGCOMMAND)
MODE_CHANGED = "mode changed from"  # how a NOTE_MODE's text begins (classify writes it)
# A CI fold marker (sections.py): a section starts (text its title, count 1 when it opens
# collapsed) or ends (text its title, count its duration in ms), or the job asks to expand
# the section it is in (Buildkite's ``^^^ +++``; text that section's title).
NOTE_SECTION = "section"
NOTE_SECTION_END = "section_end"
NOTE_SECTION_EXPAND = "section_expand"
NOTE_KINDS = (NOTE_REPEAT, NOTE_BLANK, NOTE_CUT, NOTE_WARNING, NOTE_MODE, NOTE_SECTION,
              NOTE_SECTION_END, NOTE_SECTION_EXPAND)


# How the job's stdout and stderr were captured, in the start record's config["streams"]:
# two ptys, or one for both (they went to the same file or terminal,
# runner.descriptors.same_destination) whose stream is stdout. A start record without the key
# is from before there was a choice.
STREAMS_SEPARATE = "separate"
STREAMS_MERGED = "merged"


def streams_of(config: Mapping[str, Any]) -> str:
    """What ``logcapture show`` says of a run's streams, from its start record's config."""
    if config.get("streams") == STREAMS_MERGED:
        return (f"{STREAMS_MERGED} (stdout and stderr went to the same place and were "
                "captured as one stream, in the order written: stdout)")
    return STREAMS_SEPARATE


_IDENTITY = ("run", "stream", "seq", "ts")


def kind_suffix(kind: str) -> bytes:
    """The bytes that end the NDJSON line of every record of ``kind`` (before its newline):
    the contract that a record's kind is its last key. ``to_dict`` puts ``kind`` last and the
    hot paths (``Line``, ``Lines``, ``Metadata``) write it last; a quote inside a string value
    is escaped, so no text can end a line with these bytes. Every byte-level test of a
    record's kind goes through this function (tests/test_records.py holds writer and readers
    to it)."""
    return b'"kind":"' + kind.encode() + b'"}'


# How a record about the run as a whole begins (to_json: run, stream, seq, ...; a run id has
# no quote, and a quote inside a string value is escaped, so no text can imitate it).
_RUN_STREAM = b'","stream":"run","'
_RUN_STREAM_WITHIN = 160


def run_lines(data: bytes) -> list[bytes]:
    """The NDJSON lines of ``data`` (each ending in a newline) that are records about the run
    as a whole (start, notes, end): what is kept when the output cannot be. Like
    ``kind_suffix``, a byte-level contract of the encoding (``to_dict`` writes ``run`` and
    ``stream`` first)."""
    return [ln for ln in data.splitlines(True) if _RUN_STREAM in ln[:_RUN_STREAM_WITHIN]]


# How the hot paths end a line and a metadata record.
_LINE_KIND = kind_suffix("line").decode()
_METADATA_KIND = kind_suffix("metadata").decode()
_NO_ITEMS: Mapping[str, Any] = MappingProxyType({})  # the default of every dict field


class Record:
    """Base of every record type: the identity every record carries. Each type is a named
    tuple whose first fields are ``run``, ``stream``, ``seq`` and ``ts`` (seconds since the
    epoch, when the stage saw it), with this class mixed in; ``kind`` names the type."""

    __slots__ = ()
    kind = ""
    _fields: tuple[str, ...]
    if TYPE_CHECKING:
        run: str
        stream: str
        seq: int
        ts: float

    def to_dict(self) -> dict[str, Any]:
        # Shallow on purpose: records are immutable and their values plain JSON types.
        d = dict(zip(self._fields, self, strict=True))  # type: ignore[call-overload]
        d["kind"] = self.kind
        return d

    def to_json(self) -> str:
        return dumps(self.to_dict())

    @property
    def identity(self) -> tuple[str, str, int]:
        return (self.run, self.stream, self.seq)


def _record_tuple(name: str, *fields: str, defaults: tuple[Any, ...]) -> type:
    """The named tuple a record type derives from: the identity, then ``fields``."""
    return namedtuple(name, _IDENTITY + fields, defaults=defaults)


class Start(_record_tuple("Start", "command", "cwd", "user", "uid", "host", "pid", "mode",
                          "slurm", "inventory", "config",
                          defaults=((), "", "", -1, "", 0, ENABLED, *[_NO_ITEMS] * 3)),
            Record):
    """The run began. ``stream`` is ``run``, ``seq`` 0.

    ``slurm``: the Slurm identity when present (cluster, job_id, array_job_id, array_task_id,
    step, node, job_name, partition); ``inventory``: the hardware (host, CPUs, memory, GPUs),
    filled by the sampler stage when it runs; ``config``: the effective configuration, for the
    record (never secrets)."""

    __slots__ = ()
    kind = "start"
    if TYPE_CHECKING:
        command: list[str]
        cwd: str
        user: str
        uid: int
        host: str
        pid: int
        mode: str
        slurm: Mapping[str, str]
        inventory: Mapping[str, Any]
        config: Mapping[str, Any]


class Line(_record_tuple("Line", "text", "style", defaults=("", ())), Record):
    """One rendered line of the job's output, as a terminal would show it. ``style``: its
    colours and attributes as spans ``[start, end, "sgr"]`` (``logcapture.sgr``); a plain
    line has none, and then no ``style`` key either."""

    __slots__ = ()
    kind = "line"
    if TYPE_CHECKING:
        text: str
        style: tuple[tuple[int, int, str], ...]

    def to_dict(self) -> dict[str, Any]:
        d = Record.to_dict(self)
        if not self.style:
            del d["style"]
        return d

    def to_json(self) -> str:
        # The per-line hot path: the same bytes as dumps(self.to_dict()), built directly
        # (a test holds the two equal). ``kind`` stays last (store.ingest tells line records
        # by it).
        if self.style:
            return dumps(self.to_dict())
        return (f'{{"run":{_string(self.run)},"stream":{_string(self.stream)},'
                f'"seq":{int(self.seq)},"ts":{float(self.ts)!r},"text":{_string(self.text)},'
                f'{_LINE_KIND}')


class Lines(_record_tuple("Lines", "texts", "spans", "styles", defaults=((), (), ())),
            Record):
    """Consecutive ``Line`` records of one stream, ``seq``, ``seq + 1``, ...: the classifier's
    batch output (``Classifier.feed_many``), so that a burst of plain lines costs no object per
    line. They share one ``ts``, unless ``spans`` gives their read times as ``(ts, count)``
    runs in order (the lines of several reads classified as one: ``Classifier.feed_plain``;
    ``ts`` is then the first span's). Never in the spool as such: ``to_json`` gives exactly
    the NDJSON lines of ``lines()``, joined by newlines (a test holds them equal). ``styles``,
    when any line has one, holds each line's ``Line.style`` (empty when all are plain)."""

    __slots__ = ()
    kind = "lines"
    if TYPE_CHECKING:
        texts: tuple[str, ...]
        spans: tuple[tuple[float, int], ...]
        styles: tuple[tuple[tuple[int, int, str], ...], ...]

    def times(self) -> list[float]:
        """Each line's read time."""
        if not self.spans:
            return [self.ts] * len(self.texts)
        return [ts for ts, k in self.spans for _ in range(k)]

    def lines(self) -> list[Line]:
        styles = self.styles or repeat((), len(self.texts))
        return [Line(self.run, self.stream, seq, ts, text, style)
                for seq, (ts, text, style) in enumerate(
                    zip(self.times(), self.texts, styles, strict=True), self.seq)]

    def to_json(self) -> str:
        texts = self.texts
        n = len(texts)
        if not n:
            return ""
        if self.styles:  # coloured lines: each its own way (plain batches take the bulk path)
            return "\n".join([line.to_json() for line in self.lines()])
        # Line.to_json for each text, built in bulk with C-level operations only.
        concat = "".join(texts)
        if concat.isascii() and len(concat) == len(
                concat.encode("ascii").translate(None, _ESCAPED_ASCII)):
            quote = '"'  # nothing to escape: each text is its JSON string's body
            bodies: Iterable[str] = texts
        else:
            quote = ""  # each text through the C string encoder (quotes included)
            bodies = map(_string, texts)
        head = f'{{"run":{_string(self.run)},"stream":{_string(self.stream)},"seq":'
        end = f'{quote},{_LINE_KIND}'
        # [seq, tail, body, end + newline + head] per line, joined once.
        parts = [f',"ts":{float(self.ts)!r},"text":{quote}'] * (4 * n)
        if self.spans:
            parts[1::4] = [tail for t, k in self.spans
                           for tail in [f',"ts":{float(t)!r},"text":{quote}'] * k]
        seq = int(self.seq)
        parts[0::4] = map(str, range(seq, seq + n))
        parts[2::4] = bodies
        parts[3::4] = [f"{end}\n{head}"] * n
        parts[-1] = end
        return head + "".join(parts)


class Note(_record_tuple("Note", "note", "count", "text", defaults=(NOTE_WARNING, 0, "")),
           Record):
    """Something about the output rather than output: dropped repeats, blank runs, cuts,
    warnings, mode changes. ``text`` is logcapture's own words, never the job's dropped text."""

    __slots__ = ()
    kind = "note"
    if TYPE_CHECKING:
        note: str
        count: int
        text: str


class Command(_record_tuple("Command", "text", "options", defaults=("", _NO_ITEMS)), Record):
    """A valid ``/LOGCOMMAND {json}`` line. ``text`` is the command line as the job wrote it."""

    __slots__ = ()
    kind = "command"
    if TYPE_CHECKING:
        text: str
        options: Mapping[str, Any]


class Metadata(_record_tuple("Metadata", "fields", "label", defaults=(_NO_ITEMS, "")),
               Record):
    """A stdout line that was exactly one JSON object; nested objects flattened to dotted keys.
    ``label``: whose object it was when a launcher's label stood before it
    (``ranklabel.Labelled.describe``: ``rank 1``, ``local rank 1``); none ("", and then no
    ``label`` key either) when the line was the object alone."""

    __slots__ = ()
    kind = "metadata"
    if TYPE_CHECKING:
        fields: Mapping[str, Any]
        label: str

    def to_dict(self) -> dict[str, Any]:
        d = Record.to_dict(self)
        if not self.label:
            del d["label"]
        return d

    def to_json(self) -> str:
        # A metadata line's hot path: the same bytes as dumps(self.to_dict()) (a test holds
        # them equal), without the intermediate dict; anything unusual takes the generic way.
        ts = self.ts
        if type(ts) is float and type(self.seq) is int and type(self.run) is str \
                and type(self.stream) is str and ts - ts == 0.0 and not self.label:  # finite
            try:
                body = _encode_fields(self.fields)
            except ValueError:  # a non-finite number somewhere: the generic way
                return dumps(self.to_dict())
            return (f'{{"run":{_string(self.run)},"stream":{_string(self.stream)},'
                    f'"seq":{self.seq},"ts":{ts!r},"fields":{body},{_METADATA_KIND}')
        return dumps(self.to_dict())



class Sample(_record_tuple("Sample", "node", "gpus", "job", defaults=("", (), _NO_ITEMS)),
             Record):
    """One resource sample of one node. ``stream`` is ``sample:<node>``.

    ``gpus``: per-GPU figures, a list of {uuid, index, name, utilization_gpu_percent,
    memory_used_bytes, memory_total_bytes, memory_reserved_bytes, power_watts,
    temperature_celsius, sm_clock_mhz, job_memory_used_bytes}; ``job``: the job's own
    CPU/memory/IO (cpu_seconds_total, cpu_percent, memory_rss_bytes, memory_pss_bytes,
    io_read_bytes, io_write_bytes, threads, processes)."""

    __slots__ = ()
    kind = "sample"
    if TYPE_CHECKING:
        node: str
        gpus: list[dict[str, Any]]
        job: Mapping[str, Any]


class End(_record_tuple("End", "exit_status", "signal", "state", "duration", "counts",
                        defaults=(None, None, "", 0.0, _NO_ITEMS)), Record):
    """The run ended. ``stream`` is ``run``; ``seq`` follows the run stream's other records.

    ``exit_status`` is 0-255 when the command exited, ``signal`` N when it was killed by signal
    N; ``state`` COMPLETED, FAILED, CANCELLED, SIGNALED, ...; ``counts``, per output stream:
    bytes read from the pty, rendered lines, dropped repeats, ...; ``spool``: records lost,
    write errors; ``capture``: logcapture's own CPU and memory; ``sampling``: samples taken and
    normal events that are not warnings, such as processes that ended mid-sample
    (docs/sampling.md); ``redactions``: secrets replaced, by kind (``redactions_by_kind``)."""

    __slots__ = ()
    kind = "end"
    if TYPE_CHECKING:
        exit_status: int | None
        signal: int | None
        state: str
        duration: float
        counts: Mapping[str, Mapping[str, int]]


class Progress(_record_tuple("Progress", "bar", "label", "n", "total", "unit", "rate",
                             "elapsed", "done",
                             defaults=(0, "", 0.0, None, "", None, None, 0)), Record):
    """One point of a progress bar the renderer collapsed (docs/rendering.md, "Progress as
    data"). ``stream`` is ``progress:stdout`` or ``progress:stderr`` (the bar's output
    stream), ``seq`` counts that stream's points; ``bar`` numbers the stream's bars from 0;
    ``label`` (redacted as a line is), ``n`` and ``total`` (None when the bar has none) in
    ``unit``; ``rate`` per second and ``elapsed`` seconds (None when unknown); ``done`` 1 on
    the bar's final state. At most one point a second per bar, and its final state."""

    __slots__ = ()
    kind = "progress"
    if TYPE_CHECKING:
        bar: int
        label: str
        n: float
        total: float | None
        unit: str
        rate: float | None
        elapsed: float | None
        done: int


def redactions_by_kind(counts: Any) -> dict[str, int]:
    """The secrets an End record's ``counts`` say were replaced by ``***``, by kind (those
    with any), as every reader reports them: a number per kind, never what they were."""
    by_kind = counts.get("redactions") if isinstance(counts, Mapping) else None
    if not isinstance(by_kind, Mapping):
        return {}
    return {str(k): int(v) for k, v in sorted(by_kind.items()) if isinstance(v, int) and v > 0}


# Intermediate types between the text stages (render -> filter -> classify). They carry no
# identity yet: the classifier numbers what it keeps.


class Rendered(namedtuple("Rendered", ("text", "cut", "style"), defaults=(0, ()))):
    """One committed screen line of one stream. ``cut`` counts characters dropped because the
    line was longer than the line limit (0 when whole); ``style`` its spans of colour
    (``logcapture.sgr``), empty when plain. A named tuple: the renderer makes one per line,
    and a tuple is made at C speed (``rendered_many``)."""

    __slots__ = ()
    if TYPE_CHECKING:
        text: str
        cut: int
        style: tuple[tuple[int, int, str], ...]


_new_tuple = tuple.__new__
_new_rendered = partial(_new_tuple, Rendered)


def rendered_many(texts: Iterable[str]) -> list[Rendered]:
    """``[Rendered(text) for text in texts]`` with no Python code per line (the renderer's
    per-line hot path); tests/test_pipeline.py holds the two equal."""
    return list(map(_new_rendered, zip(texts, repeat(0), repeat(()))))


def new_metadata(run: str, stream: str, seq: int, ts: float,
                 fields: dict[str, Any], label: str = "") -> Metadata:
    """``Metadata(run=run, stream=stream, seq=seq, ts=ts, fields=fields, label=label)``
    without the named tuple's keyword handling (a metadata line's hot path);
    tests/test_pipeline.py holds the two equal."""
    return _new_tuple(Metadata, (run, stream, seq, ts, fields, label))


class Dropped(namedtuple("Dropped", ("note", "count"))):
    """What the filter dropped: ``note`` is NOTE_REPEAT or NOTE_BLANK, ``count`` how many lines."""

    __slots__ = ()
    if TYPE_CHECKING:
        note: str
        count: int


KINDS: dict[str, type[Record]] = {
    cls.kind: cls for cls in (Start, Line, Note, Command, Metadata, Sample, End, Progress)
}


_string = json.encoder.encode_basestring  # C, ensure_ascii=False
# What _string escapes among ASCII characters: the C0 controls, '"' and '\\'.
_ESCAPED_ASCII = bytes(range(32)) + b'"\\'


def _json_default(o: Any) -> Any:
    if isinstance(o, Mapping):  # a dict field's read-only default (_NO_ITEMS)
        return dict(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def dumps(obj: dict[str, Any]) -> str:
    """Encode one record as one NDJSON line (no newline). Non-finite floats, which Python's
    json writes as bare NaN/Infinity (not JSON), are written as strings "NaN", "Infinity",
    "-Infinity" so every spool line is strict JSON that ClickHouse can parse."""
    try:
        return _encode(obj)
    except ValueError:
        return _encode_nan(_finite(obj))


# What json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=_json_default, ...)
# does, without building an encoder per call (a metadata line costs two records).
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                           default=_json_default).encode
_encode_nan = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"),
                               default=_json_default).encode

try:  # the C encoder JSONEncoder.encode builds on every call, built once
    from json.encoder import (  # type: ignore[attr-defined]  # CPython's C accelerator
        c_make_encoder as _c_make_encoder,
    )
except ImportError:  # pragma: no cover - CPython always has it
    _c_make_encoder = None


def _fields_encoder() -> Any:
    """``_encode`` for a metadata line's fields (a metadata line's hot path), without the
    circular-reference check: fields come from the JSON parser, which makes no cycles."""
    if _c_make_encoder is None:  # pragma: no cover
        return _encode
    iterencode = _c_make_encoder(None, _json_default, _string, None, ":", ",", False, False,
                                 False)
    join = "".join

    def encode(fields: dict[str, Any]) -> str:
        return join(iterencode(fields, 0))

    return encode


_encode_fields = _fields_encoder()


def _finite(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return "NaN" if math.isnan(o) else ("Infinity" if o > 0 else "-Infinity")
    if isinstance(o, Mapping):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def from_dict(obj: Any) -> Record:
    """Decode one spool object into its record type; ``RecordError`` names what is wrong."""
    if not isinstance(obj, dict):
        raise RecordError(f"a record must be a JSON object, not {type(obj).__name__}")
    kind = obj.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RecordError(f"unknown record kind {kind!r}")
    names = set(cls._fields)
    unknown = set(obj) - names - {"kind"}
    if unknown:
        raise RecordError(f"{kind} record has unknown field(s): {', '.join(sorted(unknown))}")
    for key, typ in (("run", str), ("stream", str), ("seq", int)):
        if not isinstance(obj.get(key), typ) or isinstance(obj.get(key), bool):
            raise RecordError(f"{kind} record: field {key!r} missing or not {typ.__name__}")
    if not isinstance(obj.get("ts"), (int, float)):
        raise RecordError(f"{kind} record: field 'ts' missing or not a number")
    args = {k: v for k, v in obj.items() if k != "kind"}
    try:
        return cls(**args)
    except TypeError as e:
        raise RecordError(f"{kind} record: {e}") from None
