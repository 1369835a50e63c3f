"""The stages wired in order: the runner's bytes -> render -> filter -> classify -> spool.

``Pipeline`` is the runner's sink, in the capture worker (capture.py runs the processes).
Per output stream it owns a ``Renderer`` and a ``LineFilter``; one ``Classifier`` serves both
streams (a ``/LOGCOMMAND`` on either stream changes the mode of both). What the classifier
keeps goes to the ``SpoolWriter``. Records about the run as a whole (start, warnings, end) are
numbered here, in stream ``run``.

Faults: a stage that raises on one stream is replaced, for that stream, by a plain line
splitter (escape sequences stripped, no progress-bar collapsing), and the fault is noted once
by type name only: an exception message may quote the job's text, which a mode may have
dropped.
"""

from __future__ import annotations

import codecs
import math
import operator
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from itertools import accumulate, compress, groupby, islice, repeat

from .classify import COMMAND_PREFIX, strictness
from .limit import OutputLimit
from .records import (
    LOST,
    NOTE_WARNING,
    OUTPUT_STREAMS,
    RUN,
    STDERR,
    STDOUT,
    Dropped,
    End,
    Note,
    Progress,
    Rendered,
    Start,
)
from .sections import MarkerBytes
from .spool.writer import SpoolWriter

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from .classify import Classifier
    from .filter import LineFilter
    from .redact import Redactor
    from .render import Renderer
    from .render.progress import Point

# The stages (render pulls in pyte and wcwidth's tables) are imported where a Pipeline is
# made: in the capture worker, after the fork, so the wrapper starts the command sooner.
LINE_LIMIT = 65536  # render.LINE_LIMIT, held equal by tests/test_pipeline.py

IDLE_COMMIT = 0.3  # seconds a stream must be quiet before its finished lines are committed
IDLE_EVERY = 0.5  # seconds between commits of a stream that is never quiet
# Seconds after a stream drew over a line that its committed lines may end a bar: a bar's
# final state comes with its last carriage return (tqdm's and Keras' close write "\r...\n"),
# and is committed within the read (a line scrolled off) or at the next idle commit.
REDRAWN = 1.0

_ESCAPES = re.compile(
    r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])"  # CSI, OSC, ESC x
    r"|[\x00-\x08\x0b-\x1f\x7f]")  # other C0 controls


def _idle(renderer: Renderer | _PlainLines, quiet: bool) -> list[Rendered]:
    return renderer.idle(quiet)


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

    def idle(self, quiet: bool = True) -> list[Rendered]:
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


def _all_kept(items: list[Rendered | Dropped], lines: list[Rendered]) -> bool:
    """Did the filter keep every one of ``lines`` (its output ``items`` is those very
    objects)?"""
    return len(items) == len(lines) and all(map(operator.is_, items, lines))


def _by_group(items: list[Rendered | Dropped], lines: list[Rendered],
              sizes: list[int]) -> list[list[Rendered | Dropped]]:
    """The filter's output ``items`` for ``lines`` (groups of ``sizes`` lines, joined), cut
    back into the groups: what feeding the filter group by group would have given each. A kept
    line is one of the objects it was given, in order; a note of dropped lines goes with the
    line that ended their run (the group whose feed would have returned it), or with the last
    group when nothing follows it."""
    if _all_kept(items, lines):
        kept: list[list[Rendered | Dropped]] = []
        at = 0  # the usual burst: every line kept
        for n in sizes:
            kept.append(items[at:at + n])
            at += n
        return kept
    group_of = [g for g, n in enumerate(sizes) for _ in range(n)]
    out: list[list[Rendered | Dropped]] = [[] for _ in sizes]
    pending: list[Rendered | Dropped] = []  # notes waiting for the line after them
    p = 0
    for item in items:
        if type(item) is Dropped:
            pending.append(item)
            continue
        while lines[p] is not item:
            p += 1
        out[group_of[p]] += [*pending, item]
        pending = []
        p += 1
    out[-1] += pending
    return out


