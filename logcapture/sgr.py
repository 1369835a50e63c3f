"""sgr: the style of a line (colours and attributes), one rule for every stage.

The renderer keeps what ECMA-48's SGR ("select graphic rendition", ``ESC [ ... m``) set for
each character of a line as *spans* beside the text: ``(start, end, sgr)``, ``start`` and
``end`` offsets into the text in code points, ``sgr`` the style normalised to SGR parameters.
A plain line has no spans. Only these are kept (what logs use; everything else, blink,
conceal, strikethrough, fonts, is dropped):

- attributes: ``1`` bold, ``2`` dim, ``3`` italic, ``4`` underline, ``7`` inverse;
- foreground: ``30``-``37``, ``90``-``97``, ``38;5;N`` (256 colours), ``38;2;R;G;B`` (true colour);
- background: ``40``-``47``, ``100``-``107``, ``48;5;N``, ``48;2;R;G;B``.

The normalised form lists the attributes in that order, then the foreground, then the
background (``"1;31"``, ``"38;5;208"``, ``"1;38;2;255;0;0"``): two ways of writing one style
give one string, so spans of one style merge and the stored text repeats few strings. Spans are
sorted, never overlap, never empty, never past the text, and neighbours differ in style.

In a record the spans are a JSON list of ``[start, end, "sgr"]`` (``Line.style``, the key
absent when the line is plain); in the store, the same JSON text in ``lines.style`` ('' when
plain). ``spans()`` reads either back, dropping anything malformed (a spool file is the user's
own and can hold anything): a style never carries text, and writing one back (``to_ansi``)
writes only SGR sequences of the form above.
"""

from __future__ import annotations

import json
import re

TYPE_CHECKING = False  # not typing's: the renderer imports this module on every job start
if TYPE_CHECKING:
    from typing import Any

Span = tuple[int, int, str]

_ATTRS = ("1", "2", "3", "4", "7")
_OFF = {22: ("1", "2"), 23: ("3",), 24: ("4",), 27: ("7",)}
_VALID = re.compile(r"[0-9;]{1,64}")
_CACHE: dict[tuple[str, str], str] = {}
_CACHE_MAX = 4096


def apply(state: str, params: str) -> str:
    """The normalised style after ``ESC [ params m`` in style ``state`` (normalised; '' is the
    default). Cached: a program sets few distinct styles."""
    key = (state, params)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    attrs, fg, bg = _split(state)
    codes = [int(p) if p.isdigit() else 0 for p in params.split(";")]
    i, n = 0, len(codes)
    while i < n:
        c = codes[i]
        i += 1
        if c == 0:
            attrs, fg, bg = set(), "", ""
        elif c in (1, 2, 3, 4, 7):
            attrs.add(str(c))
        elif c in _OFF:
            attrs.difference_update(_OFF[c])
        elif 30 <= c <= 37 or 90 <= c <= 97:
            fg = str(c)
        elif 40 <= c <= 47 or 100 <= c <= 107:
            bg = str(c)
        elif c == 39:
            fg = ""
        elif c == 49:
            bg = ""
        elif c in (38, 48):
            colour, i = _extended(codes, i)
            if colour is None:
                break  # as xterm: a malformed extended colour ends the sequence
            if c == 38:
                fg = "38;" + colour
            else:
                bg = "48;" + colour
    out = ";".join([a for a in _ATTRS if a in attrs] + [x for x in (fg, bg) if x])
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = out
    return out


def _extended(codes: list[int], i: int) -> tuple[str | None, int]:
    """``5;N`` or ``2;R;G;B`` at ``codes[i:]``: the colour and the index after it."""
    if i < len(codes) and codes[i] == 5 and i + 1 < len(codes) and codes[i + 1] <= 255:
        return f"5;{codes[i + 1]}", i + 2
    if i < len(codes) and codes[i] == 2 and i + 3 < len(codes) \
            and max(codes[i + 1:i + 4]) <= 255:
        r, g, b = codes[i + 1:i + 4]
        return f"2;{r};{g};{b}", i + 4
    return None, i


def _split(state: str) -> tuple[set[str], str, str]:
    attrs: set[str] = set()
    fg = bg = ""
    if not state:
        return attrs, fg, bg
    parts = state.split(";")
    i = 0
    while i < len(parts):
        p = parts[i]
        if p in ("38", "48"):
            k = 3 if parts[i + 1] == "5" else 5
            colour = ";".join(parts[i:i + k])
            i += k
            if p == "38":
                fg = colour
            else:
                bg = colour
            continue
        if p in _ATTRS:
            attrs.add(p)
        elif p[0] in "39" and len(p) == 2:
            fg = p
        else:
            bg = p
        i += 1
    return attrs, fg, bg


