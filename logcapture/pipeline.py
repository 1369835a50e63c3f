"""The one place that wires the stages: runner -> render -> filter -> classify -> spool.

``Pipeline`` is the runner's sink. Per output stream it owns a ``Renderer`` and a
``LineFilter``; one ``Classifier`` serves both streams (a ``/LOGCOMMAND`` on either stream
changes the mode of both). What the classifier keeps goes to the ``SpoolWriter``.
Records about the run as a whole (start, warnings, end) are numbered here, in stream ``run``.

Faults: a stage that raises on one stream is replaced, for that stream, by a plain line
splitter (escape sequences stripped, no progress-bar collapsing), and the fault is noted once
by type name only: an exception message may quote the job's text, which a mode may have
dropped.
"""

from __future__ import annotations

import codecs
import gc
import os
import pwd
import re
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from . import frame
from .classify import COMMAND_PREFIX, strictness
from .config import AdminConfig
from .errors import ConfigError, LogcaptureError
from .records import (
    ENABLED,
    NOTE_WARNING,
    OUTPUT_STREAMS,
    RUN,
    STDERR,
    STDOUT,
    End,
    Note,
    Rendered,
    Start,
)
from .spool import SpoolWriter

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any

    from .classify import Classifier
    from .filter import LineFilter
    from .render import Renderer

# The stages (render pulls in pyte and wcwidth's tables) are imported where a Pipeline is
# made: in the capture worker, after the fork, so the wrapper starts the command sooner.
LINE_LIMIT = 65536  # render.LINE_LIMIT, held equal by tests/test_pipeline.py

IDLE_COMMIT = 0.3  # seconds a stream must be quiet before its finished lines are committed
IDLE_EVERY = 0.5  # seconds between commits of a stream that is never quiet

_ESCAPES = re.compile(
    r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])"  # CSI, OSC, ESC x
    r"|[\x00-\x08\x0b-\x1f\x7f]")  # other C0 controls


class _PlainLines:
    """The fallback renderer: split on newlines, keep the text after the last carriage return,
    strip escape sequences, cut long lines. Same interface as ``Renderer``."""

    def __init__(self, line_limit: int = LINE_LIMIT):
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._partial = ""
        self._limit = line_limit

    def _line(self, raw: str) -> Rendered:
        text = _ESCAPES.sub("", raw.rsplit("\r", 1)[-1]).rstrip()
        cut = max(0, len(text) - self._limit)
        return Rendered(text[: self._limit], cut)

    def feed(self, data: bytes) -> list[Rendered]:
        parts = (self._partial + self._decoder.decode(data)).split("\n")
        self._partial = parts.pop()
        if len(self._partial) > 4 * self._limit:
            self._partial = self._partial[-4 * self._limit:]
        return [self._line(p) for p in parts]

    def idle(self) -> list[Rendered]:
        return []

    def finish(self) -> list[Rendered]:
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [self._line(rest)] if rest else []


_NEVER = float("inf")


def _has_command(lines: list[Rendered]) -> bool:
    """Might one of ``lines`` be a /LOGCOMMAND? (A false alarm only orders a tie.)"""
    return any(COMMAND_PREFIX in line.text for line in lines)


def _strictness(lines: list[Rendered]) -> int:
    return strictness([line.text for line in lines])


