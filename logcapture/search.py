"""What ``logcapture search`` looks for: the pattern, matched the same way by the store (as SQL
conditions with parameters) and by Python (for runs still in the spool), and the result's
shape (matching lines with their context, grouped by run).

A pattern is, by default, words and quoted phrases, all of which must occur in a line:

- a *word* that is one token (``NCCL``, ``gpu17``, ``héllo``) matches that token, as a whole
  token: ``hasToken(text, word)``, which the store's token index (``tokenbf_v1`` on ``text``)
  answers without reading the blocks that lack it;
- a *phrase* (``"CUDA out of memory"``, or a word with separators in it such as
  ``lr=0.001`` or ``CUDA_ERROR_OUT_OF_MEMORY``) matches that text with whole tokens at its
  ends, any run of spaces or tabs where it has one; the index narrows the lines to those with
  all of its tokens, then ``match`` checks the order;
- a word without any token character (``==>``) is a plain substring (no index).

A token is what the index stores: a longest run of ASCII letters and digits or non-ASCII
characters (ClickHouse's ``splitByNonAlpha``; so ``_``, ``.``, ``-``, ``=``, ``/`` and spaces
separate tokens). Matching is case-sensitive, as grep's.

With ``--regex`` the pattern is a regular expression (RE2 in the store, Python's ``re`` for
runs still in the spool; the common syntax behaves the same), matched anywhere in the line.
The index cannot help a regex: the store reads every line of the runs and times searched.

Text a mode dropped was never written to the spool or the store, so nothing here can find it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from .errors import UsageError

# A token of the index: ClickHouse's token extractor (splitByNonAlpha) keeps runs of ASCII
# letters and digits and of bytes >= 0x80; a non-ASCII character is all such bytes in UTF-8.
_TOKEN_RE = re.compile("[0-9A-Za-z\u0080-\U0010ffff]+")
# "Not a token character", in Python's and in RE2's syntax (the store's ``match``, UTF-8).
_NOT_TOKEN = {"python": "[^0-9A-Za-z\u0080-\U0010ffff]", "re2": r"[^0-9A-Za-z\x{80}-\x{10FFFF}]"}
_META = frozenset(".^$|?*+()[]{}\\")  # escaped alike in Python's re and RE2
_SPACE = {"python": "[ \t]+", "re2": "[ \t]+"}

# The states a run can be in: running, or ended in one of sacct's end states, SIGNALED (a
# run outside Slurm killed by a signal) or LOST (records.LOST: its writer went away);
# tests/test_search.py holds them to slurm.jobs' and records'.
STATES = ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY",
          "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REQUEUED", "SIGNALED", "LOST")
MAX_CONTEXT = 100  # lines before and after a match
MAX_LIMIT = 10_000  # matching lines in one answer
DEFAULT_LIMIT = 100


def tokens(text: str) -> list[str]:
    """The tokens the index holds for ``text``, in order."""
    return _TOKEN_RE.findall(text)


class Term(NamedTuple):
    """One part of a words pattern. ``kind``: ``token`` (a whole token), ``phrase`` (text
    with whole tokens at its ends) or ``substring`` (no token character in it)."""

    kind: str
    text: str


def _phrase_regex(text: str, dialect: str) -> str:
    """The regex of a phrase: its characters literally, runs of blanks as runs of blanks, and
    no token character just before (after) it when it starts (ends) with one."""
    out = []
    for part in re.split(r"([ \t]+)", text):
        if not part:
            continue
        if part[0] in " \t":
            out.append(_SPACE[dialect])
            continue
        for ch in part:
            if ch in _META:
                out.append("\\" + ch)
            elif ord(ch) < 0x20 or ord(ch) == 0x7f:
                out.append(f"\\x{ord(ch):02x}")
            else:
                out.append(ch)
    body = "".join(out)
    if _TOKEN_RE.match(text[0]):
        body = f"(?:^|{_NOT_TOKEN[dialect]})" + body
    if _TOKEN_RE.match(text[-1]):
        body += f"(?:$|{_NOT_TOKEN[dialect]})"
    return body


def _split_words(pattern: str) -> list[Term]:
    """``pattern`` as terms: ``"quoted phrases"`` and whitespace-separated words."""
    terms: list[Term] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch.isspace():
            i += 1
            continue
        if ch == '"':
            end = pattern.find('"', i + 1)
            if end < 0:
                raise UsageError(f"the pattern has a quote at character {i + 1} that is "
                                 f"never closed: {pattern!r}")
            phrase = pattern[i + 1:end].strip()
            if phrase:
                terms.append(_term(phrase, phrase=True))
            i = end + 1
            continue
        end = i
        while end < n and not pattern[end].isspace() and pattern[end] != '"':
            end += 1
        terms.append(_term(pattern[i:end], phrase=False))
        i = end
    return terms


def _term(text: str, phrase: bool) -> Term:
    toks = tokens(text)
    if not toks:
        return Term("substring", text)
    if not phrase and toks == [text]:
        return Term("token", text)
    return Term("phrase", text)


class Pattern:
    """A parsed search pattern: ``Pattern.parse(text)`` (words and phrases) or
    ``Pattern.parse(text, regex=True)``. ``matches(line)`` in Python and ``sql()`` in the
    store mean the same."""

    def __init__(self, text: str, terms: tuple[Term, ...], regex: str | None):
        self.text = text
        self.terms = terms
        self.regex = regex
        self._compiled: list[tuple[str, Any]] = []
        if regex is not None:
            try:
                self._compiled.append(("regex", re.compile(regex)))
            except re.error as e:
                raise UsageError(f"--regex {regex!r}: {e}") from None
        for t in terms:
            if t.kind == "phrase":
                self._compiled.append(("phrase", re.compile(_phrase_regex(t.text, "python"))))
            elif t.kind == "token":
                self._compiled.append(("token", t.text))
            else:
                self._compiled.append(("substring", t.text))

    @classmethod
    def parse(cls, text: str, regex: bool = False) -> Pattern:
        if not isinstance(text, str) or not text.strip():
            raise UsageError("the search pattern is empty")
        if "\x00" in text:
            raise UsageError("the search pattern contains a NUL character")
        if regex:
            return cls(text, (), text)
        terms = tuple(_split_words(text))
        if not terms:
            raise UsageError(f"the search pattern {text!r} has no words or phrases")
        return cls(text, terms, None)

    @property
    def indexed(self) -> bool:
        """Whether the token index narrows the search (a token in it to look for)."""
        return any(t.kind != "substring" for t in self.terms)

    def matches(self, line: str) -> bool:
        toks: set[str] | None = None
        for kind, what in self._compiled:
            if kind == "token":
                if toks is None:
                    toks = set(tokens(line))
                if what not in toks:
                    return False
            elif kind == "substring":
                if what not in line:
                    return False
            elif what.search(line) is None:
                return False
        return True

    def sql(self, column: str = "text") -> tuple[str, dict[str, Any]]:
        """A condition on ``column`` (a constant name of the caller's) and its parameters
        (``{s0:String}``, ...): the pattern is never part of the SQL text."""
        assert re.fullmatch(r"[a-z_]+", column)
        conds: list[str] = []
        params: dict[str, Any] = {}

        def param(value: str) -> str:
            name = f"s{len(params)}"
            params[name] = value
            return f"{{{name}:String}}"

        if self.regex is not None:
            conds.append(f"match({column}, {param(self.regex)})")
        for t in self.terms:
            if t.kind == "token":
                conds.append(f"hasToken({column}, {param(t.text)})")
            elif t.kind == "substring":
                conds.append(f"position({column}, {param(t.text)}) > 0")
            else:
                for tok in dict.fromkeys(tokens(t.text)):
                    conds.append(f"hasToken({column}, {param(tok)})")
                conds.append(f"match({column}, {param(_phrase_regex(t.text, 're2'))})")
        return " AND ".join(conds), params


# --- the request ---------------------------------------------------------------------------
class Request(NamedTuple):
    """One search: what to look for and where. Times are epoch seconds (None: unbounded)."""

    pattern: str
    regex: bool = False
    jobs: tuple[str, ...] = ()  # run ids or Slurm job ids (any of them)
    since: float | None = None
    until: float | None = None
    stream: str | None = None  # stdout or stderr
    states: tuple[str, ...] = ()  # any of them
    context: int = 0  # lines before and after each match
    limit: int = DEFAULT_LIMIT  # newest matching lines kept

    def checked(self) -> Request:
        """The request, or UsageError naming what is wrong with it."""
        Pattern.parse(self.pattern, self.regex)
        if self.stream not in (None, "stdout", "stderr"):
            raise UsageError(f"--stream must be stdout or stderr, not {self.stream!r}")
        bad = [s for s in self.states if s not in STATES]
        if bad:
            raise UsageError(f"--state {bad[0]!r} is not a job state (one of "
                             f"{', '.join(STATES)})")
        if not 0 <= self.context <= MAX_CONTEXT:
            raise UsageError(f"-C must be between 0 and {MAX_CONTEXT}, not {self.context}")
        if not 1 <= self.limit <= MAX_LIMIT:
            raise UsageError(f"--limit must be between 1 and {MAX_LIMIT}, not {self.limit}")
        if self.since is not None and self.until is not None and self.since > self.until:
            raise UsageError("--since is later than --until")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in zip(self._fields, self, strict=True)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Request:
        """A request sent as JSON (the read service's clients): unknown keys and wrong types
        are refused."""
        if not isinstance(d, dict) or set(d) - set(cls._fields):
            raise UsageError("a search request must be an object with the keys "
                             + ", ".join(cls._fields))
        kw: dict[str, Any] = {}
        for k, v in d.items():
            default = cls._field_defaults.get(k)
            if k in ("jobs", "states"):
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    raise UsageError(f"search: {k} must be a list of strings")
                v = tuple(v)
            elif k in ("since", "until"):
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                    raise UsageError(f"search: {k} must be a number of seconds or null")
            elif k in ("context", "limit"):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise UsageError(f"search: {k} must be a whole number")
            elif k == "regex":
                if not isinstance(v, bool):
                    raise UsageError("search: regex must be true or false")
            elif k == "stream":
                if v is not None and not isinstance(v, str):
                    raise UsageError("search: stream must be a string or null")
            elif not isinstance(v, type(default) if default is not None else str):
                raise UsageError(f"search: {k} must be a string")
            kw[k] = v
        if "pattern" not in kw:
            raise UsageError("search: the request has no pattern")
        return cls(**kw).checked()


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGO_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_when(text: str, option: str, now: float | None = None) -> float:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` ago; or a local date and time
    (``2026-11-01``, ``2026-11-01 12:00``, ``2026-11-01T12:00:30``); or ``now``."""
    now = time.time() if now is None else now
    s = text.strip()
    if s == "now":
        return now
    m = _AGO_RE.match(s)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    for fmt in ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M",
                "%Y-%m-%dT%H:%M:%S"):
        try:
            return time.mktime(time.strptime(s, fmt))
        except ValueError:
            continue
    raise UsageError(f"{option} {text!r}: give an age (30d, 12h, 90m, 2w) or a local date "
                     "and time (2026-11-01, 2026-11-01 12:00)")


# --- the answer ----------------------------------------------------------------------------
def line_of(d: dict[str, Any]) -> dict[str, Any]:
    """A line of an answer: stream, seq, ts, text, and ``line``: its line number in its run
    (logview.py; null where the source could not tell)."""
    return {"stream": d["stream"], "seq": int(d["seq"]), "ts": float(d["ts"]),
            "text": d["text"], "line": d.get("line")}


class Hit(NamedTuple):
    """A matching line of one run, with the lines around it in its stream (oldest first)."""

    run: str
    owner: str
    line: dict[str, Any]
    before: list[dict[str, Any]]
    after: list[dict[str, Any]]

    @property
    def key(self) -> tuple[float, str, int, str, str]:
        return (self.line["ts"], self.line["stream"], self.line["seq"], self.run, self.owner)


class Found(NamedTuple):
    """What one source found: hits newest first, the summaries of their runs (keyed by
    (run, owner): run, owner, job_id, name, state, start, source) and whether there were more
    hits than the request's limit."""

    hits: list[Hit]
    runs: dict[tuple[str, str], dict[str, Any]]
    truncated: bool


def merge(found: Iterable[Found], limit: int) -> Found:
    """Several sources' hits as one answer: the newest ``limit``."""
    hits: list[Hit] = []
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    truncated = False
    seen: set[tuple[Any, ...]] = set()
    for f in found:
        for h in f.hits:
            if h.key not in seen:
                seen.add(h.key)
                hits.append(h)
        runs.update(f.runs)
        truncated = truncated or f.truncated
    hits.sort(key=lambda h: h.key, reverse=True)
    if len(hits) > limit:
        hits, truncated = hits[:limit], True
    return Found(hits, {(h.run, h.owner): runs[(h.run, h.owner)] for h in hits}, truncated)


def context_of(lines: list[dict[str, Any]], i: int, n: int
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``n`` lines before and after ``lines[i]`` (one stream's lines in order)."""
    if n <= 0:
        return [], []
    return ([line_of(d) for d in lines[max(0, i - n):i]],
            [line_of(d) for d in lines[i + 1:i + 1 + n]])


def answer(found: Found) -> dict[str, Any]:
    """The JSON answer of a search: ``matches`` (lines), ``truncated``, and ``groups``: one
    per run, the run whose newest match is newest first, each with its summary and its
    ``lines`` in log order (time, then stream and sequence number): each line's stream, seq,
    ts, text, ``match`` (true for a matching line, false for context) and ``gap`` (true when
    lines were left out before it: grep's ``--``)."""
    order: list[tuple[str, str]] = []
    per_run: dict[tuple[str, str], list[Hit]] = {}
    for h in found.hits:  # newest first
        k = (h.run, h.owner)
        if k not in per_run:
            order.append(k)
            per_run[k] = []
        per_run[k].append(h)
    groups = []
    for k in order:
        groups.append({**found.runs[k], "lines": _group_lines(per_run[k])})
    return {"matches": len(found.hits), "truncated": found.truncated, "groups": groups}


def _group_lines(hits: list[Hit]) -> list[dict[str, Any]]:
    """One run's matches and their context, each line once, in log order; ``gap`` marks a
    line whose predecessor in the output is not the line just before it in its stream."""
    lines: dict[tuple[str, int], dict[str, Any]] = {}
    pred: dict[tuple[str, int], tuple[str, int]] = {}  # the line just before, where known
    for h in hits:
        block = [*h.before, h.line, *h.after]
        for j, d in enumerate(block):
            key = (d["stream"], int(d["seq"]))
            prev = lines.get(key)
            lines[key] = {**line_of(d), "match": d is h.line or bool(prev and prev["match"])}
            if j:
                pred[key] = (block[j - 1]["stream"], int(block[j - 1]["seq"]))
    out = sorted(lines.values(), key=lambda d: (d["ts"], d["stream"], d["seq"]))
    before: tuple[str, int] | None = None
    for d in out:
        key = (d["stream"], d["seq"])
        d["gap"] = before is not None and pred.get(key) != before
        before = key
    return out
