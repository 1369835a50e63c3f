"""render: raw pty bytes of one stream -> committed screen lines.

Each output stream of a job gets its own ``Renderer``, which plays the part of the terminal the
job believes it writes to (SPEC.md §2 "Rendering"): what is committed is what a terminal would
show, with no escape sequences, no colours and no carriage-return debris. docs/rendering.md
states the rules; in short:

- The emulator is pyte, with a screen ``rows`` high and ``line_limit`` cells wide, so that a
  logical line longer than the program's ``columns`` is never broken in the log. Characters
  beyond ``line_limit`` are dropped and counted in ``Rendered.cut``.
- A row is committed when it scrolls off the top of the screen, when ``idle()`` finds it above
  the cursor, when the screen is cleared, reset or left for/from the alternate screen, and at
  ``finish()``.
- A fast path keeps plain text, ``\\r`` redraws, SGR colours and erase-line out of pyte's
  per-character work. It models exactly the pyte screen state it stands in for (the rows above
  the cursor and the cursor row), hands over to pyte on anything else and takes over again when
  the screen is back in a state it can model, so its output is identical to pure pyte's
  (tests/test_render.py checks this differentially and under random chunking).

The job's output never raises (STYLE.md practice 3): unknown sequences go to ``debug``, any
exception inside the emulator is caught, the parser is reset and rendering goes on.
"""

from __future__ import annotations

import codecs
import logging
import re
import unicodedata
from collections import defaultdict, deque
from typing import Any

import pyte
from pyte import charsets as cs
from pyte import modes as mo
from pyte.screens import Char, StaticDefaultDict
from wcwidth import wcwidth

from .records import Rendered, rendered_many

__all__ = ["LINE_LIMIT", "Renderer"]

log = logging.getLogger(__name__)

#: Longest logical line kept, in characters (cells). Longer lines are cut; ``Rendered.cut``
#: counts the characters dropped. Also the emulator's width, so it bounds memory: at most
#: ``rows`` x ``LINE_LIMIT`` cells are ever held.
LINE_LIMIT = 65536

# An escape sequence (CSI/OSC parameters) longer than this is abandoned: the parser is reset,
# so a hostile "ESC [ 1111..." without end cannot grow memory.
_MAX_SEQUENCE = 4096
# DECSC savepoints kept (pyte's list is unbounded).
_MAX_SAVEPOINTS = 64
# Modes under which the fast path cannot stand in for the screen.
_ALT_SCREEN = frozenset({47 << 5, 1047 << 5, 1049 << 5})
_BLOCKERS = frozenset({mo.IRM, mo.DECOM}) | _ALT_SCREEN
# Escape tail that may be the start of a sequence the fast path knows: held back for the next
# chunk instead of handing the screen to pyte for one split sequence.
_PARTIAL = re.compile(r"\x1b(?:\[[0-9;]{0,64})?\Z")


def _width1_class() -> str:
    """A regex character class of the characters the fast path draws: printable, one cell
    wide (wcwidth 1). Everything else (wide, zero-width, combining, controls) goes to pyte."""
    parts = [r"\x20-\x7e"]
    start = prev = -2
    for cp in list(range(0xA0, 0x3000)) + list(range(0xFF61, 0xFFDD)) + [0xFFFD]:
        if wcwidth(chr(cp)) == 1 and unicodedata.category(chr(cp)) not in ("Cs", "Co", "Cn"):
            if cp != prev + 1:
                if start >= 0:
                    parts.append(_range(start, prev))
                start = cp
            prev = cp
    parts.append(_range(start, prev))
    return "".join(parts)


def _range(a: int, b: int) -> str:
    return f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}"


