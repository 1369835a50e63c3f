"""Opening a store and keeping it: the DSN, the embedded store's lock and turns, the
connection's lifecycle, and the mapping of engine errors to the store's error classes.

- ``chdb:///PATH``: the embedded engine (chDB) stored in PATH. The default is
  ``$XDG_STATE_HOME/logcapture/store`` (``~/.local/state/logcapture/store``). chDB runs one
  engine per process and allows one process per store folder, so the folder is guarded by an
  ``flock`` on ``PATH.lock`` beside it: a second process gets a clear ``StoreUnavailable``
  instead of the engine's ``BAD_ARGUMENTS``. Callers open, work and close (``open_store`` is a
  context manager) so readers and writers take turns.
- ``http(s)://USER:PASS@HOST:8123/DB``: a ClickHouse server (or a cluster, docs/storage.md).

The DSN comes from ``--store``, else ``$LOGCAPTURE_STORE``, else the ``store:`` key of the
config file, else the embedded default (``resolve_dsn``).
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlparse, urlunparse

from ..errors import (
    NoEngine,
    NotFound,
    StoreAuthError,
    StoreDataError,
    StoreError,
    StoreUnavailable,
    UsageError,
)

DEFAULT_DATABASE = "logcapture"

# ClickHouse error codes (src/Common/ErrorCodes.cpp) that mean "the data is wrong": never
# retried (Vector's ClickHouse sink does the same for 117 and 53).
DATA_ERROR_CODES = frozenset({
    6,    # CANNOT_PARSE_TEXT
    26,   # CANNOT_PARSE_QUOTED_STRING
    27,   # CANNOT_PARSE_INPUT_ASSERTION_FAILED
    32,   # ATTEMPT_TO_READ_AFTER_EOF
    38,   # CANNOT_PARSE_DATE
    41,   # CANNOT_PARSE_DATETIME
    53,   # TYPE_MISMATCH
    69,   # ARGUMENT_OUT_OF_BOUND
    70,   # CANNOT_CONVERT_TYPE
    72,   # CANNOT_PARSE_NUMBER
    117,  # INCORRECT_DATA
    131,  # TOO_LARGE_STRING_SIZE
    321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
    349,  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
    395,  # FUNCTION_THROW_IF_VALUE_IS_NON_ZERO
    407,  # DECIMAL_OVERFLOW
    469,  # VIOLATED_CONSTRAINT (a record without kind/stream/seq/ts, or no identity)
    623,  # CANNOT_PARSE_BOOL
    })
# Authentication/authorisation: stop at once, as on an HTTP 401 or 403 (a retry with the same
# credentials is refused again).
AUTH_ERROR_CODES = frozenset({
    192,  # UNKNOWN_USER
    193,  # WRONG_PASSWORD
    194,  # REQUIRED_PASSWORD
    195,  # IP_ADDRESS_NOT_ALLOWED
    497,  # ACCESS_DENIED
    516,  # AUTHENTICATION_FAILED
})
SCHEMA_ERROR_CODES = frozenset({60, 81})  # UNKNOWN_TABLE, UNKNOWN_DATABASE
# Not transient either: a bug or an engine that cannot run the statement.
FATAL_ERROR_CODES = frozenset({1, 36, 46, 47, 48, 62})  # UNSUPPORTED_METHOD, BAD_ARGUMENTS,
# UNKNOWN_FUNCTION (the lightest chDB build lacks some), UNKNOWN_IDENTIFIER, NOT_IMPLEMENTED,
# SYNTAX_ERROR

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_HTTP_STATUS_RE = re.compile(r"\b(?:HTTP|status)[^0-9]{0,20}(401|403)\b", re.IGNORECASE)


# --- DSN and locking -----------------------------------------------------------------------------
def default_store_path(env: Mapping[str, str] = os.environ) -> Path:
    state = env.get("XDG_STATE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return Path(state) / "logcapture" / "store"


def resolve_dsn(dsn: str | None = None, env: Mapping[str, str] = os.environ) -> str:
    """``--store``, else ``$LOGCAPTURE_STORE``, else ``store:`` in the admin config file
    (``$LOGCAPTURE_CONFIG`` or ``/etc/logcapture/config.yaml``, ``config.admin.load_admin``), else
    the embedded default ``chdb://$XDG_STATE_HOME/logcapture/store``."""
    if dsn:
        return dsn
    if env.get("LOGCAPTURE_STORE"):
        return env["LOGCAPTURE_STORE"]
    from ..config.admin import load_admin

    return load_admin(env=env).store or f"chdb://{default_store_path(env)}"


