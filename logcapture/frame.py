"""The frames the reader sends the capture worker over their pipe: both ends use this module.

A frame is a fixed header, ``HEADER`` (native order, no padding)::

    kind: u8 | payload length: u32 | wall time: f64 | monotonic time: f64

followed by that many payload bytes. ``kind`` is ``KIND[stream]`` (0 ``stdout``, 1
``stderr``: the payload is what one round of the reader read from that stream, and both times
are the round's ``time.time()`` and ``time.monotonic()``) or ``END`` (the payload is the
command's outcome as a JSON object; no frame follows). The last frame of a round has
``ROUND_END`` set in its kind: the worker then knows every read up to that time, which is what
lets it order the two streams' lines by their read times.

Both processes run on one machine from one installation, so the header is in native byte order
and needs no version. The reader hands the pipe a frame's header (``header``) and its payload
pieces (the pty reads) without joining them; the worker splits what it has read into frames
(``split``) without copying their payloads. ``encode`` and ``decode`` are the same format for
whole frames.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

from .records import STDERR, STDOUT

HEADER = struct.Struct("=BIdd")
STREAMS = (STDOUT, STDERR)  # kind 0 and 1: data of that stream
KIND = {STDOUT: 0, STDERR: 1}
END = 2  # payload: the outcome as a JSON object; no frame follows
ROUND_END = 0x80  # flag: the reader's round that read this frame ends with it
# A payload is one round's reads of one stream (runner: PASSES x READS_IN_A_ROW reads of
# READ_SIZE, 4 MiB) or the outcome: a length beyond this bound is a corrupt header, not a
# frame to wait for.
MAX_PAYLOAD = 1 << 26

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any


class FrameError(ValueError):
    """Bytes that are not a frame: an unknown kind, a length beyond ``MAX_PAYLOAD``, a frame
    cut short, or an end frame whose payload is not a JSON object. The message names the
    offset of the frame and what was wrong."""


def header(kind: int, length: int, wall: float, mono: float) -> bytes:
    """The header of a frame of ``kind`` (with ``ROUND_END`` or not) whose payload is
    ``length`` bytes, read at ``wall`` (time.time()) and ``mono`` (time.monotonic())."""
    return HEADER.pack(kind, length, wall, mono)


def encode(kind: int, payload: bytes, wall: float, mono: float) -> bytes:
    """One whole frame."""
    if len(payload) > MAX_PAYLOAD:
        raise FrameError(f"a frame payload of {len(payload)} bytes is over the limit of "
                         f"{MAX_PAYLOAD}")
    return HEADER.pack(kind, len(payload), wall, mono) + payload


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
          ) -> tuple[list[tuple[int, bool, float, float, int, int]], int]:
    """The whole frames in ``buf`` from offset ``pos``, as ``(kind without ROUND_END, round
    ended, wall, mono, payload start, payload end)``, and the offset after the last of them
    (the bytes from there are the start of a frame still being written). Raises
    ``FrameError`` for a header no reader writes."""
    unpack = HEADER.unpack_from
    size = HEADER.size
    total = len(buf)
    frames = []
    while total - pos >= size:
        kind, length, wall, mono = unpack(buf, pos)
        plain = kind & ~ROUND_END
        if plain > END or (plain == END and kind != END) or length > MAX_PAYLOAD:
            raise FrameError(_bad_header(pos, kind, length))
        end = pos + size + length
        if end > total:
            break
        frames.append((plain, kind != plain, wall, mono, pos + size, end))
        pos = end
    return frames, pos


def _bad_header(pos: int, kind: int, length: int) -> str:
    if length > MAX_PAYLOAD:
        return (f"frame at byte {pos}: a payload length of {length} bytes is over the limit "
                f"of {MAX_PAYLOAD} (a corrupt header)")
    return f"frame at byte {pos}: unknown kind 0x{kind:02x} (a corrupt header)"


def decode(data: bytes | bytearray | memoryview,
           ) -> list[tuple[int, bool, float, float, bytes]]:
    """Every frame of ``data``, which must hold whole frames only, as ``(kind without
    ROUND_END, round ended, wall, mono, payload)``. Raises ``FrameError`` for a corrupt
    header or a last frame cut short."""
    frames, pos = split(data)
    if pos < len(data):
        missing = HEADER.size - (len(data) - pos)
        if missing > 0:
            what = f"its header is {len(data) - pos} of {HEADER.size} bytes"
        else:
            length = HEADER.unpack_from(data, pos)[1]
            what = f"{len(data) - pos - HEADER.size} of its {length} payload bytes are there"
        raise FrameError(f"frame at byte {pos} is cut short: {what}")
    view = memoryview(data)
    return [(kind, round_end, wall, mono, bytes(view[start:end]))
            for kind, round_end, wall, mono, start, end in frames]
