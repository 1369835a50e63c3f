"""How ``logcapture serve`` holds its connections: a time limit for a request's head, a bound on
open connections, and one line, not a traceback, when a connection cannot be accepted.

Another user of the machine can connect to the page's port without the token: what such a
connection can take from the owner must be bounded before a request is even read.

- uvicorn closes a keep-alive connection idle after a response (``timeout_keep_alive``), but
  nothing bounds the time before a request's head is complete: a connection that sends
  nothing, or a byte now and then, stays open for ever (its keep-alive timer starts only after
  a response and is cancelled by any byte received; github.com/Kludex/uvicorn pull 1192).
  ``GuardedH11`` gives each request ``header_timeout`` seconds, from the connection (or the
  previous response) to its whole head, and closes the connection past it.
- uvicorn's ``limit_concurrency`` answers 503 to requests past it but still accepts and keeps
  every connection, so idle ones use up the process's file descriptors (RLIMIT_NOFILE). Past
  ``max_connections``, ``GuardedH11`` closes the oldest connection that is waiting for a
  request (the owner's next request is served, whoever opened the others), or the new one when
  every connection is answering a request.
- asyncio reports each ``accept()`` that fails for want of descriptors or memory to the event
  loop's exception handler with a traceback, up to 100 per turn of the loop, and schedules a
  retry for each (``BaseSelectorEventLoop._accept_connection``): megabytes a second, and at
  shutdown every retry still pending fails on the closed listener with a traceback of its
  own. ``AcceptErrors`` counts the failures and prints one line at most every ``every``
  seconds, and drops the retries' failures.

``GuardedH11`` subclasses uvicorn's h11 protocol and uses its connection set and its request
cycle: pyproject.toml pins the uvicorn versions this is tested with (tests/test_web.py).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT = 5.0  # seconds from a connection, or a response, to the next request's head
IDLE_TIMEOUT = 5  # seconds a keep-alive connection may wait after a response (uvicorn's own)
MAX_CONNECTIONS = 100  # a browser opens 6 per host and port; far below the usual 1024 fds
ACCEPT_REPORT_EVERY = 10.0  # seconds between lines about connections that failed to open
# The message asyncio's selector loop gives the exception handler for EMFILE, ENFILE, ENOBUFS
# and ENOMEM from accept() (CPython's Lib/asyncio/selector_events.py).
ACCEPT_OUT_OF_RESOURCES = "socket.accept() out of system resource"
# ... and how a retry it scheduled then fails once the listener is closed (the handle's repr).
RETRY_ON_CLOSED = "_start_serving"

_opened = itertools.count()  # the order connections were made in, for "the oldest"


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's head and a bound on open
    connections (class attributes: ``guarded_h11`` makes a subclass with them set)."""

    header_timeout: float = HEADER_TIMEOUT
    max_connections: int = MAX_CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._order = next(_opened)
        self._head_timer: asyncio.TimerHandle | None = None
        self._await_head()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._answering():
            self._stop_head_timer()  # the head is complete

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._answering():
            self._await_head()  # the next request on this connection gets its own deadline

    # --- the steps
    def _answering(self) -> bool:
        """A request's head came and its response is not complete."""
        return self.cycle is not None and not self.cycle.response_complete

    def _await_head(self) -> None:
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_late)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_late(self) -> None:
        self._head_timer = None
        if not self._answering():
            self.transport.close()

    def _make_room(self) -> None:
        waiting = [c for c in self.connections
                   if isinstance(c, GuardedH11) and not c._answering()
                   and not c.transport.is_closing()]
        oldest = min(waiting, key=lambda c: c._order, default=self)
        oldest.transport.close()


def guarded_h11(header_timeout: float = HEADER_TIMEOUT,
                max_connections: int = MAX_CONNECTIONS) -> type[GuardedH11]:
    """The protocol class for uvicorn's ``Config(http=...)`` with these limits."""
    return type("GuardedH11", (GuardedH11,), {"header_timeout": header_timeout,
                                              "max_connections": max_connections})


class AcceptErrors:
    """An event loop exception handler: failed ``accept()`` calls are counted and reported in
    one line at most every ``every`` seconds (the first at once); anything else goes to the
    loop's default handler."""

    def __init__(self, out: TextIO = sys.stderr, every: float = ACCEPT_REPORT_EVERY,
                 clock: Callable[[], float] = time.monotonic):
        self.out, self.every, self.clock = out, every, clock
        self.failed = 0  # since the last line
        self.reason = ""
        self._next_line = 0.0
        self._scheduled = False

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message, exc = str(context.get("message")), context.get("exception")
        if isinstance(exc, ValueError) and RETRY_ON_CLOSED in message:
            return  # a retry of accepting on the listener closed since: nothing to accept
        if message != ACCEPT_OUT_OF_RESOURCES:
            loop.default_exception_handler(context)
            return
        self.reason = exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)
        self.failed += 1
        if not self._scheduled:
            self._scheduled = True
            loop.call_later(max(0.0, self._next_line - self.clock()), self.report)

    def report(self) -> None:
        self._scheduled = False
        n, self.failed = self.failed, 0
        self._next_line = self.clock() + self.every
        print(f"logcapture serve: accepting a connection failed {n} time(s): {self.reason} "
              f"(reported at most every {self.every:g}s)", file=self.out, flush=True)
