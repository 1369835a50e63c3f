"""How the read service reaches the store: one ``StoreSession`` (``query.StoreSession``) per
kind of store.

- A ClickHouse server: a small pool of clients, one lent to each question (``ServerPool``).
- The embedded store (chDB): one process may open a store folder at a time, guarded by the
  flock on ``<store>.lock`` (``store.open_store``), and the node's agent and the Slurm epilog
  ship into that same folder. ``EmbeddedTurns`` takes turns with them: it opens the store
  for a question (waiting for the lock like any other process) and keeps it open (opening
  costs ~0.2 s) until another process waits for it: a waiter holds a shared flock on
  ``<store>.lock.want`` (``store.store_wanted``), which the service looks at every
  ``CHECK`` seconds; then it closes the store after the question in progress and leaves it
  to others for ``gap`` seconds, so that a shipper polling the lock (every 0.05 s:
  ``store.flock_within``) gets its turn. It also lets go after ``idle`` seconds without a
  question or ``hold`` seconds in a row. Its questions run one at a time (a question is a
  few queries of milliseconds; answers are sent after the store is released, so a client
  that reads slowly holds nothing).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from urllib.parse import urlparse

from ..errors import StoreError, StoreUnavailable
from ..store import Store, open_store, resolve_dsn

HOLD = 60.0  # seconds the service keeps an embedded store at most in one turn
IDLE = 30.0  # ... or since its last question
GAP = 0.25  # seconds it leaves the store to others after a turn
CHECK = 0.05  # seconds between its looks for a process waiting for the store
OPEN_WAIT = 10.0  # seconds a question waits for the store's lock
STOPPED_WAIT = 30.0  # seconds a question asked once the service stops waits to be ended
POOL_SIZE = 4  # clients of a ClickHouse server


class EmbeddedTurns:
    """Questions on an embedded store, taking turns with the other processes that open it."""

    def __init__(self, dsn: str, hold: float = HOLD, idle: float = IDLE, gap: float = GAP,
                 wait: float = OPEN_WAIT):
        self.dsn = dsn
        self.hold, self.idle, self.gap, self.wait = hold, idle, gap, wait
        self._mutex = threading.Lock()  # one question at a time; guards the fields below
        self._store: Store | None = None
        self._opened = 0.0
        self._last = 0.0
        self._reopen_after = 0.0
        self._closer: threading.Thread | None = None
        self._stopped = False
        self.turns = 0  # how many times it opened the store (tests, the benchmark)

    def __call__(self) -> AbstractContextManager[Store]:
        return self._question()

    @contextmanager
    def _question(self) -> Iterator[Store]:
        self._mutex.acquire()
        if self._stopped:  # the service stops, or starts afresh: a follower waits for that
            self._mutex.release()
            time.sleep(STOPPED_WAIT)
            raise StoreUnavailable("the read service is stopping")
        try:
            if self._store is not None and time.monotonic() - self._opened >= self.hold:
                self._close()
            if self._store is None:
                pause = self._reopen_after - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                # created when missing: the service may start before anything is shipped
                self._store = open_store(self.dsn, wait=self.wait)
                self._opened = time.monotonic()
                self.turns += 1
                self._start_closer()
            try:
                yield self._store
            finally:
                self._last = time.monotonic()
        finally:
            self._mutex.release()

    def _close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
            self._reopen_after = time.monotonic() + self.gap

    def _start_closer(self) -> None:
        if self._closer is None or not self._closer.is_alive():
            self._closer = threading.Thread(target=self._close_when_idle, daemon=True,
                                            name="logcapture-store-turns")
            self._closer.start()

    def _close_when_idle(self) -> None:
        while True:
            time.sleep(min(self.idle, CHECK))
            with self._mutex:
                if self._store is None:
                    return
                now = time.monotonic()
                if (self._stopped or now - self._last >= self.idle
                        or now - self._opened >= self.hold or self._store.wanted()):
                    self._close()
                    return

    @property
    def holding(self) -> bool:
        return self._store is not None

    def close(self) -> None:
        with self._mutex:
            self._stopped = True
            self._close()


class ServerPool:
    """Questions on a ClickHouse server: up to ``size`` clients, each lent to one question."""

    def __init__(self, dsn: str, size: int = POOL_SIZE):
        self.dsn = dsn
        self._free: queue.LifoQueue[Store] = queue.LifoQueue()
        self._slots = threading.Semaphore(size)

    def __call__(self) -> AbstractContextManager[Store]:
        return self._question()

    @contextmanager
    def _question(self) -> Iterator[Store]:
        with self._slots:
            try:
                st = self._free.get_nowait()
            except queue.Empty:
                st = open_store(self.dsn)
            failed = False
            try:
                yield st
            except StoreError:
                failed = True  # a client that failed may be in any state: a fresh one next
                raise
            finally:
                if failed:
                    st.close()
                else:
                    self._free.put(st)

    def close(self) -> None:
        while True:
            try:
                self._free.get_nowait().close()
            except queue.Empty:
                return


def store_sessions(dsn: str | None) -> EmbeddedTurns | ServerPool:
    """The sessions for the store ``dsn`` names (``store.resolve_dsn``)."""
    dsn = resolve_dsn(dsn)
    if urlparse(dsn).scheme == "chdb":
        return EmbeddedTurns(dsn)
    return ServerPool(dsn)
