"""The user's ``.logoptin`` (docs/user.md), read when the job starts.

Its existence is the opt-in. Its content is YAML: empty means ``mode: enabled``. ``load_optin``
never raises for a bad file: whatever is wrong (invalid YAML, an unknown key, a bad value, a
symlink, a FIFO, a device, a file over 64 KiB, a file owned by someone else, a world-writable
or unreadable file) the job still runs, logging falls back to the most private mode,
``disabled``, and ``OptinResult.problems`` says why, each problem naming the file, line, column
and key.
"""

from __future__ import annotations

import errno
import os
import pwd
import re
import stat
from collections import namedtuple
from collections.abc import Mapping
from pathlib import Path

from ..errors import typo_of
from ..records import DISABLED, ENABLED, MODES
from .checking import (
    BOOL,
    STR,
    Problem,
    choice,
    construct,
    file_kind,
    node_kind,
    parse,
    redact_list,
    string,
    yaml,
)

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: this module is on every job's start path
if TYPE_CHECKING:
    from typing import Any

    from .checking import Schema

OPTIN_ENV = "LOGCAPTURE_OPTIN"
OPTIN_NAME = ".logoptin"
OPTIN_MAX_BYTES = 65536
OPTIN_KEYS = ("mode", "streams", "notify", "mail", "redact", "interactive")
# ``streams``: how the job's stdout and stderr are captured (runner.descriptors.same_destination).
# ``auto``: one terminal for both when they go to the same place (the order of their writes
# is then kept there, as without logcapture), two otherwise; ``separate``: always two, so the
# log keeps stderr apart, at the price of that order where they share a place. There is no
# choice that merges streams going to different places: that would change what reaches them.
STREAMS_AUTO = "auto"
STREAMS_SEPARATE = "separate"
STREAMS_CHOICES = (STREAMS_AUTO, STREAMS_SEPARATE)
# The events a user may ask a message for (logcapture.insights.notify).
NOTIFY_EVENTS = ("failed", "stalled", "nan-metric")


# What the wrapper should add after the problems of a refused .logoptin.
FALLBACK_MESSAGE = (
    "logcapture: because of the problem(s) above this job is logged in mode 'disabled' "
    "(only /LOGCOMMAND lines are kept); run 'logcapture check' to see every problem"
)


class OptinConfig(namedtuple("OptinConfig", ("mode", "streams", "notify", "mail", "redact",
                                            "interactive"),
                             defaults=(ENABLED, STREAMS_AUTO, (), None, (), False))):
    """The user's settings: ``mode`` (the cluster guide's option), ``streams``
    (``STREAMS_CHOICES``); ``notify``, the events a short message is sent for
    (``NOTIFY_EVENTS``); ``mail``, where it goes (default: the user's own mailbox, as Slurm's
    --mail-user); ``redact``, the user's own secrets to redact, as given (literals and
    ``/REGEX/``: ``redact.pattern_of``); ``interactive``, whether interactive steps
    (``srun --pty``, ``salloc``'s shell) are captured too (``slurm.interactive``)."""

    __slots__ = ()
    if TYPE_CHECKING:
        mode: str
        streams: str
        notify: tuple[str, ...]
        mail: str | None
        redact: tuple[str, ...]
        interactive: bool


class OptinResult(namedtuple("OptinResult", ("opted_in", "config", "problems", "warnings"),
                             defaults=((),))):
    """What ``load_optin`` found.

    ``opted_in`` is False when there is no ``.logoptin`` (then nothing is captured at all);
    ``config`` is the effective configuration, mode ``disabled`` whenever ``problems`` is not
    empty; each problem is a complete message naming the file (and line, column and key where
    there is one). ``opted_in`` can be False with a problem when the file's existence could
    not even be checked (a home directory the user cannot search). ``warnings``: problems
    that change nothing but themselves: a bad ``redact`` entry is ignored and the default
    redaction applies (a secret list must not turn the user's logging off).
    """

    __slots__ = ()
    if TYPE_CHECKING:
        opted_in: bool
        config: OptinConfig
        problems: list[str]

    @property
    def ok(self) -> bool:
        return self.opted_in and not self.problems


def optin_path(env: Mapping[str, str] = os.environ) -> Path:
    """``$LOGCAPTURE_OPTIN`` if set and not empty, else ``$HOME/.logoptin`` (the passwd home
    directory when ``HOME`` is unset)."""
    explicit = env.get(OPTIN_ENV)
    if explicit:
        return Path(explicit)
    home = env.get("HOME")
    if not home:
        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            home = "/"
    return Path(home) / OPTIN_NAME


def _refused(problems: list[str], opted_in: bool = True) -> OptinResult:
    return OptinResult(opted_in=opted_in, config=OptinConfig(mode=DISABLED), problems=problems)


