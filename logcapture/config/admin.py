"""The administrator's config (``/etc/logcapture/config.yaml``, or ``$LOGCAPTURE_CONFIG``;
docs/admin.md).

``load_admin`` fails early and precisely: a ``ConfigError`` listing every problem. A missing file
means the defaults (``defaults.ADMIN_DEFAULTS``). Each key can be overridden by
``LOGCAPTURE_<KEY>`` in the environment (``LOGCAPTURE_FLUSH_INTERVAL=0.5``); environment beats
file beats default.

The *public config* is what the Slurm prolog leaves beside the spool for jobs
(``public_config``): the values of an admin config that ``load_admin`` checked, without its
secrets, as JSON. Every captured job's wrapper and every task's capture reads it as it starts;
JSON is read by the standard library's parser, where YAML would cost each of them PyYAML's
import (~12-15 ms of CPU, most of it a regular expression its reader compiles). A config file
whose name ends in ``.json`` is read as a public config: each value is checked for the kind
its key holds (text, a whole number, a number, a list of text), not again in full.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections import namedtuple
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import ConfigError
from .checking import (
    STR,
    Problem,
    absolute_path,
    bounded,
    dsn,
    file_kind,
    parse,
    positive_int,
    positive_number,
    redact_list,
    size_or_percent,
    string,
    webhook,
    yaml,
)
from .defaults import ADMIN_DEFAULTS, RENAMED_KEYS

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: this module is on every job's start path
if TYPE_CHECKING:
    from typing import Any

    from .checking import Schema

ADMIN_ENV = "LOGCAPTURE_CONFIG"
ADMIN_DEFAULT_PATH = "/etc/logcapture/config.yaml"
ADMIN_MAX_BYTES = 1 << 20
PUBLIC_SUFFIX = ".json"  # a config file read as the public config (module docstring)
SECRET_KEYS = ("store", "notify_webhook")  # admin keys never copied where jobs read


_GLOB = re.compile(r"[A-Za-z0-9_*?\[\]!-]+")


def _variable_globs(node: yaml.Node) -> Any:
    """A list of environment variable names, shell globs allowed (``*_SECRET``)."""
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    out: list[str] = []
    for n, item in enumerate(items, 1):
        if not isinstance(item, yaml.ScalarNode) or item.tag != STR \
                or not _GLOB.fullmatch(item.value):
            raise Problem(f"item {n}: must be a variable name or a glob like *_SECRET "
                           "(letters, digits, _, *, ?, [])", item)
        out.append(item.value)
    return tuple(out)


# The fields come from ADMIN_DEFAULTS (one list of keys and defaults); mypy wants literals.
class AdminConfig(namedtuple("AdminConfig", tuple(ADMIN_DEFAULTS),  # type: ignore[misc]
                             defaults=tuple(ADMIN_DEFAULTS.values()))):  # type: ignore[misc]
    """The administrator's settings (``/etc/logcapture/config.yaml``).

    ``store``: the ClickHouse DSN (``chdb://PATH`` for the embedded engine, ``http(s)://...``
    for a server); None means the embedded default. ``spool_root``: where the nodes' Slurm
    jobs spool; None means ``/var/spool/logcapture`` (``spool.layout.default_root``).
    """

    __slots__ = ()
    if TYPE_CHECKING:
        store: str | None
        spool_root: str | None
        sample_interval: float
        store_ttl_days: int | None
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
    "store": dsn,
    "spool_root": string,
    "sample_interval": positive_number,
    "store_ttl_days": positive_int,
    "cluster": string,
    "flush_interval": positive_number,
    "flush_records": positive_int,
    "segment_bytes": positive_int,
    "spool_keep_free": size_or_percent,
    "job_output_limit": positive_int,
    "job_output_tail": positive_int,
    "job_metadata_limit": positive_int,
    "user_daily_bytes": bounded(0, 2.0 ** 62, "a number of bytes"),
    "insight_gpu_idle_percent": bounded(0.0, 100.0, "a percentage"),
    "insight_gpu_memory_used_fraction": bounded(0.0, 1.0, "a fraction"),
    "insight_cpu_efficiency_low": bounded(0.0, 1.0, "a fraction"),
    "insight_memory_overrequest_factor": bounded(1.0, 1000.0, "a factor"),
    "insight_time_limit_overrequest_factor": bounded(1.0, 1000.0, "a factor"),
    "insight_min_seconds": positive_number,
    "stall_seconds": positive_number,
    "mail_prog": absolute_path,
    "notify_webhook": webhook,
    "reader_socket": string,
    "admin_group": string,
    "reader_max_clients": positive_int,
    "reader_max_clients_per_user": positive_int,
    "reader_max_follows_per_user": positive_int,
    "reader_request_timeout": positive_number,
    "redact_variables": _variable_globs,
    "redact_patterns": redact_list,
}
# The old names of renamed keys, checked as the new ones (load_admin warns and renames).
_ADMIN_SCHEMA.update({old: _ADMIN_SCHEMA[new] for old, new in RENAMED_KEYS.items()})


def admin_path(env: Mapping[str, str] = os.environ) -> Path:
    return Path(env.get(ADMIN_ENV) or ADMIN_DEFAULT_PATH)


def _env_name(key: str) -> str:
    return "LOGCAPTURE_" + key.upper()


def _read_config(file: Path, name: str) -> bytes | None:
    """The config file's bytes, None when it is missing; ``ConfigError`` when it is not a
    regular file, cannot be read or is larger than ``ADMIN_MAX_BYTES``."""
    try:
        # O_NONBLOCK: a FIFO in the config's place must not hang every job.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        with open(fd, "rb") as f:
            kind = os.fstat(fd).st_mode
            if not stat.S_ISREG(kind):
                raise ConfigError(f"{name}: is {file_kind(kind)}, not a config file", path=name)
            data = f.read(ADMIN_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory, not a config file", path=name) from None
    except OSError as e:
        raise ConfigError(f"{name}: cannot be read: {e.strerror or e}", path=name) from None
    if len(data) > ADMIN_MAX_BYTES:
        raise ConfigError(f"{name}: is larger than {ADMIN_MAX_BYTES} bytes", path=name)
    return data


def load_admin(path: Path | str | None = None, env: Mapping[str, str] = os.environ,
               warn: Callable[[str], None] | None = None) -> AdminConfig:
    """The admin config: defaults, then the file (``path``, else ``$LOGCAPTURE_CONFIG``, else
    ``/etc/logcapture/config.yaml``; a missing file is fine), then ``LOGCAPTURE_<KEY>``
    variables. Raises ``ConfigError`` listing every problem, the first one's line, column and
    key in its attributes. A renamed key (``defaults.RENAMED_KEYS``) is read under its old
    name too, and ``warn`` (the commands an administrator runs: the agent, the read service,
    ``db init``; never a job's wrapper, whose stderr is the job's) is told the new name."""
    file = Path(path) if path is not None else admin_path(env)
    name = str(file)
    values: dict[str, Any] = {}
    located: list[tuple[str, int | None, int | None, str | None]] = []
    problems: list[str] = []
    data = _read_config(file, name)
    if data is not None:
        if file.name.endswith(PUBLIC_SUFFIX):
            values, problems = _public_values(name, data)
            located.extend((p, None, None, None) for p in problems)
        else:
            values, problems = parse(name, data, _ADMIN_SCHEMA, located, quote_names=True)

    for key, check in _ADMIN_SCHEMA.items():
        var = _env_name(key)
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        node = yaml.ScalarNode(STR, raw)
        if check not in (string, dsn, absolute_path, webhook, redact_list,
                         _variable_globs):
            node = _resolve_scalar(raw)
        try:
            values[key] = check(node)
        except (Problem, ValueError, OverflowError, yaml.YAMLError) as e:
            detail = str(e) if isinstance(e, Problem) else "not a valid value"
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
    for old, new in RENAMED_KEYS.items():
        if old in values:
            value = values.pop(old)
            values.setdefault(new, value)
            if warn is not None:
                warn(f"{name}: '{old}' is deprecated, use '{new}' (the same setting; "
                     f"{_env_name(new)} in the environment)")
    return AdminConfig(**values)


# What each check of the schema returns (by the check's name), so that the public config's
# JSON values can be checked for their kind without PyYAML; bounded(...) makes a number.
_PUBLIC_KINDS = {
    "string": str, "dsn": str, "absolute_path": str, "webhook": str, "size_or_percent": str,
    "positive_int": int, "positive_number": float, "bounded.<locals>.check": float,
    "_variable_globs": tuple, "redact_list": tuple,
}
_KIND_NAMES = {str: "text", int: "a whole number", float: "a number", tuple: "a list of text"}


def public_config(admin: AdminConfig) -> bytes:
    """The public config of ``admin`` (the module docstring): its values but the secrets
    (``SECRET_KEYS``: the store's DSN, the webhook URL, which often holds a token) and those
    left unset, as JSON, one key a line in key order (the same config, the same bytes)."""
    import json

    values = {k: v for k, v in admin._asdict().items()
              if k not in SECRET_KEYS and v not in (None, "")}
    return json.dumps(values, sort_keys=True, indent=0, ensure_ascii=False).encode() + b"\n"


def _public_values(name: str, data: bytes) -> tuple[dict[str, Any], list[str]]:
    """The values of a public config (``public_config``'s JSON): (values, problems), each
    problem naming the file and the key."""
    import json

    try:
        loaded = json.loads(data)
    except json.JSONDecodeError as e:  # its message quotes no content
        return {}, [f"{name}:{e.lineno}:{e.colno}: not the JSON of a public config: {e.msg}"]
    except UnicodeDecodeError:
        return {}, [f"{name}: is not valid UTF-8"]
    except RecursionError:
        return {}, [f"{name}: not the JSON of a public config: nested too deeply"]
    if not isinstance(loaded, dict):
        return {}, [f"{name}: must be a JSON object of key: value, not {type(loaded).__name__}"]
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in loaded.items():
        check = _ADMIN_SCHEMA.get(key)
        if check is None or key in SECRET_KEYS or key in RENAMED_KEYS:
            problems.append(f"{name}: unknown key {key!r} for a public config")
            continue
        kind = _PUBLIC_KINDS[check.__qualname__]
        if kind is tuple and isinstance(value, list) \
                and all(isinstance(v, str) and v for v in value):
            values[key] = tuple(value)
        elif kind is str and isinstance(value, str) and value:
            values[key] = value
        elif kind is int and type(value) is int and value > 0:
            values[key] = value
        elif kind is float and type(value) in (int, float) and math.isfinite(value):
            values[key] = float(value)
        else:
            problems.append(f"{name}: key {key!r}: must be {_KIND_NAMES[kind]}")
    return values, problems


def _resolve_scalar(raw: str) -> yaml.ScalarNode:
    """A plain scalar node for an environment value, its tag resolved as YAML would."""
    tag = yaml.SafeLoader(" ").resolve(yaml.ScalarNode, raw, (True, False))
    return yaml.ScalarNode(tag, raw)


def admin_defaults() -> dict[str, Any]:
    """The default admin settings, by key (for documentation and ``logcapture config``)."""
    return dict(AdminConfig._field_defaults)
