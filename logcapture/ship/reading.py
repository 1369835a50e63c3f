"""Reading spool segments as bytes, for shipping.

A whole closed segment bound for the embedded store is opened by the shipper (as every file
of a user's run directory is: ``userfiles``, no link followed, a regular file of the
directory's owner with one link) and read by the engine itself (``batches._ship_direct``); the
open segment, what is left of a partly shipped one, and anything the engine cannot read or
refuses are read here as bytes (``read_segment_bytes``) and sent as they are. Those are read
one segment at a time as the batches reach them (``pending._pieces``, a generator): a shipper
holds one batch and one segment, whatever the backlog after an outage.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SpoolError
from ..ownership import first_line
from ..spool import Segment, segment_data, segments


def read_segment_bytes(seg: Segment, skip: int = 0) -> tuple[bytes, int, bool, Segment]:
    """The complete lines of a segment after the first ``skip`` as one bytes object (each
    line ending in a newline), their number, whether an incomplete last line was present,
    and the segment read (``open_segment``: its ``.gz`` if it was closed meanwhile):
    ``spool.read_lines`` without a Python object per line (the agent's hot path)."""
    data, seg = segment_data(seg)
    end = data.rfind(b"\n") + 1
    torn = end < len(data)
    start = 0
    if skip:
        parts = data.split(b"\n", skip)  # skip small objects, then the rest in one piece
        start = end if len(parts) <= skip else len(data) - len(parts[-1])
        start = min(start, end)
    body = data[start:end] if (start or end < len(data)) else data
    return body, body.count(b"\n"), torn, seg


def _begun(run_dir: Path) -> bool:
    """Whether the run's first line is complete (the agent reads a run's identity only then);
    True when that cannot be told, so that shipping reports the problem."""
    try:
        segs = segments(run_dir)
        if not segs:
            return False
        return segs[0].closed or bool(first_line(segs[0]))
    except SpoolError:
        return True
