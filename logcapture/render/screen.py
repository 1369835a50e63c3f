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
from pyte import modes as mo
from pyte.screens import Char, StaticDefaultDict
from wcwidth import wcwidth

from ..records import Rendered
from . import _MAX_SAVEPOINTS, _PATTERNS

log = logging.getLogger("logcapture.render")

# Modes under which the fast path cannot stand in for the screen.
ALT_SCREEN = frozenset({47 << 5, 1047 << 5, 1049 << 5})
BLOCKERS = frozenset({mo.IRM, mo.DECOM}) | ALT_SCREEN
LAT1_MAP = cs.LAT1_MAP

_DEFAULT = Char(data=" ", fg="default", bg="default", reverse=False)


class _Cells(dict[str, Char]):
    """Cell per character, shared: colours are never stored, so one Char per character does."""

    def __missing__(self, ch: str) -> Char:
        if len(self) > 8192:
            self.clear()
        c = self[ch] = _DEFAULT._replace(data=ch)
        return c


_CELL = _Cells()


class _Row(StaticDefaultDict[int, Char]):
    """A screen row; ``cut`` counts characters dropped beyond the width (moves with the row)."""

    cut = 0


def cells_text(row: _Row | None) -> str:
    """The row as text, one string per cell (a wide character's stub cell is "")."""
    if not row:
        return ""
    return "".join([row[x].data for x in range(max(row) + 1)])


def row_from(text: str, cut: int) -> _Row:
    row = _Row(_DEFAULT)
    row.update(zip(range(len(text)), map(_CELL.__getitem__, text), strict=True))
    row.cut = cut
    return row


