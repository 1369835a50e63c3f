"""The frames the reader sends the capture worker over their pipe: both ends use this module.

A frame is a fixed header, ``HEADER`` (native order, no padding)::

    kind: u8 | payload length: u32 | reads: u32 | first monotonic time: f64 | last: f64

then, for a frame of a stream's output, its reads as three columns (native order, the reads
in order): each read's length (u32), its wall time (f64) and whether the reader's round ended
with it (u8); then the payload. ``kind`` is ``KIND[stream]`` (0 ``stdout``, 1 ``stderr``: the
payload is the reads of that stream, one after another, each a round's reads, with the round's
``time.time()``) or ``END`` (no reads; the payload is the command's outcome as a JSON object;
no frame follows). The monotonic times are those of the frame's first and last read. A read
that ended its round tells the worker that every read up to that time has been sent, which is
what lets it order the two streams' lines by their read times.

One frame joins the consecutive rounds of one stream (the reader's ``Worker``), so that a
flood of short prints, read a few lines at a time, costs a header a few milliseconds instead
of one per read, while every read keeps its own time.

Both processes run on one machine from one installation, so the header is in native byte order
and needs no version. The reader hands the pipe a frame's header and table (``header``) and
its payload pieces (the pty reads) without joining them; the worker splits what it has read
into frames (``split``) without copying their payloads. ``encode`` and ``decode`` are the same
format for whole frames.
"""

from __future__ import annotations

import json
import struct
from array import array
from collections.abc import Iterable, Mapping

from .records import STDERR, STDOUT

HEADER = struct.Struct("=BIIdd")
READ_ENTRY = 4 + 8 + 1  # a read's length, wall time and round end in the table
STREAMS = (STDOUT, STDERR)  # kind 0 and 1: data of that stream
KIND = {STDOUT: 0, STDERR: 1}
END = 2  # payload: the outcome as a JSON object; no frame follows
# A frame joins one stream's rounds for a few milliseconds, up to the reader's pump threshold
# plus one round (runner: PUMP_BYTES, and PASSES x READS_IN_A_ROW reads of READ_SIZE, 4 MiB);
# or it is the outcome. A length or a read count beyond these bounds is a corrupt header, not
# a frame to wait for.
MAX_PAYLOAD = 1 << 26
MAX_READS = 1 << 20

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any


class FrameError(ValueError):
    """Bytes that are not a frame: an unknown kind, a length beyond ``MAX_PAYLOAD``, a frame
    cut short, or an end frame whose payload is not a JSON object. The message names the
    offset of the frame and what was wrong."""


def header(kind: int, length: int, lengths: list[int], walls: list[float],
           ends: list[bool], first_mono: float, last_mono: float) -> bytes:
    """The header and the table of reads of a frame of ``kind`` whose payload is ``length``
    bytes: the reads' ``lengths``, wall times (``time.time()``) and round ends, and the
    monotonic times of its first and last read."""
    return (HEADER.pack(kind, length, len(lengths), first_mono, last_mono)
            + array("I", lengths).tobytes() + array("d", walls).tobytes() + bytes(ends))


def encode(kind: int, payload: bytes, wall: float, mono: float,
           round_end: bool = False) -> bytes:
    """One whole frame: ``payload`` as one read at ``wall``/``mono`` (no read for ``END``)."""
    if kind == END:
        return encode_reads(END, [], mono, mono, payload)
    return encode_reads(kind, [(payload, wall, round_end)], mono, mono)


def encode_reads(kind: int, reads: Iterable[tuple[bytes, float, bool]], first_mono: float,
                 last_mono: float, payload: bytes = b"") -> bytes:
    """One whole frame of ``reads`` (data, wall time, round end); ``payload`` for ``END``."""
    reads = list(reads)
    if reads:
        payload = b"".join(data for data, _, _ in reads)
    if len(payload) > MAX_PAYLOAD:
        raise FrameError(f"a frame payload of {len(payload)} bytes is over the limit of "
                         f"{MAX_PAYLOAD}")
    return header(kind, len(payload), [len(data) for data, _, _ in reads],
                  [wall for _, wall, _ in reads], [end for _, _, end in reads],
                  first_mono, last_mono) + payload


