"""render.screen: the pyte screen the renderer hands over to for what its fast path does not
model (cursor motion, scroll regions, the alternate screen, wide characters, ...).

Imported by ``Renderer`` on the first such sequence, not with the package: pyte and wcwidth
cost ~40 ms of CPU to import, and most jobs' output (plain lines, ``\\r`` progress bars,
colours) never needs them (docs/performance.md).
"""

from __future__ import annotations

import logging
import unicodedata
from collections import defaultdict
from typing import Any

import pyte
from pyte import charsets as cs
from pyte import control as ctrl
from pyte import modes as mo
from pyte.screens import Char, StaticDefaultDict
from wcwidth import wcwidth

from .. import sgr as _sgr
from ..records import Rendered
from .patterns import PATTERNS

# DECSC savepoints kept (pyte's list is unbounded).
_MAX_SAVEPOINTS = 64
# Busy commits with the cursor below a live display, and no redraw, before the display is taken
# to have stopped: the pipeline commits a busy stream every 0.5 s, so some 5 s of other output.
LIVE_IDLES = 10

log = logging.getLogger("logcapture.render")

# Modes under which the fast path cannot stand in for the screen.
ALT_SCREEN = frozenset({47 << 5, 1047 << 5, 1049 << 5})
BLOCKERS = frozenset({mo.IRM, mo.DECOM}) | ALT_SCREEN
AUTOWRAP = mo.DECAWM  # the fast path needs it on
LAT1_MAP = cs.LAT1_MAP

_DEFAULT = Char(data=" ", fg="default", bg="default", reverse=False)


class _Cells(dict[str, Char]):
    """Cell per character of one style, shared (cells are immutable). A styled cell's ``fg``
    holds its whole normalised style (``logcapture.sgr``); pyte's own attributes are never
    set (``Screen.select_graphic_rendition``), so a cell with pyte's ``fg`` "default" is
    plain."""

    def __init__(self, sgr: str = "", limit: int = 8192) -> None:
        super().__init__()
        self.base = _DEFAULT._replace(fg=sgr) if sgr else _DEFAULT
        self.limit = limit

    def __missing__(self, ch: str) -> Char:
        if len(self) > self.limit:
            self.clear()
        c = self[ch] = self.base._replace(data=ch)
        return c


_CELL = _Cells()
# The styled cells: at most 256 styles of 512 characters each (~130k cells however many
# colours a program cycles through; a cache, so a miss costs only a new cell).
_STYLED: dict[str, _Cells] = {}
_MAX_STYLES = 256
_STYLED_CELLS = 512


def cells_of(sgr: str) -> _Cells:
    """The shared cells of style ``sgr`` ('' plain)."""
    if not sgr:
        return _CELL
    cells = _STYLED.get(sgr)
    if cells is None:
        if len(_STYLED) > _MAX_STYLES:
            _STYLED.clear()
        cells = _STYLED[sgr] = _Cells(sgr, _STYLED_CELLS)
    return cells


def _style_of(cell: Char) -> str:
    fg = cell.fg
    return "" if fg == "default" else fg


class _Row(StaticDefaultDict[int, Char]):
    """A screen row. ``cut`` counts characters of its logical line dropped at the line limit;
    ``wrapped`` is a terminal's soft-wrap flag: 0, or the number of cells this row gives its
    logical line when that line goes on in the row below (the cursor wrapped at the right
    margin: ``columns``, one less when a wide character did not fit). Both move with the row."""

    cut = 0
    wrapped = 0


def cells_text(row: _Row | None, cells: int | None = None) -> str:
    """The row as text, one string per cell (a wide character's stub cell is ""): its first
    ``cells`` cells, or up to its last cell."""
    if not row:
        return " " * cells if cells else ""
    end = max(row) + 1 if cells is None else cells
    return "".join([row[x].data for x in range(end)])


