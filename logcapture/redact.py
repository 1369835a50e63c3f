"""The redact stage: secrets in the job's text are replaced by ``***`` before anything is kept.

It takes each stream's rendered lines, in the order the pipeline hands them on (read order
across both streams), and gives back the same lines with every secret it recognises replaced
by ``REDACTED``, the rest of each line as it was. What it recognises (docs/user.md, "Secrets"):

- the values of the job's environment variables whose names match ``DEFAULT_VARIABLES`` (and
  the site's own), in plain form and in the encodings programs commonly print them in (URL
  encoding, base64 of the value alone, a JSON string's escapes); values shorter than
  ``MIN_SECRET`` are not treated as secrets;
- well-known token formats, whatever their source (``_TOKEN_PATTERNS``), and the whole body
  of a PEM or OpenSSH private key block, its BEGIN and END lines kept;
- a value the job asks to mask: ``/LOGCOMMAND {"mask": "VALUE"}``, on either stream, from that
  line on; the command line itself keeps ``***`` in the value's place;
- literals and regular expressions the user (``.logoptin``'s ``redact``) and the site (the
  admin config's ``redact_patterns``) add: ``pattern_of`` reads one, for both.

The stage runs before the repeat filter, so the filter compares the text that is stored: two
lines that differ only in a secret are one stored line repeated, and the filter's notes
describe what a reader sees. Redaction is on the text logcapture keeps; what the job writes to
its own outputs is never changed (the reader copies those bytes before any stage sees them).

Cost: one pass of a multi-pattern matcher (Aho-Corasick) over a batch's joined text finds
every line that holds a candidate: an anchor of a token format (``_ANCHORS``), a literal to
replace, a command line; a batch with none is passed through, and only the lines found are
redacted (``Redactor.lines``): ~0.1 us a line, where a test of the batch for each anchor took
0.1-2 (docs/performance.md, "Redaction"). A configured regular expression is searched in
every line.
``counts`` says how many secrets were replaced, by kind; nothing records what they were.
"""

from __future__ import annotations

import base64
import json
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from functools import partial
from itertools import accumulate
from operator import itemgetter
from urllib.parse import quote, quote_plus

from .records import Rendered
from .sgr import remap

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any

REDACTED = "***"
MIN_SECRET = 8  # a variable's value shorter than this is too common a string to be a secret
MIN_MASK = 4  # a value to mask, or a user's literal, shorter than this would blank the log

# Buildkite's agent redacts the values of variables named like its defaults
# (https://buildkite.com/docs/pipelines/configure/managing-log-output#redacted-environment-variables);
# these are those and the names ML jobs commonly keep keys in. Matched as shell globs against
# the upper-cased name.
DEFAULT_VARIABLES = (
    "*_PASSWORD", "*_SECRET", "*_TOKEN", "*_ACCESS_KEY", "*_SECRET_KEY", "*_PRIVATE_KEY",
    "*_CONNECTION_STRING", "*_API_KEY", "*APIKEY*", "*PASSWORD*", "*PASSWD*", "*_CREDENTIALS",
    "HF_TOKEN", "WANDB_API_KEY",
)

# Kinds of redaction, as ``counts`` and ``logcapture show`` name them.
ENVIRONMENT = "environment"
MASK = "mask"
USER = "user"
SITE = "site"
PRIVATE_KEY = "private-key"
AWS = "aws"
OPTION = "option"

# Token formats: (kind, anchors, pattern). A pattern is searched in a line only when one of its
# anchors (substrings every match holds) is in it: Python's re scans fast for a pattern that
# starts with a literal, and slowly (~2-30 us a line) for one that starts with a word boundary,
# a character class or a case-insensitive word. A pattern with a group ``v`` replaces only
# that group (the name or scheme before it stays readable); any other, the whole match.
_ASSIGNED = (r"passw(?:or)?d|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key"
             r"|credentials?")
_KEYWORDS = ("assword", "ASSWORD", "asswd", "ASSWD", "ecret", "ECRET", "_key", "_KEY", "-key",
             "-KEY", "pikey", "PIKEY", "redential", "REDENTIAL",
             *(f"{t}{sep}" for t in ("oken", "OKEN") for sep in ("=", ":", '"', "'", " ")))