class _Patterns:
    """Compiled on first use, not at import: building the class of one-cell characters asks
    wcwidth about 12,000 code points, and a stream of plain ASCII never needs it."""

    simple_run: re.Pattern[str]
    fast: re.Pattern[str]

    def __getattr__(self, name: str) -> re.Pattern[str]:
        one_cell = _width1_class()
        self.simple_run = re.compile(f"[{one_cell}]+")
        # The fast path's whole vocabulary: text (with newlines), carriage returns, SGR,
        # erase-line.
        self.fast = re.compile(
            f"([{one_cell}\\n]+)|(\\r+)|\\x1b\\[([0-9;]{{0,64}})m|\\x1b\\[([012]?)K")
        return getattr(self, name)  # type: ignore[no-any-return]


_PATTERNS = _Patterns()

# ASCII bytes outside the pattern's text run: controls other than newline, and DEL.
_NOT_PLAIN_ASCII = bytes([*range(0x0a), *range(0x0b, 0x20), 0x7f])

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


def _cells_text(row: _Row | None) -> str:
    """The row as text, one string per cell (a wide character's stub cell is "")."""
    if not row:
        return ""
    return "".join([row[x].data for x in range(max(row) + 1)])


def _row_from(text: str, cut: int) -> _Row:
    row = _Row(_DEFAULT)
    row.update(zip(range(len(text)), map(_CELL.__getitem__, text), strict=True))
    row.cut = cut
    return row


class _Screen(pyte.Screen):
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
        self.out.append(Rendered(_cells_text(row).rstrip(" "), row.cut if row is not None else 0))

    def last_row(self) -> int:
        """Index of the last row to commit at finish: the last non-blank row, and at least the
        rows above the cursor (blank lines the program printed)."""
        last = self.cursor.y - 1
        for y, row in self.buffer.items():
            if y > last and (row.cut or _cells_text(row).rstrip(" ")):
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
        if shifted & _ALT_SCREEN and not self.mode & _ALT_SCREEN:
            # Entering a full-screen program: what it is about to hide is final.
            self.commit_all()
            self.cursor_position()
        # DECCOLM would resize the (wide) screen to 132 columns: ignored.
        kept = [m for m in modes if not (private and (m << 5) == mo.DECCOLM)]
        super().set_mode(*kept, **kwargs)

    def reset_mode(self, *modes: int, **kwargs: Any) -> None:
        private = bool(kwargs.get("private"))
        shifted = {m << 5 for m in modes} if private else set(modes)
        if shifted & _ALT_SCREEN and self.mode & _ALT_SCREEN:
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


