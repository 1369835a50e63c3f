"""Sections: the fold markers CI systems print, read as the start and end of a section.

The markers (what each system's own log viewer folds):

- GitHub Actions: ``::group::TITLE`` starts a group, ``::endgroup::`` ends the innermost
  (https://docs.github.com/actions/reference/workflows-and-actions/workflow-commands).
- GitLab CI: ``section_start:UNIX_TS:NAME[collapsed=true]\\r\\e[0KHEADER`` and
  ``section_end:UNIX_TS:NAME\\r\\e[0K`` (https://docs.gitlab.com/ci/jobs/job_logs/); the end
  names the section it ends (and ends the sections opened inside it). A terminal erases the
  marker (``\\r`` then erase-line) and shows the header alone, so :class:`MarkerBytes` keeps
  it visible to the classifier: before rendering, the ``\\r`` right after a complete marker
  becomes a space (the bytes of the job's own output files are never changed).
- Buildkite: ``--- TITLE`` (collapsed), ``~~~ TITLE`` (collapsed, de-emphasised), ``+++ TITLE``
  (expanded) (https://buildkite.com/docs/pipelines/configure/managing-log-output); flat: a
  new one ends the section before it. ``^^^ +++`` alone on a line expands the section the
  job is in (the open group before it; scripts print it when a command fails, so that its
  output is not hidden): it starts and ends nothing.

The classifier (classify.py) turns a marker line into a ``Note`` instead of a ``Line``, in
mode ``enabled`` only (text a mode drops never becomes a title): ``NOTE_SECTION`` (``text``
the title, ``count`` 1 when it opens collapsed) and ``NOTE_SECTION_END`` (``text`` the
title, ``count`` the section's duration in ms, by the read times); ``^^^ +++`` becomes
``NOTE_SECTION_EXPAND`` (``text`` the title of the section it expands), or nothing when no
section is open. Sections nest (GitHub's and
GitLab's) in one stack for both streams, as the merged log shows them; a section still open
when the run ends is ended then.
"""

from __future__ import annotations

import re
from collections import namedtuple

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the job start path)

START = "start"
END = "end"
EXPAND = "expand"

_GITLAB = re.compile(r"section_(start|end):(\d{1,20}):([A-Za-z0-9_.-]{1,256})"
                     r"(?:\[([^\]\r\n]{0,256})\])?( ?)(.*)\Z", re.S)
_BUILDKITE = {"--- ": True, "~~~ ": True, "+++ ": False}  # prefix -> collapsed
_BUILDKITE_EXPAND = "^^^ +++"


class Marker(namedtuple("Marker", ("what", "name", "title", "collapsed", "flat"),
                        defaults=("", "", False, False))):
    """A marker line read: ``what`` START, END or EXPAND; ``name`` what an end names (GitLab) or "";
    ``title`` a start's title; ``collapsed``; ``flat`` (Buildkite: ends what is open). A
    ``collections.namedtuple``: the classifier is on every job's start path, where
    ``typing`` costs ~8 ms (docs/performance.md)."""

    __slots__ = ()
    if TYPE_CHECKING:
        what: str
        name: str
        title: str
        collapsed: bool
        flat: bool


# What a marker line starts with (``marker``): each marker is at the start of its line.
_STARTS = ("::group::", "::endgroup::", "section_", *_BUILDKITE, _BUILDKITE_EXPAND)
# ... after the newline that ends the line before it. One pattern that begins with a literal
# newline: the regex engine finds each newline with memchr and tries the starts there, ~4x
# faster on a batch of log lines than a substring search for each start (bench_sections.py).
_AFTER_NEWLINE = re.compile("\n(?:" + "|".join(map(re.escape, _STARTS)) + ")")


def may_hold_marker(joined: str) -> bool:
    """Might one of the lines joined by newlines in ``joined`` be a marker? (A cheap test for
    the classifier's batches; a false alarm only sends the batch line by line, so it looks
    only at the starts of lines: a ruler ``a --- b`` or a name with ``section_`` in it is
    none.)"""
    return joined.startswith(_STARTS) or _AFTER_NEWLINE.search(joined) is not None


