"""One exception tree for logcapture, and ``failure``: the one place that turns an error into
the line a command ends with and its exit code (the click CLI and ``logcapture run`` both use it).

::

    LogcaptureError                 exit_code 2 unless a subclass says otherwise
    ├── ConfigError                 a config file (.logoptin, admin config) is invalid;
    │                               carries path, line, column, key
    ├── RecordError                 a spool line is not a valid record
    ├── SpoolError                  the spool cannot be read or written
    ├── StoreError                  the store failed
    │   ├── StoreUnavailable        transient: connection refused, timeout, locked chDB folder
    │   ├── StoreDataError          the store refused the data (ClickHouse codes 117, 53, ...)
    │   └── StoreAuthError          401/403, authentication failed: stop at once
    │       └── NoEngine            the embedded store's engine is not installed: stop at once
    ├── ServiceError                the read service refused a request or failed
    │   └── ServiceUnavailable      no read service answers on its socket
    ├── NotFound                    no such run / job
    └── UsageError                  a command was called wrongly (exit_code 2)

The job's own output never raises any of these: bad commands, bad JSON and unknown escapes
become records (warning notes), not exceptions.
"""

from __future__ import annotations

import os


class LogcaptureError(Exception):
    exit_code = 2

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(LogcaptureError):
    """A configuration file is invalid. ``problems`` lists every problem found, each already
    naming the file, line, column and key where known."""

    def __init__(self, message: str, *, path: str = "", line: int | None = None,
                 column: int | None = None, key: str | None = None,
                 problems: list[str] | None = None):
        super().__init__(message)
        self.path = path
        self.line = line
        self.column = column
        self.key = key
        self.problems = problems if problems is not None else [message]


class RecordError(LogcaptureError):
    """See the tree above."""


class SpoolError(LogcaptureError):
    """See the tree above."""


class StoreError(LogcaptureError):
    """See the tree above."""


class StoreUnavailable(StoreError):
    """Transient: retry with backoff."""


class StoreDataError(StoreError):
    """The store refused the data: set the segment aside, do not retry."""


class StoreAuthError(StoreError):
    """Authentication or authorisation failed: stop at once."""


class NoEngine(StoreAuthError):
    """The store is the embedded one and its engine (the ``chdb`` module, the ``embedded``
    extra) is not installed: no retry helps, so it stops at once like an auth failure."""


class ServiceError(LogcaptureError):
    """See the tree above."""


class ServiceUnavailable(ServiceError):
    """No read service answers on the socket (not installed, not started, or gone)."""


class NotFound(LogcaptureError):
    exit_code = 1


class UsageError(LogcaptureError):
    exit_code = 2


def failure(e: BaseException) -> tuple[str, int] | None:
    """The one line a command ends with for an error, and its exit code; None for anything
    else (a bug: the traceback)."""
    if isinstance(e, LogcaptureError):
        return f"logcapture: error: {e.message}", e.exit_code
    if isinstance(e, KeyboardInterrupt):
        return "logcapture: aborted", 130
    if isinstance(e, OSError):
        # A file or folder we may not read (another user's store or spool, say): one line,
        # naming it, not a traceback.
        where = f": {e.filename}" if e.filename else ""
        return f"logcapture: error: {e.strerror or e}{where}", 2
    return None


# Exit statuses a shell gives a command it could not run (POSIX sh, "Command Search and
# Execution"; bash(1), "EXIT STATUS").
EXIT_NOT_FOUND = 127
EXIT_CANNOT_EXECUTE = 126


def exec_failed_status(e: OSError) -> int:
    """The exit status of a command whose exec failed with ``e``, as a shell gives it: 127 when
    it was not found (no such file, or a path or $PATH entry that is not a directory: the
    search found nothing), 126 when it was found and could not be executed."""
    if isinstance(e, (FileNotFoundError, NotADirectoryError)):
        return EXIT_NOT_FOUND
    return EXIT_CANNOT_EXECUTE


def typo_of(value: object, choices: tuple[str, ...]) -> str | None:
    """The choice ``value`` is plainly a typo of, if any. Only then is ``value`` quoted back in
    a message (a config file's, a ``/LOGCOMMAND``'s): anything else may be a secret pasted in
    the wrong place."""
    if not isinstance(value, str) or len(value) > 24 or not value.isascii() \
            or not value.strip().replace("_", "").replace("-", "").isalpha():
        return None  # digits or symbols look like a secret, not a typo
    lowered = value.strip().lower()
    import difflib  # only for a message about a typo

    match = difflib.get_close_matches(lowered, choices, n=1, cutoff=0.7)
    if match:
        return match[0]
    for choice in choices:
        if lowered and (choice.startswith(lowered) and len(lowered) >= 3):
            return choice
    return None


class Warner:
    """``logcapture:`` warnings on the real stderr (here, not in the cli package, so the Slurm job
    wrapper need not import the CLI and click): each distinct message once, at most
    ``limit`` in all, so a failing disk cannot flood the job's error file."""

    def __init__(self, fd: int = 2, limit: int = 5):
        self.fd = fd
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, message: str) -> None:
        if message in self.seen or len(self.seen) >= self.limit:
            return
        self.seen.add(message)
        text = message if message.startswith("logcapture:") else f"logcapture: {message}"
        try:
            os.write(self.fd, (text + "\n").encode("utf-8", "replace"))
        except OSError:
            pass