class Pipeline:
    """Sink for ``runner.run``: ``feed(stream, data, now)``, ``tick(now)``; then ``finish``."""

    def __init__(self, run_id: str, spool: SpoolWriter, *, mode: str, columns: int, rows: int,
                 warn: Callable[[str], None] | None = None):
        from .classify import Classifier
        from .filter import LineFilter
        from .render import Renderer

        self.run_id = run_id
        self.spool = spool
        self._warn_out = warn or (lambda msg: None)
        self.renderers: dict[str, Renderer | _PlainLines] = {
            s: Renderer(columns=columns, rows=rows) for s in OUTPUT_STREAMS}
        self.filters: dict[str, LineFilter] = {s: LineFilter() for s in OUTPUT_STREAMS}
        self.classifier: Classifier = Classifier(run_id, mode)
        self._new_filter = LineFilter
        # Read times (docs/architecture.md, "Read times and order"). Per stream: the newlines
        # fed, as (count so far, read time) of each read that had any; how many lines have
        # been given a time; the read time of the last data fed; whether its committed lines
        # are its newlines in order (the renderer has stayed in line mode since the last
        # resync), so that the k-th line was read with the k-th newline.
        self._clock: dict[str, deque[tuple[int, float]]] = {s: deque() for s in OUTPUT_STREAMS}
        self._newlines = dict.fromkeys(OUTPUT_STREAMS, 0)
        self._timed = dict.fromkeys(OUTPUT_STREAMS, 0)
        self._fed = dict.fromkeys(OUTPUT_STREAMS, 0.0)
        self._exact = dict.fromkeys(OUTPUT_STREAMS, True)
        # Committed lines waiting for the classifier, per stream: (read time, lines) runs. They
        # go in read-time order across the streams (``_release``).
        self._waiting: dict[str, deque[tuple[float, list[Rendered]]]] = {
            s: deque() for s in OUTPUT_STREAMS}
        self._known = 0.0  # every read up to this time has been fed (the reader's round ends)
        self._released = 0.0  # the latest read time handed to the classifier
        self._run_seq = 0
        self._run_lock = threading.Lock()
        self._last_data = {s: 0.0 for s in OUTPUT_STREAMS}
        self._idled = {s: True for s in OUTPUT_STREAMS}
        self._last_idle = {s: 0.0 for s in OUTPUT_STREAMS}
        self._faulted: set[str] = set()

    # --- run-level records ---------------------------------------------------------------
    def _next_run_seq(self) -> int:
        with self._run_lock:  # the sampler thread warns too
            seq = self._run_seq
            self._run_seq += 1
            return seq

    def start(self, **fields: object) -> Start:
        rec = Start(run=self.run_id, stream=RUN, seq=self._next_run_seq(), ts=time.time(),
                    mode=self.classifier.mode, **fields)
        self.spool.write([rec])
        return rec

    def warn(self, text: str, *, tell_user: bool = True) -> None:
        """A run-level warning: into the spool, and once on the user's stderr."""
        self.spool.write([Note(run=self.run_id, stream=RUN, seq=self._next_run_seq(),
                               ts=time.time(), note=NOTE_WARNING, text=text)])
        if tell_user:
            self._warn_out(text)

    # --- the sink ------------------------------------------------------------------------
    def feed(self, stream: str, data: bytes, now: float, mono: float | None = None,
             marks: list[tuple[int, float, bool]] | None = None) -> None:
        """``data`` read from ``stream`` at ``now`` (epoch seconds) and ``mono``
        (time.monotonic(), default: now). The capture worker passes the reader's times, so a
        backlog is rendered as if it had been rendered when it was read. ``marks``: the reads
        ``data`` joins, as (end offset in ``data``, read time, whether the reader's round
        ended with it); default: one read at ``now`` that ended its round."""
        self._last_data[stream] = time.monotonic() if mono is None else mono
        self._idled[stream] = False
        clock = self._clock[stream]
        n = self._newlines[stream]
        if marks is None:
            marks = [(len(data), now, True)]
        begin = 0
        for end, wall, round_end in marks:
            k = data.count(b"\n", begin, end)
            if k:
                n += k
                clock.append((n, wall))
            if round_end and wall > self._known:
                self._known = wall
            begin = end
        self._newlines[stream] = n
        self._fed[stream] = now
        self._through(stream, lambda r: r.feed(data))

    def tick(self, now: float, mono: float | None = None) -> None:
        """Commit finished lines of a stream that has been quiet for IDLE_COMMIT seconds, and
        of a busy one every IDLE_EVERY seconds (a bar redrawn without pause must not hold
        back the lines printed above it)."""
        if mono is None:
            mono = time.monotonic()
        for stream in OUTPUT_STREAMS:
            if self._idled[stream]:
                continue
            quiet = mono - self._last_data[stream] >= IDLE_COMMIT
            if quiet or mono - self._last_idle[stream] >= IDLE_EVERY:
                self._idled[stream] = quiet
                self._last_idle[stream] = mono
                self._through(stream, lambda r: r.idle(), idle=True)
        self._release()

    def tick_due(self) -> float | None:
        """The monotonic time from which a stream is quiet for IDLE_COMMIT, when ``tick``
        commits its finished lines; None when settled (nothing for ``tick`` to do until more
        data is fed: every stream's finished lines have been committed since its last data).
        A busy stream's commits every IDLE_EVERY need no timer: frames keep coming, and the
        ticks between them do it."""
        due = None
        for stream in OUTPUT_STREAMS:
            if not self._idled[stream]:
                t = self._last_data[stream] + IDLE_COMMIT
                if due is None or t < due:
                    due = t
        return due

    def _through(self, stream: str, step: Callable[[Renderer | _PlainLines], list[Rendered]],
                 idle: bool = False, final: bool = False) -> None:
        """One renderer step of ``stream``; its committed lines wait, with their read times,
        for ``_release``."""
        r = self.renderers[stream]
        screens = getattr(r, "screens", 0)
        exact = self._exact[stream] and getattr(r, "line_mode", True)
        try:
            lines = step(r)
        except Exception as e:  # noqa: BLE001 - the job's output never breaks capture
            self._fault(stream, "rendering", e)
            return
        exact = exact and getattr(r, "line_mode", True) and getattr(r, "screens", 0) == screens
        self._exact[stream] = exact
        if lines:
            self._time(stream, lines)
        if (idle or final) and getattr(self.renderers[stream], "line_mode", True):
            # Every row above the cursor is committed: the newlines fed so far are used up
            # (a redraw that moved the cursor up may have overwritten some of them).
            self._clock[stream].clear()
            self._timed[stream] = self._newlines[stream]
            self._exact[stream] = True
        if not idle and not final:
            self._release()

    def _time(self, stream: str, lines: list[Rendered]) -> None:
        """Give committed lines their read times: the k-th line of a stream whose lines are
        its newlines in order was read with its k-th newline; any other line (its renderer
        moved the cursor, or the line has no newline yet: the end of the stream) with the last
        data fed to that stream, the latest it can have been read."""
        waiting = self._waiting[stream]
        n = len(lines)
        i = 0
        if self._exact[stream]:
            clock = self._clock[stream]
            timed = self._timed[stream]
            while i < n and clock:
                upto, wall = clock[0]
                k = min(n - i, upto - timed)
                if k > 0:
                    waiting.append((wall, lines[i:i + k] if k < n else lines))
                    i += k
                    timed += k
                if timed >= upto:
                    clock.popleft()
            self._timed[stream] = timed + (n - i)
        if i < n:
            waiting.append((self._fed[stream], lines[i:] if i else lines))

    def _horizon(self, stream: str) -> float:
        """The earliest read time a line of ``stream`` not committed yet can be given."""
        if self._exact[stream]:
            clock = self._clock[stream]
            return clock[0][1] if clock else _NEVER
        return _NEVER if self._idled[stream] else self._fed[stream]

    def _release(self, final: bool = False) -> None:
        """Hand the waiting lines of both streams to the classifier in read-time order, each
        only once no line of the other stream read at or before it can still come (unless
        ``final``): a /LOGCOMMAND read at some time then applies to the other stream's lines
        read at or after it, and its lines read in the same round of the reader follow the
        command (the round has one read time). Lines of one stream keep their order."""
        waiting = self._waiting
        out, err = waiting[STDOUT], waiting[STDERR]
        while out or err:
            if out and err:
                first, other = (STDOUT, STDERR) if out[0][0] <= err[0][0] else (STDERR, STDOUT)
                if out[0][0] == err[0][0] and _has_command(waiting[other][0][1]) and (
                        _strictness(waiting[other][0][1]) < _strictness(waiting[first][0][1])):
                    # One round's lines of both streams: the stricter command goes first, so
                    # that it applies to the other stream's lines of the round.
                    first, other = other, first
            else:
                first, other = (STDOUT, STDERR) if out else (STDERR, STDOUT)
            ts, lines = waiting[first][0]
            if not final:
                if ts > self._known:
                    return  # the reader's round of this read has not all arrived yet
                h = self._horizon(other)
                if ts > h or (ts == h and not _has_command(lines)):
                    return  # the other stream may still have lines read before this one
            waiting[first].popleft()
            if ts < self._released:
                ts = self._released  # committed late (the other stream was quiet, or ended)
            else:
                self._released = ts
            self._emit(first, ts, lines)

    def _emit(self, stream: str, now: float, lines: Iterable[Rendered],
              final: bool = False) -> None:
        try:
            items = self.filters[stream].feed(list(lines))
            if final:
                items += self.filters[stream].finish()
            records = self.classifier.feed_many(stream, items, now) if items else []
        except Exception as e:  # noqa: BLE001
            self._fault(stream, "classifying", e)
            return
        if records:
            self.spool.write(records)

    def _fault(self, stream: str, stage: str, e: Exception) -> None:
        if stream in self._faulted:
            return
        self._faulted.add(stream)
        # Type name only: an exception message may quote job text a mode has dropped.
        self.warn(f"internal error while {stage} {stream} ({type(e).__name__}); "
                  f"{stream} continues with plain line splitting")
        self.renderers[stream] = _PlainLines()
        self.filters[stream] = self._new_filter()

    # --- the end -------------------------------------------------------------------------
    def _final_lines(self, now: float) -> None:
        for stream in OUTPUT_STREAMS:
            self._through(stream, lambda r: r.finish(), final=True)
            if stream in self._faulted:  # the fallback splitter's rest
                self._through(stream, lambda r: r.finish(), final=True)
        self._release(final=True)
        for stream in OUTPUT_STREAMS:
            self._emit(stream, max(now, self._released), [], final=True)

    def close_unfinished(self) -> None:
        """The wrapper went away without an outcome (killed): keep every line rendered so far
        and close the spool without an end record; the epilog, which knows the job's end,
        writes that."""
        self._final_lines(time.time())
        self.spool.close()

    def finish(self, *, exit_status: int | None, signal: int | None, state: str,
               duration: float, bytes_read: Mapping[str, int],
               extra_counts: dict[str, dict[str, int]] | None = None) -> End:
        now = time.time()
        self._final_lines(now)
        counts: dict[str, dict[str, int]] = {}
        for stream in OUTPUT_STREAMS:
            c = dict(self.classifier.counts.get(stream, {}))
            for k, v in self.filters[stream].counts.items():
                c[f"filter_{k}"] = v
            c["bytes"] = bytes_read.get(stream, 0)
            counts[stream] = c
        spool_counts = {"records_lost": self.spool.lost, "write_errors": self.spool.errors}
        counts["spool"] = spool_counts
        counts.update(extra_counts or {})
        end = End(run=self.run_id, stream=RUN, seq=self._next_run_seq(), ts=now,
                  exit_status=exit_status, signal=signal, state=state, duration=duration,
                  counts=counts)
        self.spool.write([end])
        self.spool.close()
        return end