class Renderer:
    """Bytes of one stream in, committed lines out (see the module docstring).

    ``columns`` is what the program was told (TIOCSWINSZ): cursor addressing is bounded by it.
    Plain text is never wrapped at it; lines are cut at ``line_limit`` characters instead.
    """

    #: Class switch for tests and the benchmark: ``False`` sends every byte through pyte.
    fast_path = True

    def __init__(self, columns: int = 80, rows: int = 24, line_limit: int = LINE_LIMIT):
        self.width = max(1, int(line_limit))
        self.columns = max(1, min(int(columns), self.width))
        self.rows = max(1, int(rows))
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._out: list[Rendered] = []
        self._screen = _Screen(self.width, self.rows, self.columns, self._out)
        self._stream = pyte.Stream(self._screen)
        # Honour ESC ( 0 and SO/SI as xterm does in UTF-8 mode: curses draws boxes with them.
        self._stream.use_utf8 = False
        self._unground = 0
        self._tail = ""
        self.faults = 0  # exceptions caught inside the emulator
        # Line mode: the screen is the rows above the cursor (``_pending``, already final text)
        # and the cursor row (``_cur``, one character per cell), nothing below the cursor.
        self._line_mode = True
        self._pending: deque[Rendered] = deque()
        self._burst: Rendered | None = None  # the line of the last burst of one line
        self._cur = ""
        self._x = 0
        self._cut = 0
        if not self.fast_path:
            self._to_screen()

    # -- the interface ------------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Rendered]:
        """Raw pty bytes of one stream, any chunking; returns the newly committed lines."""
        text = self._tail + self._decoder.decode(data)
        self._tail = ""
        self._process(text, final=False)
        return self._drain()

    def idle(self) -> list[Rendered]:
        """The stream has been quiet: commit the rows above the cursor (final lines), but not
        the cursor row, which may still be redrawn. Safe to call at any time."""
        if self._line_mode:
            self._out.extend(self._pending)
            self._pending.clear()
        else:
            s = self._screen
            if s.margins is None and not s.mode & _ALT_SCREEN:
                self._guard(s.commit_above_cursor)
                self._maybe_line_mode()
        return self._drain()

    def finish(self) -> list[Rendered]:
        """End of the stream: commit everything, an unterminated last line included."""
        text = self._tail + self._decoder.decode(b"", final=True)
        self._tail = ""
        self._process(text, final=True)
        if self._line_mode:
            self._out.extend(self._pending)
            self._pending.clear()
            if self._cut or self._cur.rstrip(" "):
                self._out.append(Rendered(self._cur.rstrip(" "), self._cut))
            self._cur, self._x, self._cut = "", 0, 0
        else:
            s = self._screen
            self._guard(s.commit_all)
            s.cursor.x = s.cursor.y = 0
            self._maybe_line_mode()
        return self._drain()

    # -- internals ----------------------------------------------------------------------------

    def _drain(self) -> list[Rendered]:
        out = self._out[:]
        self._out.clear()
        return out

    def _process(self, text: str, final: bool) -> None:
        pos, n = 0, len(text)
        while pos < n:
            if self._line_mode:
                pos = self._fast(text, pos)
                if pos >= n:
                    return
                if not final and _PARTIAL.match(text, pos):
                    self._tail = text[pos:]
                    return
                self._to_screen()
            end = text.find("\n", pos)
            end = n if end < 0 else end + 1
            self._guard(self._pyte_feed, text[pos:end])
            pos = end
            self._maybe_line_mode()

    def _guard(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # the job's output never raises (STYLE.md practice 3)
            self.faults += 1
            log.debug("renderer fault; parser reset", exc_info=True)
            self._stream._initialize_parser()
            self._unground = 0

    def _pyte_feed(self, data: str) -> None:
        """pyte's ``Stream.feed``, except that an exception costs only the character that
        raised it (so the result does not depend on chunking) and an endless sequence is cut."""
        stream = self._stream
        send = stream._send_to_parser
        match_text = stream._text_pattern.match
        draw = self._screen.draw
        taking = stream._taking_plain_text
        offset, n = 0, len(data)
        while offset < n:
            if taking:
                m = match_text(data, offset)
                if m:
                    start, offset = m.span()
                    draw(data[start:offset])
                    continue
                taking = False
            ch = data[offset]
            offset += 1
            try:
                taking = send(ch)
            except Exception:
                self.faults += 1
                self._screen.debug("fault", ch)
                taking = stream._taking_plain_text
            if taking:
                self._unground = 0
            else:
                self._unground += 1
                if self._unground > _MAX_SEQUENCE:
                    self._screen.debug("sequence too long")
                    stream._initialize_parser()
                    taking = stream._taking_plain_text
                    self._unground = 0
        stream._taking_plain_text = taking

    # line mode -----------------------------------------------------------------------------

    def _fast(self, text: str, pos: int) -> int:
        """Consume what the fast path models; return where it stopped."""
        if not pos and text.isascii():
            # The usual chunk: printable ASCII and newlines only, which the pattern below
            # would match as one run of text; checked at C speed instead of by the pattern.
            raw = text.encode("ascii")
            if len(raw.translate(None, _NOT_PLAIN_ASCII)) == len(raw):
                self._plain(text)
                return len(text)
        match = _PATTERNS.fast.match
        while True:
            m = match(text, pos)
            if m is None:
                return pos
            k = m.lastindex
            if k == 1:
                self._plain(m.group(1))
            elif k == 2:
                self._x = 0
            elif k == 4:
                how = m.group(4)
                x = self._x
                if how in ("", "0"):
                    self._cur = self._cur[:x]
                    self._cut = 0
                elif how == "1":
                    cur = self._cur
                    self._cur = " " * min(x + 1, len(cur)) + cur[x + 1:]
                else:
                    self._cur = ""
                    self._cut = 0
            # k == 3: SGR, no effect on text
            pos = m.end()

    def _plain(self, s: str) -> None:
        if "\n" not in s:
            self._draw(s)
            return
        parts = s.split("\n")
        self._draw(parts[0])
        pending = self._pending
        pending.append(Rendered(self._cur.rstrip(" "), self._cut))
        width = self.width
        mids = parts[1:-1]
        if not mids:
            pass
        elif len(s) > width and max(map(len, mids)) > width:
            for mid in mids:
                if len(mid) > width:
                    pending.append(Rendered(mid[:width].rstrip(" "), len(mid) - width))
                else:
                    pending.append(Rendered(mid.rstrip(" ")))
        elif mids.count(mids[0]) == len(mids):
            # The same line over and over (a burst of one message): one immutable object,
            # the same as the last burst's when the text is (the filter counts by identity).
            text = mids[0].rstrip(" ")
            same = self._burst
            if same is None or same.text != text:
                same = self._burst = Rendered(text)
            pending.extend([same] * len(mids))
        else:
            pending.extend(rendered_many([mid.rstrip(" ") for mid in mids]))
        keep = self.rows - 1
        if len(pending) > keep:  # rows scrolled off the top: committed, oldest first
            rows = list(pending)
            gone = len(rows) - keep
            self._out += rows[:gone]
            pending.clear()
            pending.extend(rows[gone:])
        self._cur, self._x, self._cut = "", 0, 0
        self._draw(parts[-1])

    def _draw(self, t: str) -> None:
        n = len(t)
        if not n:
            return
        x = self._x
        cur = self._cur
        if x > len(cur):
            cur += " " * (x - len(cur))
        room = self.width - x
        if n <= room:
            cur = cur + t if x == len(cur) else cur[:x] + t + cur[x + n:]
            self._x = x + n
        else:
            if room > 0:
                cur = cur[:x] + t[:room]
                self._x = self.width
            self._cut += n - room
        self._cur = cur

    def _to_screen(self) -> None:
        """Hand the modelled state to pyte."""
        s = self._screen
        buf = s.buffer
        buf.clear()
        y = 0
        for y, r in enumerate(self._pending):
            buf[y] = _row_from(r.text, r.cut)
        y = len(self._pending)
        buf[y] = _row_from(self._cur, self._cut)
        s.cursor.y = y
        s.cursor.x = self._x
        self._pending.clear()
        self._cur, self._x, self._cut = "", 0, 0
        self._line_mode = False

    def _maybe_line_mode(self) -> None:
        """Take over from pyte again when the screen is in a state line mode models exactly:
        parser at rest, default modes, no margins or savepoints, nothing below the cursor, and
        one character per cell on the rows above and at the cursor."""
        if not self.fast_path or self._line_mode:
            return
        s = self._screen
        if not self._stream._taking_plain_text or s.margins is not None or s.savepoints:
            return
        if s.mode & _BLOCKERS or s.charset or s.g0_charset is not cs.LAT1_MAP:
            return
        buf = s.buffer
        cy = s.cursor.y
        for y, row in buf.items():
            if y > cy and (row.cut or _cells_text(row).strip(" ")):
                return
        texts = []
        for y in range(cy + 1):
            row = buf.get(y)
            if row and any(len(c.data) != 1 for c in row.values()):
                return  # a wide character's stub, or a character with combining marks
            texts.append(_cells_text(row))
        row = buf.get(cy)
        self._pending = deque(
            Rendered(texts[y].rstrip(" "), (buf[y].cut if y in buf else 0)) for y in range(cy))
        self._cur = texts[cy]
        self._x = s.cursor.x
        self._cut = row.cut if row is not None else 0
        buf.clear()
        self._line_mode = True