def encode_end(outcome: Mapping[str, Any]) -> bytes:
    """The end frame's payload: ``outcome`` as a JSON object."""
    return json.dumps(dict(outcome)).encode()


def decode_end(payload: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The outcome an end frame carries."""
    try:
        value = json.loads(bytes(payload))
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise FrameError(f"the end frame's payload is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise FrameError(f"the end frame's payload is a JSON {type(value).__name__}, "
                         "not an object")
    return value


def split(buf: bytes | bytearray | memoryview, pos: int = 0,
          ) -> tuple[list[tuple[int, array[int], array[float], bytes, float, float, int, int]],
                     int]:
    """The whole frames in ``buf`` from offset ``pos``, as ``(kind, the reads' lengths, their
    wall times, their round ends (a byte each, 1 or 0), first monotonic time, last monotonic
    time, payload start, payload end)``, and the offset after the last of them (the bytes from
    there are the start of a frame still being written). Raises ``FrameError`` for a header or
    a table no reader writes."""
    unpack = HEADER.unpack_from
    size = HEADER.size
    total = len(buf)
    frames = []
    while total - pos >= size:
        kind, length, reads, first, last = unpack(buf, pos)
        if kind > END or length > MAX_PAYLOAD or reads > MAX_READS or (
                (kind == END) != (reads == 0)):
            raise FrameError(_bad_header(pos, kind, length, reads))
        table = pos + size
        start = table + READ_ENTRY * reads
        end = start + length
        if end > total:
            break
        lengths = array("I")
        lengths.frombytes(buf[table:table + 4 * reads])
        walls = array("d")
        walls.frombytes(buf[table + 4 * reads:start - reads])
        if reads and sum(lengths) != length:
            raise FrameError(f"frame at byte {pos}: its reads' lengths add up to "
                             f"{sum(lengths)} bytes, not its payload's {length} (a corrupt "
                             "table)")
        frames.append((kind, lengths, walls, bytes(buf[start - reads:start]), first, last,
                       start, end))
        pos = end
    return frames, pos


def _bad_header(pos: int, kind: int, length: int, reads: int) -> str:
    if kind > END:
        return f"frame at byte {pos}: unknown kind 0x{kind:02x} (a corrupt header)"
    if length > MAX_PAYLOAD:
        return (f"frame at byte {pos}: a payload length of {length} bytes is over the limit "
                f"of {MAX_PAYLOAD} (a corrupt header)")
    if reads > MAX_READS:
        return (f"frame at byte {pos}: {reads} reads are over the limit of {MAX_READS} "
                "(a corrupt header)")
    if kind == END:
        return (f"frame at byte {pos}: an end frame carries no reads, this one {reads} "
                "(a corrupt header)")
    return f"frame at byte {pos}: a frame of output with no read (a corrupt header)"


def decode(data: bytes | bytearray | memoryview,
           ) -> list[tuple[int, list[tuple[bytes, float, bool]], float, float, bytes]]:
    """Every frame of ``data``, which must hold whole frames only, as ``(kind, reads as (data,
    wall time, round end), first monotonic time, last monotonic time, payload)``. Raises
    ``FrameError`` for a corrupt header or a last frame cut short."""
    frames, pos = split(data)
    if pos < len(data):
        missing = HEADER.size - (len(data) - pos)
        if missing > 0:
            what = f"its header is {len(data) - pos} of {HEADER.size} bytes"
        else:
            _, length, reads, _, _ = HEADER.unpack_from(data, pos)
            what = (f"{len(data) - pos - HEADER.size} of its {READ_ENTRY * reads + length} "
                    "table and payload bytes are there")
        raise FrameError(f"frame at byte {pos} is cut short: {what}")
    view = memoryview(data)
    out = []
    for kind, lengths, walls, ends, first, last, start, end in frames:
        payload = bytes(view[start:end])
        reads, at = [], 0
        for n, wall, ended in zip(lengths, walls, ends, strict=True):
            reads.append((payload[at:at + n], wall, bool(ended)))
            at += n
        out.append((kind, reads, first, last, payload))
    return out