def redact(dsn: str) -> str:
    """The DSN without its password, for messages."""
    p = urlparse(dsn)
    if p.password:
        netloc = f"{p.username}:***@{p.hostname}" + (f":{p.port}" if p.port else "")
        return urlunparse(p._replace(netloc=netloc))
    return dsn


# Seconds between tries of a lock another process holds (the embedded store's, a run's
# shipping cursor's): short next to the waits (seconds), so a waiter takes a freed lock within
# a few tens of milliseconds, and cheap (one flock(2) a try).
LOCK_POLL = 0.02


def flock_within(fd: int, wait: float, poll: float = LOCK_POLL) -> bool:
    """Take an exclusive flock on ``fd``, trying again every ``poll`` seconds for at most
    ``wait`` seconds (at least once). False when another holder kept it all that time. Every
    lock waited for with a bound is waited for here."""
    import time

    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)


# clickhouse-connect logs each failed HTTP attempt itself ("Unexpected Http Driver Exception")
# through Python's last-resort handler, onto the user's terminal; every failure already
# reaches the user once, classified, from here (StoreError), so its own log stays quiet.
logging.getLogger("clickhouse_connect").addHandler(logging.NullHandler())
logging.getLogger("clickhouse_connect").propagate = False


def _want_path(lock_path: Path) -> Path:
    return lock_path.with_name(lock_path.name + ".want")


