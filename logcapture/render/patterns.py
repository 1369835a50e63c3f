"""The text the renderer's fast path draws itself, as regular expressions shared by the
fast path (``render``) and the screen (``render.screen``): runs of printable one-cell
characters, carriage returns, SGR colours and erase-line."""

from __future__ import annotations

import re


def _width1_class() -> str:
    """A regex character class of the characters the fast path draws: printable, one cell
    wide (wcwidth 1). Everything else (wide, zero-width, combining, controls) goes to pyte."""
    import unicodedata

    from wcwidth import wcwidth

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


class Patterns:
    """Compiled on first use, not at import: building the class of one-cell characters asks
    wcwidth about 12,000 code points, and a stream of plain ASCII never needs it (nor
    wcwidth's import: ``fast_ascii`` is the same pattern for text without other characters)."""

    simple_run: re.Pattern[str]
    fast: re.Pattern[str]
    fast_ascii: re.Pattern[str]

    @staticmethod
    def _fast(one_cell: str) -> re.Pattern[str]:
        # The fast path's whole vocabulary: text (with newlines), carriage returns, SGR,
        # erase-line.
        return re.compile(
            f"([{one_cell}\\n]+)|(\\r+)|\\x1b\\[([0-9;]{{0,64}})m|\\x1b\\[([012]?)K")

    def __getattr__(self, name: str) -> re.Pattern[str]:
        if name == "fast_ascii":
            self.fast_ascii = self._fast(r"\x20-\x7e")
            return self.fast_ascii
        one_cell = _width1_class()
        self.simple_run = re.compile(f"[{one_cell}]+")
        self.fast = self._fast(one_cell)
        return getattr(self, name)


PATTERNS = Patterns()