def marker(text: str) -> Marker | None:
    """The marker a rendered line is, or None."""
    if text.startswith("::"):
        if text.startswith("::group::"):
            return Marker(START, title=text[9:].strip(), collapsed=True)
        if text.rstrip() == "::endgroup::":
            return Marker(END)
        return None
    if text.startswith("section_"):
        m = _GITLAB.match(text)
        if m is None:
            return None
        kind, _, name, options, _, header = m.groups()
        if kind == "end":
            return Marker(END, name=name) if not header.strip() else None
        collapsed = "collapsed=true" in (options or "").replace(" ", "").split(",")
        return Marker(START, name=name, title=header.strip() or name, collapsed=collapsed)
    folded = _BUILDKITE.get(text[:4])
    if folded is not None and text[4:].strip():
        return Marker(START, title=text[4:].strip(), collapsed=folded, flat=True)
    if text.startswith(_BUILDKITE_EXPAND) and not text[7:].strip():
        return Marker(EXPAND)
    return None


class Open(namedtuple("Open", ("name", "title", "ts", "flat"))):
    __slots__ = ()
    if TYPE_CHECKING:
        name: str
        title: str
        ts: float
        flat: bool


class Sections:
    """The open sections of a run (one stack for both streams): ``apply(marker, ts)`` gives
    the sections a marker ends, innermost first, as ``(title, duration in ms)``, and opens
    the one it starts; ``close(ts)`` ends every open one (the run's end)."""

    def __init__(self) -> None:
        self.open: list[Open] = []

    def apply(self, m: Marker, ts: float) -> list[tuple[str, int]]:
        ended: list[Open] = []
        if m.what == EXPAND:
            return []
        if m.what == END:
            if m.name:  # GitLab: that section, and what was opened inside it
                names = [o.name for o in self.open]
                if m.name in names:
                    at = len(names) - 1 - names[::-1].index(m.name)
                    ended, self.open = self.open[at:][::-1], self.open[:at]
            elif self.open:  # GitHub: the innermost
                ended = [self.open.pop()]
        else:
            if m.flat:  # Buildkite: a new header ends every open section
                ended, self.open = self.open[::-1], []
            self.open.append(Open(m.name, m.title, ts, m.flat))
        return [(o.title, duration_ms(o.ts, ts)) for o in ended]

    def innermost(self) -> str | None:
        """The title of the section the job is in (what ``^^^ +++`` expands), or None."""
        return self.open[-1].title if self.open else None

    def close(self, ts: float) -> list[tuple[str, int]]:
        ended, self.open = self.open[::-1], []
        return [(o.title, duration_ms(o.ts, ts)) for o in ended]


def duration_ms(start: float, end: float) -> int:
    return max(0, round((end - start) * 1000))


def duration_text(ms: int) -> str:
    """A section's duration as the log shows it (logview.py writes the same in SQL): ``850
    ms``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms // 1000}.{ms % 1000 // 100} s"
    s = ms // 1000
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


_MARKER_BYTES = re.compile(rb"section_(?:start|end):\d{1,20}:[A-Za-z0-9_.-]{1,256}"
                           rb"(?:\[[^\]\r\n]{0,256}\])?\r")
# What the end of a read may hold of a marker not yet complete.
_PARTIAL = re.compile(rb"section_(?:s(?:t(?:a(?:r(?:t(?::\d{0,20}(?::[A-Za-z0-9_.-]{0,256}"
                      rb"(?:\[[^\]\r\n]{0,256}\]?)?)?)?)?)?)?)?|e(?:n(?:d(?::\d{0,20}"
                      rb"(?::[A-Za-z0-9_.-]{0,256}(?:\[[^\]\r\n]{0,256}\]?)?)?)?)?)?)?\Z")
_PREFIX = b"section_"
_MAX_HELD = 600  # longer than the longest marker


class MarkerBytes:
    """Before one stream's renderer: the ``\\r`` that ends a complete GitLab marker becomes a
    space, so the marker stays in the rendered line (see the module's docstring). A marker
    cut by the end of a read is held back (at most a few hundred bytes, no newline) until the
    next, so any chunking gives the same bytes to the renderer."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        if self._held:
            data, self._held = self._held + data, b""
        cut = _unfinished(data)
        if cut is None and _PREFIX not in data:  # the usual read: as it is
            return data
        out = bytearray(data)
        for m in _MARKER_BYTES.finditer(data):
            out[m.end() - 1] = 0x20
        if cut is not None:
            self._held = bytes(out[cut:])
            del out[cut:]
        return bytes(out)

    def finish(self) -> bytes:
        held, self._held = self._held, b""
        return held


def _unfinished(data: bytes) -> int | None:
    """Where a marker that the end of ``data`` cuts begins, or None."""
    at = data.rfind(_PREFIX, max(0, len(data) - _MAX_HELD))
    if at >= 0 and _PARTIAL.match(data, at):
        return at
    for k in range(min(len(_PREFIX) - 1, len(data)), 0, -1):  # "sect" at the very end
        if data.endswith(_PREFIX[:k]):
            return len(data) - k
    return None
