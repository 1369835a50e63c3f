"""The read service: answers ``query.Reader`` questions on a Unix socket, as the caller.

Run by the administrator (``logcapture reader serve``, slurm/logcapture-reader.service) with
the store's credentials, which users never see. Each connection carries one request
(``protocol``). The caller is who the kernel says connected (``SO_PEERCRED``: the uid of the
process at the other end, see unix(7)), never anything in the request; the caller's questions
go to a ``query.StoreReader`` as that user's name, so every query is filtered by owner
(members of the configured admin group, and root, read every owner's runs).

Robustness: a thread per client, at most ``max_clients`` at once, and of those at most
``max_clients_per_user`` from one uid, of which at most ``max_follows_per_user`` follow a run
(``logs -f``): one user's connections, idle or following runs that never end, cannot take
the slots every other user needs (the idea of systemd's ``MaxConnectionsPerSource=``,
systemd.socket(5)). A connection past a limit is told ``Busy`` with the limit it passed. A
request must arrive within ``request_timeout`` seconds (a connection that sends nothing is
closed then) and fit in ``MAX_REQUEST_BYTES``; an answer must be taken within
``send_timeout`` seconds per write and stay under ``max_response_bytes``; a client that stops
reading is dropped without holding the store (answers are read from the store first, then
sent). A bad request gets one error line; no client can stop the service.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import LogcaptureError, NotFound, ServiceError, UsageError
from ..query import FOLLOW_POLL, StoreReader, StoreSession
from ..recycle import adopt_listener
from ..store import engine_turns, engine_worn
from .protocol import BATCH, MAX_REQUEST_BYTES, Request, encode, parse_request

log = logging.getLogger("logcapture.reader")

MAX_CLIENTS = 256
MAX_CLIENTS_PER_USER = 16  # a sixteenth of MAX_CLIENTS: no user fills the service alone
MAX_FOLLOWS_PER_USER = 8  # of those, connections following a run (they may last for days)
REQUEST_TIMEOUT = 5.0  # the client sends its request line as soon as it is connected
SEND_TIMEOUT = 30.0
MAX_RESPONSE_BYTES = 1 << 30
BEAT_EVERY = 10.0  # seconds between a quiet follower's keep-alive lines
PAGE = 50_000  # records per store read of a long answer
SEND_CHUNK = 64 * 1024
BUSY_REPLIES = 16
DRAIN_BYTES = 64 << 20
DRAIN_SECONDS = 0.5


class Caller(NamedTuple):
    """Who asks: from the kernel, never from the request."""

    uid: int
    user: str
    admin: bool  # reads every owner's runs


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process that connected (``SO_PEERCRED``: pid, uid, gid as ints)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def caller_of_uid(uid: int, admin_group: str | None) -> Caller:
    """The caller with this uid: its user name, and whether it is root or a member of
    ``admin_group`` (its primary group or a supplementary one in the group database)."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return Caller(uid, str(uid), uid == 0)
    admin = uid == 0
    if admin_group and not admin:
        try:
            gid = grp.getgrnam(admin_group).gr_gid
            admin = gid in os.getgrouplist(pw.pw_name, pw.pw_gid)
        except (KeyError, OSError):
            admin = False
    return Caller(uid, pw.pw_name, admin)


