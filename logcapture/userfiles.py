"""Files in a directory that someone else may write: the one rule every reader and writer of a
spool follows, root above all (the agent, ``upload``, the epilog, the read layer).

A name in such a directory is the directory owner's to choose. It may be a symlink
(``O_NOFOLLOW`` refuses it), a FIFO or a device (``O_NONBLOCK``, then the type check), or a
hard link to a file the owner does not own: a hard link *is* the file, so no open flag tells
it apart, and only ``fstat`` after the open does (its owner, its link count; link(2)). With
``fs.protected_hardlinks = 1`` (Documentation/admin-guide/sysctl/fs.rst) the kernel refuses
a user a link to a file they could not read and write, but not one to a file they may write,
and the setting is the administrator's, not ours to rely on. So:

- the directory is opened with ``O_NOFOLLOW | O_DIRECTORY`` and checked with ``fstat``; its
  owner is the owner every file in it must have (``UserDir``);
- a file is opened relative to that descriptor with ``O_NOFOLLOW | O_NONBLOCK | O_NOCTTY``
  and accepted only when ``fstat`` says: a regular file, owned by the directory's owner, one
  link (``check_file``); anything else raises ``RefusedFile``, which names the path and why
  and nothing of the content;
- a file written there is made anew: a stale name is unlinked (which removes a name, never
  the content of the file it named), the file is created with ``O_CREAT | O_EXCL |
  O_NOFOLLOW`` (a name planted between the two is not opened), given to the directory's owner
  with ``fchown`` when it is to be theirs, and renamed into place relative to the descriptor
  (a rename replaces a name, whatever file it named).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import SpoolError

_READ_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class RefusedFile(SpoolError):
    """A file in a user's directory that is not the plain file it must be (``check_file``):
    ``message`` is "refused PATH: WHY", with nothing of its content."""

    def __init__(self, path: Path | str, why: str):
        super().__init__(f"refused {path}: {why}")
        self.path = str(path)
        self.why = why


def refusal(st: os.stat_result, owner: int) -> str | None:
    """Why a file with status ``st`` is not one to open in a directory of ``owner``, or None:
    the rule of this module's docstring in one place."""
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        return f"{kind}, not a regular file"
    problems = []
    if st.st_uid != owner:
        problems.append(f"owned by uid {st.st_uid}, not by the directory's owner (uid {owner})")
    if st.st_nlink != 1:
        problems.append(f"{st.st_nlink} links (a hard link)")
    return "; ".join(problems) or None


def check_file(fd: int, path: Path | str, owner: int) -> os.stat_result:
    """``fstat`` of an opened file, or RefusedFile (``refusal``); the caller closes ``fd``."""
    st = os.fstat(fd)
    why = refusal(st, owner)
    if why is not None:
        raise RefusedFile(path, why)
    return st


def open_dir(path: Path | str, owner: int | None = None, dir_fd: int | None = None
             ) -> tuple[int, os.stat_result]:
    """A descriptor of the directory ``path`` (relative to ``dir_fd`` when given), not
    followed if it is a symlink, and its status; RefusedFile when ``owner`` is given and does
    not own it. FileNotFoundError when there is none; SpoolError when it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise SpoolError(f"cannot open directory {path}: {e.strerror}") from None
    st = os.fstat(fd)
    if owner is not None and st.st_uid != owner:
        os.close(fd)
        raise RefusedFile(path, f"owned by uid {st.st_uid}, not by uid {owner}")
    return fd, st


def open_file(name: str, dir_fd: int, owner: int, flags: int = os.O_RDONLY,
              path: Path | str | None = None) -> int:
    """A descriptor of the file ``name`` in the directory ``dir_fd``, checked
    (``check_file``) to be a plain file of ``owner``. FileNotFoundError when there is none;
    RefusedFile when it is not such a file (``path``, default ``name``, names it); SpoolError
    when it cannot be opened."""
    shown = name if path is None else path
    try:
        fd = os.open(name, flags | _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        # ELOOP (a symlink, O_NOFOLLOW), ENXIO (a socket): refused as what they are
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            st = None
        why = refusal(st, owner) if st is not None else None
        if why is not None:
            raise RefusedFile(shown, why) from None
        raise SpoolError(f"cannot open {shown}: {e.strerror}") from None
    try:
        check_file(fd, shown, owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


class UserDir:
    """A directory opened so that nothing in it is trusted: ``O_NOFOLLOW | O_DIRECTORY``,
    checked to be a directory (and owned by ``owner`` when given); every file below it is
    opened, made, renamed and removed relative to its descriptor. A context manager."""

    def __init__(self, path: Path | str, owner: int | None = None, dir_fd: int | None = None):
        self.path = Path(path)
        self.fd, st = open_dir(path, owner, dir_fd)
        self.uid, self.gid = st.st_uid, st.st_gid

    def __enter__(self) -> UserDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def open(self, name: str, flags: int = os.O_RDONLY) -> int:
        """``open_file`` in this directory, for its owner's files."""
        return open_file(name, self.fd, self.uid, flags, self.path / name)

    def create(self, name: str, mode: int = 0o600, flags: int = os.O_WRONLY) -> int:
        """A new, empty file ``name`` for writing (whatever was there is unlinked first),
        owned by the directory's owner: only a file made here is ever written here."""
        self.unlink(name)
        try:
            return self._make(name, mode, flags)
        except FileExistsError:
            raise SpoolError(f"cannot create {self.path / name}: made by someone else "
                             "meanwhile") from None

    def _make(self, name: str, mode: int, flags: int) -> int:
        """``O_CREAT | O_EXCL``: FileExistsError when the name is there."""
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         mode, dir_fd=self.fd)
        except FileExistsError:
            raise
        except OSError as e:
            raise SpoolError(f"cannot create {self.path / name}: {e.strerror}") from None
        try:
            if os.geteuid() == 0 and self.uid != 0:  # root making a user's file: theirs
                os.fchown(fd, self.uid, self.gid)
        except OSError as e:
            os.close(fd)
            self.unlink(name)
            raise SpoolError(f"cannot give {self.path / name} to uid {self.uid}: "
                             f"{e.strerror}") from None
        return fd

    def open_or_create(self, name: str, flags: int = os.O_RDWR, mode: int = 0o600
                       ) -> tuple[int, RefusedFile | None]:
        """A descriptor of ``name``: the file there when it passes ``check_file``, else a new
        one (``_make``; a refused file is unlinked first), and the refusal of the file it
        replaced, if any. A file that another process makes meanwhile is opened, not
        replaced (two shippers must meet on one lock file)."""
        refused = None
        for _ in range(8):  # names made and removed by others meanwhile: look again
            try:
                return self.open(name, flags), refused
            except FileNotFoundError:
                pass
            except RefusedFile as e:
                refused = e
                self.unlink(name)
            try:
                return self._make(name, mode, flags), refused
            except FileExistsError:
                continue
        raise SpoolError(f"cannot open or create {self.path / name}: it keeps changing")

    def replace(self, src: str, dst: str) -> None:
        os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        """Remove the name ``name`` if it is there (a directory is left alone)."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except (FileNotFoundError, IsADirectoryError):
            pass
        except OSError as e:
            raise SpoolError(f"cannot remove {self.path / name}: {e.strerror}") from None

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
