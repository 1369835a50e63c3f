"""The capture process wiring: one run of a command with capture, in two processes.

``capture_command`` (in the wrapper) reads the configuration, makes the run's spool directory,
forks the capture worker (``runner.worker.fork_worker``) with its ``WorkerSettings`` and runs the
command under ``runner.spawn.run``, which sends the worker what the ptys give as frames
(``frame.py``). ``_capture_worker`` (in the worker) owns the spool, the ``Pipeline`` and the
resource sampler; ``serve_in_idle_time`` feeds the pipeline the frames until the end frame,
whose outcome becomes the run's end record. Whatever fails here costs a ``logcapture:``
warning, never the job: the command runs without capture if it must.
"""

from __future__ import annotations

import gc
import os
import pwd
import select
import threading
import time
from array import array
from collections import namedtuple
from collections.abc import Callable
from itertools import accumulate, chain
from pathlib import Path

from . import frame
from .config.admin import AdminConfig, load_admin
from .config.checking import keep_free_bytes
from .config.optin import FALLBACK_MESSAGE, STREAMS_AUTO, load_optin, optin_path
from .errors import ConfigError, LogcaptureError
from .limit import OutputLimit
from .pipeline import Pipeline
from .records import ENABLED
from .runner.descriptors import reserve_std_fds, same_destination
from .runner.exits import exec_command, exit_like
from .runner.outcome import Options, Outcome, own_usage
from .runner.readloop import TICK
from .runner.spawn import run
from .runner.terminal import NoTerminal, caller_winsize
from .runner.worker import COALESCE, Worker, fork_worker
from .spool.layout import RESERVE_NAME, create_run_dir
from .spool.writer import SpoolWriter

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any

    from .redact import Redactor
    from .runner.outcome import Beside


def run_command(spool: Path | None, run_id: str | None, mode: str | None, sample: bool,
                command: tuple[str, ...]) -> int:
    """``logcapture run``: capture ``command`` into the spool (``spool`` or the default);
    returns the exit status to end with (the command's; a command killed by a signal has had it
    re-raised here already)."""
    from .errors import Warner
    from .spool.layout import default_root

    return capture_command(list(command), spool_root=spool if spool is not None else
                           default_root(), run_id=run_id, mode=mode, warn=Warner(),
                           sample=sample)


def capture_command(argv: list[str], *, spool_root: Path, run_id: str | None = None,
                    mode: str | None = None, warn: Callable[[str], None],
                    env: dict[str, str] | None = None,
                    slurm: dict[str, str] | None = None, sample: bool = True,
                    beside: Beside | None = None) -> int:
    """Run ``argv`` under ptys with capture; return the exit code for ``sys.exit`` (after
    re-raising the command's signal if it was killed by one). ``beside``:
    ``runner.outcome.Options.beside``.

    This process reads the ptys and copies the bytes to the real outputs, nothing more;
    rendering, classifying, spooling and resource sampling run in a capture worker process
    (``_capture_worker``) forked here, before any thread starts and before the command is
    spawned, so that they run on another core and never stall the reader (a thread would:
    the GIL makes the job block on the ~4 KB pty buffer; docs/performance.md).

    Whatever fails in here before the command starts (a bad config, an unwritable spool)
    is reported through ``warn`` and the command runs without capture (or in the most private
    mode): the job's outcome never depends on logcapture.
    """
    closed = reserve_std_fds()  # before any file is opened here
    # runner.spawn.run starts the command with subprocess: imported before the worker is
    # forked, which asks slurmctld with it at a Slurm job's end (slurm.jobs.job_end_state).
    import subprocess  # noqa: F401
    worker, base_env, winsize, merge, run_dir = prepare(
        argv, spool_root=spool_root, run_id=run_id, mode=mode, warn=warn, env=env,
        slurm=slurm, sample=sample)
    try:
        outcome = run(argv, worker, Options(env=base_env, warn=warn, winsize=winsize,
                                            merge=bool(merge), closed=closed, beside=beside))
    except NoTerminal as e:
        # No pty or no file descriptor left: the command runs as if logcapture were not
        # there, in this process, so its exit status and signals are the
        # wrapper's. The worker is stopped first; a run directory it left without a record
        # (an empty first segment) goes too, so no run that never started stays behind.
        warn(f"cannot start capture: no pseudo-terminal or process ({e.strerror}); capture "
             "disabled for this run, the command runs normally")
        if worker is not None:
            worker.give_up()
        if run_dir is not None:
            remove_if_empty(run_dir)
        return exec_command(argv, base_env, warn, closed)
    if outcome.spawn_error:
        warn(outcome.spawn_error)
    return exit_like(outcome)


