"""render: raw pty bytes of one stream -> committed screen lines.

Each output stream of a job gets its own ``Renderer``, which plays the part of the terminal the
job believes it writes to: what is committed is what a terminal would
show, with no escape sequences, no colours and no carriage-return debris. docs/rendering.md
states the rules; in short:

- The emulator is pyte, with the program's screen: ``columns`` wide and ``rows`` high. A line
  longer than ``columns`` wraps onto the rows below as on the program's terminal, so that
  cursor motion and erasing act on the rows the program sees; the rows of one logical line are
  joined again when committed (a terminal's soft-wrap flag), so the log never breaks a line at
  the terminal's width. A logical line is cut at ``line_limit`` characters; the rest is
  counted in ``Rendered.cut``.
- A logical line is committed when its last row scrolls off the top of the screen, when
  ``idle()`` finds it above the cursor's line, when the screen is cleared, reset or left
  for/from the alternate screen, and at ``finish()``.
- A fast path keeps plain text, ``\\r`` redraws, SGR colours and erase-line out of pyte's
  per-character work. It models exactly the pyte screen state it stands in for (the lines above
  the cursor and the cursor's line), hands over to pyte on anything else and takes over again
  when the screen is back in a state it can model, so its output is identical to pure pyte's
  (tests/test_render.py checks this differentially and under random chunking).

The job's output never raises: unknown sequences go to ``debug``, any
exception inside the emulator is caught, the parser is reset and rendering goes on.
"""

from __future__ import annotations

import codecs
import re
from collections import deque
from itertools import repeat

from .. import sgr as _sgr
from ..records import Rendered, rendered_many
from .patterns import PATTERNS

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any

    import pyte

    from .screen import Screen

__all__ = ["LINE_LIMIT", "Renderer"]

#: Longest logical line kept, in characters (cells). Longer lines are cut; ``Rendered.cut``
#: counts the characters dropped. Also the emulator's width, so it bounds memory: at most
#: ``rows`` x ``LINE_LIMIT`` cells are ever held.
LINE_LIMIT = 65536

# An escape sequence (CSI/OSC parameters) longer than this is abandoned: the parser is reset,
# so a hostile "ESC [ 1111..." without end cannot grow memory.
_MAX_SEQUENCE = 4096
# Escape tail that may be the start of a sequence the fast path knows: held back for the next
# chunk instead of handing the screen to pyte for one split sequence.
_PARTIAL = re.compile(r"\x1b(?:\[[0-9;]{0,64})?\Z")



# SGR parameters that reset the style (the usual end of a coloured part).
_RESETS = frozenset(("", "0"))

# ASCII bytes outside the pattern's text run: controls other than newline, and DEL.
_NOT_PLAIN_ASCII = bytes([*range(0x0a), *range(0x0b, 0x20), 0x7f])

def _rows(cells: int, columns: int) -> int:
    """Rows a logical line of ``cells`` cells takes on a screen ``columns`` wide (a line that
    fills its last row exactly does not take the next: the cursor waits at the margin)."""
    return (cells - 1) // columns + 1 if cells > 0 else 1


