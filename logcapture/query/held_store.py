"""The store as one command holds it (``HeldStore``, a ``store_reader.StoreSession``): opened
on the first question and kept until released, since an embedded store is one process's at a
time; or opened for each read and closed after (``Reopened``, between a follower's reads).
A follower takes turns (``HeldStore.take_turns``): on an embedded store, in a helper process
(``store.turns``), since each turn of chDB's engine in this process would leave threads and
descriptors behind.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import cast

from ..errors import LogcaptureError, NotFound
from ..store import Store
from ..store.turns import Elsewhere


class HeldStore:
    """A ``StoreSession`` for one command: opens the store on the first question and keeps
    it until ``release`` (between a follower's reads) or ``close``. ``available`` is False when
    there is no store to read (an embedded store never created, or its config is root's)."""

    def __init__(self, dsn: str | None, wait: float = 5.0,
                 warn: Callable[[str], None] | None = None):
        self.dsn = dsn
        self.wait = wait
        self.warn = warn
        self._store: Store | None = None
        self._checked: bool | None = None
        self._far: Elsewhere | None = None  # take_turns on an embedded store
        self._taking_turns = False

    @property
    def available(self) -> bool:
        if self._checked is None:
            try:
                self._open()
                self._checked = True
            except LogcaptureError as e:
                from ..errors import ConfigError

                if self.warn is not None and not isinstance(e, (NotFound, ConfigError)):
                    self.warn(f"store not read: {e.message}")
                self._checked = False
        return self._checked

    def _open(self) -> Store:
        if self._store is None and self._far is not None:
            self._store = cast(Store, self._far.open())
        elif self._store is None:
            from ..store import open_store

            self._store = open_store(self.dsn, wait=self.wait, must_exist=True)
        return self._store

    def __call__(self) -> AbstractContextManager[Store]:
        return _Borrowed(self._open())

    def wanted(self) -> bool:
        """Whether another process waits for the embedded store held here
        (``store.store_wanted``)."""
        return self._store is not None and self._store.wanted()

    def release(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()

    def take_turns(self) -> None:
        """Let the store go, and from now on take it for one read at a time (a follower:
        the shipper writes in between); on an embedded store those turns are taken in a
        helper process (``store.turns``)."""
        self.release()
        if not self._taking_turns:
            self._taking_turns = True
            if _embedded(self.dsn):
                self._far = Elsewhere(self.dsn, self.wait)

    def close(self) -> None:
        try:
            self.release()
        finally:
            if self._far is not None:
                self._far.close()


def _embedded(dsn: str | None) -> bool:
    """Whether ``dsn`` (None: the one configured) names an embedded store."""
    from ..store.connection import resolve_dsn

    try:
        return resolve_dsn(dsn).startswith("chdb:")
    except LogcaptureError:
        return False  # it will not open here either: the first read says why


class _Borrowed(AbstractContextManager[Store]):
    """A held store lent for one question (leaving the block does not close it)."""

    def __init__(self, store: Store):
        self.store = store

    def __enter__(self) -> Store:
        return self.store

    def __exit__(self, *exc: object) -> None:
        return None

class Reopened:
    """A ``StoreSession`` that opens the held store for one read and closes it after."""

    def __init__(self, held: HeldStore):
        self.held = held

    def __call__(self) -> AbstractContextManager[Store]:
        return _OpenClose(self.held)


class _OpenClose(AbstractContextManager[Store]):
    def __init__(self, held: HeldStore):
        self.held = held

    def __enter__(self) -> Store:
        return self.held._open()

    def __exit__(self, *exc: object) -> None:
        self.held.release()