class Prepared(namedtuple("Prepared", ("worker", "env", "winsize", "merge", "run_dir"))):
    """What ``prepare`` made: the capture worker (None: capture is off for this run), the
    command's environment, the ptys' size (None: the caller's), whether stdout and stderr
    share one pty, the run's spool directory (None when capture is off)."""

    __slots__ = ()
    if TYPE_CHECKING:
        worker: Worker | None
        env: dict[str, str]
        winsize: tuple[int, int] | None
        merge: bool
        run_dir: Path | None


def prepare(argv: list[str], *, spool_root: Path, run_id: str | None = None,
            mode: str | None = None, warn: Callable[[str], None],
            env: dict[str, str] | None = None, slurm: dict[str, str] | None = None,
            sample: bool = True, merge: bool | None = None, gpus: bool = True) -> Prepared:
    """Everything before the command's ptys: the configuration, the opt-in file, the run's
    spool directory and Start fields, and the capture worker, forked here. ``merge``: whether
    stdout and stderr share one pty (None: decided here, ``runner.descriptors.same_destination``).
    ``gpus`` False: the Start record's inventory without the node's GPUs (no NVML in this
    capture at all: a task of a step, whose node's GPUs its job's batch run and node sampler
    record).
    What fails costs a warning and turns capture off (``Prepared.worker`` None)."""
    base_env = dict(os.environ if env is None else env)
    worker: Worker | None = None
    problems: list[str] = []
    run_dir: Path | None = None
    try:
        try:
            admin = load_admin(env=base_env)
        except ConfigError as e:
            problems += [f"admin config: {p}" for p in e.problems]
            admin = AdminConfig()
        effective_mode = mode
        path = optin_path(base_env)
        optin = load_optin(path)
        if optin.problems:
            problems += optin.problems
            problems.append(FALLBACK_MESSAGE.removeprefix("logcapture: "))  # the note adds its own
        problems += optin.warnings
        if effective_mode is None:
            effective_mode = optin.config.mode if optin.opted_in else ENABLED
        # One pty for both streams when they go to the same place, so that what reaches it
        # is what the job wrote there, in its order (runner.descriptors.same_destination).
        if merge is None:
            merge = optin.config.streams == STREAMS_AUTO and same_destination()
        rid = run_id or default_run_id(base_env)
        run_dir = create_run_dir(spool_root, rid)
        rows, cols = caller_winsize()
        start_fields: dict[str, Any] = dict(
            command=list(argv), cwd=os.getcwd(), user=_user_name(), uid=os.getuid(),
            host=_hostname(), pid=os.getpid(),
            slurm=slurm if slurm is not None else slurm_identity(base_env),
            config={"mode": effective_mode, "optin": str(path) if optin.opted_in else None,
                    "columns": cols, "rows": rows,
                    "streams": "merged" if merge else "separate"})
        if optin.ok and optin.config.notify:  # the messages asked for (insights.notify)
            start_fields["config"]["notify"] = {"events": list(optin.config.notify),
                                                "mail": optin.config.mail}
        for problem in problems:  # on the user's stderr now, in the spool by the worker
            warn(problem)
        settings = WorkerSettings(
            run_id=rid, run_dir=run_dir, admin=admin, mode=effective_mode, rows=rows,
            columns=cols, env=dict(base_env), problems=problems, sample=sample,
            start_fields=start_fields, wrapper_pid=os.getpid(), warn=warn, merged=merge,
            redact=optin.config.redact if optin.ok else (), gpus=gpus)
        worker = fork_worker(lambda fd: _capture_worker(fd, settings))
        base_env["LOGCAPTURE_RUN_ID"] = rid
        winsize: tuple[int, int] | None = (rows, cols)
    except Exception as e:  # noqa: BLE001 - never break the job
        for problem in problems:
            warn(problem)
        reason = e.message if isinstance(e, LogcaptureError) else type(e).__name__
        warn(f"capture disabled for this run: {reason}; the command runs normally")
        worker = None
        winsize = None
        if merge is None:  # the job's bytes, in order, all the same
            merge = same_destination()

    return Prepared(worker, base_env, winsize, bool(merge), run_dir if worker else None)


