"""The progress bars of one stream, followed while the renderer collapses them.

``ProgressTracker`` is given, at most once a second (``progress.INTERVAL``; a stream where no
bar was found is looked at again after ``LOOK_EVERY``), the lines the renderer still holds
uncommitted, the ones a program redraws (``Renderer.live``), and every
line the renderer commits. A live line that ``progress.parse_bar`` reads is a state of a bar;
the bar's points are its states, at most one a second, and its final state: the line it is
committed as, or its last state when it is erased (tqdm's ``leave=False``), when its count
goes back (the same bar drawn again) or when the stream ends. Between two samples, while a bar
is live, the live lines are read after every renderer step without making a point (a peek):
a bar's latest state is followed, so that the state a reset draws over (Lightning's epoch bar
at 313/313, drawn as the next epoch's 0/313 within the same second) is its final point, and a
bar drawn and ended between two samples is still seen. A bar is known by its label
with its numbers taken out (tqdm's ``epoch 3`` is the bar ``epoch 2`` was) and its place
among the live lines with that label. A committed line of a bar's own shape (``strong``)
that was never seen live (a bar that finished within one read) is a bar of one point; a plain
``n/total`` counter counts only on the line the program drew over after a carriage return
(``Renderer.redrawn``), seen with two different counts, so that a log line that mentions
``3/10`` is no bar, nor a flood of them.

The tracker says nothing about modes: the pipeline keeps a point only where the mode kept the
stream's text (docs/rendering.md, "Progress as data").
"""

from __future__ import annotations

import re
from collections import namedtuple

from ..progress import INTERVAL, BarState, parse_bar

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the job start path)

# A stream with no bar is looked at for a new one at most this often (seconds): a flood's
# chunks, every few milliseconds, cost no parsing of the live lines each.
LOOK_EVERY = 0.25
_DIGITS = re.compile(r"\d+(?:\.\d+)?")
# What every line of a bar's own shape holds (progress.parse_bar): committed lines without
# any are not parsed unless a bar is live (a flood of plain lines costs a few C-level
# substring searches a batch).
_MARKERS = ("%|", "\u2501", "%[", "/step", "/sample", "ETA:", "/s]", "s/it")
# ... and what the final state of a live plain counter holds (looked for only while one is
# live: log lines printed above a tqdm bar mention paths and fractions).
_LIVE_MARKERS = ("/",)


class Point(namedtuple("Point", ("bar", "state", "ts", "rate", "elapsed", "done"))):
    """A kept point of a bar (a ``collections.namedtuple``: no ``typing`` on the start
    path)."""

    __slots__ = ()
    if TYPE_CHECKING:
        bar: int  # the bar's number in its stream, from 0
        state: BarState
        ts: float
        rate: float | None  # per second: the bar's own, else from its previous point
        elapsed: float | None  # seconds: the bar's own, else since it was first seen
        done: bool  # the bar's final state


class _Bar:
    __slots__ = ("number", "first_ts", "last", "last_ts", "emitted", "counts", "missed",
                 "rate")

    def __init__(self, state: BarState, ts: float) -> None:
        self.number: int | None = None  # given when its first point is kept
        self.first_ts = ts
        self.last = state
        self.last_ts = ts
        self.emitted: tuple[float, float] | None = None  # (ts, n) of its last point
        self.counts = {state.n}
        self.missed = 0  # samples in a row that did not see it
        self.rate: float | None = None  # of its last point

    def see(self, state: BarState, ts: float) -> None:
        """Its latest state; ``last_ts`` stays the time its count got there (a bar that
        waits at its end, as an epoch's bar during validation, ends when it got there)."""
        if state.n != self.last.n:
            self.last_ts = ts
        self.last = state


def _key(label: str) -> str:
    return _DIGITS.sub("#", label)


