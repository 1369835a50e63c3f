"""Retrying a store that is unavailable: one backoff curve for ``upload`` and the ``Agent``
(the package docstring sorts the failures: only ``StoreUnavailable`` is retried)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import StoreUnavailable

# Seconds a shipper waits for an embedded store that another process holds (the read service
# lets go as soon as it sees a process waiting: store.store_wanted) before it retries later.
STORE_WAIT = 5.0


Warn = Callable[[str], None]


@dataclass(frozen=True)
class RetryPolicy:
    """How long a shipper waits before it tries a failing store again: ``first`` seconds,
    then twice the last wait, at most ``most`` (Vector's sinks likewise back off exponentially
    up to ``retry_max_duration_secs``, 30 s by default). The one curve of ``upload`` and the
    ``Agent``."""

    first: float = 0.5
    most: float = 30.0

    def after(self, delay: float) -> float:
        """The wait after a failure, ``delay`` being the wait before it (0: none yet)."""
        return min(max(delay * 2, self.first), self.most)


RETRY = RetryPolicy()


def _with_retry(fn: Callable[[], Any], deadline: float, sleep: Callable[[float], None],
                warn: Warn | None, policy: RetryPolicy = RETRY) -> Any:
    """Run ``fn``; retry StoreUnavailable with ``policy``'s backoff until ``deadline``
    (monotonic). Auth and data errors pass straight through."""
    delay = 0.0
    while True:
        try:
            return fn()
        except StoreUnavailable as e:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            delay = policy.after(delay)
            if warn:
                warn(f"{e.message}; retrying in {min(delay, left):.1f}s")
            sleep(min(delay, left))
