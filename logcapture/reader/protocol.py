"""The read service's request protocol, shared by the server and its client.

One connection, one question. The client sends ONE request: a JSON object on one line (UTF-8,
at most ``MAX_REQUEST_BYTES`` with its newline). The service answers with JSON lines (NDJSON):

- ``{"items": [X, ...]}`` zero or more times: run summaries, records, export rows, in
  order, a batch per line (one ``json.loads`` per batch instead of per record: a 10,000-line
  log decodes in a quarter of the time);
- ``{"value": X}`` once, for a question with one answer (``resolve``, ``describe``,
  ``whoami``);
- ``{"beat": true}`` now and then while a ``follow`` waits for new lines (so that a client
  that went away is noticed); clients ignore it;
- last, ``{"end": true, "count": N}``, or ``{"error": MESSAGE, "kind": KIND}`` where KIND is
  ``NotFound``, ``UsageError`` (a bad request), ``Busy`` (too many clients: in all, of this
  user, or of this user following runs; the message names the limit), ``TooLarge``
  (the answer passed the service's size limit) or another error class's name.

Requests (``op`` and its arguments; any other key is refused, and so is a request that names
a user: the service takes the caller's identity from the kernel, never from the request):

=============  =============================================  ==================================
op             arguments                                      answer
=============  =============================================  ==================================
``whoami``                                                    value: user, uid, admin
``runs``                                                      items: run summaries, newest first
``resolve``    ``ref`` (run id, job id, ``latest`` or null)    value: a run id
``summary``    ``run``                                        value: the run's summary
``lines``      ``run``, ``stream`` (null: all), ``tail``       items: records
``follow``     ``run``; to resume a follow that was cut off:    items: records until the end record
               ``next`` (stream -> the next seq not read),
               ``started`` (the Start record was read)
``log``        ``run``, ``stderr``, ``before``, ``after``,    value: a page of the log
               ``limit``, ``line``                            (``query.Reader.log``)
``describe``   ``run``                                        value: the ``show`` mapping
``metadata``   ``run``                                        items: metadata records, newest first
``samples``    ``run``                                        items: sample records, oldest first
``export``     ``run``, ``what`` (lines, metadata, samples,   items: export rows
               progress)
``search``     ``request`` (``search.Request`` as an object)  value: the search's answer
                                                              (``search.answer``)
=============  =============================================  ==================================
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import UsageError
from ..records import OUTPUT_STREAMS
from ..search import Request as SearchRequest
from ..store import EXPORTS

VERSION = 1
MAX_REQUEST_BYTES = 64 * 1024
MAX_REF_CHARS = 256  # a run id is at most 128 (spool.check_run_id); a job ref far less
MAX_TAIL = 10_000_000
BATCH = 2_000  # items per answer line
STREAM_NAME = re.compile(r"[A-Za-z0-9:._-]{1,128}")  # stdout, run, sample:NODE

# op -> (required arguments, optional arguments)
OPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "whoami": ((), ()),
    "runs": ((), ()),
    "resolve": ((), ("ref",)),
    "summary": (("run",), ()),
    "lines": (("run",), ("stream", "tail")),
    "follow": (("run",), ("next", "started")),
    "log": (("run",), ("stderr", "before", "after", "limit", "line")),
    "describe": (("run",), ()),
    "metadata": (("run",), ()),
    "samples": (("run",), ()),
    "export": (("run", "what"), ()),
    "search": (("request",), ()),
}
IDENTITY_KEYS = frozenset({"uid", "user", "owner", "gid", "pid", "admin", "as", "identity"})


class Request(NamedTuple):
    op: str
    args: dict[str, Any]


def encode(obj: dict[str, Any]) -> bytes:
    """One protocol line. ``ensure_ascii``: a text of the job that is not valid UTF-8 (kept
    as surrogates by the spool's reader) still travels."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def request_line(op: str, **args: Any) -> bytes:
    return encode({"v": VERSION, "op": op, **{k: v for k, v in args.items() if v is not None}})


def _text(name: str, value: Any, nullable: bool) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not value:
        raise UsageError(f"request key {name!r} must be a non-empty string")
    if len(value) > MAX_REF_CHARS:
        raise UsageError(f"request key {name!r} is longer than {MAX_REF_CHARS} characters")
    if any(ord(c) < 32 for c in value):
        raise UsageError(f"request key {name!r} holds a control character")
    return value


def _stream(value: Any) -> str | None:
    if value is not None and value not in OUTPUT_STREAMS:
        raise UsageError(f"request key 'stream' must be one of {', '.join(OUTPUT_STREAMS)} "
                         "or null")
    return value


def _count(name: str, nullable: bool) -> Callable[[Any], int | None]:
    def check(value: Any) -> int | None:
        if value is None and nullable:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_TAIL:
            raise UsageError(f"request key {name!r} must be a whole number from 1 to "
                             f"{MAX_TAIL}")
        return value
    return check


def _flag(name: str) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise UsageError(f"request key {name!r} must be true or false")
        return value
    return check


def _nexts(value: Any) -> dict[str, int]:
    """Where a follow resumes: each stream's next seq not read yet (a record's ``stream``:
    stdout, stderr, run, a node's samples)."""
    if not isinstance(value, dict) or len(value) > 64 or any(
            not isinstance(k, str) or not STREAM_NAME.fullmatch(k) for k in value) or any(
            not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**63
            for v in value.values()):
        raise UsageError("request key 'next' must map stream names to record numbers")
    return dict(value)


def _line(value: Any) -> int:
    """A line number (``query.Reader.log``): a run may have more lines than ``MAX_TAIL``."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**63:
        raise UsageError("request key 'line' must be a line number (1, 2, ...)")
    return value


def _what(value: Any) -> str:
    if value not in EXPORTS:
        raise UsageError(f"request key 'what' must be one of {', '.join(EXPORTS)}")
    return value


# Each key a request may hold, and its check (which returns the value the readers get).
_CHECKS: dict[str, Callable[[Any], Any]] = {
    "run": lambda v: _text("run", v, nullable=False),
    "ref": lambda v: _text("ref", v, nullable=True),
    "stream": _stream,
    "tail": _count("tail", nullable=True),
    "before": lambda v: _text("before", v, nullable=True),
    "after": lambda v: _text("after", v, nullable=True),
    "stderr": _flag("stderr"),
    "started": _flag("started"),
    "next": _nexts,
    "limit": _count("limit", nullable=False),
    "line": _line,
    "what": _what,
    # a search's keys and types are checked as the CLI's are; it names no owner
    "request": lambda v: SearchRequest.from_dict(v).to_dict(),
}


def parse_request(line: bytes) -> Request:
    """The request on one line, checked; UsageError names what is wrong."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise UsageError("the request is not a JSON object on one line") from None
    if not isinstance(obj, dict):
        raise UsageError("the request is not a JSON object on one line")
    version = obj.pop("v", VERSION)
    if version != VERSION:
        raise UsageError(f"protocol version {version!r} is not served (this service: "
                         f"{VERSION})")
    op = obj.pop("op", None)
    if not isinstance(op, str) or op not in OPS:
        raise UsageError(f"unknown op {op!r}: one of {', '.join(OPS)}")
    forged = sorted(IDENTITY_KEYS & set(obj))
    if forged:
        raise UsageError(f"request key {forged[0]!r} refused: the service takes your "
                         "identity from the operating system, not from the request")
    required, optional = OPS[op]
    unknown = sorted(set(obj) - set(required) - set(optional))
    if unknown:
        raise UsageError(f"unknown request key {unknown[0]!r} for op {op!r}")
    missing = [key for key in required if key not in obj]
    if missing:
        raise UsageError(f"op {op!r} needs the key {missing[0]!r}")
    return Request(op, {key: _CHECKS[key](obj[key]) for key in _CHECKS if key in obj})