class Renderer:
    """Bytes of one stream in, committed lines out (see the module docstring).

    ``columns`` x ``rows`` is what the program was told (TIOCSWINSZ): the screen it draws on.
    Lines longer than ``columns`` wrap there and are joined again in the log; lines are cut at
    ``line_limit`` characters.
    """

    #: Class switch for tests and the benchmark: ``False`` sends every byte through pyte.
    fast_path = True

    def __init__(self, columns: int = 80, rows: int = 24, line_limit: int = LINE_LIMIT):
        self.width = max(1, int(line_limit))
        self.columns = max(1, min(int(columns), 0xFFFF))  # a winsize is 16 bits
        self.rows = max(1, int(rows))
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._out: list[Rendered] = []
        # The pyte screen and parser, made on the first sequence the fast path cannot model
        # (``_emulator``): most streams never need them.
        self._screen: Screen | None = None
        self._stream: pyte.Stream | None = None
        self._unground = 0
        self._tail = ""
        self.faults = 0  # exceptions caught inside the emulator
        # Line mode: the screen is the rows above the cursor (``_pending``, already final text)
        # and the cursor row (``_cur``, one character per cell), nothing below the cursor.
        self._line_mode = True
        self.screens = 0  # times the full emulator took the screen over (``line_mode``)
        self._pending: deque[Rendered] = deque()
        # What the lines of _pending take on the program's screen, in the same order: each
        # line's text before trailing spaces were stripped (spaces wrap onto rows too), or its
        # number of rows. A deque of at most the lines _pending keeps, so that keeping it in
        # step costs one C-level extend a chunk.
        self._raw: deque[str | int] = deque(maxlen=self.rows - 1)
        self._burst: Rendered | None = None  # the line of the last burst of one line
        self._cur = ""
        self._x = 0
        self._cut = 0
        # Style (logcapture.sgr): the current SGR state, and the cursor line's spans over its
        # cells (one character per cell in line mode). Both empty while the output is plain,
        # which costs the plain path nothing but two truth tests a draw.
        self._sgr = ""
        self._style: list[_sgr.Span] = []
        self._redrawn = False  # the cursor's line was drawn over after a carriage return
        if not self.fast_path:
            self._to_screen()

    # -- the interface ------------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Rendered]:
        """Raw pty bytes of one stream, any chunking; returns the newly committed lines."""
        text = self._tail + self._decoder.decode(data)
        self._tail = ""
        self._process(text, final=False)
        return self._drain()

    def idle(self, quiet: bool = True) -> list[Rendered]:
        """Commit the rows above the cursor (final lines), but not the cursor row, which may
        still be redrawn, nor the rows of a live display the program is redrawing
        (``Screen.commit_above_cursor``). ``quiet``: the stream has paused (else it is busy
        and this is a periodic commit), so a live display the cursor has left has ended. Safe
        to call at any time."""
        if self._line_mode:
            self._out.extend(self._pending)
            self._pending.clear()
            self._raw.clear()
        else:
            from .screen import ALT_SCREEN

            s = self._screen
            assert s is not None  # line mode is left only through _to_screen
            if s.margins is None and not s.mode & ALT_SCREEN:
                self._guard(s.commit_above_cursor, quiet)
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
            self._raw.clear()
            if self._cut or self._cur.rstrip(" "):
                self._out.append(self._cursor_line())
            self._cur, self._x, self._cut = "", 0, 0
            self._style = []
        else:
            s = self._emulator()
            self._guard(s.commit_all)
            s.cursor.x = s.cursor.y = 0
            self._maybe_line_mode()
        return self._drain()

    def live(self) -> list[str]:
        """The lines the renderer still holds, which the program may redraw, as they stand:
        where progress bars are (render/progress.py): the lines not committed yet and the
        cursor's line (a program that moves the cursor up redraws the rows above it: rich's
        bars, nested tqdm bars). Nothing while a full-screen program has the screen, nor the
        cursor's line while the program is drawing over it (the cursor inside its text, not at
        its start: what follows the cursor is the previous state's, a read that ended in the
        middle of a redraw)."""
        if self._line_mode:
            cur = self._cur.rstrip(" ")
            if 0 < self._x < len(cur):
                cur = ""
            return [r.text for r in self._pending] + ([cur] if cur else [])
        from .screen import ALT_SCREEN

        s = self._screen
        assert s is not None  # line mode is left only through _to_screen
        return [] if s.mode & ALT_SCREEN else s.live_lines()

    def redrawn(self) -> str | None:
        """The cursor's line when the program drew over it after a carriage return (a ``\\r``
        counter), in line mode; else None."""
        if self._line_mode and self._redrawn:
            return self._cur.rstrip(" ") or None
        return None

    @property
    def line_mode(self) -> bool:
        """Are the rows the lines the newlines ended, in order (the fast path's state), so
        that the k-th line committed is the one the k-th newline ended? Not while the full
        emulator has the screen, nor across a call in which it had it (``screens`` grew): a
        cursor moved up may have overwritten a row."""
        return self._line_mode

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
        except Exception:  # the job's output never raises
            from .screen import log  # only the emulator's work gets here

            self.faults += 1
            log.debug("renderer fault; parser reset", exc_info=True)
            assert self._stream is not None  # a fault comes from the emulator's work
            self._stream._initialize_parser()
            self._unground = 0

    def _pyte_feed(self, data: str) -> None:
        """pyte's ``Stream.feed``, except that an exception costs only the character that
        raised it (so the result does not depend on chunking) and an endless sequence is cut."""
        stream, screen = self._stream, self._screen
        assert stream is not None and screen is not None  # the emulator has the screen
        send = stream._send_to_parser
        match_text = stream._text_pattern.match
        draw = screen.draw
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
                screen.debug("fault", ch)
                taking = stream._taking_plain_text
            if taking:
                self._unground = 0
            else:
                self._unground += 1
                if self._unground > _MAX_SEQUENCE:
                    screen.debug("sequence too long")
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
        match = (PATTERNS.fast_ascii if text.isascii() else PATTERNS.fast).match
        columns = self.columns
        screen = columns * self.rows
        while True:
            m = match(text, pos)
            if m is None:
                return pos
            k = m.lastindex
            if k == 1:
                self._plain(m.group(1))
            elif k == 2:
                if len(self._cur) > screen:
                    return pos  # the line's first rows scrolled off: pyte models where it goes
                self._x = 0
                if self._cur:
                    self._redrawn = True
            elif k == 3:
                params = m.group(3)
                self._sgr = "" if params in _RESETS else _sgr.apply(self._sgr, params)
            else:
                how = m.group(4)
                x = self._x
                if (x or how == "1") and len(self._cur) > columns:
                    return pos  # a line that wrapped: the erase acts on the cursor's row only
                if how in ("", "0"):
                    self._cur = self._cur[:x]
                    self._cut = 0
                    if self._style:
                        self._style = list(_sgr.clip(self._style, x))
                elif how == "1":
                    cur = self._cur
                    self._cur = " " * min(x + 1, len(cur)) + cur[x + 1:]
                    if self._style:
                        self._style = _sgr.paint(self._style, 0, x + 1, "")
                else:
                    self._cur = ""
                    self._cut = 0
                    self._style = []
            pos = m.end()

    def _cursor_line(self) -> Rendered:
        """The cursor's line as a committed line."""
        text = self._cur.rstrip(" ")
        if not self._style:
            return Rendered(text, self._cut)
        return Rendered(text, self._cut, _sgr.clip(self._style, len(text)))

    def _plain(self, s: str) -> None:
        if "\n" not in s:
            self._draw(s)
            return
        parts = s.split("\n")
        self._draw(parts[0])
        self._redrawn = False
        pending = self._pending
        raw = self._raw
        pending.append(self._cursor_line())
        raw.append(self._cur)
        width = self.width
        mids = parts[1:-1]
        if not mids:
            pass
        elif self._sgr:  # whole lines in one style
            for mid in mids:
                text = mid[:width].rstrip(" ")
                pending.append(Rendered(text, max(0, len(mid) - width),
                                        ((0, len(text), self._sgr),) if text else ()))
                raw.append(mid[:width])
            mids = []
        elif len(s) > width and max(map(len, mids)) > width:
            for mid in mids:
                if len(mid) > width:
                    pending.append(Rendered(mid[:width].rstrip(" "), len(mid) - width))
                    raw.append(mid[:width])
                else:
                    pending.append(Rendered(mid.rstrip(" ")))
                    raw.append(mid)
            mids = []
        elif mids.count(mids[0]) == len(mids):
            # The same line over and over (a burst of one message): one immutable object,
            # the same as the last burst's when the text is (the filter counts by identity).
            text = mids[0].rstrip(" ")
            same = self._burst
            if same is None or same.text != text:
                same = self._burst = Rendered(text)
            pending.extend([same] * len(mids))
        else:
            pending.extend(rendered_many(map(str.rstrip, mids, repeat(" "))))
        raw.extend(mids)
        keep = self.rows - 1
        if len(pending) > keep:  # rows scrolled off the top: committed, oldest first
            rows = list(pending)
            gone = len(rows) - keep
            self._out += rows[:gone]
            pending.clear()
            pending.extend(rows[gone:])
        self._cur, self._x, self._cut = "", 0, 0
        self._style = []
        self._draw(parts[-1])

    def _draw(self, t: str) -> None:
        n = len(t)
        if not n:
            return
        x = self._x
        room = self.width - x
        if room <= 0:  # the cursor is at or past the line limit (moved there in pyte)
            self._cut += n
            return
        cur = self._cur
        if x > len(cur):
            cur += " " * (x - len(cur))
        if n <= room:
            cur = cur + t if x == len(cur) else cur[:x] + t + cur[x + n:]
            self._x = x + n
        else:
            cur = cur[:x] + t[:room]
            self._x = self.width
            self._cut += n - room
        self._cur = cur
        sgr, style = self._sgr, self._style
        if not (sgr or style):
            return
        if not style or style[-1][1] <= x:  # drawn past every span: the usual case
            if not sgr:
                return
            if style and style[-1][1] == x and style[-1][2] == sgr:
                style[-1] = (style[-1][0], self._x, sgr)
            else:
                style.append((x, self._x, sgr))
        else:
            self._style = _sgr.paint(style, x, self._x, sgr)

    def _emulator(self) -> Screen:
        if self._screen is None:
            from .screen import Screen, Stream

            self._screen = Screen(self.columns, self.rows, self.width, self._out)
            self._stream = Stream(self._screen)
            # Honour ESC ( 0 and SO/SI as xterm does in UTF-8 mode: curses draws boxes with
            # them.
            self._stream.use_utf8 = False
        return self._screen

    def _to_screen(self) -> None:
        """Hand the modelled state to pyte: each line laid out on the rows it takes at the
        program's width, the rows that did not fit scrolled off the top as they would have."""
        from .screen import row_from

        s = self._emulator()
        self.screens += 1
        c = self.columns
        layout: list[_RowLayout] = []  # text, cut, wrapped, style per row
        for r, raw in zip(self._pending, self._raw, strict=True):
            n = raw if isinstance(raw, int) else _rows(len(raw), c)
            _lay_out(layout, r.text, r.cut, n, c, r.style)
        x = self._x
        row_in_line = (x - 1) // c if x > 0 else 0  # at x = k*c the cursor waits at the margin
        cy = len(layout) + row_in_line
        _lay_out(layout, self._cur, self._cut, max(_rows(len(self._cur), c), row_in_line + 1), c,
                 self._style)
        buf = s.buffer
        buf.clear()
        over = len(layout) - s.lines
        for row in layout[:max(over, 0)]:
            s.hand_on(row_from(*row))
        if over > 0:
            layout = layout[over:]
            cy -= over
        for y, row in enumerate(layout):
            buf[y] = row_from(*row)
        s.cursor.y = cy
        s.cursor.x = x - row_in_line * c
        s.sgr = self._sgr
        self._pending.clear()
        self._raw.clear()
        self._cur, self._x, self._cut = "", 0, 0
        self._style = []
        self._redrawn = False
        self._line_mode = False

    def _maybe_line_mode(self) -> None:
        """Take over from pyte again when the screen is in a state line mode models exactly:
        parser at rest, default modes, no margins or savepoints, no line scrolled off in part,
        nothing below the cursor, the cursor's line starting on the cursor row, and one
        character per cell on the rows above and at the cursor."""
        if not self.fast_path or self._line_mode:
            return
        from .screen import AUTOWRAP, BLOCKERS, LAT1_MAP, cells_style, cells_text

        s = self._screen
        assert s is not None and self._stream is not None
        if (not self._stream._taking_plain_text or s.margins is not None or s.savepoints
                or s.live is not None):  # line mode would commit a live display's rows
            return
        if (s.mode & BLOCKERS or AUTOWRAP not in s.mode or s.charset
                or s.g0_charset is not LAT1_MAP or s.carry_open):
            return
        buf = s.buffer
        cy = s.cursor.y
        for y, row in buf.items():
            if y > cy and (row.cut or cells_text(row).strip(" ")):
                return
        at_cursor = buf.get(cy)
        if (at_cursor is not None and (at_cursor.wrapped or at_cursor.cut)) \
                or s.chain_start(cy) != cy:
            # Line mode keeps one cut count for the cursor's line, counted on its last row
            # when it hands the screen back: a cut already on the cursor's row (an erase left
            # it there) would move to the row the line grows onto.
            return
        texts = []
        for y in range(cy + 1):
            line = buf.get(y)
            if line and any(len(c.data) != 1 for c in line.values()):
                return  # a wide character's stub, or a character with combining marks
            texts.append(cells_text(line))
        pending: deque[Rendered] = deque()
        raw = self._raw
        raw.clear()
        parts: list[str] = []
        style: list[_sgr.Span] = []
        cut = at = 0
        for y in range(cy):
            line = buf.get(y)
            wrapped = line.wrapped if line is not None else 0
            part = texts[y][:wrapped].ljust(wrapped) if wrapped else texts[y]
            if line:
                style += _sgr.shift(cells_style(line, len(part)), at)
            parts.append(part)
            at += len(part)
            cut += line.cut if line is not None else 0
            if not wrapped:
                text = "".join(parts).rstrip(" ")
                pending.append(Rendered(text, cut, _sgr.clip(_sgr.merged(style),
                                                             len(text))))
                raw.append(len(parts))
                parts, style, cut, at = [], [], 0, 0
        self._pending = pending
        self._cur = texts[cy]
        self._style = cells_style(at_cursor, len(self._cur)) if at_cursor else []
        self._x = s.cursor.x
        self._cut = at_cursor.cut if at_cursor is not None else 0
        self._sgr = s.sgr
        buf.clear()
        self._line_mode = True


_RowLayout = tuple[str, int, int, list[_sgr.Span]]  # a row's text, cut, wrapped, spans


def _lay_out(layout: list[_RowLayout], text: str, cut: int, rows: int, columns: int,
             style: tuple[_sgr.Span, ...] | list[_sgr.Span]) -> None:
    """Append the ``rows`` rows a logical line takes on a screen ``columns`` wide."""
    for i in range(rows - 1):
        layout.append((text[i * columns:(i + 1) * columns], 0, columns,
                       _sgr.cut(style, i * columns, (i + 1) * columns) if style else []))
    start = (rows - 1) * columns
    layout.append((text[start:start + columns], cut, 0,
                   _sgr.cut(style, start, start + columns) if style else []))