# --------------------------------------------------------------------------- one whole run


def capture_command(argv: list[str], *, spool_root: Path, run_id: str | None = None,
                    mode: str | None = None, warn: Callable[[str], None],
                    env: dict[str, str] | None = None,
                    slurm: dict[str, str] | None = None, sample: bool = True) -> int:
    """Run ``argv`` under ptys with capture; return the exit code for ``sys.exit`` (after
    re-raising the command's signal if it was killed by one).

    This process reads the ptys and copies the bytes to the real outputs, nothing more;
    rendering, classifying, spooling and resource sampling run in a capture worker process
    (``_capture_worker``) forked here, before any thread starts and before the command is
    spawned, so that they run on another core and never stall the reader (a thread would:
    the GIL makes the job block on the ~4 KB pty buffer; docs/performance.md).

    Whatever fails in here before the command starts (a bad config, an unwritable spool)
    is reported through ``warn`` and the command runs without capture (or in the most private
    mode): the job's outcome never depends on logcapture.
    """
    from . import runner
    from .config import (
        FALLBACK_MESSAGE,
        STREAMS_AUTO,
        load_admin,
        load_optin,
        optin_path,
    )
    from .spool import create_run_dir

    base_env = dict(os.environ if env is None else env)
    worker: runner.Worker | None = None
    problems: list[str] = []
    merge: bool | None = None
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
        if effective_mode is None:
            effective_mode = optin.config.mode if optin.opted_in else ENABLED
        # One pty for both streams when they go to the same place, so that what reaches it
        # is what the job wrote there, in its order (runner.same_destination).
        merge = optin.config.streams == STREAMS_AUTO and runner.same_destination()
        rid = run_id or default_run_id(base_env)
        run_dir = create_run_dir(spool_root, rid)
        rows, cols = runner.caller_winsize()
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
        settings = _WorkerSettings(
            run_id=rid, run_dir=run_dir, admin=admin, mode=effective_mode, rows=rows,
            columns=cols, env=dict(base_env), problems=problems, sample=sample,
            start_fields=start_fields, wrapper_pid=os.getpid(), warn=warn)
        worker = runner.fork_worker(lambda fd: _capture_worker(fd, settings))
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
            merge = runner.same_destination()

    try:
        outcome = runner.run(argv, worker, runner.Options(env=base_env, warn=warn,
                                                          winsize=winsize, merge=bool(merge)))
    except runner.NoTerminal as e:
        # No pty or no file descriptor left: the command runs as if logcapture were not
        # there, in this process, so its exit status and signals are the
        # wrapper's. The worker is stopped first; a run directory it left without a record
        # (an empty first segment) goes too, so no run that never started stays behind.
        warn(f"cannot start capture: no pseudo-terminal or process ({e.strerror}); capture "
             "disabled for this run, the command runs normally")
        if worker is not None:
            worker.give_up()
            _remove_if_empty(run_dir)
        return runner.exec_command(argv, base_env, warn)
    if outcome.spawn_error:
        warn(outcome.spawn_error)
    return runner.exit_like(outcome)


