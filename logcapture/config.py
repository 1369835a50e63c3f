"""Configuration: the user's ``.logoptin`` and the administrator's config file.

Two files, two policies (docs/user.md, docs/admin.md):

``.logoptin`` (the user's, read when the job starts)
    Its existence is the opt-in. Its content is YAML: empty means ``mode: enabled``.
    ``load_optin`` never raises for a bad file: whatever is wrong (invalid YAML, an unknown key,
    a bad value, a symlink, a FIFO, a device, a file over 64 KiB, a file owned by someone else,
    a world-writable or unreadable file) the job still runs, logging falls back to the most
    private mode, ``disabled``, and ``OptinResult.problems`` says why, each problem naming the
    file, line, column and key. Values are never quoted back unless they are plainly a typo of
    a valid word: people paste secrets into the wrong place.

Admin config (``/etc/logcapture/config.yaml``, or ``$LOGCAPTURE_CONFIG``)
    ``load_admin`` fails early and precisely: a ``ConfigError`` listing every problem. A missing
    file means the defaults. Each key can be overridden by ``LOGCAPTURE_<KEY>`` in the
    environment (``LOGCAPTURE_FLUSH_INTERVAL=0.5``); environment beats file beats default.
"""

from __future__ import annotations

import errno
import math
import os
import pwd
import re
import stat
from collections import namedtuple
from collections.abc import Callable, Mapping
from pathlib import Path

from .errors import ConfigError, typo_of
from .records import DISABLED, ENABLED, MODES
from .redact import pattern_of

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: this module is on every job's start path
if TYPE_CHECKING:
    from typing import Any

    Schema = dict[str, Callable[[Any], Any]]  # a check takes a yaml.Node

OPTIN_ENV = "LOGCAPTURE_OPTIN"
OPTIN_NAME = ".logoptin"
OPTIN_MAX_BYTES = 65536
OPTIN_KEYS = ("mode", "streams", "notify", "mail", "redact")
# ``streams``: how the job's stdout and stderr are captured (runner.same_destination).
# ``auto``: one terminal for both when they go to the same place (the order of their writes
# is then kept there, as without logcapture), two otherwise; ``separate``: always two, so the
# log keeps stderr apart, at the price of that order where they share a place. There is no
# choice that merges streams going to different places: that would change what reaches them.
STREAMS_AUTO = "auto"
STREAMS_SEPARATE = "separate"
STREAMS_CHOICES = (STREAMS_AUTO, STREAMS_SEPARATE)
# The events a user may ask a message for (logcapture.insights.notify).
NOTIFY_EVENTS = ("failed", "stalled", "nan-metric")

ADMIN_ENV = "LOGCAPTURE_CONFIG"
ADMIN_DEFAULT_PATH = "/etc/logcapture/config.yaml"
ADMIN_MAX_BYTES = 1 << 20

# What the wrapper should add after the problems of a refused .logoptin.
FALLBACK_MESSAGE = (
    "logcapture: because of the problem(s) above this job is logged in mode 'disabled' "
    "(only /LOGCOMMAND lines are kept); run 'logcapture check' to see every problem"
)


class _LazyYaml:
    """Stands for the ``yaml`` module until first used: the first attribute asked of it
    imports PyYAML and puts the real module in its place. PyYAML costs ~12 ms of CPU to
    import, and the wrapper of every job reads config files that are usually absent or
    empty."""

    def __getattr__(self, name: str) -> Any:
        import yaml as module

        globals()["yaml"] = module
        return getattr(module, name)


yaml: Any = _LazyYaml()

_STR = "tag:yaml.org,2002:str"
_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"

# YAML 1.1 reads these unquoted words as booleans: ``mode: off`` is ``mode: false``.
_YAML_FALSE = {"off", "no", "false", "n"}
_YAML_TRUE = {"on", "yes", "true", "y"}


# ----------------------------------------------------------------------------------- .logoptin


# The configuration types are named tuples, as the records are (records.py says why).