_TOKEN_PATTERNS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    # https://github.blog/engineering/platform-security/behind-githubs-new-authentication-token-formats/
    ("github", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
     r"gh[pousr]_(?<![A-Za-z0-9_]gh._)[A-Za-z0-9]{36,255}\b"),
    ("github", ("github_pat_",), r"github_pat_[A-Za-z0-9_]{22,255}\b"),
    # Access key ids (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_identifiers.html);
    # a secret key on the same line is ``_AWS_SECRET``.
    (AWS, ("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),
     r"A(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])(?<![A-Za-z0-9]A...)[A-Z0-9]{16}\b"),
    # https://api.slack.com/authentication/token-types and incoming webhooks.
    ("slack", ("xox",), r"xox[abposre]-(?<![A-Za-z0-9]xox.-)[A-Za-z0-9-]{10,}"),
    ("slack", ("xapp-",), r"xapp-[0-9]-[A-Za-z0-9-]{10,}"),
    ("slack", ("hooks.slack.com",), r"hooks\.slack\.com/services/(?P<v>[A-Za-z0-9/_-]{20,})"),
    ("huggingface", ("hf_",), r"hf_(?<![A-Za-z0-9]hf_)[A-Za-z0-9]{30,}\b"),
    ("openai", ("sk-",),
     r"sk-(?<![A-Za-z0-9]sk-)(?:proj-|svcacct-|admin-|ant-)?[A-Za-z0-9_-]{20,}"),
    # RFC 7519: three base64url parts; the first two are JSON objects, so they start "eyJ".
    ("jwt", ("eyJ",), r"eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
    # RFC 6750 and RFC 7617 credentials.
    ("bearer", ("uthorization", "UTHORIZATION"),
     r"(?i:authorization)[\"']?\s*[:=]\s*[\"']?(?:(?i:basic|bearer|token|digest)\s+)?"
     r"(?P<v>[A-Za-z0-9._~+/-]{8,}=*)"),
    ("bearer", ("earer", "EARER"), r"(?i:bearer)\s+(?P<v>[A-Za-z0-9._~+/-]{16,}=*)"),
    # RFC 3986 userinfo: scheme://user:PASSWORD@host.
    ("url-password", ("://",), r"://[^\s:/@\"'<>]*:(?P<v>[^\s/@\"'<>]+)@"),
    # A value given to a name that ends like a secret's (api_key=..., "password": "...",
    # --token=...); not a path, a placeholder (<pad>, ${VAR}) or a short word.
    (OPTION, _KEYWORDS, rf"(?i:{_ASSIGNED})[\"']?\s*[:=]\s*[\"']?"
                        r"(?P<v>(?![/.~])[A-Za-z0-9_./+~=@!%^*-]{8,})"),
)
_TOKENS = tuple((kind, anchors, re.compile(pattern)) for kind, anchors, pattern in _TOKEN_PATTERNS)
# A 40-character secret access key, on a line with an access key id; not a hex digest.
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])(?=[A-Za-z0-9/+]{0,39}[A-Z/+])[A-Za-z0-9/+]{40}"
                         r"(?![A-Za-z0-9/+=])")
# RFC 7468 and OpenSSH's PROTOCOL.key: a private key is a block of lines between these.
_KEY_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----")
_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----")
KEY_MAX_LINES = 500  # a 16384-bit RSA key is ~200 lines; past this the block has no END

# Every match of _TOKENS holds one of its pattern's anchors, and every key block's BEGIN line
# "PRIVATE KEY": a line with none of these, no literal and no command is left as it is.
_ANCHORS = tuple(sorted({a for _, anchors, _ in _TOKEN_PATTERNS for a in anchors}
                        | {"PRIVATE KEY"}))

COMMAND_PREFIX = "/LOGCOMMAND"  # a command line's start (classify.py says what a command is)
_MASK_VALUE = re.compile(r'"mask"\s*:\s*"(?P<v>(?:[^"\\]|\\.)*)"')


