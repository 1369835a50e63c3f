"""The read service's client: ``ServiceReader`` asks the ``query.Reader`` questions over the
service's Unix socket (``protocol``), and ``service_socket`` says where that socket is."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import (
    ConfigError,
    LogcaptureError,
    NotFound,
    ServiceError,
    ServiceUnavailable,
    UsageError,
)
from ..query import LOG_PAGE
from .protocol import request_line

DEFAULT_SOCKET = "/run/logcapture/reader.sock"
SERVICE_UNIT = "logcapture-reader"  # slurm/logcapture-reader.service
CONNECT_TIMEOUT = 5.0
RESUME_WAIT = 30.0  # seconds a follow cut off by the service tries to go on (a restart)
RESUME_POLL = 0.2
READ_TIMEOUT = 120.0  # a question's answer, or a follower's keep-alive, comes well within it
READ_BUFFER = 1 << 18  # an answer line holds up to 2,000 records (protocol.BATCH)


class _Cut(ServiceError):
    """The connection ended before the answer did (the service stopped or restarted)."""
_KINDS: dict[str, type[LogcaptureError]] = {"NotFound": NotFound, "UsageError": UsageError}


def expected_socket(env: Mapping[str, str] = os.environ, default: str = DEFAULT_SOCKET
                    ) -> Path | None:
    """Where this machine's read service answers, or would if it ran:
    ``$LOGCAPTURE_READER_SOCKET`` (empty: none), else the admin config's ``reader_socket``
    where this user may read the config, else ``default`` when it or its directory is there
    (slurm/logcapture-reader.service makes ``/run/logcapture`` and keeps it while the service
    is stopped: RuntimeDirectoryPreserve=yes). None where no service is set up (a laptop)."""
    if "LOGCAPTURE_READER_SOCKET" in env:
        value = env["LOGCAPTURE_READER_SOCKET"]
        return Path(value) if value else None
    try:
        from ..config.admin import load_admin

        configured = load_admin(env=env).reader_socket
        if configured:
            return Path(configured)
    except ConfigError:
        pass  # root's config (it may hold the store's credentials): the default path
    path = Path(default)
    return path if os.path.lexists(path) or path.parent.is_dir() else None


def service_socket(env: Mapping[str, str] = os.environ) -> Path | None:
    """The read service's socket when one is there (``expected_socket``); None when no
    socket exists at that path (a laptop, a cluster without the service, a service
    stopped)."""
    path = expected_socket(env)
    return path if path is not None and _is_socket(path) else None


def unreachable(path: Path | str, why: str) -> ServiceUnavailable:
    """The error of every command that needs the read service and finds none answering: what
    failed, and where an administrator looks (the unit's status and log)."""
    return ServiceUnavailable(
        f"no read service answers on {path} ({why}): the read service is not running; "
        f"`systemctl status {SERVICE_UNIT}` says why (or ask your administrator)")


def _is_socket(path: Path) -> bool:
    import stat

    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


class ServiceReader:
    """The Reader that asks the read service on ``socket_path``; the service answers as the
    user the kernel says this process runs as."""

    def __init__(self, socket_path: Path | str, connect_timeout: float = CONNECT_TIMEOUT,
                 read_timeout: float = READ_TIMEOUT):
        self.socket_path = Path(socket_path)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout

    # --- the wire
    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.connect_timeout)
        try:
            sock.connect(str(self.socket_path))
        except OSError as e:
            sock.close()
            raise unreachable(self.socket_path, e.strerror or str(e)) from None
        return sock

    def _ask(self, op: str, **args: Any) -> Iterator[tuple[str, Any]]:
        """("items", [X, ...]) for each batch of the answer, then ("value", X) or nothing."""
        sock = self._connect()
        try:
            sock.sendall(request_line(op, **args))
            sock.settimeout(self.read_timeout)
            with sock.makefile("rb", buffering=READ_BUFFER) as f:
                for raw in f:
                    if not raw.endswith(b"\n"):  # cut off in the middle of a line
                        raise _Cut("the read service closed the connection in the middle "
                                   "of its answer")
                    try:
                        msg = json.loads(raw)
                    except ValueError:
                        raise ServiceError("the read service sent a line that is not "
                                           "JSON") from None
                    if "items" in msg:
                        yield "items", msg["items"]
                    elif "value" in msg:
                        yield "value", msg["value"]
                    elif "error" in msg:
                        kind = _KINDS.get(str(msg.get("kind")), ServiceError)
                        raise kind(f"{msg['error']}" if kind is not ServiceError
                                   else f"read service: {msg['error']}")
                    elif msg.get("end"):
                        return
            raise _Cut("the read service closed the connection before the end of its answer")
        except TimeoutError:
            raise ServiceError(f"the read service did not answer within "
                               f"{self.read_timeout:g}s") from None
        except OSError as e:
            raise _Cut(f"reading from the read service: {e.strerror or e}") from None
        finally:
            sock.close()

    def _items(self, op: str, **args: Any) -> list[Any]:
        out: list[Any] = []
        for kind, x in self._ask(op, **args):
            if kind == "items":
                out += x
        return out

    def _value(self, op: str, **args: Any) -> Any:
        for kind, x in self._ask(op, **args):
            if kind == "value":
                return x
        raise ServiceError(f"the read service gave no answer to {op!r}")

    # --- the questions (query.Reader)
    def whoami(self) -> dict[str, Any]:
        return dict(self._value("whoami"))

    def runs(self) -> list[dict[str, Any]]:
        return self._items("runs")

    def resolve(self, ref: str | None) -> str:
        return str(self._value("resolve", ref=ref))

    def summary(self, run: str) -> dict[str, Any]:
        return dict(self._value("summary", run=run))

    def lines(self, run: str, stream: str | None = None, tail: int | None = None
              ) -> list[dict[str, Any]]:
        return self._items("lines", run=run, stream=stream, tail=tail)

    def follow(self, run: str) -> Iterator[dict[str, Any]]:
        """The run's records until its end. A follow the service cut off (it restarted:
        docs/admin.md, "start afresh in place") goes on from the last record read, for up
        to ``RESUME_WAIT`` seconds of tries."""
        nexts: dict[str, int] = {}  # stream -> the next seq not read (as the service keeps)
        started = connected = ended = False
        deadline: float | None = None
        while True:
            resume = {"next": nexts, "started": started} if connected else {}
            try:
                for kind, x in self._ask("follow", run=run, **resume):
                    connected = True
                    if kind != "items":
                        continue
                    deadline = None  # it goes on: a later cut gets its own wait
                    for rec in x:
                        if rec.get("kind") == "start":
                            started = True
                        elif rec.get("kind") == "end":
                            ended = True
                        elif isinstance(rec.get("seq"), int) and isinstance(
                                rec.get("stream"), str):
                            stream = rec["stream"]
                            nexts[stream] = max(nexts.get(stream, 0), rec["seq"] + 1)
                        yield rec
                return
            except (_Cut, ServiceUnavailable) as e:
                if ended:
                    return  # cut off after the End record: nothing more was to come
                if isinstance(e, ServiceUnavailable) and not connected:
                    raise  # no service to follow through at all
                connected = True
                now = time.monotonic()
                deadline = deadline or now + RESUME_WAIT
                if now >= deadline:
                    raise
                time.sleep(RESUME_POLL)

    def log(self, run: str, stderr: bool = False, before: str | None = None,
            after: str | None = None, limit: int = LOG_PAGE, line: int | None = None
            ) -> dict[str, Any]:
        return dict(self._value("log", run=run, stderr=stderr, before=before, after=after,
                                limit=limit, **({"line": line} if line is not None else {})))

    def describe(self, run: str) -> dict[str, Any]:
        return dict(self._value("describe", run=run))

    def metadata(self, run: str) -> list[dict[str, Any]]:
        return self._items("metadata", run=run)

    def samples(self, run: str) -> list[dict[str, Any]]:
        return self._items("samples", run=run)

    def export_rows(self, run: str, what: str) -> list[dict[str, Any]]:
        return self._items("export", run=run, what=what)

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        return dict(self._value("search", request=request))

    def close(self) -> None:
        pass