def _lock_or_wait(fd: int, lock_path: Path, wait: float) -> bool:
    """Take the store's flock, waiting up to ``wait`` seconds. A process that has to wait says
    so by holding a shared flock on ``<store>.lock.want`` meanwhile: a holder that keeps the
    store between questions (the read service) sees it (``store_wanted``) and lets go."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        if wait <= 0:
            return False
    want = None
    try:
        want = os.open(_want_path(lock_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(want, fcntl.LOCK_SH)  # the holder's check holds it exclusively a moment
    except OSError:
        pass  # not ours to write (another user's store): wait all the same
    try:
        return flock_within(fd, wait)
    finally:
        if want is not None:
            os.close(want)


def store_wanted(lock_path: Path) -> bool:
    """Whether another process waits for the embedded store whose lock is ``lock_path``."""
    try:
        fd = os.open(_want_path(lock_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the flock when it was taken
    return False


class _StoreLock:
    """Per-process reference-counted flock on ``<store>.lock``: chDB is one engine per process,
    so clients of one process share it; another process is refused."""

    _held: dict[str, tuple[int, int]] = {}  # path -> (fd, refcount)
    _mutex = threading.Lock()
    turns = 0  # how many times this process took a store's lock anew: each starts the engine

    @classmethod
    def acquire(cls, lock_path: Path, wait: float = 0.0) -> None:
        key = str(lock_path)
        with cls._mutex:
            if key in cls._held:
                fd, n = cls._held[key]
                cls._held[key] = (fd, n + 1)
                return
            try:
                lock_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except PermissionError:
                # An embedded store belongs to whoever made it (on a cluster: root, so users
                # cannot read each other's rows); a clear message, not a traceback.
                raise StoreAuthError(
                    f"no permission to open the embedded store "
                    f"{lock_path.with_suffix('')}: it belongs to another user; ask an "
                    "administrator, or read your own spool with --source spool") from None
            except OSError as e:
                raise StoreUnavailable(f"cannot open the embedded store's lock {lock_path}: "
                                       f"{e.strerror}") from None
            if not _lock_or_wait(fd, lock_path, wait):
                holder = ""
                try:
                    holder = os.pread(fd, 32, 0).decode().strip()
                except OSError:
                    pass
                os.close(fd)
                who = f" (pid {holder})" if holder.isdigit() else ""
                raise StoreUnavailable(
                    f"the embedded store {lock_path.with_suffix('')} is in use by "
                    f"another process{who}; chDB allows one process per store folder, "
                    "try again when it has finished") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            cls._held[key] = (fd, 1)
            cls.turns += 1

    @classmethod
    def release(cls, lock_path: Path) -> None:
        key = str(lock_path)
        with cls._mutex:
            if key not in cls._held:
                return
            fd, n = cls._held[key]
            if n > 1:
                cls._held[key] = (fd, n - 1)
                return
            del cls._held[key]
            os.close(fd)  # closing the descriptor drops the flock

    @classmethod
    def held(cls) -> Path | None:
        """The lock of an embedded store this process holds open (``<store>.lock``), if any:
        chDB runs one engine per process, on one path."""
        with cls._mutex:
            key = next(iter(cls._held), None)
        return Path(key) if key is not None else None


# --- the embedded engine's wear on a long-lived process ---------------------------------------
# Each time a process starts chDB's engine on a store folder that has tables, the engine leaves
# behind about 5 idle threads of its pool and 7 descriptors (its threads' /proc files), closed
# or not (measured with chdb-core-lite 26.5 and chdb-core 26.9). A command opens the store a few
# times; a process that takes turns on an embedded store for days (the agent, every batch; the
# read service, every turn) grows by that much each turn until the engine aborts the process at
# the descriptor limit. Such a process asks ``engine_worn()`` between turns and, when it says
# so, starts itself afresh (``recycle.start_afresh``), as web servers recycle a worker
# after a number of requests for leaks they cannot mend (gunicorn's ``max_requests``, Apache's
# ``MaxConnectionsPerChild``).
ENGINE_TURNS = 200  # turns on an embedded store before a long-lived process starts afresh


def engine_turns() -> int:
    """How many times this process started the embedded engine (took a store's lock anew)."""
    return _StoreLock.turns


def open_descriptors() -> int:
    """How many descriptors this process has open (0 where /proc cannot tell)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def engine_worn(since: int = 0, turns: int | None = None) -> bool:
    """Whether a long-lived process should start afresh before its next turn on an embedded
    store: it has started the engine ``turns`` times since its count was ``since``
    (``ENGINE_TURNS``; the env's ``LOGCAPTURE_ENGINE_TURNS`` when set), or it has started it
    and uses half of its descriptor limit already."""
    import resource

    if turns is None:
        setting = os.environ.get("LOGCAPTURE_ENGINE_TURNS", "")
        turns = int(setting) if setting.isdigit() and int(setting) > 0 else ENGINE_TURNS
    started = _StoreLock.turns - since
    if started >= turns:
        return True
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return (started > 0 and soft != resource.RLIM_INFINITY
            and open_descriptors() > soft // 2)


# --- errors -------------------------------------------------------------------------------
def classify(exc: BaseException, what: str = "") -> StoreError:
    """Map a clickhouse-connect/chDB exception to the store's error classes."""
    if isinstance(exc, StoreError):
        return exc
    msg = str(exc).strip()
    short = msg.splitlines()[0][:400] if msg else type(exc).__name__
    code = getattr(exc, "code", None)
    if not isinstance(code, int):
        m = re.search(r"Code: (\d+)", msg)
        code = int(m.group(1)) if m else None
    prefix = f"{what}: " if what else ""
    if code in AUTH_ERROR_CODES or _HTTP_STATUS_RE.search(msg):
        return StoreAuthError(f"{prefix}the store refused the credentials or the access "
                              f"(stopping at once): {short}")
    if code in DATA_ERROR_CODES:
        err = StoreDataError(f"{prefix}the store refused the data: {short}")
        err.code = code  # type: ignore[attr-defined]
        return err
    if code in FATAL_ERROR_CODES and "EmbeddedServer" not in msg:
        return StoreError(f"{prefix}{short}")
    if code in SCHEMA_ERROR_CODES:
        return StoreError(f"{prefix}the store has no logcapture schema (run `logcapture db "
                          f"init`): {short}")
    cause = _network_cause(exc)
    if cause is not None:  # the socket's own words, not the HTTP client's retry report
        short = cause.strerror or str(cause) or type(cause).__name__
    return StoreUnavailable(f"{prefix}{short}")


def _network_cause(exc: BaseException) -> OSError | None:
    """The operating system's error under a connection failure (refused, no such host, timed
    out), found through the exceptions the HTTP client chained on it; None if there is none."""
    seen = 0
    cause = exc.__cause__ or exc.__context__
    while cause is not None and seen < 16:
        if isinstance(cause, OSError):
            return cause
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return None


# --- the connection --------------------------------------------------------------------------
class _Connection:
    """A clickhouse-connect client on the logcapture schema, and its lifecycle: the part of
    ``Store`` that every other part (schema, ingest, queries, export) runs its statements
    through (``_command``, ``_query``), each failure classified (``classify``)."""

    def __init__(self, client: Any, dsn: str, lock_path: Path | None = None):
        self.client = client
        self.dsn = dsn
        self._lock_path = lock_path
        self.embedded = lock_path is not None
        # asynchronous inserts into ``ingest`` (``ASYNC_INSERT_SETTINGS``): on a server
        self.async_insert = not self.embedded
        self._closed = False
        self._extra_clients: list[Any] = []  # more handles on the embedded engine

    # --- lifecycle
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for extra in self._extra_clients:
                extra.close()
            self.client.close()
        finally:
            if self._lock_path is not None:
                _StoreLock.release(self._lock_path)

    def wanted(self) -> bool:
        """Whether another process waits for this embedded store (``store_wanted``)."""
        return self._lock_path is not None and store_wanted(self._lock_path)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _command(self, sql: str, params: dict[str, Any] | None = None,
                 what: str = "") -> Any:
        try:
            return self.client.command(sql, parameters=params or None)
        except Exception as e:  # noqa: BLE001 - classified below
            raise classify(e, what) from None

    def _query(self, sql: str, params: dict[str, Any] | None = None,
               what: str = "reading", formats: dict[str, str] | None = None
               ) -> list[tuple[Any, ...]]:
        try:
            return list(self.client.query(sql, parameters=params or None,
                                          query_formats=formats).result_rows)
        except Exception as e:  # noqa: BLE001
            raise classify(e, what) from None

    def _more_clients(self, n: int) -> list[Any]:
        """``n`` more handles on the embedded engine this store opened (kept until close)."""
        import clickhouse_connect

        while len(self._extra_clients) < n:
            try:
                client = clickhouse_connect.get_client(dsn=f"chdb://{_chdb_path(self.dsn)}")
                client.database = DEFAULT_DATABASE
            except Exception as e:  # noqa: BLE001
                raise classify(e, "opening the embedded store") from None
            self._extra_clients.append(client)
        return self._extra_clients[:n]


# --- opening ---------------------------------------------------------------------------------
# One line: what a plain install (no ``embedded`` extra) says when a command needs a store and
# none is named, so the embedded default would be used.
NO_ENGINE = ("the embedded store ({path}) needs the chDB engine, which is not installed: "
             "pip install 'logcapture[embedded]', or name a ClickHouse server with "
             "LOGCAPTURE_STORE=http(s)://USER:PASS@HOST:8123/DB (or --store, or store: in the "
             "config file)")


def check_engine(dsn: str | None, env: Mapping[str, str] = os.environ) -> None:
    """Raise NoEngine (one line: how to get a store) when ``dsn`` (``resolve_dsn`` when
    None) is the embedded store and its engine is not installed."""
    dsn = resolve_dsn(dsn, env)
    if urlparse(dsn).scheme == "chdb" and importlib.util.find_spec("chdb") is None:
        raise NoEngine(NO_ENGINE.format(path=_chdb_path(dsn)))


def _chdb_path(dsn: str) -> Path:
    p = urlparse(dsn)
    if p.netloc and p.netloc not in ("",):
        raise UsageError(f"embedded store DSN must be chdb:///ABSOLUTE/PATH, not {dsn!r}")
    if not p.path or not p.path.startswith("/"):
        raise UsageError(f"embedded store DSN must be chdb:///ABSOLUTE/PATH, not {dsn!r}")
    return Path(os.path.realpath(p.path))


def connect(dsn: str | None, *, wait: float, must_exist: bool, connect_timeout: float,
            env: Mapping[str, str], send_receive_timeout: float = 60.0
            ) -> tuple[Any, str, Path | None]:
    """A clickhouse-connect client on the store named by ``dsn`` (``resolve_dsn`` when None),
    its resolved DSN, and for the embedded store the lock file now held (None for a server).
    ``open_store`` (the package's) wraps them in a ``Store``; the parameters are its."""
    import clickhouse_connect

    dsn = resolve_dsn(dsn, env)
    scheme = urlparse(dsn).scheme
    if scheme == "chdb":
        path = _chdb_path(dsn)
        if must_exist and not path.is_dir():
            raise NotFound(f"no store at {path}")
        check_engine(dsn, env)
        lock = path.with_name(path.name + ".lock")
        _StoreLock.acquire(lock, wait)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
            except Exception as e:  # noqa: BLE001
                raise classify(e, f"opening the embedded store {path}") from None
            try:
                client.command("CREATE DATABASE IF NOT EXISTS {db:Identifier}",
                               parameters={"db": DEFAULT_DATABASE})
                client.database = DEFAULT_DATABASE
            except Exception as e:  # noqa: BLE001
                client.close()
                raise classify(e, f"opening the embedded store {path}") from None
        except BaseException:
            _StoreLock.release(lock)
            raise
        return client, dsn, lock
    if scheme in ("http", "https"):
        p = urlparse(dsn)
        database = p.path.strip("/") or DEFAULT_DATABASE
        if not _IDENT_RE.match(database):
            raise UsageError(f"invalid database name {database!r} in the store DSN")
        try:
            client = clickhouse_connect.get_client(
                dsn=urlunparse(p._replace(path="")), database=database,
                connect_timeout=connect_timeout, send_receive_timeout=send_receive_timeout,
                query_retries=0)
        except Exception as e:  # noqa: BLE001
            err = classify(e, f"connecting to {redact(dsn)}")
            if "UNKNOWN_DATABASE" in str(e) or getattr(e, "code", None) == 81:
                client = _create_database(p, database, connect_timeout, send_receive_timeout)
            else:
                raise err from None
        return client, dsn, None
    raise UsageError(f"unsupported store DSN {redact(dsn)!r}: use chdb:///PATH or "
                     "http(s)://USER:PASS@HOST:8123/DB")


def _create_database(p: Any, database: str, connect_timeout: float,
                     send_receive_timeout: float) -> Any:
    import clickhouse_connect

    try:
        client = clickhouse_connect.get_client(dsn=urlunparse(p._replace(path="")),
                                               connect_timeout=connect_timeout,
                                               send_receive_timeout=send_receive_timeout,
                                               query_retries=0)
        client.command("CREATE DATABASE IF NOT EXISTS {db:Identifier}",
                       parameters={"db": database})
        client.database = database
        return client
    except Exception as e:  # noqa: BLE001
        raise classify(e, "creating the database") from None