def remove_if_empty(run_dir: Path) -> None:
    """Remove ``run_dir`` if every file in it but the spool's reserve is empty (nothing was
    captured)."""
    try:
        entries = list(os.scandir(run_dir))
        if any(e.stat(follow_symlinks=False).st_size for e in entries
               if e.name != RESERVE_NAME):
            return
        for e in entries:
            os.unlink(e.path)
        os.rmdir(run_dir)
    except OSError:
        pass  # kept: readers skip a run without records


class WorkerSettings(namedtuple("WorkerSettings", (
        "run_id", "run_dir", "admin", "mode", "rows", "columns", "env", "problems", "sample",
        "start_fields", "wrapper_pid", "warn", "merged", "redact", "gpus"))):
    """What the capture worker needs from the wrapper (it is forked, so this is a plain copy).
    Every field is required and a misspelt one is a TypeError: a named tuple, as the records
    are (records.py says why not a dataclass)."""

    __slots__ = ()
    if TYPE_CHECKING:
        run_id: str
        run_dir: Path
        admin: AdminConfig
        mode: str
        rows: int
        columns: int
        env: dict[str, str]
        problems: list[str]
        sample: bool
        start_fields: dict[str, Any]
        wrapper_pid: int
        warn: Callable[[str], None]
        merged: bool  # one pty for stdout and stderr
        redact: tuple[str, ...]  # the user's own secrets (.logoptin's redact)
        gpus: bool  # the node's GPUs in the inventory (prepare)


def _capture_worker(fd: int, s: WorkerSettings) -> int:
    """The capture process: own the spool, the pipeline and the sampler; render what the
    reader sends until its end frame; write the end record. Returns the exit status."""
    warn = s.warn
    sampler: Any = None
    try:
        spool = SpoolWriter(s.run_dir, segment_bytes=s.admin.segment_bytes,
                            keep_free=keep_free_bytes(s.admin.spool_keep_free, s.run_dir),
                            flush_interval=s.admin.flush_interval,
                            flush_records=s.admin.flush_records, warn=warn)
        pipeline = Pipeline(s.run_id, spool, mode=s.mode, columns=s.columns, rows=s.rows,
                            warn=warn, merged=s.merged, redactor=_redactor(s),
                            limit=OutputLimit(s.admin.job_output_limit,
                                              s.admin.job_output_tail,
                                              s.admin.job_metadata_limit))
        quiet: list[str] = []  # notes for the log only, not the user's stderr
        sampler, inventory = _start_sampler(s.run_id, s.admin.sample_interval, s.env, spool,
                                            quiet, s.sample, root_pid=s.wrapper_pid,
                                            gpus=s.gpus)
        pipeline.start(inventory=inventory, **s.start_fields)
        for problem in s.problems:  # the wrapper told the user already
            pipeline.warn(problem, tell_user=False)
        for text in quiet:
            pipeline.warn(text, tell_user=False)
        if sampler is not None:
            sampler_warn = pipeline.warn
            sampler.warn = lambda text: sampler_warn(f"resource sampling: {text}",
                                                     tell_user=False)
            sampler.start()
    except Exception as e:  # noqa: BLE001 - never break the job
        reason = e.message if isinstance(e, LogcaptureError) else type(e).__name__
        warn(f"capture disabled for this run: {reason}; the command runs normally")
        if sampler is not None:
            sampler.stop(final_sample=False)
        _discard(fd)  # the reader's writes must keep succeeding
        return 0

    # Everything made so far lives as long as this process: out of the collector's sight,
    # so its collections scan only what rendering allocates.
    gc.freeze()
    sched: dict[str, int] = {}
    try:
        end, sched = serve_in_idle_time(fd, pipeline, spool)
    except Exception as e:  # noqa: BLE001 - a bug here must not reach the job
        warn(f"capture stopped after an internal error ({type(e).__name__}); the command "
             "goes on and its output still reaches its files")
        try:
            if sampler is not None:
                sampler.stop(final_sample=False)
            pipeline.close_unfinished()  # keep what was rendered
        except Exception:  # noqa: BLE001, S110 - already warned; the reader must go on
            pass
        _discard(fd)  # the reader's writes must keep succeeding
        return 0
    if sampler is not None:
        try:
            sampler.stop()
        except Exception as e:  # noqa: BLE001
            warn(f"resource sampling failed to stop ({type(e).__name__})")
    try:
        if end is None:
            if s.env.get("SLURM_JOB_ID"):
                pipeline.close_unfinished()  # the epilog knows how the job ended
            else:
                pipeline.finish_lost(f"the logcapture wrapper (pid {s.wrapper_pid}) went away "
                                     "before the command's outcome was known")
            return 0
        outcome = Outcome(end["exit_status"], end["signal"], end["pid"], end["started"],
                          end["ended"], end["bytes"], spawn_error=end["spawn_error"])
        reader = end.get("reader", {})
        mine = own_usage()
        state = "FAILED" if outcome.spawn_error else outcome.state
        if s.env.get("SLURM_JOB_ID") and not outcome.spawn_error:
            from .slurm.jobs import job_end_state

            state = job_end_state(outcome.exit_status, outcome.signal, s.env,
                                  task="step" in (s.start_fields.get("slurm") or {}))
        usage = end.get("usage")
        pipeline.finish(exit_status=outcome.exit_status, signal=outcome.signal,
                        state=state, duration=outcome.duration, bytes_read=outcome.bytes,
                        extra_counts={**({"job": usage} if isinstance(usage, dict) and usage
                                         else {}), "capture": {
                            # Both capture processes (reader and worker), for bench/ and show.
                            "cpu_ms": reader.get("cpu_ms", 0) + mine["cpu_ms"],
                            "max_rss_kib": max(reader.get("max_rss_kib", 0),
                                               mine["max_rss_kib"]),
                            "reader_cpu_ms": reader.get("cpu_ms", 0),
                            "reader_reads": reader.get("reads", 0),
                            "reader_lingers": reader.get("lingers", 0),
                            "worker_cpu_ms": mine["cpu_ms"], **sched},
                            # The counter itself, not a copy: finish redacts the last lines
                            # before it writes the end record.
                            "redactions": pipeline.redactor.counts,
                            **({"sampling": sampler.counts()} if sampler is not None else {})})
    except Exception as e:  # noqa: BLE001
        warn(f"could not finish the spool ({type(e).__name__})")
    return 0