def variants(value: str) -> set[str]:
    """``value`` as programs commonly print it: itself, URL-encoded, base64 (standard and
    URL-safe, with and without padding), with a JSON string's escapes; and each of its lines
    when it has several (the stage sees one line at a time)."""
    out = {value}
    out.add(quote(value, safe=""))
    out.add(quote_plus(value, safe=""))
    raw = value.encode()
    for b64 in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()):
        out.add(b64)
        out.add(b64.rstrip("="))
    out.add(json.dumps(value)[1:-1])
    out.add(json.dumps(value, ensure_ascii=False)[1:-1])
    for line in value.splitlines():
        if len(line.strip()) >= MIN_SECRET:
            out.add(line.strip())
    return {v for v in out if len(v) >= min(MIN_SECRET, len(value)) and "\n" not in v}


def secret_values(env: Mapping[str, str], names: Iterable[str] = DEFAULT_VARIABLES) -> set[str]:
    """The values of ``env``'s variables whose names match one of the globs ``names`` (upper
    case), at least MIN_SECRET characters long."""
    globs = [n.upper() for n in names]
    return {value for name, value in env.items()
            if len(value) >= MIN_SECRET and any(fnmatchcase(name.upper(), g) for g in globs)}


def pattern_of(item: str) -> str | re.Pattern[str]:
    """A configured ``redact`` item: ``/REGEX/`` is a regular expression, anything else a
    literal. Raises ValueError saying what is wrong, without quoting the item (it may be a
    secret)."""
    if len(item) >= 2 and item.startswith("/") and item.endswith("/"):
        try:
            rx = re.compile(item[1:-1])
        except re.error as e:
            where = f" at position {e.pos + 1}" if e.pos is not None else ""
            raise ValueError(f"not a valid regular expression: {e.msg}{where}") from None
        if rx.search(""):
            raise ValueError("the regular expression matches an empty string (it would "
                             "redact nothing but mark every line)")
        return rx
    if len(item) < MIN_MASK:
        raise ValueError(f"a literal must be at least {MIN_MASK} characters long "
                         f"(write /REGEX/ for a regular expression)")
    return item


def mask_accepted(value: str) -> bool:
    """Is ``value`` of a ``mask`` command one this stage takes? (It replaces an accepted
    value by REDACTED in the command line before the classifier reads it.)"""
    return value == REDACTED or len(value) >= MIN_MASK