def cells_style(row: _Row | None, cells: int | None = None) -> list[_sgr.Span]:
    """The spans of the row's first ``cells`` cells (or up to its last cell), as offsets into
    ``cells_text`` of the same cells (a wide character is one code point in two cells)."""
    if not row or all([c.fg == "default" for c in row.values()]):
        return []
    end = max(row) + 1 if cells is None else cells
    spans: list[_sgr.Span] = []
    at = 0
    for x in range(end):
        cell = row[x]
        n = len(cell.data)
        if not n:
            continue
        st = _style_of(cell)
        if st:
            if spans and spans[-1][1] == at and spans[-1][2] == st:
                spans[-1] = (spans[-1][0], at + n, st)
            else:
                spans.append((at, at + n, st))
        at += n
    return spans


def row_from(text: str, cut: int, wrapped: int = 0, style: list[_sgr.Span] | None = None
             ) -> _Row:
    row = _Row(_DEFAULT)
    row.update(zip(range(len(text)), map(_CELL.__getitem__, text), strict=True))
    for s, e, st in style or ():
        cells = cells_of(st)
        row.update(zip(range(s, e), map(cells.__getitem__, text[s:e]), strict=True))
    row.cut = cut
    row.wrapped = wrapped
    return row


def _line(text: str, cut: int, style: list[_sgr.Span]) -> Rendered:
    text = text.rstrip(" ")
    return Rendered(text, cut, _sgr.clip(style, len(text)) if style else ())


class Stream(pyte.Stream):
    """pyte's stream, with a log's carriage return (``Screen.line_start``)."""

    basic = {**pyte.Stream.basic, ctrl.CR: "line_start"}  # noqa: RUF012 - pyte reads it so