def _redactor(s: WorkerSettings) -> Redactor:
    """The run's redaction: the job's environment, the site's and the user's patterns
    (both checked when their files were read: config/)."""
    from .redact import Redactor, pattern_of

    return Redactor(s.env, variables=s.admin.redact_variables,
                    user=[pattern_of(item) for item in s.redact],
                    site=[pattern_of(item) for item in s.admin.redact_patterns])


def _discard(fd: int) -> None:
    try:
        while os.read(fd, 1 << 20):
            pass
    except OSError:
        pass


# The worker renders in the CPU's idle time: its rendering thread runs under SCHED_IDLE, so a
# CPU that runs only it counts as idle when the kernel places the job and the reader as they
# wake (sched(7)), and the two, which hand every write over through the pty, are not queued
# behind it. A worker that cannot keep up there (every CPU busy: the job's own threads, or
# other jobs on a shared node) hands its work to a thread at the normal policy for the rest of
# the run: once it renders a frame read more than LAG_MAX seconds before (the reader holds a
# frame for at most worker.PUMP_MAX), or when frames waited through LAG_CHECK seconds in which
# it ran less than STARVED of a CPU (while the job prints without pause on a 2-CPU node it
# gets ~15 %; beside a busy process on its CPU, ~0.3 %). Its other thread checks only while
# frames wait. An unprivileged thread cannot leave SCHED_IDLE (sched(7), RLIMIT_NICE), hence
# a second thread, not a change of policy. The spool's flusher thread moves with the
# rendering; the sampler's keeps the normal policy (samples are taken on time).
LAG_MAX = 1.0
LAG_CHECK = 0.25
STARVED = 0.05


