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
        return FarStore(self)

    def close(self) -> None:
        """Stop the helper (the command is done)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()
            proc.stdout.close()
            proc.wait()

    def _ask(self, *request: Any) -> Any:
        if self._proc is None:
            self._start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            pickle.dump(request, proc.stdin)
            proc.stdin.flush()
            kind, value = pickle.load(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            self.close()
            raise StoreUnavailable(f"the store's helper process ended ({e or 'no answer'})"
                                   ) from None
        if kind == "error":
            raise value
        if request[0] == "close" and value:  # worn: it exits; the next turn starts another
            self.close()
        return value

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "logcapture.store.turns"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, close_fds=True)
        self.helpers += 1
        assert self._proc.stdin is not None
        pickle.dump((self.dsn, self.wait), self._proc.stdin)


class FarStore:
    """A ``Store`` open in the helper: its methods (``wanted`` too) are called there, their
    answers plain data; ``close`` lets the store go."""

    def __init__(self, far: Elsewhere):
        self._far = far
        self._open = True
        self.embedded = True

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._far._ask("call", name, args, kwargs)
        return call

    def close(self) -> None:
        if self._open:
            self._open = False
            self._far._ask("close")


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
        pickle.dump(reply, replies)
        replies.flush()
        if request[0] == "close" and value:
            break  # worn: the command starts another helper for its next turn


def main() -> int:
    import signal

    # ^C reaches the whole foreground process group: the command decides, and ends this by
    # closing its end of the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _answer(os.fdopen(0, "rb"), replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