class OptinConfig(namedtuple("OptinConfig", ("mode", "streams", "notify", "mail", "redact"),
                             defaults=(ENABLED, STREAMS_AUTO, (), None, ()))):
    """The user's settings: ``mode`` (the cluster guide's option), ``streams``
    (``STREAMS_CHOICES``); ``notify``, the events a short message is sent for
    (``NOTIFY_EVENTS``); ``mail``, where it goes (default: the user's own mailbox, as Slurm's
    --mail-user); ``redact``, the user's own secrets to redact, as given (literals and
    ``/REGEX/``: ``redact.pattern_of``)."""

    __slots__ = ()
    if TYPE_CHECKING:
        mode: str
        streams: str
        notify: tuple[str, ...]
        mail: str | None
        redact: tuple[str, ...]


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


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


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
    values, problems = _parse(name, data, _OPTIN_SCHEMA, located)
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
        kind = _file_kind(st.st_mode)
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


# ------------------------------------------------------------------------------ YAML checking


class _Problem(Exception):
    """One problem with one value; raised by value checkers, collected by ``_parse``.
    ``node``: the part of the value it is about, when not all of it (an item of a list)."""

    def __init__(self, message: str, node: yaml.Node | None = None):
        super().__init__(message)
        self.node = node


def _where(name: str, node: yaml.Node | None) -> str:
    if node is None:
        return name
    mark = node.start_mark
    return f"{name}:{mark.line + 1}:{mark.column + 1}"


def _node_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return {
        _NULL: "nothing (null)",
        _BOOL: "a boolean",
        _INT: "an integer",
        _FLOAT: "a number",
        _STR: "a string",
    }.get(node.tag, "a tagged value")


def _construct(node: yaml.Node) -> Any:
    """The Python value of one plain scalar node (safe tags only)."""
    return yaml.SafeLoader(" ").construct_object(node, deep=True)


def _choice(choices: tuple[str, ...]) -> Callable[[yaml.Node], Any]:
    def check(node: yaml.Node) -> Any:
        listed = ", ".join(choices)
        if not isinstance(node, yaml.ScalarNode) or node.tag != _STR:
            hint = ""
            if isinstance(node, yaml.ScalarNode) and node.style is None:
                raw = node.value.lower()
                if raw in _YAML_FALSE and DISABLED in choices:
                    hint = (f"; YAML reads a bare {node.value} as the boolean false: "
                            f"did you mean {DISABLED}?")
                elif raw in _YAML_TRUE and ENABLED in choices:
                    hint = (f"; YAML reads a bare {node.value} as the boolean true: "
                            f"did you mean {ENABLED}?")
            raise _Problem(f"must be one of {listed}, not {_node_kind(node)}{hint}")
        if node.value in choices:
            return node.value
        typo = typo_of(node.value, choices)
        if typo is not None:
            raise _Problem(f"must be one of {listed}, not {node.value!r} (did you mean {typo}?)")
        raise _Problem(f"must be one of {listed}; the value given is not one of them "
                       "(not repeated here in case it is a secret)")
    return check


def _string(node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode) or node.tag != _STR:
        raise _Problem(f"must be a string, not {_node_kind(node)}")
    if not node.value:
        raise _Problem("must not be empty")
    return node.value


def _positive_number(node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode) or node.tag not in (_INT, _FLOAT):
        raise _Problem(f"must be a number of seconds greater than 0, not {_node_kind(node)}")
    value = float(_construct(node))
    if not math.isfinite(value) or value <= 0:
        raise _Problem("must be a finite number of seconds greater than 0")
    return value


