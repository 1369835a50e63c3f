"""Reading a YAML config file against a schema: every value checked by its key's check, every
problem named with the file, line, column and key, and values never quoted back unless they are
plainly a typo of a valid word (people paste secrets into the wrong place). PyYAML is imported on
first use (``yaml``). Used by ``optin`` and ``admin``.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable

from ..errors import typo_of
from ..records import DISABLED, ENABLED
from ..redact import pattern_of

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: this module is on every job's start path
if TYPE_CHECKING:
    from typing import Any

    Schema = dict[str, Callable[[Any], Any]]  # a check takes a yaml.Node

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

STR = "tag:yaml.org,2002:str"
NULL = "tag:yaml.org,2002:null"
BOOL = "tag:yaml.org,2002:bool"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"

# YAML 1.1 reads these unquoted words as booleans: ``mode: off`` is ``mode: false``.
_YAML_FALSE = {"off", "no", "false", "n"}
_YAML_TRUE = {"on", "yes", "true", "y"}


def file_kind(mode: int) -> str:
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


# ------------------------------------------------------------------------------ YAML checking


class Problem(Exception):
    """One problem with one value; raised by value checkers, collected by ``parse``.
    ``node``: the part of the value it is about, when not all of it (an item of a list)."""

    def __init__(self, message: str, node: yaml.Node | None = None):
        super().__init__(message)
        self.node = node


def where(name: str, node: yaml.Node | None) -> str:
    if node is None:
        return name
    mark = node.start_mark
    return f"{name}:{mark.line + 1}:{mark.column + 1}"


def node_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return {
        NULL: "nothing (null)",
        BOOL: "a boolean",
        INT: "an integer",
        FLOAT: "a number",
        STR: "a string",
    }.get(node.tag, "a tagged value")


def construct(node: yaml.Node) -> Any:
    """The Python value of one plain scalar node (safe tags only)."""
    return yaml.SafeLoader(" ").construct_object(node, deep=True)


def choice(choices: tuple[str, ...]) -> Callable[[yaml.Node], Any]:
    def check(node: yaml.Node) -> Any:
        listed = ", ".join(choices)
        if not isinstance(node, yaml.ScalarNode) or node.tag != STR:
            hint = ""
            if isinstance(node, yaml.ScalarNode) and node.style is None:
                raw = node.value.lower()
                if raw in _YAML_FALSE and DISABLED in choices:
                    hint = (f"; YAML reads a bare {node.value} as the boolean false: "
                            f"did you mean {DISABLED}?")
                elif raw in _YAML_TRUE and ENABLED in choices:
                    hint = (f"; YAML reads a bare {node.value} as the boolean true: "
                            f"did you mean {ENABLED}?")
            raise Problem(f"must be one of {listed}, not {node_kind(node)}{hint}")
        if node.value in choices:
            return node.value
        typo = typo_of(node.value, choices)
        if typo is not None:
            raise Problem(f"must be one of {listed}, not {node.value!r} (did you mean {typo}?)")
        raise Problem(f"must be one of {listed}; the value given is not one of them "
                       "(not repeated here in case it is a secret)")
    return check


def string(node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode) or node.tag != STR:
        raise Problem(f"must be a string, not {node_kind(node)}")
    if not node.value:
        raise Problem("must not be empty")
    return node.value


def positive_number(node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode) or node.tag not in (INT, FLOAT):
        raise Problem(f"must be a number of seconds greater than 0, not {node_kind(node)}")
    value = float(construct(node))
    if not math.isfinite(value) or value <= 0:
        raise Problem("must be a finite number of seconds greater than 0")
    return value


def positive_int(node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode) or node.tag != INT:
        raise Problem(f"must be a whole number greater than 0, not {node_kind(node)}")
    value = int(construct(node))
    if value <= 0:
        raise Problem("must be a whole number greater than 0")
    return value


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%|[KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def size_or_percent(node: yaml.Node) -> Any:
    """Bytes (``1048576``, ``512M``, ``2GiB``: binary units) or a share of a filesystem
    (``5%``), as journald.conf(5) takes SystemKeepFree=; kept as given, resolved against the
    filesystem when used (``keep_free_bytes``)."""
    text = str(node.value).strip() if isinstance(node, yaml.ScalarNode) else ""
    m = _SIZE_RE.match(text)
    if not m:
        raise Problem("must be bytes (1048576, 512M, 2G) or a percentage of the spool's "
                       f"filesystem (5%), not {node_kind(node) if not text else text!r}")
    if m.group(2) == "%" and float(m.group(1)) >= 100:
        raise Problem(f"a percentage must be under 100, not {text}")
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


def dsn(node: yaml.Node) -> Any:
    # A DSN may carry a password: never quote it back.
    if not isinstance(node, yaml.ScalarNode) or node.tag != STR:
        raise Problem(f"must be a DSN string (chdb://PATH, http(s)://HOST:PORT), "
                       f"not {node_kind(node)}")
    scheme, sep, _ = node.value.partition("://")
    if not sep or scheme.lower() not in DSN_SCHEMES:
        raise Problem("must be a DSN starting with chdb://, http:// or https:// "
                       "(the value is not repeated here: it may hold a password)")
    return node.value


DSN_SCHEMES = ("chdb", "http", "https")


def bounded(low: float, high: float, what: str) -> Callable[[yaml.Node], Any]:
    """A number from ``low`` to ``high`` (inclusive)."""
    def check(node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode) or node.tag not in (INT, FLOAT):
            raise Problem(f"must be {what} from {low:g} to {high:g}, not {node_kind(node)}")
        value = float(construct(node))
        if not math.isfinite(value) or not low <= value <= high:
            raise Problem(f"must be {what} from {low:g} to {high:g}, not {node.value}")
        return value
    return check


def absolute_path(node: yaml.Node) -> Any:
    value = string(node)
    if not value.startswith("/"):
        raise Problem(f"must be an absolute path (like /usr/bin/mail), not {value!r}")
    return value


def webhook(node: yaml.Node) -> Any:
    # A webhook URL often carries its token: never quote it back.
    value = string(node)
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest:
        raise Problem("must be an http:// or https:// URL (the value is not repeated here: "
                       "it may hold a token)")
    return value


def redact_list(node: yaml.Node) -> Any:
    """A list of secrets to redact: literals and ``/REGEX/`` (a single one may be given
    bare). Each is checked as the redact stage will read it; none is quoted back."""
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    out: list[str] = []
    for n, item in enumerate(items, 1):
        if not isinstance(item, yaml.ScalarNode) or item.tag not in (STR, INT, FLOAT):
            raise Problem(f"item {n}: must be a string (a literal, or /REGEX/), not "
                           f"{node_kind(item)}", item)
        try:
            pattern_of(item.value)
        except ValueError as e:
            raise Problem(f"item {n}: {e}", item) from None
        if item.value not in out:
            out.append(item.value)
    return tuple(out)


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


def parse(name: str, data: bytes, schema: Schema,
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

    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == NULL):
        return {}, problems  # empty file (or only comments): the defaults
    if not isinstance(root, yaml.MappingNode):
        mark = root.start_mark
        add(f"must be a mapping of option: value (like 'mode: enabled'), not {node_kind(root)}",
            mark.line + 1, mark.column + 1)
        return {}, problems

    known = tuple(schema)
    values: dict[str, Any] = {}
    seen: dict[str, int] = {}
    for key_node, value_node in root.value:
        kmark = key_node.start_mark
        kline, kcol = kmark.line + 1, kmark.column + 1
        if not isinstance(key_node, yaml.ScalarNode):
            add(f"a key must be a plain name, not {node_kind(key_node)}; "
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
        except Problem as e:
            vmark = (e.node or value_node).start_mark
            add(f"key {key!r}: {e}", vmark.line + 1, vmark.column + 1, key)
        except (ValueError, OverflowError, yaml.YAMLError):
            vmark = value_node.start_mark
            add(f"key {key!r}: not a valid value", vmark.line + 1, vmark.column + 1, key)
    return values, problems