class Redactor:
    """Secrets out of one run's text. ``lines(stream, lines)`` for the output streams,
    ``start_fields(fields)`` for the start record; ``counts`` by kind."""

    def __init__(self, env: Mapping[str, str] | None = None,
                 variables: Iterable[str] = (), user: Iterable[str | re.Pattern[str]] = (),
                 site: Iterable[str | re.Pattern[str]] = ()):
        """``env``: the job's environment; ``variables``: name globs beyond
        DEFAULT_VARIABLES; ``user`` and ``site``: configured items (``pattern_of``)."""
        self.counts: Counter[str] = Counter()
        self._literals: dict[str, str] = {}  # literal -> kind
        self._regexes: list[tuple[str, re.Pattern[str]]] = []
        for kind, items in ((SITE, site), (USER, user)):
            for item in items:
                if isinstance(item, str):
                    self._literals.setdefault(item, kind)
                else:
                    self._regexes.append((kind, item))
        for value in secret_values(env or {}, (*DEFAULT_VARIABLES, *variables)):
            for v in variants(value):
                self._literals[v] = ENVIRONMENT
        self._in_key: dict[str, int] = {}  # stream -> lines of a key block so far
        self._build()

    def _build(self) -> None:
        # Imported here, in the capture worker: the job's start (config/checking.py imports this
        # module for pattern_of) does not pay for it.
        from ahocorasick_rs import AhoCorasick, MatchKind

        literals = sorted(self._literals, key=len, reverse=True)  # the longest form first
        self._literal_rx = re.compile("|".join(map(re.escape, literals))) if literals else None
        # Leftmost-first, non-overlapping matches suffice to find every line with a candidate
        # (``_lines_found``); the crate's SIMD prefilter makes them the fastest kind
        # (https://docs.rs/aho-corasick/latest/aho_corasick/enum.MatchKind.html).
        self._matcher = AhoCorasick((*_ANCHORS, COMMAND_PREFIX, *literals),
                                    matchkind=MatchKind.LeftmostFirst)

    def add_mask(self, value: str) -> None:
        for v in variants(value) | {value}:
            self._literals[v] = MASK
        self._build()

    # --- the hot path ---------------------------------------------------------------------
    def lines(self, stream: str, lines: list[Rendered]) -> list[Rendered]:
        """``lines`` of ``stream`` with their secrets replaced: the very list when none has a
        candidate, else a new list whose unchanged lines are the objects given."""
        if not lines:
            return lines
        if self._in_key.get(stream):
            return self._each(stream, lines, range(len(lines)))
        found = self._matcher.find_matches_as_indexes(
            lines[0].text if len(lines) == 1 else "\n".join(map(itemgetter(0), lines)))
        if not found and not self._regexes:
            return lines
        return self._each(stream, lines, _lines_found(found, lines))

    def _each(self, stream: str, lines: list[Rendered], found: Iterable[int]
              ) -> list[Rendered]:
        """``lines`` with the lines at the indexes ``found`` (ascending) redacted, and every
        line searched with the configured regular expressions. A line that starts a key block
        or masks a value changes what the lines after it hold: they are all redacted."""
        out = list(lines)
        done = 0  # lines before this have been redacted
        for i in found:
            if i < done:
                continue
            self._regex_lines(out, done, i)
            matcher = self._matcher
            out[i] = self._redacted(stream, out[i])
            done = i + 1
            if self._in_key.get(stream) or self._matcher is not matcher:
                for j in range(done, len(out)):
                    out[j] = self._redacted(stream, out[j])
                return out
        self._regex_lines(out, done, len(out))
        return out

    def _redacted(self, stream: str, line: Rendered) -> Rendered:
        text = self._line(stream, line.text)
        return line if text is line.text else _with_text(line, text)

    def _regex_lines(self, out: list[Rendered], start: int, stop: int) -> None:
        """``out[start:stop]``, lines without a candidate, searched with the configured
        regular expressions (what ``_line`` does last)."""
        if not self._regexes:
            return
        for i in range(start, stop):
            text = self._regexes_in(out[i].text)
            if text is not out[i].text:
                out[i] = _with_text(out[i], text)

    def text(self, text: str) -> str:
        """One string that is no line of the output (a start record's field): a key block
        that starts in it ends with it."""
        return self._line("", text) if text else text

    def start_fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A start record's fields with the command line, working directory and Slurm
        identity redacted: a value after an option named like a secret (``--password X``)
        too."""
        out = dict(fields)
        if "command" in out:
            command = [self.text(str(arg)) for arg in out["command"]]
            for i in range(1, len(command)):
                if _OPTION_NAME.fullmatch(command[i - 1]) and len(command[i]) >= MIN_MASK \
                        and command[i] != REDACTED:
                    command[i] = REDACTED
                    self.counts[OPTION] += 1
            out["command"] = command
        if isinstance(out.get("cwd"), str):
            out["cwd"] = self.text(out["cwd"])
        if isinstance(out.get("slurm"), Mapping):
            out["slurm"] = {k: self.text(v) if isinstance(v, str) else v
                            for k, v in out["slurm"].items()}
        return out

    # --- one line -------------------------------------------------------------------------
    def _line(self, stream: str, text: str) -> str:
        """``text`` redacted; the same object when nothing was found."""
        text = self._key_block(stream, text)
        if COMMAND_PREFIX in text:
            text = self._mask_command(text)
        if self._literal_rx is not None:
            text = self._literal_rx.sub(self._literal_repl, text) if self._literal_rx.search(
                text) else text
        aws = self.counts[AWS]
        for kind, anchors, rx in _TOKENS:
            if any(map(text.__contains__, anchors)) and rx.search(text):
                text = rx.sub(partial(self._token_repl, kind), text)
        if self.counts[AWS] > aws:
            text = _AWS_SECRET.sub(self._aws_repl, text)
        return self._regexes_in(text)

    def _regexes_in(self, text: str) -> str:
        """``text`` with the configured regular expressions' matches replaced."""
        for kind, rx in self._regexes:
            if rx.search(text):
                text, n = rx.subn(REDACTED, text)
                self.counts[kind] += n
        return text

    def _count(self, kind: str) -> str:
        self.counts[kind] += 1
        return REDACTED

    def _literal_repl(self, m: re.Match[str]) -> str:
        return self._count(self._literals[m.group()])

    def _aws_repl(self, m: re.Match[str]) -> str:
        return self._count(AWS)

    def _token_repl(self, kind: str, m: re.Match[str]) -> str:
        if "v" not in m.re.groupindex:
            return self._count(kind)
        if m.group("v") == REDACTED:
            return m.group(0)  # already redacted (an environment value, a mask)
        base = m.start()
        start, end = m.span("v")
        whole = m.group(0)
        return whole[:start - base] + self._count(kind) + whole[end - base:]

    def _key_block(self, stream: str, text: str) -> str:
        """A private key block's lines: the body replaced, BEGIN and END kept."""
        inside = self._in_key.get(stream, 0)
        if inside:
            end = _KEY_END.search(text)
            if end:
                self._in_key[stream] = 0
                body = text[:end.start()]
                return (REDACTED if body.strip() else body) + text[end.start():]
            self._in_key[stream] = inside + 1 if inside < KEY_MAX_LINES else 0
            return REDACTED
        begin = _KEY_BEGIN.search(text)
        if begin is None:
            return text
        self.counts[PRIVATE_KEY] += 1
        head, rest = text[:begin.end()], text[begin.end():]
        end = _KEY_END.search(rest)
        if end:  # the whole block on one line (a repr with \n escapes)
            return head + REDACTED + rest[end.start():]
        if stream:  # the lines that follow are the block's (a start record field has none)
            self._in_key[stream] = 1
        return head + (REDACTED if rest.strip() else "")

    def _mask_command(self, text: str) -> str:
        """A ``/LOGCOMMAND`` naming a value to mask: the value is masked from here on, and
        replaced in the command line itself (even in a command malformed otherwise)."""
        if not text.lstrip().startswith(COMMAND_PREFIX):
            return text
        found = _MASK_VALUE.search(text)
        if found is None:
            return text
        raw = found.group("v")
        try:
            value = json.loads(f'"{raw}"')
        except ValueError:
            value = raw
        if value == REDACTED or len(value) < MIN_MASK:
            return text
        self.add_mask(value)
        if raw != value:
            self._literals[raw] = MASK
            self._build()
        self.counts[MASK] += 1
        return text[:found.start("v")] + REDACTED + text[found.end("v"):]


def _lines_found(found: list[tuple[int, int, int]], lines: list[Rendered]) -> list[int]:
    """The indexes, ascending, of the ``lines`` (their texts joined by newlines) that the
    matches ``found`` (pattern, start, end) overlap: every line with a candidate. A match
    that spans lines (a masked value with a newline in it) hides a match that starts inside
    it, so each line it touches counts."""
    if not found:
        return []
    starts = list(accumulate((len(line.text) + 1 for line in lines[:-1]), initial=0))
    out: set[int] = set()
    for _, start, end in found:
        out.update(range(bisect_right(starts, start) - 1, bisect_right(starts, end - 1)))
    return sorted(out)


# An option that takes a secret as the next argument: --password X, -token X, --api-key X.
_OPTION_NAME = re.compile(rf"--?[A-Za-z0-9_-]*(?i:{_ASSIGNED})")



def _with_text(line: Rendered, text: str) -> Rendered:
    """``line`` with its text redacted; its style kept where the text is unchanged (a masked
    part has none), so a style's offsets never reach past or into what was replaced."""
    if not line.style:
        return line._replace(text=text)
    return line._replace(text=text, style=remap(line.style, line.text, text))