class Pipeline:
    """Sink for ``runner.spawn.run``: ``feed(stream, data, now)``, ``tick(now)``; then
    ``finish``."""

    def __init__(self, run_id: str, spool: SpoolWriter, *, mode: str, columns: int, rows: int,
                 warn: Callable[[str], None] | None = None, merged: bool = False,
                 redactor: Redactor | None = None, limit: OutputLimit | None = None):
        """``merged``: stdout and stderr share one terminal, fed as stdout. ``redactor``:
        the run's secrets (default: the token formats alone). ``limit``: the bound on what
        the run stores (default: ``limit.py``'s)."""
        from .classify import Classifier
        from .filter import LineFilter
        from .redact import Redactor
        from .render import Renderer

        self.run_id = run_id
        self.spool = spool
        self.limit = limit if limit is not None else OutputLimit()
        self._cut_noted = False
        self._warn_out = warn or (lambda msg: None)
        self.renderers: dict[str, Renderer | _PlainLines] = {
            s: Renderer(columns=columns, rows=rows) for s in OUTPUT_STREAMS}
        self.redactor = redactor if redactor is not None else Redactor()
        self.filters: dict[str, LineFilter] = {s: LineFilter() for s in OUTPUT_STREAMS}
        self.classifier: Classifier = Classifier(
            run_id, mode, (STDOUT,) if merged else OUTPUT_STREAMS)
        self._new_filter = LineFilter
        self._markers = {s: MarkerBytes() for s in OUTPUT_STREAMS}  # GitLab's, kept visible
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
        self._released_stream = ""  # and the stream of the lines released at it
        self._began = (time.time(), time.monotonic())  # the start record's, once written
        self._run_seq = 0
        self._run_lock = threading.Lock()
        self._last_data = {s: 0.0 for s in OUTPUT_STREAMS}
        self._idled = {s: True for s in OUTPUT_STREAMS}
        self._last_idle = {s: 0.0 for s in OUTPUT_STREAMS}
        self._faulted: set[str] = set()
        from .render.progress import ProgressTracker

        # Progress bars as data (docs/rendering.md): each stream's bars, and their points
        # waiting, as (read time, stream, point), until every line read up to them has been
        # classified, so that the mode they were read in decides whether they are kept.
        self.trackers = {s: ProgressTracker() for s in OUTPUT_STREAMS}
        self._points: deque[tuple[float, str, Point]] = deque()
        self._progress_seq = dict.fromkeys(OUTPUT_STREAMS, 0)
        # When the stream last drew over a line (the read time of its last carriage return,
        # or of a step the full emulator took): its committed lines are searched for bars'
        # final states only within REDRAWN of it or while a bar is live, its live lines only
        # once it has drawn over one at all; so a flood of plain lines costs one search for a
        # byte a read (bench/bench_progress.py).
        self._redrawn_at = dict.fromkeys(OUTPUT_STREAMS, -_NEVER)
        self._screens = dict.fromkeys(OUTPUT_STREAMS, 0)

    # --- run-level records ---------------------------------------------------------------
    def _next_run_seq(self) -> int:
        with self._run_lock:  # the sampler thread warns too
            seq = self._run_seq
            self._run_seq += 1
            return seq

    def start(self, **fields: object) -> Start:
        fields = self.redactor.start_fields(fields)
        rec = Start(run=self.run_id, stream=RUN, seq=self._next_run_seq(), ts=time.time(),
                    mode=self.classifier.mode, **fields)
        self._began = (rec.ts, time.monotonic())
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
             marks: list[tuple[int, float, int]] | None = None) -> None:
        """``data`` read from ``stream`` at ``now`` (epoch seconds) and ``mono``
        (time.monotonic(), default: now). The capture worker passes the reader's times, so a
        backlog is rendered as if it had been rendered when it was read. ``marks``: the reads
        ``data`` joins, as (end offset in ``data``, read time, nonzero when the reader's
        round ended with it); default: one read at ``now`` that ended its round."""
        self._last_data[stream] = time.monotonic() if mono is None else mono
        self._idled[stream] = False
        clock = self._clock[stream]
        n = self._newlines[stream]
        if marks is None:
            marks = [(len(data), now, True)]
        # A flood's chunk joins dozens of reads: each pass over them at C level. A clock
        # entry for each read with newlines: (newlines so far, its read time).
        ends, walls, rounds = zip(*marks, strict=True)
        counts = list(map(data.count, repeat(b"\n"), (0, *ends[:-1]), ends))
        totals = accumulate(counts, initial=n)
        next(totals)
        clock.extend(compress(zip(totals, walls, strict=True), counts))
        n += sum(counts)
        ended = max(compress(walls, rounds), default=self._known)
        if ended > self._known:
            self._known = ended
        self._newlines[stream] = n
        self._fed[stream] = now
        if b"\r" in data:
            self._redrawn_at[stream] = now
        shown = self._markers[stream].feed(data)
        self._through(stream, lambda r: r.feed(shown))

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
                self._through(stream, partial(_idle, quiet=quiet), idle=True)
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
        waiting = len(self._waiting[stream])
        if lines:
            self._time(stream, lines)
        self._track(stream, r, list(islice(self._waiting[stream], waiting, None)), final)
        if (idle or final) and getattr(self.renderers[stream], "line_mode", True):
            # Every row above the cursor is committed: the newlines fed so far are used up
            # (a redraw that moved the cursor up may have overwritten some of them).
            self._clock[stream].clear()
            self._timed[stream] = self._newlines[stream]
            self._exact[stream] = True
        if not idle and not final:
            self._release()

    def _track(self, stream: str, r: Renderer | _PlainLines,
               committed: list[tuple[float, list[Rendered]]], final: bool) -> None:
        """The stream's progress bars after a renderer step: the lines it committed (with
        their read times), its live lines at most once a second, every bar's end at the
        stream's end."""
        from .render import Renderer

        tracker = self.trackers[stream]
        ts = self._fed[stream]
        screens = getattr(r, "screens", 0)
        if screens != self._screens[stream] or not getattr(r, "line_mode", True):
            self._screens[stream] = screens
            self._redrawn_at[stream] = ts
        if self._redrawn_at[stream] == -_NEVER:
            return  # nothing drawn over yet: no bar
        recent = ts - self._redrawn_at[stream] <= REDRAWN or tracker.live or final
        try:
            points = [p for at, lines in committed if recent
                      for p in tracker.committed([line.text for line in lines], at)]
            if final:
                points += tracker.finish(ts)
            elif isinstance(r, Renderer) and (tracker.live or tracker.due(ts)):
                points += tracker.sample(r.live(), ts, r.redrawn())
        except Exception as e:  # noqa: BLE001 - the job's output never breaks capture
            self._fault(stream, "following progress bars on", e)
            return
        self._points.extend((p.ts, stream, p) for p in points)

    def _emit_progress(self, final: bool = False) -> None:
        """Spool the progress points whose read time every line before them has passed
        (classified: the mode they were read in is known), those the mode kept."""
        points = self._points
        out: list[Progress] = []
        while points:
            ts, stream, p = points[0]
            if not final and not self._settled(ts):
                break
            points.popleft()
            if not self.classifier.keeps_progress(ts):
                continue
            seq = self._progress_seq[stream]
            self._progress_seq[stream] = seq + 1
            out.append(Progress(
                run=self.run_id, stream=f"progress:{stream}", seq=seq, ts=p.ts, bar=p.bar,
                label=self.redactor.text(p.state.label), n=p.state.n, total=p.state.total,
                unit=p.state.unit, rate=p.rate, elapsed=p.elapsed, done=int(p.done)))
        if out:
            self.spool.write(out)

    def _settled(self, ts: float) -> bool:
        """Has every line read at or before ``ts`` been handed to the classifier?"""
        return ts <= self._known and all(
            (not q or q[0][0] > ts) and self._horizon(s) > ts
            for s, q in self._waiting.items())

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
        command (the round has one read time). Lines of one stream keep their order.

        The groups released one after another from one stream are filtered and classified as
        one run (``_emit_run``): a group is one read of the reader, a few lines in a flood of
        short prints, and classifying each alone doubled the worker's CPU there
        (bench_runner prints)."""
        released: list[tuple[str, float, list[Rendered]]] = []
        try:
            self._release_into(released, final)
        finally:
            for stream, run in groupby(released, key=operator.itemgetter(0)):
                self._emit_run(stream, [(ts, lines) for _, ts, lines in run])
            if self._points:
                self._emit_progress(final)

    def _release_into(self, released: list[tuple[str, float, list[Rendered]]],
                      final: bool) -> None:
        """``_release``'s choice of what goes next, appended to ``released`` in order."""
        waiting = self._waiting
        out, err = waiting[STDOUT], waiting[STDERR]
        if not final and bool(out) != bool(err):
            # One stream has lines waiting and the other none to come before them (one pty
            # for both, or a quiet stream): what the reader's rounds have completed goes,
            # without the checks that order two streams.
            first, other = (STDOUT, STDERR) if out else (STDERR, STDOUT)
            if self._horizon(other) == _NEVER:
                queue, known = waiting[first], self._known
                while queue and queue[0][0] <= known:
                    ts, lines = queue.popleft()
                    released.append((first, self._in_order(first, ts), lines))
                return
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
            released.append((first, self._in_order(first, ts), lines))

    def _in_order(self, stream: str, ts: float) -> float:
        """The time stamp the lines of ``stream`` read at ``ts`` are released with: never
        before the last released (they were committed late: the other stream was quiet, or
        ended), and after it when they would sort before it at the same time (stderr after
        stdout, or a command's round): the spool then holds a run's records in the log's
        order, ``(ts, stream, seq)`` (logview.py), so line numbers counted in the order of
        writing are the log's and a running job's new lines only add numbers after the last.
        The next float is 0.24 us later at today's epoch, within the store's ns."""
        last = self._released
        if ts < last or (ts == last and stream < self._released_stream):
            ts = last if stream >= self._released_stream else math.nextafter(last, _NEVER)
        self._released, self._released_stream = ts, stream
        return ts

    def _emit_run(self, stream: str, groups: list[tuple[float, list[Rendered]]],
                  final: bool = False) -> None:
        """Filter ``stream``'s groups of lines as one batch, then classify them together when
        the filter kept every line and they are all plain lines (``Classifier.feed_plain``:
        one record, a read time per line), else group by group at each group's read time
        (the filter's output cut back into the groups: ``_by_group``); spool the records in
        one write.
        ``final``: the filter's last note (a run of repeats at the end) goes with the last
        group.
        Secrets are redacted first, in one call for the batch (redact.py's pass-through test
        is per call), so that the filter compares the text that is stored; only the groups'
        sizes are read after that."""
        try:
            if len(groups) == 1:
                ts, lines = groups[0]
                items = self.filters[stream].feed(list(self.redactor.lines(stream, lines)))
                if final:
                    items += self.filters[stream].finish()
                records = self.classifier.feed_many(stream, items, ts) if items else []
            else:
                everything = self.redactor.lines(
                    stream, [line for _, lines in groups for line in lines])
                items = self.filters[stream].feed(everything)
                if final:
                    items += self.filters[stream].finish()
                records = None
                if _all_kept(items, everything):
                    # Every line kept (the usual burst): the groups' spans, as they are.
                    records = self.classifier.feed_plain(
                        stream, items, [(ts, len(lines)) for ts, lines in groups if lines])
                if records is None:
                    records = [rec for ts, part in zip([ts for ts, _ in groups],
                                                       _by_group(items, everything,
                                                                 [len(g) for _, g in groups]),
                                                       strict=True) if part
                               for rec in self.classifier.feed_many(stream, part, ts)]
        except Exception as e:  # noqa: BLE001
            self._fault(stream, "classifying", e)
            return
        if records:
            records = self.limit.feed(records)
            if self.limit.over and not self._cut_noted:
                from .views import size as views_size  # once per run: not at every start

                self._cut_noted = True
                records.append(Note(
                    run=self.run_id, stream=RUN, seq=self._next_run_seq(),
                    ts=self.limit.cut_ts, note=NOTE_WARNING, text=(
                        f"job_output_limit ({views_size(self.limit.limit)} of output text) "
                        "reached: the lines after this are not stored, except the run's "
                        f"last {self.limit.tail_lines}, kept for its end")))
            self.spool.write(records)
            self._note_loss(self.spool.loss)

    def _last_words(self) -> None:
        """Before the spool closes: the lines the output limit kept for the end, then room on
        a full disk for what is left (``SpoolWriter.settle``) and the note of any loss."""
        self._write_tail()
        self.spool.settle()
        self._note_loss(self.spool.take_loss())

    def _write_tail(self) -> None:
        """The lines the output limit held for the run's end, after a note that says what
        was left out before them."""
        tail = self.limit.tail()
        left = self.limit.lines_left_out
        if left:
            from .views import size as views_size  # only past the limit: not at every end

            ts = tail[0].ts if tail else time.time()
            self.spool.write([Note(
                run=self.run_id, stream=RUN, seq=self._next_run_seq(), ts=ts,
                note=NOTE_WARNING, count=left, text=(
                    f"{left} lines ({views_size(self.limit.chars_left_out)} of text) were "
                    "left out here: job_output_limit reached; the run's last lines follow"))])
        if tail:
            self.spool.write(tail)
        if self.limit.metadata_left_out:
            self.warn(f"{self.limit.metadata_left_out} metadata rows were not stored: "
                      f"job_metadata_limit ({self.limit.metadata_limit} rows) reached",
                      tell_user=False)

    def _note_loss(self, loss: tuple[int, str] | None) -> None:
        """A note where the spool's loss ends (it writes again, or the run ends): how many
        lines of output the disk refused, and why. The user's stderr had the spool's own
        warnings when it failed and when it recovered."""
        if loss is not None:
            n, why = loss
            self.warn(f"{n} lines of output were not stored here: the spool could not write "
                      f"them ({why or 'write failed'})", tell_user=False)

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
            self._feed_held(stream)
            self._through(stream, lambda r: r.finish(), final=True)
            if stream in self._faulted:  # the fallback splitter's rest
                self._through(stream, lambda r: r.finish(), final=True)
        self._release(final=True)
        for stream in OUTPUT_STREAMS:
            self._emit_run(stream, [(max(now, self._released), [])], final=True)
        ended = self.classifier.close_sections(max(now, self._released))  # never closed
        if ended:
            self.spool.write(self.limit.feed(ended))

    def _feed_held(self, stream: str) -> None:
        """The bytes ``MarkerBytes`` held back at the end of the stream, to the renderer."""
        held = self._markers[stream].finish()
        if held:
            self._through(stream, lambda r: r.feed(held))

    def close_unfinished(self) -> None:
        """The wrapper went away without an outcome (killed) in a Slurm job: keep every line
        rendered so far and close the spool without an end record; the epilog, which knows
        the job's end, writes that."""
        self._final_lines(time.time())
        self._last_words()
        self.spool.close()

    def finish_lost(self, why: str) -> End:
        """The wrapper went away without an outcome outside Slurm (nobody else will close the
        run): keep every line rendered so far and end the run ``LOST`` at its last output,
        with a note that says why."""
        started, began = self._began
        last = max(self._last_data.values())
        duration = max(0.0, last - began) if last else 0.0
        self.warn(f"{why}; the run is closed as {LOST} at its last output", tell_user=False)
        return self.finish(exit_status=None, signal=None, state=LOST, duration=duration,
                           bytes_read={}, at=started + duration)

    def finish(self, *, exit_status: int | None, signal: int | None, state: str,
               duration: float, bytes_read: Mapping[str, int],
               extra_counts: dict[str, dict[str, int]] | None = None,
               at: float | None = None) -> End:
        """The end record, at ``at`` (default: now, but never before the start plus
        ``duration``: a wall clock stepped back meanwhile must not end a run before it
        began), after the last lines; then the spool is closed."""
        now = time.time()
        self._final_lines(now)
        if at is None:
            at = max(now, self._began[0] + duration)
        self._last_words()
        counts: dict[str, dict[str, int]] = {}
        for stream in OUTPUT_STREAMS:
            c = dict(self.classifier.counts.get(stream, {}))
            for k, v in self.filters[stream].counts.items():
                c[f"filter_{k}"] = v
            c["bytes"] = bytes_read.get(stream, 0)
            counts[stream] = c
        spool_counts = {"records_lost": self.spool.lost, "write_errors": self.spool.errors}
        counts["spool"] = spool_counts
        counts["limit"] = self.limit.counts()
        counts.update(extra_counts or {})
        end = End(run=self.run_id, stream=RUN, seq=self._next_run_seq(), ts=at,
                  exit_status=exit_status, signal=signal, state=state, duration=duration,
                  counts=counts)
        self.spool.write([end])
        self.spool.close()
        return end