def load_optin(path: Path | str, uid: int | None = None) -> OptinResult:
    """Read and validate a ``.logoptin``; never raises for a bad file.

    ``uid`` is the job user's uid (default: ours); the file must belong to that user. The file
    is checked with ``lstat`` before it is opened (so a device or FIFO is never even opened),
    then opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked again with ``fstat`` (so swapping
    the file between the two checks does not help either).
    """
    name = str(path)
    try:
        data = _read_optin(path, name, os.getuid() if uid is None else uid)
    except _Answer as answer:
        return answer.result
    if len(data) > OPTIN_MAX_BYTES:
        return _refused([f"{name}: is larger than {OPTIN_MAX_BYTES} bytes "
                               f"({OPTIN_MAX_BYTES // 1024} KiB), the limit for {OPTIN_NAME}"])
    if not data.strip(b" \n"):  # empty means mode: enabled (no YAML to parse)
        return OptinResult(opted_in=True, config=OptinConfig(), problems=[])
    located: list[tuple[str, int | None, int | None, str | None]] = []
    values, problems = parse(name, data, _OPTIN_SCHEMA, located)
    soft = {msg for msg, _, _, key in located if key == "redact"}
    if any(p not in soft for p in problems):
        return _refused(problems)
    warnings = tuple(f"{p}; the default redaction applies" for p in problems)
    return OptinResult(opted_in=True, config=OptinConfig(**values), problems=[],
                       warnings=warnings)


class _Answer(Exception):
    """``load_optin``'s result, known before the file's content is read."""

    def __init__(self, result: OptinResult):
        super().__init__()
        self.result = result


def _absent() -> OptinResult:
    return OptinResult(opted_in=False, config=OptinConfig(mode=DISABLED), problems=[])


def _read_optin(path: Path | str, name: str, uid: int) -> bytes:
    """The file's first ``OPTIN_MAX_BYTES + 1`` bytes once it passed the checks (``_Answer``
    when it is absent, or refused and why)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise _Answer(_absent()) from None
    except OSError as e:
        # Existence unknown (e.g. a home directory we may not search): not opted in, but say so.
        raise _Answer(_refused([f"{name}: cannot be checked: {e.strerror or e}; logging is off"],
                               opted_in=False)) from None
    problem = _check_stat(name, st, uid)
    if problem:
        raise _Answer(_refused([problem]))
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _Answer(_refused([f"{name}: is a symbolic link; {OPTIN_NAME} must be a "
                                    "regular file (symlinks are refused)"])) from None
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            raise _Answer(_absent()) from None
        raise _Answer(_refused([f"{name}: cannot be read: {e.strerror or e}"])) from None
    try:
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise _Answer(_refused([f"{name}: was replaced while being opened; try again"]))
        problem = _check_stat(name, fst, uid)
        if problem:
            raise _Answer(_refused([problem]))
        chunks: list[bytes] = []
        total = 0
        while total <= OPTIN_MAX_BYTES:
            chunk = os.read(fd, OPTIN_MAX_BYTES + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise _Answer(_refused([f"{name}: cannot be read: {e.strerror or e}"])) from None
    finally:
        os.close(fd)


def _check_stat(name: str, st: os.stat_result, uid: int) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        kind = file_kind(st.st_mode)
        why = " (symlinks are refused)" if stat.S_ISLNK(st.st_mode) else ""
        return f"{name}: is {kind}; {OPTIN_NAME} must be a regular file{why}"
    if st.st_uid != uid:
        return (f"{name}: is owned by uid {st.st_uid}, not by the job's user (uid {uid}); "
                f"only your own {OPTIN_NAME} is used")
    if st.st_mode & stat.S_IWOTH:
        return (f"{name}: is writable by everyone (anybody could change your logging mode); "
                f"fix it with: chmod o-w {name}")
    if st.st_size > OPTIN_MAX_BYTES:
        return (f"{name}: is larger than {OPTIN_MAX_BYTES} bytes ({OPTIN_MAX_BYTES // 1024} KiB), "
                f"the limit for {OPTIN_NAME} ({st.st_size} bytes)")
    return None


def _events(node: yaml.Node) -> Any:
    """A list of NOTIFY_EVENTS (a single event may be given bare)."""
    listed = ", ".join(NOTIFY_EVENTS)
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    out: list[str] = []
    for item in items:
        if not isinstance(item, yaml.ScalarNode) or item.tag != STR:
            raise Problem(f"must be a list of events ({listed}), not a list holding "
                           f"{node_kind(item)}")
        if item.value not in NOTIFY_EVENTS:
            typo = typo_of(item.value, NOTIFY_EVENTS)
            said = f" {item.value!r} (did you mean {typo}?)" if typo else ""
            raise Problem(f"unknown event{said}; the events are {listed}")
        if item.value not in out:
            out.append(item.value)
    return tuple(out)


_MAIL = re.compile(r"[A-Za-z0-9_.+-]+(?:@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)?")


def _mail(node: yaml.Node) -> Any:
    value = string(node)
    if not _MAIL.fullmatch(value) or value.startswith("-"):
        raise Problem("must be a mail address (name@example.org) or a local user name "
                       "(the value is not repeated here)")
    return value



def _streams(node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode) and node.tag == STR and node.value.strip().lower() in (
            "merged", "merge", "combined", "one"):
        raise Problem(
            f"must be one of {', '.join(STREAMS_CHOICES)}, not {node.value!r}: stdout and "
            "stderr are captured as one stream whenever they go to the same place (auto); "
            "to merge them, send both to one place (2>&1, or no #SBATCH -e)")
    return choice(STREAMS_CHOICES)(node)


def _boolean(node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode) or node.tag != BOOL:
        raise Problem(f"must be true or false, not {node_kind(node)}")
    return bool(construct(node))


_OPTIN_SCHEMA: Schema = {"mode": choice(MODES), "streams": _streams, "notify": _events,
                         "mail": _mail, "redact": redact_list, "interactive": _boolean}
