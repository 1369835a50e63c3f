"""The insight type every part of ``logcapture.insights`` produces."""

from __future__ import annotations

from collections import namedtuple
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

# What an insight is about: why a run ended badly, how well it used what it held, or what is
# happening to it now.
FAILURE = "failure"
EFFICIENCY = "efficiency"
LIVE = "live"


class Evidence(namedtuple("Evidence", ("stream", "seq", "text"))):
    """A log line an insight rests on: its stream and sequence number, and its text (only ever
    a line the spool or store holds: text dropped by a mode was never there)."""

    __slots__ = ()
    if TYPE_CHECKING:
        stream: str
        seq: int
        text: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "seq": self.seq, "text": self.text}


class Insight(namedtuple("Insight", ("kind", "message", "evidence", "hint", "category",
                                     "details"), defaults=((), "", FAILURE, None))):
    """One answer: ``kind`` (``cuda-oom``, ``gpu-idle``, ``stalled``...), a one-line
    ``message``, the ``evidence`` lines, a ``hint`` (what to try next, or ""), its
    ``category`` (FAILURE, EFFICIENCY, LIVE) and ``details`` (figures, by name)."""

    __slots__ = ()
    if TYPE_CHECKING:
        kind: str
        message: str
        evidence: tuple[Evidence, ...]
        hint: str
        category: str
        details: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "category": self.category, "message": self.message,
                "hint": self.hint, "evidence": [e.to_dict() for e in self.evidence],
                "details": dict(self.details or {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Insight:
        evidence = tuple(Evidence(str(e.get("stream", "")), int(e.get("seq", 0)),
                                  e.get("text") if isinstance(e.get("text"), str) else None)
                         for e in d.get("evidence") or () if isinstance(e, dict))
        return cls(str(d.get("kind", "")), str(d.get("message", "")), evidence,
                   str(d.get("hint") or ""), str(d.get("category") or FAILURE),
                   dict(d.get("details") or {}))
