"""Reading a user's files as root, in the epilog: the job's End record.

Root never trusts the user's directory: everything root opens below ``<job id>/`` is opened
as ``logcapture.userfiles`` says (relative to a directory descriptor, ``O_NOFOLLOW``, a
directory or a regular file of the job's user with one link), is read with a size bound,
and its content never appears in root's messages (which name only paths and numbers).

This is the one reader of segments besides ``spool.reading`` (which reads a whole segment by
path, for its owner or for the shipper): root reads only the tail of the last segments,
relative to descriptors of the job's user, streaming and bounded. Segment names are
``spool.layout``'s (``segment_index``).
"""

from __future__ import annotations

import os

from .jobs import END_STATES

# Bounds for what root reads from a user's directory.
MAX_SEGMENT_BYTES = 64 * 1024 * 1024  # compressed or plain size of the segment with the End
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024
MAX_END_LINE_BYTES = 1024 * 1024
MAX_DIR_ENTRIES = 100_000
MAX_END_CANDIDATES = 8  # segments tried, newest first, when looking for the End record
# The states an End record may carry: Slurm's end states, and SIGNALED (a run outside Slurm
# killed by a signal).
_END_STATES = (*END_STATES, "SIGNALED")


def _open_user_dir(name: str, dir_fd: int, uid: int) -> int | None:
    """A directory in a user's tree, not followed if it is a symlink, owned by ``uid``
    (``userfiles.open_dir``); None when it is not such a directory."""
    from ..errors import SpoolError
    from ..userfiles import open_dir

    try:
        return open_dir(name, uid, dir_fd)[0]
    except (OSError, SpoolError):
        return None


def _is_user_dir(name: str, dir_fd: int, uid: int) -> bool:
    fd = _open_user_dir(name, dir_fd, uid)
    if fd is None:
        return False
    os.close(fd)
    return True


def _list_dir(fd: int) -> list[str]:
    """At most MAX_DIR_ENTRIES names of a directory (a user may fill it with millions)."""
    names: list[str] = []
    with os.scandir(fd) as it:
        for entry in it:
            names.append(entry.name)
            if len(names) >= MAX_DIR_ENTRIES:
                break
    return names


def _open_user_file(name: str, dir_fd: int, uid: int, limit: int) -> tuple[int, int] | None:
    """(fd, size) of a plain file of ``uid`` (``userfiles.open_file``: regular, one link, no
    symlink followed, no FIFO blocked on) of at most ``limit`` bytes; None otherwise."""
    from ..errors import SpoolError
    from ..userfiles import open_file

    try:
        fd = open_file(name, dir_fd, uid)
    except (OSError, SpoolError):
        return None
    size = os.fstat(fd).st_size
    if size > limit:
        os.close(fd)
        return None
    return fd, size


def _tail(fd: int, size: int, compressed: bool) -> bytes:
    """The last MAX_END_LINE_BYTES bytes of a segment's content, reading at most
    MAX_SEGMENT_BYTES and decompressing at most MAX_DECOMPRESSED_BYTES."""
    import zlib

    if not compressed:
        start = max(0, size - MAX_END_LINE_BYTES)
        return os.pread(fd, MAX_END_LINE_BYTES, start)
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    tail = b""
    total = 0
    read = 0
    while read < size and total <= MAX_DECOMPRESSED_BYTES:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        read += len(chunk)
        data = chunk
        while data and total <= MAX_DECOMPRESSED_BYTES:
            try:
                out = d.decompress(data, 1 << 20)
            except zlib.error:
                return tail
            total += len(out)
            tail = (tail + out)[-MAX_END_LINE_BYTES:]
            data = d.unconsumed_tail
            if d.eof:
                return tail
    return tail


def _valid_end(obj: object, run_id: str) -> dict[str, object] | None:
    """The fields of a well-formed End record of ``run_id``, else None (the file is the
    user's: nothing of it is trusted beyond these typed, bounded values)."""
    if not isinstance(obj, dict) or obj.get("kind") != "end" or obj.get("run") != run_id:
        return None
    status, sig, state = obj.get("exit_status"), obj.get("signal"), obj.get("state")
    if status is not None and (type(status) is not int or not 0 <= status <= 255):
        return None
    if sig is not None and (type(sig) is not int or not 1 <= sig <= 128):
        return None
    duration = obj.get("duration")
    return {"exit_status": status, "signal": sig,
            "state": state if state in _END_STATES else "",
            "duration": float(duration) if isinstance(duration, (int, float))
            and type(duration) is not bool else None}


def read_end(job_fd: int, run_id: str, uid: int) -> dict[str, object] | None:
    """The End record of run ``run_id`` in a job directory, read as root would read anything
    of a user's: no symlinks, regular files of the user only, bounded."""
    from ..spool.layout import segment_index

    run_fd = _open_user_dir(run_id, job_fd, uid)
    if run_fd is None:
        return None
    try:
        found: list[tuple[int, bool, str]] = []
        for name in _list_dir(run_fd):
            index = segment_index(name)
            if index is not None:
                found.append((index, name.endswith(".gz"), name))
        # The End is in the last segment the wrapper wrote; names planted after it (symlinks,
        # FIFOs, huge files) are refused one by one, a few at most.
        for _, compressed, name in sorted(found, reverse=True)[:MAX_END_CANDIDATES]:
            opened = _open_user_file(name, run_fd, uid, MAX_SEGMENT_BYTES)
            if opened is None:
                continue
            fd, size = opened
            try:
                tail = _tail(fd, size, compressed=compressed)
            finally:
                os.close(fd)
            end = _end_in(tail, run_id)
            if end is not None:
                return end
    finally:
        os.close(run_fd)
    return None


def _end_in(tail: bytes, run_id: str) -> dict[str, object] | None:
    import json

    complete = tail.split(b"\n")[:-1]  # the last element is an incomplete line (or b"")
    for line in reversed(complete[1:] if len(tail) >= MAX_END_LINE_BYTES else complete):
        if b'"end"' not in line:
            continue
        try:
            end = _valid_end(json.loads(line), run_id)
        except ValueError:
            continue
        if end is not None:
            return end
    return None