def _remove_if_empty(run_dir: Path) -> None:
    """Remove ``run_dir`` if every file in it is empty (nothing was captured)."""
    try:
        entries = list(os.scandir(run_dir))
        if any(e.stat(follow_symlinks=False).st_size for e in entries):
            return
        for e in entries:
            os.unlink(e.path)
        os.rmdir(run_dir)
    except OSError:
        pass  # kept: readers skip a run without records


class _WorkerSettings:
    """What the capture worker needs from the wrapper (it is forked, so this is a plain copy)."""

    def __init__(self, **kw: Any):
        self.__dict__.update(kw)

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


def _capture_worker(fd: int, s: _WorkerSettings) -> int:
    """The capture process: own the spool, the pipeline and the sampler; render what the
    reader sends until its end frame; write the end record. Returns the exit status."""
    warn = s.warn
    sampler: Any = None
    try:
        spool = SpoolWriter(s.run_dir, segment_bytes=s.admin.segment_bytes,
                            flush_interval=s.admin.flush_interval,
                            flush_records=s.admin.flush_records, warn=warn)
        pipeline = Pipeline(s.run_id, spool, mode=s.mode, columns=s.columns, rows=s.rows,
                            warn=warn)
        quiet: list[str] = []  # notes for the log only, not the user's stderr
        sampler, inventory = _start_sampler(s.run_id, s.admin.sample_interval, s.env, spool,
                                            quiet, s.sample, root_pid=s.wrapper_pid)
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
    try:
        end = serve(fd, pipeline)
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
            pipeline.close_unfinished()
            return 0
        from .runner import Outcome, own_usage
        outcome = Outcome(end["exit_status"], end["signal"], end["pid"], end["started"],
                          end["ended"], end["bytes"], spawn_error=end["spawn_error"])
        reader = end.get("reader", {})
        mine = own_usage()
        state = "FAILED" if outcome.spawn_error else outcome.state
        if s.env.get("SLURM_JOB_ID") and not outcome.spawn_error:
            from .slurm import job_end_state

            state = job_end_state(outcome.exit_status, outcome.signal, s.env)
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
                            "worker_cpu_ms": mine["cpu_ms"]},
                            **({"sampling": sampler.counts()} if sampler is not None else {})})
    except Exception as e:  # noqa: BLE001
        warn(f"could not finish the spool ({type(e).__name__})")
    return 0


