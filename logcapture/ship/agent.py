"""The agent: tails every run of a spool root and ships new lines as they come."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..config.defaults import SPOOL_RETENTION_DAYS
from ..errors import LogcaptureError, NotFound, SpoolError, StoreAuthError, StoreError
from ..insights.live import LiveWatch
from ..insights.notify import Notifier
from ..ownership import identity_from_spool
from ..records import LOST
from ..spool.abandoned import close_abandoned, writer_gone
from ..spool.layout import find_run_dirs, segments
from ..spool.layout import mtime as _mtime
from ..spool.reading import begun
from ..store import Identity, Store, engine_turns, engine_worn, open_store
from ..userfiles import UserDir
from .batches import BATCH_BYTES, ShippedHook, ship_runs
from .cursor import RunCursor, lock_cursor
from .diagnosis import JobInfo, diagnose_run, notify_event
from .pending import _RunJob
from .result import UploadResult
from .retention import retire_shipped
from .retry import RETRY, STORE_WAIT, RetryPolicy, Warn

BATCH_INTERVAL = 2.0
# How often the agent looks for segments of shipped runs that have outlived the retention
# (a run is shipped while its segments are young; nothing else comes back to it).
SWEEP_EVERY = 3600.0
SAMPLES_DIR = ".samples"  # slurm.SAMPLES_DIR: the node samplers' spool, inside the spool root
SAMPLES_IDLE = 900.0  # seconds without a new sample after which a samples-only run is done
# How often the agent looks for runs that stalled: a stall is found within a minute.
LIVE_EVERY = 30.0


@dataclass
class AgentStats:
    flushes: int = 0
    records: int = 0
    failures: int = 0
    last_error: str = ""


# How often the agent says again that the store is still unreachable, and what is waiting.
REMIND_EVERY = 300.0
# Seconds a batch in flight gets after TERM before the agent gives it up and exits: within
# systemd's TimeoutStopSec (slurm/logcapture-agent.service) with room to spare. The store did
# not take what was given up, or took it and the cursor does not say so: the next start ships
# it (again; the store drops the copies).
STOP_GRACE = 5.0


class AgentStopped(BaseException):
    """Raised in the agent's main thread (``Agent.install_signal_handlers``) when a store call
    outlasts ``STOP_GRACE`` after TERM: a ``BaseException`` like ``KeyboardInterrupt``, so that
    no ``except Exception`` of the HTTP client holds it."""


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@dataclass
class _Outage:
    """The store's state as the agent's log tells it: one line when it fails, a reminder at
    most every ``remind_every`` seconds while it stays down, one line when it is back."""

    remind_every: float
    since: float | None = None  # agent clock of the first failure
    reason: str = ""
    reminded_at: float = 0.0
    failures: int = 0
    shipped: int = 0  # records shipped since the first failure (partial flushes)
    shipped_bytes: int = 0

    def failed(self, now: float, reason: str, waiting: Callable[[], str]) -> str | None:
        self.failures += 1
        self.reason = reason
        if self.since is None:
            self.since = self.reminded_at = now
            return f"store unreachable: {reason}; keeping the spool and retrying"
        if now - self.reminded_at < self.remind_every:
            return None
        self.reminded_at = now
        return (f"store still unreachable after {_duration(now - self.since)} "
                f"({self.failures} tries): {reason}; waiting: {waiting()}")

    def shipped_some(self, result: UploadResult) -> None:
        self.shipped += result.records
        self.shipped_bytes += result.bytes

    def recovered(self, now: float) -> str | None:
        if self.since is None:
            return None
        line = (f"store reachable again after {_duration(now - self.since)} down "
                f"({self.failures} failed tries); shipped {self.shipped} records "
                f"({self.shipped_bytes / 1e6:.1f} MB) since")
        self.since, self.failures, self.shipped, self.shipped_bytes = None, 0, 0, 0
        return line


class Agent:
    """Tail every run under ``spool_root`` and ship new lines in batches: a flush happens when
    the unshipped bytes reach ``batch_bytes`` or the oldest unshipped data is
    ``batch_interval`` seconds old. The store is opened for each flush and closed after it, so
    other processes can use an embedded store in between. ``stop()`` (the CLI calls it on
    TERM/INT) makes ``run()`` flush what is pending and return.

    The node samplers' spool ``spool_root/.samples`` (docs/admin.md: laid out like a spool
    root, ``.samples/JOB/RUN``) is tailed too, so one agent per node ships both. A samples-only
    run has no End record: it is done once everything it holds is shipped and either
    ``job_ended(run_dir)`` says its job ended (the CLI reads the job's trusted record) and its
    segments are closed, or no sample came for ``samples_idle`` seconds; then it is no longer
    watched.

    Transient store failures keep the data and retry on the next flush with ``retry``'s
    backoff; ``log`` (every line printed, unlike ``warn``'s, which may print each distinct
    message once) says when the store failed, every ``remind_every`` seconds what is waiting
    while it stays down, and when it is back. An authentication failure stops the agent
    (``run()`` raises StoreAuthError). ``timeouts``: a server's connect and send/receive
    timeouts (``open_store``)."""

    def __init__(self, spool_root: Path, dsn: str | None = None, *,
                 batch_bytes: int = BATCH_BYTES, batch_interval: float = BATCH_INTERVAL,
                 poll: float = 0.25, retention_days: float | None = SPOOL_RETENTION_DAYS,
                 identify: Callable[[Path], Identity] = identity_from_spool,
                 job_ended: Callable[[Path], bool] = lambda run_dir: False,
                 samples_idle: float = SAMPLES_IDLE, warn: Warn | None = None,
                 job_info: JobInfo | None = None, notifier: Notifier | None = None,
                 stall_seconds: float = 1800.0, live_every: float = LIVE_EVERY,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, log: Warn | None = None,
                 retry: RetryPolicy = RETRY, remind_every: float = REMIND_EVERY,
                 timeouts: tuple[float, float] = (5.0, 60.0), stop_grace: float = STOP_GRACE,
                 end_when_worn: bool = False):
        self.spool_root = Path(spool_root)
        self.job_ended = job_ended
        self.job_info = job_info
        self.notifier = notifier
        self.live = LiveWatch(stall_seconds)
        self.live_every = live_every
        self._live_at = 0.0  # agent clock of the next stall check
        self._live_runs: dict[tuple[str, int], tuple[Path, Identity]] = {}
        self._resumed: set[tuple[str, int]] = set()  # runs begun before this agent (``_resume``)
        self.samples_idle = samples_idle
        self.wall = wall
        self.dsn = dsn
        self.batch_bytes = batch_bytes
        self.batch_interval = batch_interval
        self.poll = poll
        self.retention_days = retention_days
        self.identify = identify
        self.warn = warn or (lambda m: None)
        self.log = log or self.warn
        self.retry = retry
        self.timeouts = timeouts
        self.stop_grace = stop_grace
        self._outage = _Outage(remind_every)
        self._stop_by: float | None = None  # agent clock by which a stopping agent exits
        self._final = False  # in the flush after the loop (``run``)
        self._alarm = False  # a SIGALRM armed by TERM (``install_signal_handlers``)
        self.clock = clock
        self.stats = AgentStats()
        self._stop = threading.Event()
        # An embedded store wears a process that opens it batch after batch (``engine_worn``):
        # with ``end_when_worn`` the loop ends with ``worn`` set, for the command to start the
        # agent afresh.
        self.end_when_worn = end_when_worn
        self._turns_at_start = engine_turns()
        self.worn = False
        self._seen: dict[tuple[str, int], int] = {}  # (run dir, segment index) -> size seen
        self._dirty_since: float | None = None
        self._dirty_bytes = 0
        self._backoff = 0.0
        self._retry_at = 0.0
        self._done: set[str] = set()  # runs fully shipped
        self._sweep_at = 0.0  # agent clock of the next sweep (``sweep``)
        self._said: set[str] = set()  # refused files warned of (``_say_refused``)

    def stop(self) -> None:
        """Make ``run()`` return: it ships no new batch after ``stop_grace`` seconds."""
        if self._stop_by is None:
            self._stop_by = self.clock() + self.stop_grace
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """TERM and INT stop the agent (``stop``); a store call still blocked ``stop_grace``
        seconds later (a server that accepts and never answers) is broken off by SIGALRM
        (setitimer(2)), whose handler raises ``AgentStopped``: the blocked system call returns
        EINTR and Python runs the handler (PEP 475). Main thread only, as every handler."""
        def term(*_: object) -> None:
            if not self._stop.is_set():
                self._alarm = True
                signal.setitimer(signal.ITIMER_REAL, self.stop_grace)
            self.stop()

        def alarm(*_: object) -> None:
            raise AgentStopped

        signal.signal(signal.SIGALRM, alarm)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, term)

    def run_dirs(self) -> list[Path]:
        """The runs to tail: the spool root's, then the node samplers' (``.samples``, when it
        is a directory and not a symlink)."""
        out = find_run_dirs(self.spool_root)
        samples = self.spool_root / SAMPLES_DIR
        try:
            if stat.S_ISDIR(os.stat(samples, follow_symlinks=False).st_mode):
                out += find_run_dirs(samples)
        except OSError:
            pass
        return out

    def _is_samples(self, run_dir: Path) -> bool:
        return run_dir.parent.parent == self.spool_root / SAMPLES_DIR

    def _samples_done(self, job: _RunJob) -> bool:
        """A samples-only run (no End record) is done when all its complete lines are in the
        store, nothing is set aside, and its job ended (segments closed) or it is idle."""
        cur = job.rc.cursor
        if cur.aside or any(cur.lines.get(p.seg.index, 0) < p.skip + p.count
                            for p in job.pending):
            return False
        closed = all(p.seg.closed for p in job.pending)
        if not (closed and self.job_ended(job.run_dir)):
            # segments only: the directory's mtime moves with every cursor save
            newest = max((_mtime(p.seg.path) for p in job.pending), default=0.0)
            if self.wall() - newest < self.samples_idle:
                return False
        cur.shipped_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        job.rc.save()
        return True

    def scan(self) -> int:
        """Bytes appended to spools since the last look (stat only, no reading)."""
        grown = 0
        for run_dir in self.run_dirs():
            if str(run_dir) in self._done:
                continue
            try:
                segs = segments(run_dir)
            except SpoolError:
                continue
            for seg in segs:
                key = (str(run_dir), seg.index)
                try:
                    size = os.stat(seg.path, follow_symlinks=False).st_size
                except OSError:
                    continue
                if key not in self._seen:
                    grown += size or 1
                elif size != self._seen[key]:
                    grown += abs(size - self._seen[key]) or 1
                self._seen[key] = size
        return grown

    def due(self) -> bool:
        grown = self.scan()
        now = self.clock()
        if grown:
            self._dirty_bytes += grown
            if self._dirty_since is None:
                self._dirty_since = now
        if self._dirty_since is None or now < self._retry_at:
            return False
        return (self._dirty_bytes >= self.batch_bytes
                or now - self._dirty_since >= self.batch_interval)

    @property
    def stopping(self) -> bool:
        """Whether ``stop()`` was called (a signal, a test)."""
        return self._stop.is_set()

    def _stopping(self) -> bool:
        """Between batches: whether to leave the rest for the next start (stopped, and the
        grace is over) or for the next flush (stopped: the last flush ships what it can)."""
        return self._stop_by is not None and (self.clock() >= self._stop_by
                                              or not self._final)

    def flush(self) -> UploadResult:
        """Ship everything pending now (one store session for all runs), batch by batch,
        until the agent stops."""
        result = UploadResult()
        self._dirty_since, self._dirty_bytes = None, 0
        runs = [r for r in self.run_dirs() if str(r) not in self._done]
        if not runs:
            return result
        found: dict[int, list[Any]] = {}
        try:
            with open_store(self.dsn, wait=STORE_WAIT, connect_timeout=self.timeouts[0],
                            send_receive_timeout=self.timeouts[1]) as store, \
                    ExitStack() as stack:
                jobs = self._jobs(runs, stack)
                self._resume(store, jobs)
                done = ship_runs(store, jobs, result, max_bytes=self.batch_bytes,
                                 retention_days=self.retention_days, job_info=self.job_info,
                                 notifier=self.notifier, until=self._stopping,
                                 shipped=self._watch(found))
                self._observe(store, jobs, found, result)
                self._finish(store, jobs, done, result)
            self._backoff = 0.0
            self._outage.shipped_some(result)
            if (line := self._outage.recovered(self.clock())) is not None:
                self.log(line)
        except StoreAuthError:
            raise
        except StoreError as e:
            self._failed(e, result)
        self._warn_and_count(result)
        return result

    def _failed(self, e: StoreError, result: UploadResult) -> None:
        """A flush the store failed: retry later (``retry``), and say so (``_Outage``)."""
        self.stats.failures += 1
        self.stats.last_error = e.message
        self._backoff = self.retry.after(self._backoff)
        self._retry_at = self.clock() + self._backoff
        self._dirty_since = self._dirty_since or self.clock()
        self._outage.shipped_some(result)
        line = self._outage.failed(self.clock(), e.message, self.waiting)
        if line is not None:
            self.log(line)

    def waiting(self) -> str:
        """What the spool holds that the store has not taken, for the log: runs, and the
        bytes on disk of their segments with nothing shipped yet or still open (a segment
        shipped in part is left out: this is a stat of each segment, no reading)."""
        runs = size = 0
        for run_dir in self.run_dirs():
            if str(run_dir) in self._done:
                continue
            try:
                with UserDir(run_dir) as d:
                    cur = RunCursor(run_dir, d).cursor
                if cur.shipped_at:
                    continue
                segs = [seg for seg in segments(run_dir)
                        if seg.index not in cur.aside
                        and (not seg.closed or seg.index not in cur.lines)]
                size += sum(os.stat(seg.path, follow_symlinks=False).st_size for seg in segs)
            except (SpoolError, OSError):
                continue
            runs += 1
        return f"{runs} run(s), {size / 1e6:.1f} MB of spool segments"

    def _jobs(self, runs: list[Path], stack: ExitStack) -> list[_RunJob]:
        """The runs to ship now, each with its cursor locked (in ``stack``) and its identity:
        not one an upload holds (next time), one already shipped, or one whose first line is
        not written yet (the identity would miss the Start record's cluster and job id, and
        the rows read next would carry that; its growth brings it back)."""
        jobs = []
        for run_dir in runs:
            try:
                rc = stack.enter_context(lock_cursor(run_dir, wait=0))
            except SpoolError:
                if not os.path.isdir(run_dir):
                    continue  # removed since it was listed (the epilog shipped it)
                raise
            if rc is None:
                self._dirty_since = self._dirty_since or self.clock()
                continue
            self._say_refused(rc)
            if rc.cursor.shipped_at:
                self._done.add(str(run_dir))
                continue
            if not begun(run_dir):
                continue
            try:
                jobs.append(_RunJob(run_dir, rc, self.identify(run_dir)))
            except (LogcaptureError, OSError) as e:
                self.warn(f"run {run_dir.name}: {e}")
        return jobs

    def _say_refused(self, rc: RunCursor) -> None:
        """Warn of the files ``rc`` refused (``userfiles``) now, whatever is done with the run
        next (a run already shipped, or not begun, goes no further)."""
        for w in rc.warnings:
            said = f"run {rc.run_dir.name}: {w}"
            if said not in self._said:  # a file refused by the sweep and then by a flush
                self._said.add(said)
                self.warn(said)
        rc.warnings.clear()
        if len(self._said) > 10_000:  # said again after a while, not remembered forever
            self._said.clear()

    def _finish(self, store: Store, jobs: list[_RunJob], done: list[bool],
                result: UploadResult) -> None:
        """Stop watching the runs shipped to their end; a samples-only run is done once its
        job ended (its efficiency notes then have every sample)."""
        for job, d in zip(jobs, done, strict=True):
            if not d and self._is_samples(job.run_dir):
                d = self._samples_done(job)
                if d:
                    diagnose_run(store, job.identity, self.job_info(job.run_dir)
                                 if self.job_info else {}, result, self.notifier)
            if d:
                key = (job.identity.run, job.identity.uid)
                self.live.forget(key)
                self._live_runs.pop(key, None)
                self._resumed.discard(key)
                self._done.add(str(job.run_dir))
                result.runs.append(job.run_dir.name)

    def _warn_and_count(self, result: UploadResult) -> None:
        for run, seg, no, why in result.bad_lines:
            self.warn(f"run {run}: {seg} line {no}: corrupt line skipped: {why}")
        for run, seg, why in result.set_aside:
            self.warn(f"run {run}: {seg} set aside: {why}")
        for w in result.warnings:
            self.warn(w)
        self.stats.flushes += 1
        self.stats.records += result.records

    # --- while jobs run (logcapture.insights.live)
    def _watch(self, found: dict[int, list[Any]]) -> ShippedHook:
        """``ship_runs``' hook: show the live watch each batch the store took (as it goes:
        the bytes are not kept), gathering what it finds by job (``id``) in ``found``."""
        now = self.wall()

        def shipped(job: _RunJob, data: bytes) -> None:
            if data:
                key = (job.identity.run, job.identity.uid)
                found.setdefault(id(job), []).extend(self.live.observe(key, data, now))
        return shipped

    def _observe(self, store: Store, jobs: list[_RunJob], found: dict[int, list[Any]],
                 result: UploadResult) -> None:
        """Store and announce what the live watch found in what was just shipped
        (``_watch``); every run it saw is watched for stalls from now on."""
        now = self.wall()
        for job in jobs:
            key = (job.identity.run, job.identity.uid)
            if not self._is_samples(job.run_dir):
                self._live_runs[key] = (job.run_dir, job.identity)
                self.live.observe(key, b"", now)
            if found.get(id(job)):
                self._report(store, job.identity, key, found[id(job)], "nan-metric", result)

    def _resume(self, store: Store, jobs: list[_RunJob]) -> None:
        """Before a batch: watch each run that an earlier agent began to ship (this one
        started afresh in place, or was restarted) as if this one had seen what was
        shipped, since that is not shipped again: from the store, its Start record, when it
        last printed, the metric reported NaN and whether its stall was reported."""
        now = self.wall()
        for job in jobs:
            key = (job.identity.run, job.identity.uid)
            if (not job.rc.cursor.records or key in self._resumed
                    or self._is_samples(job.run_dir)
                    or self.live.start_record(key) is not None):
                continue
            run, user = job.identity.run, job.identity.user
            try:
                start = store.run_info(run, user, counts=False)["start_record"]
                last = store.last_output(run, user)
                insights = store.insights(run, user)
            except (StoreError, NotFound):
                continue  # tried again with the next batch
            self._resumed.add(key)
            if start is None:
                continue
            nan_keys = [i["details"]["key"] for i in insights if i["kind"] == "nan-metric"
                        and isinstance((i.get("details") or {}).get("key"), str)]
            stalls = [float(i["ts"]) for i in insights if i["kind"] == "stalled"]
            self.live.resume(key, start, now, last_output=last, nan_keys=nan_keys,
                             stalled=bool(stalls) and (last is None or max(stalls) > last))

    def _report(self, store: Store, identity: Identity, key: tuple[str, int],
                found: list[Any], event: str, result: UploadResult) -> None:
        dicts = [i.to_dict() for i in found]
        try:
            store.insert_insights(identity, dicts, self.wall())
        except StoreError as e:
            result.warnings.append(f"run {identity.run}: {event} not stored: {e.message}")
        if self.notifier is not None:
            result.warnings += notify_event(self.notifier, event, identity,
                                            self.live.start_record(key), dicts)

    def check_live(self, now: float | None = None) -> int:
        """Look for runs that stalled (every ``live_every`` seconds from ``run()``); store
        and announce them. Returns how many were found."""
        now = self.wall() if now is None else now
        stalled = []
        for key, (run_dir, identity) in list(self._live_runs.items()):
            if self.live.start_record(key) is None:
                continue  # a run seen before its Start record: not judged
            running = not self.job_ended(run_dir)
            insight = self.live.check(key, now, running)
            if insight is not None:
                stalled.append((key, identity, insight))
        if not stalled:
            return 0
        result = UploadResult()
        try:
            with open_store(self.dsn, wait=STORE_WAIT, connect_timeout=self.timeouts[0],
                            send_receive_timeout=self.timeouts[1]) as store:
                for key, identity, insight in stalled:
                    self._report(store, identity, key, [insight], "stalled", result)
        except StoreError as e:
            self.warn(f"stalled run(s) not stored: {e.message}")
        for w in result.warnings:
            self.warn(w)
        return len(stalled)

    def _slurm_end(self, run_dir: Path) -> str | None:
        """How Slurm says the run's job ended (``NODE_FAIL``, ...), asked only of a run whose
        writer lock is free; None when it has not ended or this is not a Slurm job."""
        from ..slurm.jobs import END_STATES

        if self.job_info is None or not writer_gone(run_dir):
            return None
        try:
            said = str(self.job_info(run_dir).get("slurm_state") or "").split(" ")[0]
        except Exception:  # noqa: BLE001 - Slurm's answer is a hint; the grace rule stands
            return None
        return said if said in END_STATES else None

    def end_abandoned(self) -> int:
        """End the runs whose writer is gone (``spool.abandoned.close_abandoned``; with the live
        watch): nothing else would end a run whose wrapper and node went away outside Slurm, and the
        agent would watch it forever. Their end record ships with the next flush."""
        ended = 0
        for run_dir in self.run_dirs():
            if str(run_dir) in self._done:
                continue
            try:
                end = close_abandoned(run_dir, state=self._slurm_end(run_dir))
                if end is not None:
                    ended += 1
                    self.log(f"run {run_dir.name}: its writer is gone; ended as "
                             f"{getattr(end, 'state', LOST)}")
            except (SpoolError, OSError) as e:
                self.warn(f"run {run_dir.name}: cannot end it: {e}")
        return ended

    def sweep(self) -> UploadResult:
        """Delete the segments of shipped runs that have outlived the retention (every
        ``SWEEP_EVERY`` seconds from ``run()``). A run busy with an upload is left for the
        next sweep."""
        result = UploadResult()
        if self.retention_days is None:
            return result
        for run_dir in self.run_dirs():
            try:
                with lock_cursor(run_dir, wait=0) as rc:
                    if rc is None:
                        continue
                    self._say_refused(rc)
                    if not rc.cursor.shipped_at:
                        continue
                    if retire_shipped(rc, self.retention_days, result):
                        rc.save()
            except (SpoolError, OSError) as e:  # removed meanwhile, or unreadable
                if os.path.isdir(run_dir):
                    self.warn(f"run {run_dir.name}: {e}")
        for w in result.warnings:
            self.warn(w)
        return result

    def run(self) -> AgentStats:
        """Loop until ``stop()``; then flush what is pending (batch by batch, until the store
        fails once or ``stop_grace`` is over) and return. A flush in progress at ``stop()``
        ends after its batch; a store call blocked past the grace is broken off
        (``install_signal_handlers``). With ``end_when_worn``, also returns between batches
        with ``worn`` set once the embedded engine has worn this process (``engine_worn``)."""
        try:
            while not self._stop.is_set():
                if self.due():
                    self.flush()
                if self.clock() >= self._live_at:
                    self._live_at = self.clock() + self.live_every
                    self.end_abandoned()
                    self.check_live()
                if self.clock() >= self._sweep_at:
                    self._sweep_at = self.clock() + SWEEP_EVERY
                    self.sweep()
                if (self.end_when_worn and not self._stop.is_set()
                        and engine_worn(since=self._turns_at_start)):
                    self.worn = True  # between batches: what is pending waits for the new start
                    return self.stats
                self._stop.wait(self.poll)
            self._final = True
            self.scan()
            self.flush()
        except AgentStopped:
            self.log(f"stopped after {self.stop_grace:.0f}s with a store call unanswered; "
                     "the next start ships what is left")
        finally:
            if self._alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
        return self.stats