# -- spans ---------------------------------------------------------------------------------

def paint(spans: list[Span], start: int, end: int, sgr: str) -> list[Span]:
    """``spans`` with ``[start, end)`` set to ``sgr`` ('' clears it); neighbours of one style
    merged."""
    out: list[Span] = []
    for s, e, st in spans:
        if e <= start or s >= end:
            out.append((s, e, st))
            continue
        if s < start:
            out.append((s, start, st))
        if e > end:
            out.append((end, e, st))
    if sgr and end > start:
        out.append((start, end, sgr))
    out.sort()
    return merged(out)


def merged(spans: list[Span]) -> list[Span]:
    out: list[Span] = []
    for s, e, st in spans:
        if out and out[-1][1] == s and out[-1][2] == st:
            out[-1] = (out[-1][0], e, st)
        else:
            out.append((s, e, st))
    return out


def clip(spans: list[Span] | tuple[Span, ...], n: int) -> tuple[Span, ...]:
    """The spans within the first ``n`` code points (a line's text after its trailing spaces
    were stripped, or its limit)."""
    if not spans or spans[-1][1] <= n:
        return tuple(spans)
    return tuple((s, min(e, n), st) for s, e, st in spans if s < n)


def shift(spans: list[Span] | tuple[Span, ...], by: int) -> list[Span]:
    return [(s + by, e + by, st) for s, e, st in spans]


def cut(spans: list[Span] | tuple[Span, ...], start: int, end: int) -> list[Span]:
    """The spans within ``[start, end)``, as offsets from ``start``."""
    return [(max(s, start) - start, min(e, end) - start, st) for s, e, st in spans
            if s < end and e > start]


def remap(spans: tuple[Span, ...], old: str, new: str) -> tuple[Span, ...]:
    """The spans of ``old`` for ``new``, the same text with one part replaced (a secret
    masked): the common start and end keep their style, the replaced part has none."""
    if not spans:
        return ()
    n, m = len(old), len(new)
    pre = 0
    limit = min(n, m)
    while pre < limit and old[pre] == new[pre]:
        pre += 1
    suf = 0
    while suf < limit - pre and old[n - 1 - suf] == new[m - 1 - suf]:
        suf += 1
    head = cut(spans, 0, pre)
    tail = shift(cut(spans, n - suf, n), m - suf)
    return tuple(merged(head + tail))


# -- the record and the store --------------------------------------------------------------

def to_json(spans: tuple[Span, ...] | list[Any]) -> str:
    """The JSON text of a line's spans (the record's ``style`` value, the store's column)."""
    return json.dumps([list(s) for s in spans], separators=(",", ":"))


def spans(value: Any) -> tuple[Span, ...]:
    """A line's spans from a record's ``style`` (a list) or the store's column (its JSON text,
    '' when plain), for a text of any length: what is malformed is dropped, and each style is
    normalised again, so what is written back is SGR and nothing else."""
    if not value:
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return ()
    if not isinstance(value, (list, tuple)):
        return ()
    out: list[Span] = []
    last = 0
    for item in value:
        if not (isinstance(item, (list, tuple)) and len(item) == 3):
            continue
        s, e, st = item
        if type(s) is not int or type(e) is not int or not isinstance(st, str) \
                or not 0 <= last <= s < e or not _VALID.fullmatch(st):
            continue
        st = apply("", st)
        if st:
            out.append((s, e, st))
            last = e
    return tuple(out)


def to_ansi(text: str, spans_: tuple[Span, ...]) -> str:
    """``text`` with its spans written back as SGR sequences, each styled part closed with
    ``ESC[0m``, so nothing bleeds into the next line."""
    if not spans_:
        return text
    parts: list[str] = []
    at = 0
    for s, e, st in spans_:
        if s >= len(text):
            break
        parts.append(text[at:s])
        parts.append(f"\x1b[{st}m{text[s:e]}\x1b[0m")
        at = max(at, e)
    parts.append(text[at:])
    return "".join(parts)


def wants_color(choice: str, isatty: bool, environ: Any) -> bool:
    """``--color auto|always|never``: auto writes colours to a terminal unless ``NO_COLOR``
    is set to anything but '' (https://no-color.org)."""
    if choice == "always":
        return True
    if choice == "never":
        return False
    return isatty and not environ.get("NO_COLOR")


def shown_text(paint: bool) -> Any:
    """What a log entry (``logview.Entry``) prints as: its text, with its colours written back
    when ``paint``."""
    if paint:
        return lambda e: to_ansi(e.text, e.style)
    return lambda e: e.text
