"""What a shipping did: records, bytes, runs, and what went wrong, for the caller to report."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class UploadResult:
    """What an upload did. ``exit_code``: 0 everything selected shipped, 1 partial (bad lines
    skipped, segments set aside, some runs failed), 2 failure (nothing could be shipped:
    store unreachable past the deadline, authentication refused, no such run, already
    shipped without --force)."""

    exit_code: int = 0
    runs: list[str] = field(default_factory=list)  # runs that shipped completely
    skipped: list[str] = field(default_factory=list)  # already shipped (--all)
    failed: list[str] = field(default_factory=list)
    records: int = 0  # spool lines shipped
    bytes: int = 0
    bad_lines: list[tuple[str, str, int, str]] = field(default_factory=list)  # run, seg, no, why
    torn: int = 0
    set_aside: list[tuple[str, str, str]] = field(default_factory=list)  # run, segment, why
    deleted: int = 0  # segments deleted after shipping
    insights: int = 0  # insights stored for runs that finished shipping
    warnings: list[str] = field(default_factory=list)
    error: str = ""
    elapsed: float = 0.0

    @property
    def success(self) -> bool:
        return self.exit_code == 0

    def summary(self) -> str:
        parts = [f"shipped {self.records} records ({self.bytes / 1e6:.1f} MB) of "
                 f"{len(self.runs)} run(s) in {self.elapsed:.1f}s"]
        if self.skipped:
            parts.append(f"{len(self.skipped)} already shipped")
        if self.bad_lines:
            parts.append(f"{len(self.bad_lines)} corrupt line(s) skipped")
        if self.torn:
            parts.append(f"{self.torn} torn line(s) skipped")
        if self.set_aside:
            parts.append(f"{len(self.set_aside)} segment(s) set aside")
        return "; ".join(parts)
