"""filter: rendered lines of one stream -> lines and notes about what was dropped.

Consecutive repeated lines are dropped with a note saying how many; runs of blank
lines become one. One ``LineFilter`` per stream, so the rules never mix stdout and stderr.

- A line identical to the previous one (same text, same cut) is dropped and counted; when the
  run ends (a different line arrives, or ``finish()``), a ``Dropped(NOTE_REPEAT, n)`` follows
  the kept first line, ``n`` being the exact number of lines dropped.
- A blank line (empty after ``rstrip()``) following a blank line is dropped the same way and
  noted as ``Dropped(NOTE_BLANK, n)``; blank lines that differ only in whitespace are one run.
- Lines are never held back: the first of a run goes out at once; only the count waits.
- The lines kept are the very objects given, in their order (``pipeline._by_group`` cuts a
  batch of several reads back into the reads by identity).
"""

from __future__ import annotations

from .records import NOTE_BLANK, NOTE_REPEAT, Dropped, Rendered

__all__ = ["LineFilter"]


class LineFilter:
    """Drops consecutive repeats and blank runs of one stream; ``counts`` keeps the tally:
    ``lines_in``, ``lines_out``, ``repeats_dropped``, ``blanks_dropped``."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {
            "lines_in": 0, "lines_out": 0, "repeats_dropped": 0, "blanks_dropped": 0,
        }
        self._last: Rendered | None = None
        self._last_blank = False
        self._run = 0  # lines dropped in the current run

    def feed(self, lines: list[Rendered]) -> list[Rendered | Dropped]:
        n = len(lines)
        counts = self.counts
        counts["lines_in"] += n
        if n > 1:
            # Two cases cover a burst, checked with C-level operations over the texts; any
            # other batch takes the line-by-line loop below (the rule itself).
            last = self._last
            first = lines[0]
            if lines[-1] is first and lines.count(first) == n:
                # One object n times (the renderer shares it for a burst of one line; count
                # compares by identity first, so this costs no per-line Python work).
                blank = not first.text.rstrip()
                if last is not None and ((blank and self._last_blank)
                                         or (not blank and first == last)):
                    self._run += n
                    return []
                out_one: list[Rendered | Dropped] = []
                self._end_run(out_one)
                out_one.append(first)
                counts["lines_out"] += 1
                self._last = first
                self._last_blank = blank
                self._run = n - 1
                return out_one
            texts = [line.text for line in lines]
            if last is not None and texts.count(last.text) == n \
                    and [line.cut for line in lines].count(last.cut) == n \
                    and [line.style for line in lines].count(last.style) == n:
                # Every line equals the last one kept: all dropped, one run.
                self._run += n
                return []
            if all(map(str.rstrip, texts)) and (last is None or texts[0] != last.text) \
                    and not any(map(str.__eq__, texts, texts[1:])):
                # No blank line, no two neighbours with the same text, the first unlike the
                # last one kept: every line is kept; a pending run ends before the first.
                out: list[Rendered | Dropped] = []
                self._end_run(out)
                out += lines
                counts["lines_out"] += n
                self._last = lines[-1]
                self._last_blank = False
                return out
        return self._each(lines)

    def _each(self, lines: list[Rendered]) -> list[Rendered | Dropped]:
        out: list[Rendered | Dropped] = []
        counts = self.counts
        for line in lines:
            blank = not line.text.rstrip()
            if self._last is not None and (
                    (blank and self._last_blank) or (not blank and line == self._last)):
                self._run += 1
                continue
            self._end_run(out)
            out.append(line)
            counts["lines_out"] += 1
            self._last = line
            self._last_blank = blank
        return out

    def finish(self) -> list[Rendered | Dropped]:
        out: list[Rendered | Dropped] = []
        self._end_run(out)
        self._last = None
        self._last_blank = False
        return out

    def _end_run(self, out: list[Rendered | Dropped]) -> None:
        if self._run:
            if self._last_blank:
                out.append(Dropped(NOTE_BLANK, self._run))
                self.counts["blanks_dropped"] += self._run
            else:
                out.append(Dropped(NOTE_REPEAT, self._run))
                self.counts["repeats_dropped"] += self._run
            self._run = 0