class ProgressTracker:
    """One stream's bars (see the module docstring): ``sample(live, ts)``,
    ``committed(texts, ts)`` and ``finish(ts)`` return the new points."""

    def __init__(self) -> None:
        self._bars: dict[tuple[str, int], _Bar] = {}
        self._numbers = 0
        self._sampled = float("-inf")  # the last sample that found a bar
        self._looked = float("-inf")  # the last sample
        self._ended: dict[str, BarState] = {}  # by label: the last bar committed (``_again``)

    @property
    def live(self) -> bool:
        """Is a bar being followed (seen live, not ended yet)?"""
        return bool(self._bars)

    def due(self, ts: float) -> bool:
        return ts - self._sampled >= INTERVAL and ts - self._looked >= LOOK_EVERY

    def sample(self, live: list[str], ts: float, redrawn: str | None = None) -> list[Point]:
        """The live lines at ``ts`` (``redrawn``: the one of them the program drew over after
        a carriage return, the only one where a plain counter counts). A sample when the last
        one is ``INTERVAL`` ago; else, while a bar is live, a peek (the module docstring): the
        only points it makes are the final states of bars drawn again from the start."""
        due = self.due(ts)
        if not due and not self._bars:
            return []
        if due:
            self._looked = ts
        out: list[Point] = []
        seen: dict[str, int] = {}
        present = set()
        for text in live:
            state = parse_bar(text)
            if state is None or (not state.strong and text != redrawn):
                continue
            k = state.key or _key(state.label)
            key = (k, seen.get(k, 0))
            seen[k] = key[1] + 1
            bar = self._bars.get(key)
            if bar is not None and (state.n < bar.last.n or (
                    state.total != bar.last.total and state.key is None)):
                self._close(bar, out)  # drawn again from the start: a new bar
                del self._bars[key]
                bar = None
            if bar is None and self._again(k, state):
                continue
            if not due:
                self._peek(key, bar, state, ts)
                continue
            self._sampled = ts
            present.add(key)
            if bar is None:
                bar = self._bars[key] = _Bar(state, ts)
            else:
                bar.counts.add(state.n)
                bar.missed = 0
            self._point(bar, state, ts, False, out)
        if not due:
            return out
        if not present and self._bars:
            self._sampled = ts
        for key in [k for k in self._bars if k not in present]:
            # Gone: erased (tqdm's leave=False), or the sample fell in the middle of a
            # redraw (rich erases its rows before it draws them again): ended once two
            # samples in a row missed it.
            bar = self._bars[key]
            bar.missed += 1
            if bar.missed >= 2:
                self._close(self._bars.pop(key), out)
        return out

    def _again(self, k: str, state: BarState) -> bool:
        """Is ``state``, live where no bar is followed, the final state of the bar of label
        ``k`` whose line was just committed, drawn again (a live display's row the renderer
        committed while the program still redraws it)? Else a new bar begins: forget it."""
        ended = self._ended.get(k)
        if ended is not None and (ended.label, ended.n, ended.total) == (
                state.label, state.n, state.total):
            return True
        self._ended.pop(k, None)
        return False

    def _peek(self, key: tuple[str, int], bar: _Bar | None, state: BarState,
              ts: float) -> None:
        """A state seen between samples: the bar's latest, no point; seen, it is not erased
        (rich erases its rows before it draws them again). A plain counter that has made no
        point yet keeps its first state (its first point once it counts), and one first seen
        here waits for a sample: its first two points stay a second apart."""
        if bar is None:
            if state.strong:
                self._bars[key] = _Bar(state, ts)
            return
        bar.counts.add(state.n)
        bar.missed = 0  # drawn since the last sample: not erased
        if state.strong or bar.number is not None:
            bar.see(state, ts)

    def committed(self, texts: list[str], ts: float) -> list[Point]:
        """Lines the renderer committed at ``ts``: a bar's final state when one is a bar
        seen live, or a bar of one point when it has a bar's own shape."""
        out: list[Point] = []
        counters = any(not bar.last.strong for bar in self._bars.values())
        markers = _MARKERS + _LIVE_MARKERS if counters else _MARKERS
        joined = "\n".join(texts)
        if not any(m in joined for m in markers):
            return out
        for text in texts:
            if not any(m in text for m in markers):
                continue
            state = parse_bar(text)
            if state is None:
                continue
            k = state.key or _key(state.label)
            key = min((b for b in self._bars if b[0] == k), default=None)
            if key is not None:
                bar = self._bars.pop(key)
                self._shift(key)
                bar.counts.add(state.n)
                self._point(bar, state, ts, True, out)
                self._ended[k] = state
            elif state.strong:
                self._point(_Bar(state, ts), state, ts, True, out)
                self._ended[k] = state
        return out

    def _shift(self, gone: tuple[str, int]) -> None:
        """The line of bar ``gone`` was committed, the topmost live line of its label: the
        live bars below it with that label are one place higher now."""
        below = sorted(b for b in self._bars if b[0] == gone[0] and b[1] > gone[1])
        for k, i in below:
            self._bars[(k, i - 1)] = self._bars.pop((k, i))

    def finish(self, ts: float) -> list[Point]:
        """The stream ended: each bar still live ends with its last state."""
        out: list[Point] = []
        for bar in self._bars.values():
            self._close(bar, out)
        self._bars.clear()
        return out

    def _close(self, bar: _Bar, out: list[Point]) -> None:
        ts = bar.last_ts if bar.emitted is None else max(bar.last_ts, bar.emitted[0])
        self._point(bar, bar.last, ts, True, out)

    def _point(self, bar: _Bar, state: BarState, ts: float, done: bool,
               out: list[Point]) -> None:
        if not state.strong and len(bar.counts) < 2:
            bar.see(state, ts)
            return  # a counter is a bar once it has been seen counting
        if bar.emitted is not None and bar.emitted[1] == state.n and not done:
            bar.see(state, ts)
            return  # no progress since its last point
        if bar.number is None:
            bar.number = self._numbers
            self._numbers += 1
            if not state.strong and bar.last is not state and bar.last.n != state.n:
                # the counter's first state, held until it counted
                out.append(Point(bar.number, bar.last, bar.last_ts, None,
                                 bar.last.elapsed, False))
                bar.emitted = (bar.last_ts, bar.last.n)
        rate = state.rate
        if rate is None and bar.emitted is not None:
            rate = ((state.n - bar.emitted[1]) / (ts - bar.emitted[0]) if ts > bar.emitted[0]
                    else bar.rate)
        elapsed = state.elapsed if state.elapsed is not None else ts - bar.first_ts
        out.append(Point(bar.number, state, ts, rate, elapsed, done))
        bar.rate = rate
        bar.emitted = (ts, state.n)
        bar.last, bar.last_ts = state, ts