class Screen(pyte.Screen):
    """pyte's screen with what a log needs (PTY-RENDER.md pitfalls):

    - LNM always on: the pty has OPOST off, so ``\\n`` arrives bare (no staircase);
    - rows leaving the screen are handed on (``index``), never lost;
    - no autowrap: the screen is ``line_limit`` wide and characters past it are cut and counted;
    - erase/insert/delete work on the cells present, so the wide screen costs nothing;
    - cursor motion to a column is bounded by the program's ``columns`` (``ESC[999C``);
    - clear screen, reset and the alternate screen commit what they would wipe;
    - unknown sequences are counted in ``debug``; bounded savepoints.
    """

    def __init__(self, width: int, rows: int, program_columns: int, out: list[Rendered]):
        self.out = out
        self.program_columns = program_columns
        self.tabs_default = True
        self.unknown = 0
        super().__init__(width, rows)
        self.buffer = defaultdict(lambda: _Row(_DEFAULT))  # type: ignore[assignment]
        self.mode.add(mo.LNM)

    # -- committing -------------------------------------------------------------------------

    def hand_on(self, row: _Row | None) -> None:
        self.out.append(Rendered(cells_text(row).rstrip(" "), row.cut if row is not None else 0))

    def last_row(self) -> int:
        """Index of the last row to commit at finish: the last non-blank row, and at least the
        rows above the cursor (blank lines the program printed)."""
        last = self.cursor.y - 1
        for y, row in self.buffer.items():
            if y > last and (row.cut or cells_text(row).rstrip(" ")):
                last = y
        return last

    def commit_all(self) -> None:
        buf = self.buffer
        for y in range(self.last_row() + 1):
            self.hand_on(buf.get(y))
        buf.clear()

    def commit_above_cursor(self) -> None:
        """Commit the rows above the cursor and move the cursor row to the top."""
        cy = self.cursor.y
        if cy <= 0:
            return
        buf = self.buffer
        for y in range(cy):
            self.hand_on(buf.pop(y, None))
        for y in range(cy, self.lines):
            row = buf.pop(y, None)
            if row is not None:
                buf[y - cy] = row
        self.cursor.y = 0

    # -- pyte events ------------------------------------------------------------------------

    def reset(self) -> None:
        if hasattr(self, "cursor"):  # not during pyte's __init__
            self.commit_all()
        super().reset()
        self.mode.add(mo.LNM)
        self.tabs_default = True

    def index(self) -> None:
        top, bottom = self.margins or (0, self.lines - 1)
        if self.cursor.y == bottom:
            buf = self.buffer
            self.hand_on(buf.pop(top, None))
            for y in range(top + 1, bottom + 1):
                row = buf.pop(y, None)
                if row is not None:
                    buf[y - 1] = row
        else:
            self.cursor_down()

    def draw(self, data: str) -> None:
        charset = self.g1_charset if self.charset else self.g0_charset
        if charset is not cs.LAT1_MAP:
            data = data.translate(charset)
        cursor = self.cursor
        width = self.columns
        row = self.buffer[cursor.y]
        insert = mo.IRM in self.mode
        i, n = 0, len(data)
        while i < n:
            m = None if insert else _PATTERNS.simple_run.match(data, i)
            if m is not None:
                run = m.group()
                i = m.end()
                x = cursor.x
                room = width - x
                k = len(run)
                if k <= room:
                    row.update(zip(range(x, x + k), map(_CELL.__getitem__, run), strict=True))
                    cursor.x = x + k
                else:
                    if room > 0:
                        row.update(zip(range(x, width), map(_CELL.__getitem__, run[:room]),
                                       strict=True))
                        cursor.x = width
                    row.cut += k - room
                continue
            ch = data[i]
            i += 1
            w = wcwidth(ch)
            x = cursor.x
            if w > 0:
                if x + w > width:
                    row.cut += 1
                    continue
                if insert:
                    self.insert_characters(w)
                row[x] = _CELL[ch]
                if w == 2:
                    row[x + 1] = _CELL[""]
                cursor.x = x + w
            elif w == 0 and x > 0:
                # Zero-width (combining, joiners, variation selectors): joins the previous
                # character, skipping a wide character's stub cell.
                px = x - 1
                if row[px].data == "" and px > 0:
                    px -= 1
                prev = row[px].data
                if len(prev) < 32:
                    row[px] = _CELL[unicodedata.normalize("NFC", prev + ch)]
            # else: unprintable, or zero-width at the line start: nothing shows.

    def erase_in_line(self, how: int = 0, private: bool = False) -> None:
        row = self.buffer[self.cursor.y]
        x = self.cursor.x
        if how == 0:
            for k in [k for k in row if k >= x]:
                del row[k]
            row.cut = 0
        elif how == 1:
            for k in [k for k in row if k <= x]:
                del row[k]
        elif how == 2:
            row.clear()
            row.cut = 0
        else:
            self.debug("erase_in_line", how)

    def erase_in_display(self, how: int = 0, *args: Any, **kwargs: Any) -> None:
        buf = self.buffer
        cy = self.cursor.y
        if how == 0:
            for y in [y for y in buf if y > cy]:
                del buf[y]
            self.erase_in_line(0)
        elif how == 1:
            for y in [y for y in buf if y < cy]:
                del buf[y]
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
            self.buffer[y].update(dict.fromkeys(range(self.program_columns), e))

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

    def _clamp_column(self, column: int) -> int:
        return max(0, min(column, self.program_columns - 1))

    def cursor_forward(self, count: int | None = None) -> None:
        x = self.cursor.x
        limit = max(self.program_columns - 1, x)
        self.cursor.x = min(x + (count or 1), limit, self.columns - 1)

    def cursor_to_column(self, column: int | None = None) -> None:
        self.cursor.x = self._clamp_column((column or 1) - 1)

    def cursor_position(self, line: int | None = None, column: int | None = None) -> None:
        col = (column or 1) - 1
        y = (line or 1) - 1
        if self.margins is not None and mo.DECOM in self.mode:
            y += self.margins.top
            if not self.margins.top <= y <= self.margins.bottom:
                return
        self.cursor.x = self._clamp_column(col)
        self.cursor.y = y
        self.ensure_vbounds()

    def cursor_to_line(self, line: int | None = None) -> None:
        self.cursor.y = (line or 1) - 1
        if mo.DECOM in self.mode and self.margins is not None:
            self.cursor.y += self.margins.top
        self.ensure_vbounds()

    def save_cursor(self) -> None:
        super().save_cursor()
        if len(self.savepoints) > _MAX_SAVEPOINTS:
            del self.savepoints[0]

    def set_title(self, param: str) -> None:
        pass  # not kept: never output, and may be large

    def set_icon_name(self, param: str) -> None:
        pass

    def debug(self, *args: Any, **kwargs: Any) -> None:
        self.unknown += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("unknown terminal sequence: %r %r", args[:4], kwargs)
