"""Turns on an embedded store taken in a helper process, for a command that takes many.

Each time a process starts chDB's engine (opens an embedded store that another process held in
between: a *turn*), the engine leaves 5-7 idle threads and about 7 descriptors behind, and
aborts the process once its descriptor limit is reached (``connection.engine_worn``). The
long-lived services start afresh in place (``logcapture.recycle``). A command that follows a
run straight from an embedded store (``logs -f`` as the store's owner, not through the read
service) lets the store go between its reads, so that the shipper can write, and takes a turn
every read: it would abort after a few minutes.

``Elsewhere`` takes those turns in a helper (``python -m logcapture.store.turns``, spawned, not
forked from a process whose engine threads run): each ``open`` opens the store there and
returns a ``Store`` stand-in whose method calls are answered there; its ``close`` lets the
store go. A helper that the engine has worn exits after its turn and the next ``open`` spawns
another, so the command itself starts the engine at most once, whatever it follows.

The protocol, over the helper's stdin and a copy of its stdout (its fd 1 then points at its
stderr, so that nothing else it prints can break a reply): pickled tuples, the first
``(dsn, wait)``, then ``("open",)``, ``("call", name, args, kwargs)``, ``("close",)``, each
answered by ``("ok", value)`` or ``("error", exception)``. Pickle is safe here: both ends are
this program, the pipes are private to the two processes.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import IO, Any

from ..errors import LogcaptureError, StoreUnavailable


class Elsewhere:
    """The turns of one command on the embedded store ``dsn``, in a helper process."""

    def __init__(self, dsn: str | None, wait: float = 5.0):
        self.dsn, self.wait = dsn, wait
        self._proc: subprocess.Popen[bytes] | None = None
        self.helpers = 0  # helpers started (tests)

    def open(self) -> FarStore:
        self._ask("open")
        assert self._proc is not None
        return FarStore(self, self._proc)

    def close(self) -> None:
        """Stop the helper (the command is done): end of file on its requests, then a few
        seconds to finish the question it may be answering."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _end(proc, wait=CLOSE_WAIT)

    def _ask(self, *request: Any, proc: subprocess.Popen[bytes] | None = None) -> Any:
        """The answer to ``request``; ``proc``: the helper the question is for (a store it
        opened), StoreUnavailable when that one is gone. A helper that fails to answer, or a
        question interrupted before its answer (^C), ends the helper: the next turn starts
        another rather than read an answer meant for an earlier question."""
        if proc is not None and proc is not self._proc:
            raise StoreUnavailable("the store's helper process ended")
        if self._proc is None:
            self._start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            pickle.dump(request, proc.stdin)
            proc.stdin.flush()
            kind, value = pickle.load(proc.stdout)
        except BaseException as e:  # a broken pipe, a cut or garbled answer, or ^C
            self._proc = None
            _end(proc, wait=0)
            if not isinstance(e, Exception):
                raise
            raise StoreUnavailable(f"the store's helper process ended ({e or 'no answer'})"
                                   ) from None
        if kind == "error":
            raise value
        if request[0] == "close" and value:  # worn: it exits; the next turn starts another
            self.close()
        return value

    def _start(self) -> None:
        # A session of its own: ^C at the terminal is the command's to act on (it ends the
        # helper by closing the pipe), not a KeyboardInterrupt in the middle of an answer.
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "logcapture.store.turns"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, close_fds=True, start_new_session=True)
        self.helpers += 1
        assert self._proc.stdin is not None
        pickle.dump((self.dsn, self.wait), self._proc.stdin)


CLOSE_WAIT = 5.0  # seconds a helper has to finish its question when the command is done


def _end(proc: subprocess.Popen[bytes], wait: float) -> None:
    """Close the helper's pipes, give it ``wait`` seconds to exit, then kill it; reaped."""
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass  # its pipe already broken
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class FarStore:
    """A ``Store`` open in the helper ``proc``: its methods (``wanted`` too) are called there,
    their answers plain data; ``close`` lets the store go. Once that helper has ended (a
    failure, or worn), every question raises StoreUnavailable; ``close`` is then done."""

    def __init__(self, far: Elsewhere, proc: subprocess.Popen[bytes]):
        self._far, self._proc = far, proc
        self._open = True
        self.embedded = True
        self.dsn = far.dsn

    def __getattr__(self, name: str) -> Any:
        from . import Store

        if name.startswith("_") or not callable(getattr(Store, name, None)):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._far._ask("call", name, args, kwargs, proc=self._proc)
        return call

    def close(self) -> None:
        if self._open:
            self._open = False
            if self._proc is self._far._proc:
                self._far._ask("close", proc=self._proc)


def _answer(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The helper's loop (module docstring)."""
    from . import engine_turns, engine_worn, open_store

    dsn, wait = pickle.load(requests)
    since = engine_turns()
    store: Any = None
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            break
        value: Any = None
        try:
            if request[0] == "open":
                store = open_store(dsn, wait=wait, must_exist=True)
            elif request[0] == "call" and store is None:
                raise StoreUnavailable("the store is not open in its helper process")
            elif request[0] == "call":
                value = getattr(store, request[1])(*request[2], **request[3])
            else:
                if store is not None:
                    store.close()
                store = None
                value = engine_worn(since)
            reply: tuple[str, Any] = ("ok", value)
        except Exception as e:  # noqa: BLE001 - every failure goes back to the command
            try:
                pickle.loads(pickle.dumps(e))
                reply = ("error", e)
            except Exception:  # noqa: BLE001 - an exception that does not pickle
                reply = ("error", LogcaptureError(f"{type(e).__name__}: {e}"))
        try:
            data = pickle.dumps(reply)
        except Exception as e:  # noqa: BLE001 - an answer that does not pickle
            data = pickle.dumps(("error", LogcaptureError(f"no answer: {type(e).__name__}")))
        replies.write(data)
        replies.flush()
        if request[0] == "close" and value:
            break  # worn: the command starts another helper for its next turn


def main() -> int:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _answer(os.fdopen(0, "rb"), replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