def _discard(fd: int) -> None:
    try:
        while os.read(fd, 1 << 20):
            pass
    except OSError:
        pass


def serve(fd: int, pipeline: Pipeline) -> dict[str, Any] | None:
    """Feed ``pipeline`` the frames (frame.py) read from ``fd`` until the end frame; return
    its payload (the outcome), or None at end of file without one (the wrapper was killed;
    a frame it had not finished writing is dropped).

    Ticks: every TICK seconds of the reader's clock, taken from the frames' times while there
    is a backlog (so a backlog renders as it would have when it was read); when the pipe is
    empty, when the pipeline says a stream has been quiet long enough (``tick_due``), by this
    process's clock, and not at all while it is settled. Consecutive frames of one stream read
    within COALESCE seconds of each other are rendered as one chunk, each frame's lines keeping
    its read time: a worker that fell behind catches up in large chunks instead of paying the
    per-chunk cost for every short read (docs/performance.md)."""
    from .runner import COALESCE, TICK

    split = frame.split
    streams = frame.STREAMS
    buf = bytearray()
    # Read into one buffer made once: os.read would allocate (and the allocator map, shrink
    # and unmap) a fresh 1 MiB object at every wake-up.
    into = bytearray(1 << 20)
    got = memoryview(into)
    readv = os.readv
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    last_tick = time.monotonic()
    while True:
        due = pipeline.tick_due()
        if due is None:  # nothing to commit until the next frame: no tick wake-ups
            timeout = -1
        else:
            wait = due - time.monotonic()
            timeout = max(0, int(wait * 1000) + 1) if wait > 0 else 0
        if not poller.poll(timeout):
            last_tick = time.monotonic()
            pipeline.tick(time.time(), last_tick)
            continue
        n = readv(fd, [into])
        if not n:
            return None
        buf += got[:n]
        frames, pos = split(buf)
        i, n = 0, len(frames)
        while i < n:
            stream, round_end, wall, mono, start, end = frames[i]
            if stream == frame.END:
                return frame.decode_end(buf[start:end])
            if mono - last_tick >= TICK:
                # The reader's clock moved on by a tick or more since the last one: tick as
                # it would have (after a few ticks more change nothing: idled streams stay so).
                steps = 0
                while last_tick + TICK <= mono:
                    last_tick = last_tick + TICK if steps < 4 else mono
                    steps += 1
                    pipeline.tick(wall - (mono - last_tick), last_tick)
            j = i + 1
            while j < n and frames[j][0] == stream and frames[j][2] - wall <= COALESCE:
                j += 1
            if j == i + 1:
                pipeline.feed(streams[stream], bytes(buf[start:end]), wall, mono,
                              [(end - start, wall, round_end)])
            else:
                group = frames[i:j]
                chunk = b"".join([buf[f[4]:f[5]] for f in group])
                marks = []
                at = 0
                for f in group:
                    at += f[5] - f[4]
                    marks.append((at, f[2], f[1]))
                _, _, wall, mono, _, _ = group[-1]
                pipeline.feed(streams[stream], chunk, wall, mono, marks)
            i = j
        del buf[:pos]


