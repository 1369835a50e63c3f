"""filter: rendered lines of one stream -> lines and notes about what was dropped.

SPEC.md §2: consecutive repeated lines are dropped with a note saying how many; runs of blank
lines become one. One ``LineFilter`` per stream, so the rules never mix stdout and stderr.

- A line identical to the previous one (same text, same cut) is dropped and counted; when the
  run ends (a different line arrives, or ``finish()``), a ``Dropped(NOTE_REPEAT, n)`` follows
  the kept first line, ``n`` being the exact number of lines dropped.
- A blank line (empty after ``rstrip()``) following a blank line is dropped the same way and
  noted as ``Dropped(NOTE_BLANK, n)``; blank lines that differ only in whitespace are one run.
- Lines are never held back: the first of a run goes out at once; only the count waits.
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
        out: list[Rendered | Dropped] = []
        counts = self.counts
        counts["lines_in"] += len(lines)
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