def serve_in_idle_time(fd: int, pipeline: Pipeline, spool: SpoolWriter | None = None, *,
                       lag_max: float = LAG_MAX, check: float = LAG_CHECK,
                       starved: float = STARVED,
                       ) -> tuple[dict[str, Any] | None, dict[str, int]]:
    """``_Server.run``, rendering in a thread under SCHED_IDLE until it falls behind (LAG_MAX,
    STARVED), then in this thread at its own policy, from the frame where the other stopped
    (the frame it was rendering is finished first). ``spool``'s flusher thread moves with
    the rendering (``SpoolWriter.restart_flusher``): it writes what the rendering makes, and
    at the normal policy it would take a CPU from the job for every flush. Returns the
    outcome and counts for the end record: ``worker_sched_idle`` (1 when the policy was set),
    ``worker_handovers`` (1 when this thread took over)."""
    server = _Server(fd, pipeline)
    done = threading.Event()
    ready = threading.Event()  # the rendering thread has tried its policy
    ended_r, ended_w = os.pipe()  # wakes this thread when the rendering thread returns
    stop_r, stop_w = os.pipe()  # wakes the rendering thread to stop
    result: list[Any] = []
    counts = {"worker_sched_idle": 0, "worker_handovers": 0}
    clock: list[int] = []

    def render() -> None:
        try:
            try:
                clock.append(time.pthread_getcpuclockid(threading.get_ident()))
            except (AttributeError, OSError):  # no thread CPU clock: the LAG_MAX rule only
                pass
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread's
                counts["worker_sched_idle"] = 1
            except (AttributeError, OSError):  # not Linux, or refused: the normal policy
                pass
            else:
                _move_flusher(spool)
            ready.set()
            result.append(server.run(stop_r))
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            result.append(e)
        finally:
            ready.set()
            os.write(ended_w, b"x")
            done.set()

    try:
        threading.Thread(target=render, name="logcapture-render", daemon=True).start()
    except RuntimeError:  # no thread to be had: render here, at this thread's policy
        for pipe_fd in (ended_r, ended_w, stop_r, stop_w):
            os.close(pipe_fd)
        return server.run(), counts
    ready.wait()
    if counts["worker_sched_idle"]:
        _watch(server, done, ended_r, clock, lag_max, check, starved)
    if server.stop:
        os.write(stop_w, b"x")  # out of a poll without a timeout
    done.wait()
    for pipe_fd in (ended_r, ended_w, stop_r, stop_w):
        os.close(pipe_fd)
    outcome = _outcome(result[0])
    if not server.stopped:
        return outcome, counts  # it ended first
    counts["worker_handovers"] = 1
    _move_flusher(spool)
    server.stop = server.stopped = False
    return server.run(), counts


def _watch(server: _Server, done: threading.Event, ended_fd: int, clock: list[int],
           lag_max: float, check: float, starved: float) -> None:
    """Until the rendering thread returns (``done``): set ``server.stop`` once it falls
    behind (serve_in_idle_time)."""
    poller = select.poll()
    poller.register(server.fd, select.POLLIN)
    poller.register(ended_fd, select.POLLIN)
    idle_checks = 0
    while not done.is_set():
        if idle_checks >= 4:
            # Nothing waited at the last checks: sleep until frames come (or the rendering
            # thread returns), then check on the timer again. Waking for each frame would
            # take a CPU and the GIL from the others at every frame of a flood.
            poller.poll()
            idle_checks = 0
        waited = server.pending()
        ran, since = _cpu_ns(clock), time.monotonic()
        done.wait(check)
        if done.is_set():
            return
        if waited and server.pending():
            idle_checks = 0
            elapsed = time.monotonic() - since
            if server.late >= lag_max or bool(clock) and (
                    _cpu_ns(clock) - ran < starved * elapsed * 1e9):
                server.stop = True  # honoured between two frames: the thread returns
                return
        else:
            idle_checks += 1


def _move_flusher(spool: SpoolWriter | None) -> None:
    """The spool's flusher thread to the calling thread's policy; where no thread can be
    started, the flusher goes on where it is."""
    if spool is not None:
        try:
            spool.restart_flusher()
        except RuntimeError:
            pass


def _cpu_ns(clock: list[int]) -> int:
    """The CPU time of the thread whose CPU-time clock ``clock`` holds (0 when unknown)."""
    try:
        return time.clock_gettime_ns(clock[0]) if clock else 0
    except OSError:
        return 0


def _outcome(value: Any) -> dict[str, Any] | None:
    if isinstance(value, BaseException):
        raise value
    return value