def _start_sampler(run_id: str, interval: float, env: dict[str, str], spool: SpoolWriter,
                   problems: list[str], enabled: bool,
                   root_pid: int | None = None) -> tuple[Any, dict[str, Any]]:
    """The resource sampler of this node and the hardware inventory for the start
    record. Returns (None, inventory) when sampling is off; never raises. Its problems (no
    NVML on a CPU node, say) go to the log only: they are not the user's to fix."""
    from . import sampler as S

    inventory_warnings: list[str] = []
    try:
        # The job is the wrapper's child; the wrapper and this capture worker are not the job.
        root = root_pid if root_pid is not None else os.getpid()
        job = S.JobCollector(root_pid=root, cgroup_path=S.find_job_cgroup(root),
                             exclude_pids={root, os.getpid()},
                             cpus_allocated=S.cpus_allocated_from_env(env))
        gpu = S.GpuCollector(job_gpus=S.job_gpus_from_env(env), pids_fn=job.pids)
        inventory = S.inventory(env=env, gpu=gpu, warn=inventory_warnings.append)
    except Exception as e:  # noqa: BLE001
        problems.append(f"resource sampling unavailable ({type(e).__name__})")
        return None, {}
    if inventory_warnings:  # kept with the inventory, not as log notes: a CPU node has no NVML
        inventory = {**inventory, "warnings": inventory_warnings}
    if not enabled:
        gpu.close()
        return None, inventory
    node = (env.get("SLURMD_NODENAME") or _hostname()).split(".")[0]
    sampler = S.Sampler(run_id, node=node, gpu=gpu, job=job, interval=interval,
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