class ReadService:
    """The service on ``socket_path``; ``identify(conn) -> Caller`` (the kernel's peer
    credentials by default; tests pass their own), ``uid_of(conn)``: the uid whose share a
    connection counts against (the kernel's, read in the accepting thread: no user database
    look-up there)."""

    def __init__(self, socket_path: Path, sessions: StoreSession, *,
                 admin_group: str | None = None,
                 identify: Callable[[socket.socket], Caller] | None = None,
                 uid_of: Callable[[socket.socket], int] = peer_uid,
                 max_clients: int = MAX_CLIENTS,
                 max_clients_per_user: int = MAX_CLIENTS_PER_USER,
                 max_follows_per_user: int = MAX_FOLLOWS_PER_USER,
                 request_timeout: float = REQUEST_TIMEOUT,
                 send_timeout: float = SEND_TIMEOUT,
                 max_response_bytes: int = MAX_RESPONSE_BYTES, beat_every: float = BEAT_EVERY,
                 follow_poll: float = FOLLOW_POLL, end_when_worn: bool = False):
        self.socket_path = Path(socket_path)
        self.sessions = sessions
        self.admin_group = admin_group
        self.identify = identify or (lambda conn: caller_of_uid(peer_uid(conn), admin_group))
        self.uid_of = uid_of
        self.max_clients = max_clients
        self.limits = _Limits(max_clients, max_clients_per_user, max_follows_per_user)
        self.request_timeout = request_timeout
        self.send_timeout = send_timeout
        self.max_response_bytes = max_response_bytes
        self.beat_every = beat_every
        self.follow_poll = follow_poll
        self._listener: socket.socket | None = None
        self._busy_replies = threading.BoundedSemaphore(BUSY_REPLIES)
        self._stop = threading.Event()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._server_thread: threading.Thread | None = None
        self.served = 0  # answered requests (errors included)
        # An embedded store wears a process that takes turns on it (``store.engine_worn``):
        # with ``end_when_worn``, ``serve_forever`` returns with ``worn`` set at a moment no
        # client is being answered, the store let go and the socket still open
        # (``listener_fd``), for the command to start the service afresh on that socket.
        self.end_when_worn = end_when_worn
        self._turns_at_start = engine_turns()
        self.worn = False

    # --- the socket
    def bind(self) -> None:
        """Create the socket (mode 0666: anyone may connect, the kernel says who did). A
        stale socket file is replaced; a live service on the path is an error. A service
        started afresh in place takes over its listening socket from ``LOGCAPTURE_LISTEN_FD``
        (``recycle``) instead."""
        adopted = adopt_listener((socket.AF_UNIX,), self.socket_path)
        if adopted is not None:
            self._listener = adopted
            return
        path = self.socket_path
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            st = os.lstat(path)
            if not stat.S_ISSOCK(st.st_mode):
                raise ServiceError(f"{path} exists and is not a socket; not replacing it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(str(path))
                raise ServiceError(f"another read service answers on {path}")
            except OSError:
                path.unlink()  # stale: nobody listens
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            tmp.unlink(missing_ok=True)
            sock.bind(str(tmp))
            os.chmod(tmp, 0o666)
            os.replace(tmp, path)  # the socket appears with its final mode
        except OSError as e:
            sock.close()
            raise ServiceError(f"cannot create the socket {path}: {e.strerror or e}") from None
        sock.listen(128)
        self._listener = sock

    def serve_forever(self) -> None:
        if self._listener is None:
            self.bind()
        listener = self._listener
        assert listener is not None
        listener.settimeout(0.2)
        try:
            while not self._stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    if self._worn():
                        self.worn = True
                        return
                    continue
                except OSError:
                    if self._stop.is_set():
                        break
                    raise
                self._start_client(conn)
        finally:
            if not self.worn:
                self.close_listener()

    def close_listener(self) -> None:
        """Stop listening and remove the socket file (once)."""
        if self._listener is None:
            return
        self._listener.close()
        self._listener = None
        try:
            self.socket_path.unlink()
        except OSError:
            pass

    def _worn(self) -> bool:
        """Between questions (checked in the accepting thread, so none starts meanwhile;
        followers may be connected: they resume from their last record, ``client.follow``):
        whether the embedded engine has worn this process; if so the store is let go."""
        if not self.end_when_worn or not self.limits.only_following:
            return False
        if not engine_worn(since=self._turns_at_start):
            return False
        close = getattr(self.sessions, "close", None)
        if close is not None:
            close()
        return True

    @property
    def listener_fd(self) -> int | None:
        """The listening socket's descriptor (for a start afresh in place)."""
        return self._listener.fileno() if self._listener is not None else None

    def start(self) -> threading.Thread:
        """Serve in a background thread (tests, the benchmark); ``stop`` ends it."""
        self.bind()
        t = threading.Thread(target=self.serve_forever, daemon=True, name="logcapture-reader")
        t.start()
        self._server_thread = t
        return t

    def stop(self, wait: float = 5.0) -> None:
        """Stop accepting (the socket is removed), then wait up to ``wait`` seconds for the
        clients being answered."""
        self._stop.set()
        deadline = time.monotonic() + wait
        if self._server_thread is not None:
            self._server_thread.join(wait)
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    # --- one client
    @property
    def clients(self) -> int:
        """Connections being answered now."""
        return self.limits.total

    def _start_client(self, conn: socket.socket) -> None:
        try:
            uid = self.uid_of(conn)
        except OSError:
            conn.close()
            return
        refusal = self.limits.take_client(uid)
        if refusal is not None:
            # Told so by a short-lived thread of its own (the answer waits for the request,
            # or the client would lose it: ``_send_error``); past BUSY_REPLIES of those at
            # once, the connection is just closed.
            if self._busy_replies.acquire(blocking=False):
                threading.Thread(target=self._busy, args=(conn, refusal), daemon=True).start()
            else:
                conn.close()
            return
        t = threading.Thread(target=self._client, args=(conn, uid), daemon=True,
                             name="logcapture-reader-client")
        with self._lock:
            self._threads.add(t)
        t.start()

    def _busy(self, conn: socket.socket, message: str) -> None:
        try:
            self._send_error(conn, message, "Busy")
        finally:
            conn.close()
            self._busy_replies.release()

    def _client(self, conn: socket.socket, uid: int) -> None:
        caller: Caller | None = None
        try:
            caller = self.identify(conn)
            request = self._read_request(conn)
            with self.limits.follow(uid, request.op == "follow"):
                self._answer(conn, caller, request)
        except _Gone as e:
            log.info("client %s: %s", caller.user if caller else "?", e)
        except _Refused as e:
            self._send_error(conn, str(e), "Busy")
        except LogcaptureError as e:
            self._send_error(conn, e.message, type(e).__name__)
        except Exception:  # noqa: BLE001 - one client's failure never stops the service
            log.exception("client %s: internal error", caller.user if caller else "?")
            self._send_error(conn, "internal error in the read service (logged)", "internal")
        finally:
            self.served += 1
            self.limits.give_client(uid)  # before the client sees the end: it may ask again
            conn.close()
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _read_request(self, conn: socket.socket) -> Request:
        conn.settimeout(self.request_timeout)
        data = b""
        deadline = time.monotonic() + self.request_timeout
        while b"\n" not in data:
            if len(data) >= MAX_REQUEST_BYTES:
                raise UsageError(f"request longer than {MAX_REQUEST_BYTES} bytes")
            if time.monotonic() > deadline:
                raise UsageError(f"no complete request line within {self.request_timeout:g}s")
            try:
                chunk = conn.recv(MAX_REQUEST_BYTES + 1 - len(data))
            except TimeoutError:
                raise UsageError(f"no complete request line within "
                                 f"{self.request_timeout:g}s") from None
            if not chunk:
                raise _Gone("closed before a whole request line")
            data += chunk
        line, _, _ = data.partition(b"\n")
        return parse_request(line)

    def _answer(self, conn: socket.socket, caller: Caller, request: Request) -> None:
        reader = StoreReader(self.sessions, None if caller.admin else caller.user)
        out = _Sender(conn, self.send_timeout, self.max_response_bytes)
        op, a = request.op, request.args
        if op == "whoami":
            out.value({"user": caller.user, "uid": caller.uid, "admin": caller.admin})
        elif op == "resolve":
            out.value(reader.resolve(a.get("ref")))
        elif op == "summary":
            out.value(reader.summary(a["run"]))
        elif op == "describe":
            out.value(reader.describe(a["run"]))
        elif op == "search":
            out.value(reader.search(a["request"]))
        elif op == "log":
            out.value(reader.log(a["run"], **{k: a[k] for k in ("stderr", "before", "after",
                                                               "limit", "line") if k in a}))
        elif op == "follow":
            def beat() -> None:  # between the follower's reads: is the client still there?
                if time.monotonic() - out.last_sent >= self.beat_every:
                    out.beat()

            out.batches(reader.follow_batches(a["run"], poll=self.follow_poll, on_idle=beat,
                                              resume=a.get("next"),
                                              started=a.get("started", False)),
                        each=True)
        else:
            out.batches(self._batches(reader, op, a))
        out.end()

    @staticmethod
    def _batches(reader: StoreReader, op: str, a: dict[str, Any]) -> Iterable[list[Any]]:
        if op == "runs":
            return [reader.runs()]
        if op == "lines":
            if a.get("tail"):
                return [reader.lines(a["run"], a.get("stream"), a["tail"])]
            return reader.iter_lines(a["run"], a.get("stream"), page=PAGE)
        if op == "metadata":
            return [reader.metadata(a["run"])]
        if op == "samples":
            return [reader.samples(a["run"])]
        if op == "export":
            return [reader.export_rows(a["run"], a["what"])]
        raise UsageError(f"unknown op {op!r}")

    @staticmethod
    def _send_error(conn: socket.socket, message: str, kind: str) -> None:
        """The error line, then a short wait for the client to stop sending: a Unix socket
        closed with unread data resets the connection, and the client would lose the
        error (at most DRAIN_BYTES are read, for at most DRAIN_SECONDS)."""
        try:
            conn.settimeout(1.0)
            conn.sendall(encode({"error": message, "kind": kind}))
            conn.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + DRAIN_SECONDS
            drained = 0
            while drained < DRAIN_BYTES and time.monotonic() < deadline:
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = conn.recv(SEND_CHUNK)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass


class _Gone(Exception):
    """The client went away or stopped reading."""


class _Refused(Exception):
    """A limit refuses the request; the message names it."""


class _Limits:
    """The service's connection counts, in all, per uid, and following per uid, under one
    lock. ``take_client`` counts a connection or says which limit refuses it (the message the
    client gets)."""

    def __init__(self, total: int, per_user: int, follows_per_user: int):
        self.max_total, self.per_user, self.follows_per_user = total, per_user, follows_per_user
        self.total = 0
        self._clients: dict[int, int] = {}  # uid -> connections being answered
        self._follows: dict[int, int] = {}  # uid -> of those, following a run
        self._lock = threading.Lock()

    def take_client(self, uid: int) -> str | None:
        with self._lock:
            mine = self._clients.get(uid, 0)
            if mine >= self.per_user:
                return (f"you already have {mine} connections to the read service, the "
                        "most it allows one user (reader_max_clients_per_user); close some "
                        "(other logcapture commands, `logs -f`) and try again")
            if self.total >= self.max_total:
                return (f"the read service is busy ({self.max_total} clients, its limit "
                        "reader_max_clients); try again")
            self._clients[uid] = mine + 1
            self.total += 1
            return None

    def give_client(self, uid: int) -> None:
        with self._lock:
            self.total -= 1
            _uncount(self._clients, uid)

    @property
    def only_following(self) -> bool:
        """Whether every connection being answered follows a run (none waits for an answer
        to a question)."""
        with self._lock:
            return self.total == sum(self._follows.values())

    @contextmanager
    def follow(self, uid: int, following: bool) -> Iterator[None]:
        """Counts a following connection while it follows; raises ``_Refused`` past the
        limit."""
        if not following:
            yield
            return
        with self._lock:
            mine = self._follows.get(uid, 0)
            if mine >= self.follows_per_user:
                raise _Refused(f"you already follow {mine} run(s) through the read service, "
                               "the most it allows one user (reader_max_follows_per_user); "
                               "stop a `logs -f` and try again")
            self._follows[uid] = mine + 1
        try:
            yield
        finally:
            with self._lock:
                _uncount(self._follows, uid)


def _uncount(counts: dict[int, int], uid: int) -> None:
    """One fewer for ``uid``; a uid at zero leaves the map (it holds only uids with
    connections, however many uids come and go)."""
    left = counts[uid] - 1
    if left:
        counts[uid] = left
    else:
        del counts[uid]


class _Sender:
    """Writes answer lines in chunks, each within ``timeout`` seconds, at most ``limit``
    bytes in all."""

    def __init__(self, conn: socket.socket, timeout: float, limit: int):
        self.conn = conn
        self.limit = limit
        self.sent = 0
        self.count = 0
        self.buf: list[bytes] = []
        self.size = 0
        self.last_sent = time.monotonic()
        conn.settimeout(timeout)

    def _write(self, line: bytes) -> None:
        if self.sent + self.size + len(line) > self.limit:
            raise ServiceError(f"the answer is larger than the service's limit of "
                               f"{self.limit} bytes")
        self.buf.append(line)
        self.size += len(line)
        if self.size >= SEND_CHUNK:
            self.flush()

    def flush(self) -> None:
        if not self.buf:
            return
        data = b"".join(self.buf)
        self.buf, self.size = [], 0
        try:
            self.conn.sendall(data)
        except TimeoutError:
            raise _Gone("stopped reading; dropped") from None
        except OSError as e:
            raise _Gone(f"went away ({e.strerror or e})") from None
        self.sent += len(data)
        self.last_sent = time.monotonic()

    def value(self, value: Any) -> None:
        self._write(encode({"value": value}))

    def batches(self, batches: Iterable[list[Any]], each: bool = False) -> None:
        """Each batch as ``{"items": [...]}`` lines of at most ``BATCH`` items; ``each``:
        send every batch at once (a follower's lines go out as they come)."""
        for batch in batches:
            for i in range(0, len(batch), BATCH):
                self._write(encode({"items": batch[i:i + BATCH]}))
            self.count += len(batch)
            if each:
                self.flush()

    def beat(self) -> None:
        self._write(encode({"beat": True}))
        self.flush()

    def end(self) -> None:
        self._write(encode({"end": True, "count": self.count}))
        self.flush()


__all__ = ["Caller", "NotFound", "ReadService", "caller_of_uid", "peer_uid"]