def _positive_int(node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode) or node.tag != _INT:
        raise _Problem(f"must be a whole number greater than 0, not {_node_kind(node)}")
    value = int(_construct(node))
    if value <= 0:
        raise _Problem("must be a whole number greater than 0")
    return value


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%|[KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _size_or_percent(node: yaml.Node) -> Any:
    """Bytes (``1048576``, ``512M``, ``2GiB``: binary units) or a share of a filesystem
    (``5%``), as journald.conf(5) takes SystemKeepFree=; kept as given, resolved against the
    filesystem when used (``keep_free_bytes``)."""
    text = str(node.value).strip() if isinstance(node, yaml.ScalarNode) else ""
    m = _SIZE_RE.match(text)
    if not m:
        raise _Problem("must be bytes (1048576, 512M, 2G) or a percentage of the spool's "
                       f"filesystem (5%), not {_node_kind(node) if not text else text!r}")
    if m.group(2) == "%" and float(m.group(1)) >= 100:
        raise _Problem(f"a percentage must be under 100, not {text}")
    return text


def keep_free_bytes(setting: str | int | None, path: str | os.PathLike[str]) -> int:
    """``spool_keep_free`` in bytes for the filesystem holding ``path`` (0 when unset)."""
    m = _SIZE_RE.match(str(setting or 0))
    if not m:
        return 0
    number, unit = float(m.group(1)), (m.group(2) or "").lower()
    if unit == "%":
        try:
            st = os.statvfs(path)
        except OSError:
            return 0
        return int(st.f_blocks * st.f_frsize * number / 100)
    return int(number * _SIZE_UNITS[unit[:1]])


def _dsn(node: yaml.Node) -> Any:
    # A DSN may carry a password: never quote it back.
    if not isinstance(node, yaml.ScalarNode) or node.tag != _STR:
        raise _Problem(f"must be a DSN string (chdb://PATH, http(s)://HOST:PORT), "
                       f"not {_node_kind(node)}")
    scheme, sep, _ = node.value.partition("://")
    if not sep or scheme.lower() not in _DSN_SCHEMES:
        raise _Problem("must be a DSN starting with chdb://, http:// or https:// "
                       "(the value is not repeated here: it may hold a password)")
    return node.value


_DSN_SCHEMES = ("chdb", "http", "https")


def _bounded(low: float, high: float, what: str) -> Callable[[yaml.Node], Any]:
    """A number from ``low`` to ``high`` (inclusive)."""
    def check(node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode) or node.tag not in (_INT, _FLOAT):
            raise _Problem(f"must be {what} from {low:g} to {high:g}, not {_node_kind(node)}")
        value = float(_construct(node))
        if not math.isfinite(value) or not low <= value <= high:
            raise _Problem(f"must be {what} from {low:g} to {high:g}, not {node.value}")
        return value
    return check


def _absolute_path(node: yaml.Node) -> Any:
    value = _string(node)
    if not value.startswith("/"):
        raise _Problem(f"must be an absolute path (like /usr/bin/mail), not {value!r}")
    return value


def _webhook(node: yaml.Node) -> Any:
    # A webhook URL often carries its token: never quote it back.
    value = _string(node)
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest:
        raise _Problem("must be an http:// or https:// URL (the value is not repeated here: "
                       "it may hold a token)")
    return value


def _events(node: yaml.Node) -> Any:
    """A list of NOTIFY_EVENTS (a single event may be given bare)."""
    listed = ", ".join(NOTIFY_EVENTS)
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    out: list[str] = []
    for item in items:
        if not isinstance(item, yaml.ScalarNode) or item.tag != _STR:
            raise _Problem(f"must be a list of events ({listed}), not a list holding "
                           f"{_node_kind(item)}")
        if item.value not in NOTIFY_EVENTS:
            typo = typo_of(item.value, NOTIFY_EVENTS)
            said = f" {item.value!r} (did you mean {typo}?)" if typo else ""
            raise _Problem(f"unknown event{said}; the events are {listed}")
        if item.value not in out:
            out.append(item.value)
    return tuple(out)


_MAIL = re.compile(r"[A-Za-z0-9_.+-]+(?:@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)?")


def _mail(node: yaml.Node) -> Any:
    value = _string(node)
    if not _MAIL.fullmatch(value) or value.startswith("-"):
        raise _Problem("must be a mail address (name@example.org) or a local user name "
                       "(the value is not repeated here)")
    return value



def _streams(node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode) and node.tag == _STR and node.value.strip().lower() in (
            "merged", "merge", "combined", "one"):
        raise _Problem(
            f"must be one of {', '.join(STREAMS_CHOICES)}, not {node.value!r}: stdout and "
            "stderr are captured as one stream whenever they go to the same place (auto); "
            "to merge them, send both to one place (2>&1, or no #SBATCH -e)")
    return _choice(STREAMS_CHOICES)(node)


def _redact_list(node: yaml.Node) -> Any:
    """A list of secrets to redact: literals and ``/REGEX/`` (a single one may be given
    bare). Each is checked as the redact stage will read it; none is quoted back."""
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    out: list[str] = []
    for n, item in enumerate(items, 1):
        if not isinstance(item, yaml.ScalarNode) or item.tag not in (_STR, _INT, _FLOAT):
            raise _Problem(f"item {n}: must be a string (a literal, or /REGEX/), not "
                           f"{_node_kind(item)}", item)
        try:
            pattern_of(item.value)
        except ValueError as e:
            raise _Problem(f"item {n}: {e}", item) from None
        if item.value not in out:
            out.append(item.value)
    return tuple(out)


_OPTIN_SCHEMA: Schema = {"mode": _choice(MODES), "streams": _streams, "notify": _events,
                         "mail": _mail, "redact": _redact_list}

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_QUOTED = re.compile(r"'([^']*)'|\"([^\"]*)\"")


def _scrub(text: str) -> str:
    """PyYAML's messages sometimes quote the file (tag and alias names): keep only quotes of a
    single character or of a token name like '<block end>'."""
    def repl(m: re.Match[str]) -> str:
        inner = m.group(1) if m.group(1) is not None else m.group(2)
        if len(inner) <= 2 or re.fullmatch(r"<[a-z ]+>", inner):
            return m.group(0)
        return "'…'"
    return _QUOTED.sub(repl, text or "")


def _line_col_of_byte(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return line, column


def _line_col_of_char(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


class _Located(Exception):
    """A problem of a whole file, and where it is when known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


def _compose(data: bytes) -> yaml.Node | None:
    """The YAML node tree of ``data`` (UTF-8, a BOM allowed); ``_Located`` when it is not
    text or not YAML, with PyYAML's explanation in plain words."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _Located("is not valid UTF-8 (bad byte here)",
                       *_line_col_of_byte(data, e.start)) from None
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        message = _scrub(e.problem or e.context or "invalid YAML")
        if e.context and e.problem and e.problem.startswith("but "):
            message = f"{_scrub(e.context)}, {message}"
        elif e.context and e.problem:
            message = f"{message} ({_scrub(e.context)}"
            if e.context_mark is not None:
                message += f" at line {e.context_mark.line + 1}"
            message += ")"
        if mark is None:
            raise _Located(f"invalid YAML: {message}") from None
        raise _Located(f"invalid YAML: {message}", mark.line + 1, mark.column + 1) from None
    except yaml.reader.ReaderError as e:
        raise _Located(f"invalid YAML: character #x{e.character:04x} is not allowed in YAML",
                       *_line_col_of_char(text, e.position)) from None
    except yaml.YAMLError as e:  # pragma: no cover - every PyYAML error is one of the above
        raise _Located(f"invalid YAML: {type(e).__name__}") from None
    except RecursionError:
        raise _Located("invalid YAML: nested too deeply") from None


def _parse(name: str, data: bytes, schema: Schema,
           problems_out: list[tuple[str, int | None, int | None, str | None]] | None = None,
           quote_names: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Validate a YAML mapping against ``schema``: (values found, problems). Every problem is
    found, not only the first; each names file, line, column and key. ``problems_out``, when
    given, also receives (message, line, column, key) tuples. Unknown keys are quoted back only
    when they are a typo of a known key, or with ``quote_names`` when they look like a name."""
    problems: list[str] = []
    located = problems_out if problems_out is not None else []

    def add(message: str, line: int | None = None, column: int | None = None,
            key: str | None = None) -> None:
        where = name if line is None else f"{name}:{line}:{column}"
        problems.append(f"{where}: {message}")
        located.append((problems[-1], line, column, key))

    try:
        root = _compose(data)
    except _Located as e:
        add(e.message, e.line, e.column)
        return {}, problems

    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == _NULL):
        return {}, problems  # empty file (or only comments): the defaults
    if not isinstance(root, yaml.MappingNode):
        mark = root.start_mark
        add(f"must be a mapping of option: value (like 'mode: enabled'), not {_node_kind(root)}",
            mark.line + 1, mark.column + 1)
        return {}, problems

    known = tuple(schema)
    values: dict[str, Any] = {}
    seen: dict[str, int] = {}
    for key_node, value_node in root.value:
        kmark = key_node.start_mark
        kline, kcol = kmark.line + 1, kmark.column + 1
        if not isinstance(key_node, yaml.ScalarNode):
            add(f"a key must be a plain name, not {_node_kind(key_node)}; "
                f"known keys: {', '.join(known)}", kline, kcol)
            continue
        key = key_node.value
        if key not in schema:
            typo = typo_of(key, known)
            if typo is not None:
                add(f"unknown key {key!r} (did you mean {typo!r}?)", kline, kcol, key)
            elif quote_names and _NAME.fullmatch(key):
                add(f"unknown key {key!r}; known keys: {', '.join(known)}", kline, kcol, key)
            else:
                add(f"unknown key (not repeated here in case it is a secret); "
                    f"known keys: {', '.join(known)}", kline, kcol)
            continue
        if key in seen:
            add(f"key {key!r}: given twice (first at line {seen[key]})", kline, kcol, key)
            continue
        seen[key] = kline
        try:
            values[key] = schema[key](value_node)
        except _Problem as e:
            vmark = (e.node or value_node).start_mark
            add(f"key {key!r}: {e}", vmark.line + 1, vmark.column + 1, key)
        except (ValueError, OverflowError, yaml.YAMLError):
            vmark = value_node.start_mark
            add(f"key {key!r}: not a valid value", vmark.line + 1, vmark.column + 1, key)
    return values, problems


# ------------------------------------------------------------------------------ admin config


_GLOB = re.compile(r"[A-Za-z0-9_*?\[\]!-]+")


def _variable_globs(node: yaml.Node) -> Any:
    """A list of environment variable names, shell globs allowed (``*_SECRET``)."""
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    out: list[str] = []
    for n, item in enumerate(items, 1):
        if not isinstance(item, yaml.ScalarNode) or item.tag != _STR \
                or not _GLOB.fullmatch(item.value):
            raise _Problem(f"item {n}: must be a variable name or a glob like *_SECRET "
                           "(letters, digits, _, *, ?, [])", item)
        out.append(item.value)
    return tuple(out)


_ADMIN_DEFAULTS = {
    "store": None,
    "spool_root": None,
    "sample_interval": 10.0,  # seconds between resource samples
    "retention_days": 90,  # the store's TTL
    "cluster": "",  # the cluster's name in records; "" = Slurm's ClusterName when known
    "flush_interval": 0.5,  # seconds between spool flushes (a quiet line lands within 1 s)
    "flush_records": 1000,  # flush after this many buffered records
    "segment_bytes": 8 * 1024 * 1024,  # rotate spool segments at this size
    # Free space the spool leaves on its filesystem (bytes, 512M, or 5%): below it no more
    # lines are stored, with a note (journald's SystemKeepFree=).
    "spool_keep_free": "0",
    # The bound on what one run stores (logcapture.limit): characters of output text, the
    # lines kept at the end past it, metadata rows.
    "job_output_limit": 2 * 1024 ** 3,
    "job_output_tail": 1000,
    "job_metadata_limit": 1_000_000,
    # Bytes of output lines one user's runs may add to the store in a UTC day (0: no bound),
    # enforced by the shipper where it writes the store; the lines stay in the spool.
    "user_daily_bytes": 0,
    # Efficiency notes (logcapture.insights.efficiency): when a run's figures earn one.
    "insight_gpu_idle_percent": 10.0,  # GPUs whose mean utilisation is under this are idle
    "insight_gpu_memory_used_fraction": 0.25,  # peak GPU memory under this share: unused
    "insight_cpu_efficiency_low": 0.25,  # CPU time / (cores x wall time) under this: low
    "insight_memory_overrequest_factor": 4.0,  # memory requested over this x the peak used
    "insight_time_limit_overrequest_factor": 4.0,  # time limit over this x the run time
    "insight_min_seconds": 600.0,  # shorter runs get no efficiency notes
    # While a job runs (the agent): no new output for this long while it runs is a stall.
    "stall_seconds": 1800.0,
    # Messages users ask for in .logoptin: Slurm's MailProg convention (-s SUBJECT ADDRESS,
    # body on stdin) and a webhook every message is also posted to (none by default).
    "mail_prog": "/usr/bin/mail",
    "notify_webhook": None,
    "reader_socket": None,  # the read service's socket (None: /run/logcapture/reader.sock)
    "admin_group": None,  # members read every user's runs through the read service
    # The read service's limits (None: its defaults, logcapture.reader.server's constants).
    "reader_max_clients": None,  # connections answered at once, in all
    "reader_max_clients_per_user": None,  # ... from one uid
    "reader_max_follows_per_user": None,  # ... from one uid following a run (logs -f)
    "reader_request_timeout": None,  # seconds a connection may take to send its request
    # Secrets (logcapture.redact): variable names (globs) whose values are redacted, beyond
    # redact.DEFAULT_VARIABLES, and literals or /REGEX/ redacted in every job's output.
    "redact_variables": (),
    "redact_patterns": (),
}


# The fields come from _ADMIN_DEFAULTS (one list of keys and defaults); mypy wants literals.
class AdminConfig(namedtuple("AdminConfig", tuple(_ADMIN_DEFAULTS),  # type: ignore[misc]
                             defaults=tuple(_ADMIN_DEFAULTS.values()))):  # type: ignore[misc]
    """The administrator's settings (``/etc/logcapture/config.yaml``).

    ``store``: the ClickHouse DSN (``chdb://PATH`` for the embedded engine, ``http(s)://...``
    for a server); None means the embedded default. ``spool_root``: where the nodes' Slurm
    jobs spool; None means ``/var/spool/logcapture`` (``spool.default_root``).
    """

    __slots__ = ()
    if TYPE_CHECKING:
        store: str | None
        spool_root: str | None
        sample_interval: float
        retention_days: int
        cluster: str
        flush_interval: float
        flush_records: int
        segment_bytes: int
        spool_keep_free: str
        job_output_limit: int
        job_output_tail: int
        job_metadata_limit: int
        user_daily_bytes: int
        insight_gpu_idle_percent: float
        insight_gpu_memory_used_fraction: float
        insight_cpu_efficiency_low: float
        insight_memory_overrequest_factor: float
        insight_time_limit_overrequest_factor: float
        insight_min_seconds: float
        stall_seconds: float
        mail_prog: str
        notify_webhook: str | None
        reader_socket: str | None
        admin_group: str | None
        reader_max_clients: int | None
        reader_max_clients_per_user: int | None
        reader_max_follows_per_user: int | None
        reader_request_timeout: float | None
        redact_variables: tuple[str, ...]
        redact_patterns: tuple[str, ...]


_ADMIN_SCHEMA: Schema = {
    "store": _dsn,
    "spool_root": _string,
    "sample_interval": _positive_number,
    "retention_days": _positive_int,
    "cluster": _string,
    "flush_interval": _positive_number,
    "flush_records": _positive_int,
    "segment_bytes": _positive_int,
    "spool_keep_free": _size_or_percent,
    "job_output_limit": _positive_int,
    "job_output_tail": _positive_int,
    "job_metadata_limit": _positive_int,
    "user_daily_bytes": _bounded(0, 2.0 ** 62, "a number of bytes"),
    "insight_gpu_idle_percent": _bounded(0.0, 100.0, "a percentage"),
    "insight_gpu_memory_used_fraction": _bounded(0.0, 1.0, "a fraction"),
    "insight_cpu_efficiency_low": _bounded(0.0, 1.0, "a fraction"),
    "insight_memory_overrequest_factor": _bounded(1.0, 1000.0, "a factor"),
    "insight_time_limit_overrequest_factor": _bounded(1.0, 1000.0, "a factor"),
    "insight_min_seconds": _positive_number,
    "stall_seconds": _positive_number,
    "mail_prog": _absolute_path,
    "notify_webhook": _webhook,
    "reader_socket": _string,
    "admin_group": _string,
    "reader_max_clients": _positive_int,
    "reader_max_clients_per_user": _positive_int,
    "reader_max_follows_per_user": _positive_int,
    "reader_request_timeout": _positive_number,
    "redact_variables": _variable_globs,
    "redact_patterns": _redact_list,
}


def admin_path(env: Mapping[str, str] = os.environ) -> Path:
    return Path(env.get(ADMIN_ENV) or ADMIN_DEFAULT_PATH)


def _env_name(key: str) -> str:
    return "LOGCAPTURE_" + key.upper()


def load_admin(path: Path | str | None = None,
               env: Mapping[str, str] = os.environ) -> AdminConfig:
    """The admin config: defaults, then the file (``path``, else ``$LOGCAPTURE_CONFIG``, else
    ``/etc/logcapture/config.yaml``; a missing file is fine), then ``LOGCAPTURE_<KEY>``
    variables. Raises ``ConfigError`` listing every problem, the first one's line, column and
    key in its attributes."""
    file = Path(path) if path is not None else admin_path(env)
    name = str(file)
    values: dict[str, Any] = {}
    located: list[tuple[str, int | None, int | None, str | None]] = []
    problems: list[str] = []
    data: bytes | None = None
    try:
        # O_NONBLOCK: a FIFO in the config's place must not hang every job.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        with open(fd, "rb") as f:
            kind = os.fstat(fd).st_mode
            if not stat.S_ISREG(kind):
                raise ConfigError(f"{name}: is {_file_kind(kind)}, not a config file", path=name)
            data = f.read(ADMIN_MAX_BYTES + 1)
    except FileNotFoundError:
        data = None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory, not a config file", path=name) from None
    except OSError as e:
        raise ConfigError(f"{name}: cannot be read: {e.strerror or e}", path=name) from None
    if data is not None:
        if len(data) > ADMIN_MAX_BYTES:
            raise ConfigError(f"{name}: is larger than {ADMIN_MAX_BYTES} bytes", path=name)
        values, problems = _parse(name, data, _ADMIN_SCHEMA, located, quote_names=True)

    for key, check in _ADMIN_SCHEMA.items():
        var = _env_name(key)
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        node = yaml.ScalarNode(_STR, raw)
        if check not in (_string, _dsn, _absolute_path, _webhook, _redact_list,
                         _variable_globs):
            node = _resolve_scalar(raw)
        try:
            values[key] = check(node)
        except (_Problem, ValueError, OverflowError, yaml.YAMLError) as e:
            detail = str(e) if isinstance(e, _Problem) else "not a valid value"
            message = f"environment variable {var}: {detail}"
            problems.append(message)
            located.append((message, None, None, key))

    if problems:
        first = located[0] if located else (problems[0], None, None, None)
        summary = problems[0] if len(problems) == 1 else (
            f"{len(problems)} problems in the logcapture configuration:\n  "
            + "\n  ".join(problems))
        raise ConfigError(summary, path=name, line=first[1], column=first[2], key=first[3],
                          problems=problems)
    return AdminConfig(**values)


def _resolve_scalar(raw: str) -> yaml.ScalarNode:
    """A plain scalar node for an environment value, its tag resolved as YAML would."""
    tag = yaml.SafeLoader(" ").resolve(yaml.ScalarNode, raw, (True, False))
    return yaml.ScalarNode(tag, raw)


def admin_defaults() -> dict[str, Any]:
    """The default admin settings, by key (for documentation and ``logcapture config``)."""
    return dict(AdminConfig._field_defaults)