class Screen(pyte.Screen):
    """pyte's screen with what a log needs (pyte's defaults that a log cannot use):

    - the program's own size: a line longer than ``columns`` wraps onto the rows below, as on
      its terminal, so cursor motion and erasing act on the rows the program sees. Each row
      keeps a soft-wrap flag (``_Row.wrapped``) and the rows of one logical line are joined
      again when they are committed; clearing a whole row ends the line above it there, as in
      xterm and tmux (tmux's grid.c, grid_clear_lines);
    - except for a carriage return and a newline, which go to the start of the logical line and
      of the next one (``line_start``, ``linefeed``), and erase-line at the start of a line that
      wraps, which erases the whole line: a program redrawing a status line with ``\\r`` (and
      ``ESC[K``) means the whole line, even when it is wider than the screen it was given;
    - a logical line is cut at ``line_limit`` cells, the rest counted in ``Rendered.cut``;
    - LNM always on: the pty has OPOST off, so ``\\n`` arrives bare (no staircase);
    - rows leaving the top of the screen are handed on (``index``), never lost; the start of a
      logical line that is still going on below is kept in ``carry`` meanwhile;
    - erase/insert/delete work on the cells present;
    - clear screen, reset and the alternate screen commit what they would wipe;
    - unknown sequences are counted in ``debug``; bounded savepoints.
    """

    buffer: defaultdict[int, _Row]  # type: ignore[assignment]

    def __init__(self, columns: int, rows: int, line_limit: int, out: list[Rendered]):
        self.out = out
        self.line_limit = line_limit
        # The logical line whose first rows scrolled off the top while the top row goes on
        # with it (``carry_open``): its text, cells and cut so far.
        self.carry = ""
        self.carry_style: list[_sgr.Span] = []
        self.carry_cells = 0
        self.carry_cut = 0
        self.carry_open = False
        self.tabs_default = True
        self.unknown = 0
        self.sgr = ""  # the current style (logcapture.sgr), '' plain
        self.sgr_saved: list[str] = []  # with each DECSC savepoint
        # The rows (top, bottom) a program is redrawing in place, by moving the cursor up over
        # them: a live display (rich's progress, nested tqdm bars, docker's layers). ``idle``
        # leaves them on the screen while the cursor is among them (``commit_above_cursor``).
        self.live: tuple[int, int] | None = None
        self.live_idles = 0
        super().__init__(columns, rows)
        self.buffer = defaultdict(lambda: _Row(_DEFAULT))
        self.mode.add(mo.LNM)

    # -- committing -------------------------------------------------------------------------

    def hand_on(self, row: _Row | None) -> None:
        """Commit a row leaving the top of the screen, joined to the rows of its logical line
        before it; a row whose line goes on below waits in ``carry``."""
        if row is None:
            text, cut, wrapped, style = "", 0, 0, []
        else:
            wrapped = row.wrapped
            text, cut = cells_text(row, wrapped or None), row.cut
            style = cells_style(row, wrapped or None)
        if self.carry_open:
            if style:
                style = _sgr.merged(self.carry_style + _sgr.shift(style, len(self.carry)))
            else:
                style = self.carry_style
            text = self.carry + text
            cut += self.carry_cut
        if wrapped:
            self.carry_cells = (self.carry_cells if self.carry_open else 0) + wrapped
            self.carry, self.carry_cut, self.carry_open = text, cut, True
            self.carry_style = style
        else:
            self.carry, self.carry_cells, self.carry_cut, self.carry_open = "", 0, 0, False
            self.carry_style = []
            self.out.append(_line(text, cut, style))

    def end_carry(self) -> None:
        """The top row no longer goes on with the line that scrolled off: that line is final."""
        if self.carry_open:
            self.out.append(_line(self.carry, self.carry_cut, self.carry_style))
        self.carry, self.carry_cells, self.carry_cut, self.carry_open = "", 0, 0, False
        self.carry_style = []

    def chain_start(self, y: int) -> int:
        """The first row of the logical line that row ``y`` belongs to."""
        buf = self.buffer
        while y > 0:
            above = buf.get(y - 1)
            if above is None or not above.wrapped:
                break
            y -= 1
        return y

    def line_offset(self, y: int) -> int:
        """Cells of row ``y``'s logical line before that row (scrolled-off ones included)."""
        buf = self.buffer
        base = 0
        while y > 0:
            above = buf.get(y - 1)
            if above is None or not above.wrapped:
                return base
            base += above.wrapped
            y -= 1
        return base + self.carry_cells if self.carry_open else base

    def break_above(self, y: int) -> None:
        """Row ``y`` was cleared whole or replaced: the row above no longer goes on into it."""
        if y > 0:
            above = self.buffer.get(y - 1)
            if above is not None:
                above.wrapped = 0
        else:
            self.end_carry()

    def last_row(self) -> int:
        """Index of the last row to commit at finish: the last non-blank row, and at least the
        rows above the cursor (blank lines the program printed)."""
        last = self.cursor.y - 1
        for y, row in self.buffer.items():
            if y > last and (row.cut or cells_text(row).rstrip(" ")):
                last = y
        return last

    def commit_all(self) -> None:
        self.live = None
        buf = self.buffer
        for y in range(self.last_row() + 1):
            self.hand_on(buf.get(y))
        if self.carry_open and not (self.carry.strip(" ") or self.carry_cut):
            self.carry_open = False  # the rest of the line is blank: none was printed
        self.end_carry()
        buf.clear()

    def live_lines(self) -> list[str]:
        """The logical lines on the screen, none of them committed yet, joined across soft
        wraps, trailing spaces stripped. All of them, not only the cursor's and those below
        it: a program that redraws several rows (nested bars) may be read while its cursor
        is on any of them. Not the line the program is drawing over (the cursor inside the
        text of its row, not at its start: the rest of the row is the previous state's)."""
        buf = self.buffer
        rows = [y for y, row in buf.items() if row]
        if not rows:
            return []
        out: list[str] = []
        parts: list[str] = []
        cy, cx = self.cursor.y, self.cursor.x
        skip = False
        for y in range(max(rows) + 1):
            row = buf.get(y)
            wrapped = row.wrapped if row is not None else 0
            parts.append(cells_text(row, wrapped or None))
            if y == cy and 0 < cx < len(parts[-1].rstrip(" ")):
                skip = True
            if not wrapped:
                text = "".join(parts).rstrip(" ")
                parts = []
                if text and not skip:
                    out.append(text)
                skip = False
        if parts and not skip:
            out.append("".join(parts).rstrip(" "))
        return out

    def commit_above_cursor(self, quiet: bool = True) -> None:
        """Commit the logical lines above the cursor's and move the cursor's line to the top,
        except the rows of a live display (``live``): a program that redraws several rows (a
        bar and its metrics below it, one bar per worker) rests its cursor on the last or the
        first of them, and a state committed between two redraws would be a line the terminal
        never kept. When the cursor has gone below them, the display has ended if the stream
        is ``quiet`` (it ended with a newline); on a busy stream lines were printed above it
        (``tqdm.write``, rich's ``console.log``), which pushed it down: it is taken to end at
        the cursor's row, as high as it was, for at most ``LIVE_IDLES`` such commits with no
        redraw (then its rows commit: a display redrawn so seldom may keep a state twice)."""
        live = self.live
        y = self.cursor.y
        if live is not None and y > live[1]:
            self.live_idles += 1
            if quiet or self.live_idles > LIVE_IDLES:
                self.live = live = None
            else:
                self.live = live = (y - (live[1] - live[0]), y)
        cy = self.chain_start(self.cursor.y if live is None
                              else max(0, min(self.cursor.y, live[0])))
        if cy <= 0:
            return
        if live is not None:
            self.live = (live[0] - cy, live[1] - cy)
        buf = self.buffer
        for y in range(cy):
            self.hand_on(buf.pop(y, None))
        for y in range(cy, self.lines):
            row = buf.pop(y, None)
            if row is not None:
                buf[y - cy] = row
        self.cursor.y -= cy

    # -- pyte events ------------------------------------------------------------------------

    def reset(self) -> None:
        if hasattr(self, "cursor"):  # not during pyte's __init__
            self.commit_all()
        super().reset()
        self.sgr = ""
        self.sgr_saved = []
        self.mode.add(mo.LNM)
        self.tabs_default = True

    def went_up(self, old: int, new: int | None = None) -> None:
        """The cursor moved from row ``old`` up to row ``new`` (the cursor's row, or above the
        screen's top where a move went past it: rows an ``idle`` already committed): those
        rows are being redrawn. A move up from the bottom of the live rows (or below them)
        starts a new redraw; one from within them (the next bar of the same redraw) widens
        it."""
        if new is None:
            new = self.cursor.y
        if new >= old:
            return
        live = self.live
        self.live = (new, old) if live is None or old >= live[1] else (min(live[0], new),
                                                                        live[1])
        self.live_idles = 0

    def cursor_up(self, count: int | None = None) -> None:
        old = self.cursor.y
        top = self.margins.top if self.margins is not None and old >= self.margins.top else 0
        super().cursor_up(count)
        self.went_up(old, old - (count or 1) if self.cursor.y == top else None)

    def index(self) -> None:
        top, bottom = self.margins or (0, self.lines - 1)
        if self.cursor.y == bottom:
            live = self.live
            if live is not None and top == 0:  # the live rows scroll up with the screen
                self.live = None if live[1] == 0 else (live[0] - 1, live[1] - 1)
            buf = self.buffer
            row = buf.pop(top, None)
            if top == 0:
                self.hand_on(row)
            else:  # leaves a scrolling region: a line of its own
                self.out.append(_line(cells_text(row), row.cut if row is not None else 0,
                                      cells_style(row)))
            for y in range(top + 1, bottom + 1):
                row = buf.pop(y, None)
                if row is not None:
                    buf[y - 1] = row
        else:
            self.cursor_down()

    def line_start(self) -> None:
        """Carriage return: to the start of the logical line. On a terminal it goes to the start
        of the line's last row, so a ``\\r`` redraw of a line wider than the screen (Keras'
        progress bar at 80 columns) piles its states up; a batch job's screen size is only
        what logcapture told it, and the line's last state is what it meant to show."""
        self.cursor.y = self.chain_start(self.cursor.y)
        self.cursor.x = 0

    def linefeed(self) -> None:
        """Newline: to the start of the next logical line (past the rows the cursor's line goes
        on in, where a carriage return left the cursor on one of its first rows)."""
        buf = self.buffer
        bottom = self.margins.bottom if self.margins else self.lines - 1
        y = self.cursor.y
        while y < bottom:
            row = buf.get(y)
            if row is None or not row.wrapped:
                break
            y += 1
        self.cursor.y = y
        self.index()
        self.cursor.x = 0

    def reverse_index(self) -> None:
        top = self.margins.top if self.margins else 0
        scrolls = self.cursor.y == top
        old = self.cursor.y
        super().reverse_index()
        self.went_up(old)
        if scrolls:  # a blank row came in at the top
            self.break_above(top)

    # Insert and delete lines: pyte's own leave a row in place when the row meant to replace it
    # is absent from the (sparse) buffer.

    def insert_lines(self, count: int | None = None) -> None:
        count = count or 1
        top, bottom = self.margins or (0, self.lines - 1)
        y0 = self.cursor.y
        if top <= y0 <= bottom:
            buf = self.buffer
            for y in range(bottom, y0 - 1, -1):
                row = buf.pop(y, None)
                if row is not None and y + count <= bottom:
                    buf[y + count] = row
            self.cursor.x = 0
            self.break_above(y0)

    def delete_lines(self, count: int | None = None) -> None:
        count = count or 1
        top, bottom = self.margins or (0, self.lines - 1)
        y0 = self.cursor.y
        if top <= y0 <= bottom:
            buf = self.buffer
            for y in range(y0, bottom + 1):
                row = buf.pop(y + count, None) if y + count <= bottom else None
                if row is not None:
                    buf[y] = row
                else:
                    buf.pop(y, None)
            self.cursor.x = 0
            self.break_above(y0)

    def _wrap(self) -> tuple[_Row, int]:
        """Autowrap: the cursor row goes on in the next row (scrolling at the bottom); that row
        and its offset in its logical line, as ``line_offset`` counts it (not the offset
        before plus the row left: a row that scrolled out of a scrolling region went as a
        line of its own, and the line goes on from the rows still there)."""
        cursor = self.cursor
        self.buffer[cursor.y].wrapped = cursor.x
        self.index()
        cursor.x = 0
        return self.buffer[cursor.y], self.line_offset(cursor.y)

    def draw(self, data: str) -> None:
        charset = self.g1_charset if self.charset else self.g0_charset
        if charset is not cs.LAT1_MAP:
            data = data.translate(charset)
        row = self.buffer[self.cursor.y]
        insert = mo.IRM in self.mode
        autowrap = mo.DECAWM in self.mode
        base = self.line_offset(self.cursor.y)  # cells of the logical line before this row
        i, n = 0, len(data)
        while i < n:
            m = None if insert else PATTERNS.simple_run.match(data, i)
            if m is not None:
                i = m.end()
                row, base = self._draw_run(m.group(), row, base, autowrap)
            else:
                row, base = self._draw_char(data[i], row, base, autowrap, insert)
                i += 1

    def _draw_run(self, run: str, row: Any, base: int, autowrap: bool) -> tuple[Any, int]:
        """A run of single-width characters (``simple_run``), written a row's worth at a time;
        the row and its offset in the logical line after it."""
        cursor, columns, limit = self.cursor, self.columns, self.line_limit
        cells = cells_of(self.sgr)
        k, j = len(run), 0
        while j < k:
            x = cursor.x
            if x >= columns:
                if autowrap and base + x < limit:
                    row, base = self._wrap()
                    x = 0
                elif not autowrap:
                    x = cursor.x = columns - 1
            take = min(columns - x, k - j, limit - base - x)
            if take <= 0:  # the line limit: the rest is cut
                row.cut += k - j
                break
            row.update(zip(range(x, x + take), map(cells.__getitem__, run[j:j + take]),
                           strict=True))
            cursor.x = x + take
            j += take
        return row, base

    def _draw_char(self, ch: str, row: Any, base: int, autowrap: bool,
                   insert: bool) -> tuple[Any, int]:
        """One character of any width (wide, zero-width, unprintable); the row and its offset
        in the logical line after it."""
        cursor, columns, limit = self.cursor, self.columns, self.line_limit
        w = wcwidth(ch)
        x = cursor.x
        if w > 0:
            if x + w > columns:
                if w > columns:
                    return row, base  # wider than the screen: no terminal can show it
                if not autowrap:
                    x = cursor.x = columns - w
                elif base + x < limit:  # as a terminal would: on the next row
                    row, base = self._wrap()
                    x = 0
            # Past the line limit where it would be drawn: counted on that row, so that
            # erasing the row (ESC[K after it) takes it back, as for one-cell characters.
            if base + x + w > limit:
                row.cut += 1
                return row, base
            if insert:
                self.insert_characters(w)
            cells = cells_of(self.sgr)
            row[x] = cells[ch]
            if w == 2:
                row[x + 1] = cells[""]
            cursor.x = x + w
        elif w == 0 and x > 0:
            # Zero-width (combining, joiners, variation selectors): joins the previous
            # character, skipping a wide character's stub cell.
            px = x - 1
            if row[px].data == "" and px > 0:
                px -= 1
            prev = row[px].data
            if len(prev) < 32:
                row[px] = cells_of(_style_of(row[px]))[unicodedata.normalize("NFC", prev + ch)]
        # else: unprintable, or zero-width at the line start: nothing shows.
        return row, base

    def _cleared(self, y: int) -> None:
        """Row ``y`` was cleared whole: it no longer goes on below, nor the row above into it."""
        self.buffer[y].wrapped = 0
        self.break_above(y)

    def erase_in_line(self, how: int = 0, private: bool = False) -> None:
        cy = self.cursor.y
        row = self.buffer[cy]
        x = self.cursor.x
        if how in (0, 2) and x == 0 and row.wrapped and self.line_offset(cy) == 0:
            # At the start of a line that wraps, where a carriage return puts the cursor: the
            # whole line, as ``\r ESC[K`` before a redraw means (see ``line_start``).
            buf = self.buffer
            for y in range(cy, self.lines):
                line = buf.get(y)
                if line is None:
                    break
                wrapped = line.wrapped
                line.clear()
                line.cut = line.wrapped = 0
                if not wrapped:
                    break
            return
        if how == 0:
            for k in [k for k in row if k >= x]:
                del row[k]
            row.cut = 0
            if x == 0:
                self._cleared(cy)
        elif how == 1:
            for k in [k for k in row if k <= x]:
                del row[k]
            if x >= self.columns - 1:
                self._cleared(cy)
        elif how == 2:
            row.clear()
            row.cut = 0
            self._cleared(cy)
        else:
            self.debug("erase_in_line", how)

    def erase_in_display(self, how: int = 0, *args: Any, **kwargs: Any) -> None:
        buf = self.buffer
        cy = self.cursor.y
        if how == 0:
            for y in [y for y in buf if y > cy]:
                del buf[y]
            buf[cy].wrapped = 0
            self.erase_in_line(0)
        elif how == 1:
            for y in [y for y in buf if y < cy]:
                del buf[y]
            if cy > 0:
                self.end_carry()
            self.erase_in_line(1)
        elif how in (2, 3):
            self.commit_all()
        else:
            self.debug("erase_in_display", how)

    def insert_characters(self, count: int | None = None) -> None:
        count = count or 1
        row = self.buffer[self.cursor.y]
        x = self.cursor.x
        moved = sorted((k for k in row if k >= x), reverse=True)
        for k in moved:
            cell = row.pop(k)
            if k + count < self.columns:
                row[k + count] = cell

    def delete_characters(self, count: int | None = None) -> None:
        count = count or 1
        row = self.buffer[self.cursor.y]
        x = self.cursor.x
        for k in sorted(k for k in row if k >= x):
            cell = row.pop(k)
            if k >= x + count:
                row[k - count] = cell

    def alignment_display(self) -> None:
        e = _CELL["E"]
        for y in range(self.lines):
            self.buffer[y].update(dict.fromkeys(range(self.columns), e))

    def tab(self) -> None:
        if self.tabs_default:
            self.cursor.x = min((self.cursor.x // 8 + 1) * 8, self.columns - 1)
        else:
            super().tab()

    def set_tab_stop(self) -> None:
        self.tabs_default = False
        super().set_tab_stop()

    def clear_tab_stop(self, how: int = 0) -> None:
        self.tabs_default = False
        super().clear_tab_stop(how)

    def set_mode(self, *modes: int, **kwargs: Any) -> None:
        private = bool(kwargs.get("private"))
        shifted = {m << 5 for m in modes} if private else set(modes)
        if shifted & ALT_SCREEN and not self.mode & ALT_SCREEN:
            # Entering a full-screen program: what it is about to hide is final.
            self.commit_all()
            self.cursor_position()
        # DECCOLM would resize the (wide) screen to 132 columns: ignored.
        kept = [m for m in modes if not (private and (m << 5) == mo.DECCOLM)]
        super().set_mode(*kept, **kwargs)

    def reset_mode(self, *modes: int, **kwargs: Any) -> None:
        private = bool(kwargs.get("private"))
        shifted = {m << 5 for m in modes} if private else set(modes)
        if shifted & ALT_SCREEN and self.mode & ALT_SCREEN:
            # Leaving a full-screen program: its last screen is what it showed.
            self.commit_all()
            self.cursor_position()
        # LNM stays on (it stands for the tty's ONLCR); DECCOLM is ignored.
        kept = [m for m in modes
                if not (private and (m << 5) == mo.DECCOLM) and not (not private and m == 20)]
        super().reset_mode(*kept, **kwargs)

    def cursor_position(self, line: int | None = None, column: int | None = None) -> None:
        col = (column or 1) - 1
        y = (line or 1) - 1
        if self.margins is not None and mo.DECOM in self.mode:
            y += self.margins.top
            if not self.margins.top <= y <= self.margins.bottom:
                return
        old = self.cursor.y
        self.cursor.x = max(0, min(col, self.columns - 1))
        self.cursor.y = y
        self.ensure_vbounds()
        self.went_up(old)

    def cursor_to_line(self, line: int | None = None) -> None:
        old = self.cursor.y
        self.cursor.y = (line or 1) - 1
        if mo.DECOM in self.mode and self.margins is not None:
            self.cursor.y += self.margins.top
        self.ensure_vbounds()
        self.went_up(old)

    def save_cursor(self) -> None:
        super().save_cursor()
        self.sgr_saved.append(self.sgr)  # DECSC saves the rendition too
        if len(self.savepoints) > _MAX_SAVEPOINTS:
            del self.savepoints[0]
            del self.sgr_saved[0]

    def restore_cursor(self) -> None:
        if self.sgr_saved:
            self.sgr = self.sgr_saved.pop()
        else:
            self.sgr = ""  # DECRC without a savepoint: the default rendition, as xterm
        super().restore_cursor()

    def select_graphic_rendition(self, *attrs: int, **kwargs: Any) -> None:
        """SGR: kept as the normalised style of the cells drawn next (``logcapture.sgr``: it
        knows dim and true colour, which pyte drops); pyte's own attributes stay default."""
        if kwargs.get("private"):
            return
        self.sgr = _sgr.apply(self.sgr, ";".join(map(str, attrs)))

    def set_title(self, param: str) -> None:
        pass  # not kept: never output, and may be large

    def set_icon_name(self, param: str) -> None:
        pass

    def debug(self, *args: Any, **kwargs: Any) -> None:
        self.unknown += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("unknown terminal sequence: %r %r", args[:4], kwargs)
