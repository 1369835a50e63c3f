"""The caller's standard descriptors: ``reserve_std_fds`` (closed ones held by /dev/null, closed
again in the command) and ``same_destination`` (do stdout and stderr write to one place, so that
one pty must carry both); ``wait_for``, the one wait for descriptors to be ready.
"""

from __future__ import annotations

import fcntl
import os
import select
import stat
from collections.abc import Callable, Iterable


def reserve_std_fds() -> frozenset[int]:
    """Open /dev/null on whichever of 0, 1 and 2 is closed, and return which were: else the
    first files opened here (a pty's master, the worker's pipe) would take those numbers, and
    the command would read its own output as its stdin (or the reader copy it back into the
    pty). The command gets them closed again (``Options.closed``, ``exec_command``), as it
    would have without logcapture."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    for fd in closed:  # in order: the lowest free number is ``fd`` itself
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:  # pragma: no cover - only if another thread opened a file meanwhile
            os.dup2(null, fd)
            os.close(null)
    return frozenset(closed)


def closer(fds: frozenset[int]) -> Callable[[], None]:
    """The child's last step before exec: close ``fds`` (``reserve_std_fds``)."""
    def close() -> None:
        for fd in fds:
            os.close(fd)
    return close


def same_destination(fd1: int = 1, fd2: int = 2) -> bool:
    """Do ``fd1`` and ``fd2`` write to the same place, so that the order of writes across them
    is part of what ends up there? True for one open file description (``2>&1``, Slurm's
    ``slurm-N.out`` without ``-e``), for the same pipe, FIFO, socket or terminal however it
    was opened (writes to it are kept in order), and for the same regular file when both
    append (``>>f 2>>f``: each write lands at the end). Not for /dev/null (nobody sees an
    order there: the streams keep their names), not for two descriptors that each write at
    their own offset of one file (``>f 2>f``: each overwrites the other at its own offset, so
    the bytes a stream writes land where they would without a terminal only if it keeps its
    own descriptor), and not when either is closed."""
    try:
        a, b = os.fstat(fd1), os.fstat(fd2)
    except OSError:
        return False
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        return False
    if stat.S_ISCHR(a.st_mode) and a.st_rdev == os.makedev(1, 3):  # /dev/null
        return False
    if not stat.S_ISREG(a.st_mode):
        return True  # one pipe, socket or terminal: one queue of writes
    try:
        fl1, fl2 = fcntl.fcntl(fd1, fcntl.F_GETFL), fcntl.fcntl(fd2, fcntl.F_GETFL)
        if fl1 & fl2 & os.O_APPEND:
            return True
        return _same_description(fd1, fd2)
    except OSError:
        return False


def _same_description(fd1: int, fd2: int) -> bool:
    """Are ``fd1`` and ``fd2`` one open file description (one offset)? kcmp(2) says exactly;
    where it is missing (a kernel without CONFIG_KCMP, another architecture), two descriptors
    at one offset are taken as one: a file opened twice at the same offset would have its
    streams overwrite each other, so no order of theirs survives there anyway."""
    number = _KCMP_SYSCALL.get(os.uname().machine)
    if number is not None:
        import ctypes  # only for a regular file shared by both streams

        libc = ctypes.CDLL(None, use_errno=True)
        pid = os.getpid()
        got = libc.syscall(number, pid, pid, 0, fd1, fd2)  # 0: KCMP_FILE
        if got >= 0:
            return got == 0
    return os.lseek(fd1, 0, os.SEEK_CUR) == os.lseek(fd2, 0, os.SEEK_CUR)


_KCMP_SYSCALL = {"x86_64": 312, "aarch64": 272, "ppc64le": 354}


def wait_for(read: Iterable[int] = (), write: Iterable[int] = (),
             timeout: float | None = None) -> set[int]:
    """Wait until one of ``read`` can be read (or its other end is gone) or one of ``write``
    written, at most ``timeout`` seconds (None: no bound), and return the ones that are.
    poll(2), not select(2): a command started by a program that left a thousand descriptors
    open to it gets its ptys numbered past 1023, which select cannot watch (its FD_SETSIZE)."""
    events: dict[int, int] = {}
    for fd in read:
        events[fd] = events.get(fd, 0) | select.POLLIN
    for fd in write:
        events[fd] = events.get(fd, 0) | select.POLLOUT
    poller = select.poll()
    for fd, mask in events.items():
        poller.register(fd, mask)
    ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return {fd for fd, _ in poller.poll(ms)}