class _Server:
    """Feed ``pipeline`` the frames (frame.py) read from ``fd``: ``run`` returns the end
    frame's payload (the outcome), or None at end of file without one (the wrapper was
    killed; a frame it had not finished writing is dropped). Resumable: ``run`` returns
    early, with ``stopped`` set, between two frames once ``stop`` is set (from another
    thread), and a later ``run`` goes on from there. ``late`` is how long before its
    rendering the last frame rendered was read (seconds).

    Ticks: every TICK seconds of the reader's clock, taken from the frames' times while there
    is a backlog (so a backlog renders as it would have when it was read); when the pipe is
    empty, when the pipeline says a stream has been quiet long enough (``tick_due``), by this
    process's clock, and not at all while it is settled. Consecutive frames of one stream read
    within COALESCE seconds of each other are rendered as one chunk, each read's lines keeping
    its read time: a worker that fell behind catches up in large chunks instead of paying the
    per-chunk cost for every short read (docs/performance.md)."""

    def __init__(self, fd: int, pipeline: Pipeline) -> None:
        self.fd = fd
        self.pipeline = pipeline
        self.buf = bytearray()  # whole frames not rendered yet, then part of the next one
        # Read into one buffer made once: os.read would allocate (and the allocator map,
        # shrink and unmap) a fresh 1 MiB object at every wake-up.
        self.into = bytearray(1 << 20)
        self.last_tick = time.monotonic()
        self.stop = False
        self.stopped = False
        self.rendering = False
        self.late = 0.0
        self._peek = select.poll()
        self._peek.register(fd, select.POLLIN)

    def pending(self) -> bool:
        """Frames wait: being rendered, or not read yet (or the end of file is)."""
        return self.rendering or bool(self._peek.poll(0))

    def run(self, stop_fd: int | None = None) -> dict[str, Any] | None:
        """Render until the end frame (its payload), the end of file (None) or a stop (None,
        ``stopped`` set); ``stop_fd`` turning readable ends a wait for frames to check
        ``stop``."""
        pipeline = self.pipeline
        buf = self.buf
        got = memoryview(self.into)
        readv = os.readv
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        if stop_fd is not None:
            poller.register(stop_fd, select.POLLIN)
        # Frames read before a stop and not rendered yet go first.
        done, end = self._render(buf)
        while not done:
            if self.stop:  # every whole frame read is rendered: go on from the next read
                self.stopped = True
                return None
            due = pipeline.tick_due()
            if due is None:  # nothing to commit until the next frame: no tick wake-ups
                timeout = -1
            else:
                wait = due - time.monotonic()
                timeout = max(0, int(wait * 1000) + 1) if wait > 0 else 0
            ready = poller.poll(timeout)
            if not ready:
                self.last_tick = time.monotonic()
                pipeline.tick(time.time(), self.last_tick)
                continue
            if all(fd != self.fd for fd, _ in ready):
                continue  # only the stop pipe: checked at the top
            self.rendering = True  # before the read empties the pipe: pending() stays true
            n = readv(self.fd, [self.into])
            if not n:
                return None
            buf += got[:n]
            done, end = self._render(buf)
            self.rendering = False
        return end

    def _render(self, buf: bytearray) -> tuple[bool, dict[str, Any] | None]:
        """Render the whole frames at the start of ``buf`` and remove them; (True, outcome)
        at the end frame or a stop, (False, None) when more must be read."""
        pipeline = self.pipeline
        coalesce, tick_s = COALESCE, TICK
        streams = frame.STREAMS
        frames, pos = frame.split(buf)
        i, n = 0, len(frames)
        last_tick = self.last_tick
        try:
            while i < n:
                if self.stop:
                    del buf[:frames[i - 1][7] if i else 0]  # frame i's header starts there
                    self.stopped = True
                    return True, None
                stream, lengths, walls, ends, mono, last_mono, start, end = frames[i]
                if stream == frame.END:
                    return True, frame.decode_end(buf[start:end])
                wall = walls[0]
                if mono - last_tick >= tick_s:
                    # The reader's clock moved on by a tick or more since the last one: tick
                    # as it would have (after a few ticks more change nothing: idled streams
                    # stay so).
                    steps = 0
                    while last_tick + tick_s <= mono:
                        last_tick = last_tick + tick_s if steps < 4 else mono
                        steps += 1
                        pipeline.tick(wall - (mono - last_tick), last_tick)
                j = i + 1
                while j < n and frames[j][0] == stream and frames[j][2][0] - wall <= coalesce:
                    j += 1
                if j == i + 1:
                    chunk = bytes(buf[start:end])
                else:
                    group = frames[i:j]
                    chunk = b"".join([buf[f[6]:f[7]] for f in group])
                    lengths = array("I", chain.from_iterable([f[1] for f in group]))
                    walls = array("d", chain.from_iterable([f[2] for f in group]))
                    ends = b"".join([f[3] for f in group])
                    last_mono = group[-1][5]
                pipeline.feed(streams[stream], chunk, walls[-1], last_mono,
                              list(zip(accumulate(lengths), walls, ends, strict=True)))
                self.late = time.monotonic() - last_mono
                i = j
        finally:
            self.last_tick = last_tick
        del buf[:pos]
        return False, None


