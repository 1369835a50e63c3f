"""The bound on what one run stores, between the classifier and the spool.

A runaway job (a loop printing for days) must not fill the spool and the store. Past
``job_output_limit`` characters of stored output text, lines are no longer stored as they
come; the run's last ``job_output_tail`` lines are kept and stored at its end, because that is
where the error that ended it is (GitLab's runner keeps only the head of a job log past its
``output_limit``, and its users ask for the end: gitlab-org/gitlab-runner#4339). Metadata rows
have their own bound (``job_metadata_limit``). Nothing here slows or fails the job: what is
not stored is counted, and the caller puts a note at the cut and another where the tail
begins.

``OutputLimit.feed(records)`` returns the records to store now; ``tail()`` the ones kept for
the end; ``counts()`` what was left out.
"""

from __future__ import annotations

from collections import deque

from .records import RUN, Line, Lines, Metadata, Record

TYPE_CHECKING = False  # not typing's: every job imports this (records.py says why)
if TYPE_CHECKING:
    from collections.abc import Iterable

# Defaults (admin config): generous, so that only a runaway job meets them.
JOB_OUTPUT_LIMIT = 2 * 1024 ** 3  # characters of output text stored per run
JOB_OUTPUT_TAIL = 1000  # lines kept at the end of a run past the limit
JOB_METADATA_LIMIT = 1_000_000  # metadata rows stored per run


def _split(rec: Lines, k: int) -> tuple[Lines, Lines]:
    """A ``Lines`` record as its first ``k`` lines and the rest (``0 < k < len``), each with
    its lines' read times (``spans``: ``(ts, count)`` runs)."""
    if not rec.spans:
        head_spans: tuple[tuple[float, int], ...] = ()
        rest_spans: tuple[tuple[float, int], ...] = ()
        rest_ts = rec.ts
    else:
        head, rest, seen = [], [], 0
        for ts, n in rec.spans:
            if seen + n <= k:
                head.append((ts, n))
            elif seen >= k:
                rest.append((ts, n))
            else:
                head.append((ts, k - seen))
                rest.append((ts, seen + n - k))
            seen += n
        head_spans, rest_spans, rest_ts = tuple(head), tuple(rest), rest[0][0]
    styles = rec.styles
    return (rec._replace(texts=rec.texts[:k], spans=head_spans, styles=styles[:k]),
            rec._replace(seq=rec.seq + k, ts=rest_ts, texts=rec.texts[k:], spans=rest_spans,
                         styles=styles[k:]))


def _lines(rec: Record) -> tuple[int, int]:
    """Output lines and characters of text a record holds (0, 0 for a note)."""
    if isinstance(rec, Lines):
        return len(rec.texts), sum(map(len, rec.texts))
    if isinstance(rec, Line):
        return 1, len(rec.text)
    return 0, 0


class OutputLimit:
    """Counts what a run stores and holds back what is past the bounds."""

    def __init__(self, limit: int = JOB_OUTPUT_LIMIT, tail: int = JOB_OUTPUT_TAIL,
                 metadata_limit: int = JOB_METADATA_LIMIT):
        self.limit = limit
        self.tail_lines = max(0, tail)
        self.metadata_limit = metadata_limit
        self.chars = 0  # output text stored, or held for the tail
        self.metadata = 0
        self.over = False  # the output limit was reached
        self.cut_ts = 0.0  # the read time of the first line not stored as it came
        self.lines_left_out = 0
        self.chars_left_out = 0
        self.metadata_left_out = 0
        self._tail: deque[tuple[Record, int, int]] = deque()  # record, lines, characters
        self._tail_total = 0

    def feed(self, records: Iterable[Record]) -> list[Record]:
        """The records to store now; the rest is held for the tail or left out."""
        out: list[Record] = []
        for rec in records:
            if isinstance(rec, Metadata):
                self.metadata += 1
                if self.metadata > self.metadata_limit:
                    self.metadata_left_out += 1
                    continue
                out.append(rec)
                continue
            if self.over and rec.stream != RUN and rec.kind in ("line", "lines", "note"):
                self._hold(rec)
                continue
            n, chars = _lines(rec)
            if n and self.chars + chars > self.limit:
                self.over = True
                if isinstance(rec, Lines):  # the lines of the batch that still fit
                    room, k = self.limit - self.chars, 0
                    while k < n and len(rec.texts[k]) <= room:
                        room -= len(rec.texts[k])
                        k += 1
                    if k:
                        head, rec = _split(rec, k)
                        self.chars += self.limit - self.chars - room
                        out.append(head)
                self.cut_ts = rec.ts
                self._hold(rec)
                continue
            self.chars += chars
            out.append(rec)
        return out

    def _hold(self, rec: Record) -> None:
        n, chars = _lines(rec)
        self._tail.append((rec, n, chars))
        self._tail_total += n
        # Whole records leave the tail, oldest first, while the rest still holds tail_lines:
        # a batch is kept whole, so the tail holds at least tail_lines (at most one batch more).
        while self._tail and self._tail_total - self._tail[0][1] >= self.tail_lines:
            _, n0, c0 = self._tail.popleft()
            self._tail_total -= n0
            self.lines_left_out += n0
            self.chars_left_out += c0
        if self.tail_lines == 0 and self._tail:
            _, n0, c0 = self._tail.popleft()
            self._tail_total -= n0
            self.lines_left_out += n0
            self.chars_left_out += c0

    def tail(self) -> list[Record]:
        """The records held for the run's end, in order (emptied)."""
        out = [rec for rec, _, _ in self._tail]
        self._tail.clear()
        self._tail_total = 0
        return out

    def counts(self) -> dict[str, int]:
        """For the end record's ``counts["limit"]``."""
        return {"lines_left_out": self.lines_left_out, "chars_left_out": self.chars_left_out,
                "metadata_left_out": self.metadata_left_out}