def _start_sampler(run_id: str, interval: float, env: dict[str, str], spool: SpoolWriter,
                   problems: list[str], enabled: bool, root_pid: int | None = None,
                   gpus: bool = True) -> tuple[Any, dict[str, Any]]:
    """The resource sampler of this node and the hardware inventory for the start
    record. Returns (None, inventory) when sampling is off; never raises. Its problems (no
    NVML on a CPU node, say) go to the log only: they are not the user's to fix. ``gpus``
    False (no sampling then): the inventory without GPUs, and NVML never started."""
    if not gpus and not enabled:
        from .sampling.sampler import inventory as cpu_inventory

        try:
            return None, cpu_inventory(env=env, gpus=False)
        except Exception as e:  # noqa: BLE001
            problems.append(f"resource inventory unavailable ({type(e).__name__})")
            return None, {}
    from .sampling.gpu import GpuCollector, job_gpus_from_env
    from .sampling.job import JobCollector, cpus_allocated_from_env, find_job_cgroup
    from .sampling.sampler import Sampler
    from .sampling.sampler import inventory as take_inventory

    inventory_warnings: list[str] = []
    try:
        # The job is the wrapper's child; the wrapper and this capture worker are not the job.
        root = root_pid if root_pid is not None else os.getpid()
        job = JobCollector(root_pid=root, cgroup_path=find_job_cgroup(root),
                           exclude_pids={root, os.getpid()},
                           cpus_allocated=cpus_allocated_from_env(env))
        if enabled:  # imported now, as the rest of the worker's modules (gc.freeze)
            job.psutil  # noqa: B018
        gpu = GpuCollector(job_gpus=job_gpus_from_env(env), pids_fn=job.pids)
        inventory = take_inventory(env=env, gpu=gpu, warn=inventory_warnings.append)
    except Exception as e:  # noqa: BLE001
        problems.append(f"resource sampling unavailable ({type(e).__name__})")
        return None, {}
    if inventory_warnings:  # kept with the inventory, not as log notes: a CPU node has no NVML
        inventory = {**inventory, "warnings": inventory_warnings}
    if not enabled:
        gpu.close()
        return None, inventory
    node = (env.get("SLURMD_NODENAME") or _hostname()).split(".")[0]
    sampler = Sampler(run_id, node=node, gpu=gpu, job=job, interval=interval,
                      emit=lambda rec: spool.write([rec]))
    return sampler, inventory


def _hostname() -> str:
    """``socket.gethostname()`` without importing socket (the wrapper's start-up cost): on
    Linux both are uname's nodename."""
    return os.uname().nodename


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def slurm_identity(env: dict[str, str]) -> dict[str, str]:
    """The job's Slurm identity from its environment (when run inside a Slurm job)."""
    keys = {
        "cluster": "SLURM_CLUSTER_NAME", "job_id": "SLURM_JOB_ID",
        "array_job_id": "SLURM_ARRAY_JOB_ID", "array_task_id": "SLURM_ARRAY_TASK_ID",
        "step": "SLURM_STEP_ID", "node": "SLURMD_NODENAME", "job_name": "SLURM_JOB_NAME",
        "partition": "SLURM_JOB_PARTITION", "nodelist": "SLURM_JOB_NODELIST",
        "restart_count": "SLURM_RESTART_COUNT",
        # what the job asked for (insights.efficiency.slurm_request)
        "cpus": "SLURM_CPUS_ON_NODE", "mem_per_node_mb": "SLURM_MEM_PER_NODE",
        "mem_per_cpu_mb": "SLURM_MEM_PER_CPU", "gpus": "SLURM_GPUS_ON_NODE",
        "num_nodes": "SLURM_JOB_NUM_NODES", "end_time": "SLURM_JOB_END_TIME",
    }
    return {k: env[v] for k, v in keys.items() if env.get(v)}


def default_run_id(env: dict[str, str]) -> str:
    """The Slurm job id inside a Slurm job (array tasks have their own), else
    ``<time>-<host>-<pid>``."""
    if env.get("SLURM_JOB_ID"):
        return env["SLURM_JOB_ID"]
    host = _hostname().split(".")[0] or "host"
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{host}-{os.getpid()}"
