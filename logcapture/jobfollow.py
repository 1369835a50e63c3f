"""``logcapture logs -f JOB`` of a job with ``srun`` steps: the batch script's lines and every
task run's (``jobref.tasks``), read as they are written, wherever each is read from, shown as
``logs JOB`` shows them once the job has ended (``rankview``: merged by read time, labelled
``N: ``, the same line of several ranks folded), until the job has ended.

Where each run is read from:

- **This machine's spool** (the node that runs the job, or the batch node of a job that spans
  several): every ``SPOOL_POLL`` (0.25 s, as the follow of one run) each run's new records
  are read (``runs.SpoolFollow``: a run whose writer is gone is closed as that follow closes
  it) and turned into log entries (``logview.LogView``, one per run). Every ``DISCOVER``
  (1 s) the spool is looked at for task runs that appeared since (a new ``srun`` step's
  tasks): only the Start record of a run directory not seen before is read.
- **The store, or the read service** (a run of another node, shipped there; a login node):
  every ``STORE_POLL`` (1 s) each such run's log entries after the last one read
  (``Reader.log``: the question the job page follows a run with, answered alike by the
  store and the read service), and every ``DISCOVER_STORED`` (2 s) the store's runs of the
  job (``LocalReader.stored_runs``) for new task runs. Such a run has ended once its end
  record is in and a read ``FOLLOW_SETTLE`` (3 s) later finds nothing new (the shipper may
  insert a batch's lines after its end record). An embedded store is let go after each
  round of reads, so the shipper can write. The store is asked when the job's batch run is
  not in this spool, or when the job's node list is not this one node (its tasks on other
  nodes are only there); a run that is in this spool is read from it.

Each ``srun`` step's section (``rankview.StepMarks``; not with ``--rank``/``--node``) is put
where ``logs JOB`` puts it, right after the step's last entry: an entry that comes after a
step's latest one (the batch script's next line, another step's first line) waits until the
step prints again or every task run of it has ended and a look for new task runs came after
(when the store is asked, a look of the store ``HOLD_STORED`` after the end: a task run of
another node reaches it within that). A step that is quiet for a while holds the batch
script's lines that long.

An entry is shown once no entry of an earlier time can still come: ``HOLD`` seconds after its
time (the spool writer flushes within ``FLUSH_INTERVAL``), ``HOLD_STORED`` (6 s) when the
store is asked (a line reaches it within the spool's flush and the shipper's batch interval),
and after the last look for new task runs; a line that several ranks may print is held for
the folding window (``rankview.Folder``). New lines therefore show a few seconds after they
were printed, in the order ``logs JOB`` prints them. At most ``MAX_HELD`` entries wait (a
flood is shown a little out of that order rather than held without bound). It returns once
every run it follows has ended (its end record read, or the one that
``spool.abandoned.close_abandoned`` writes for a run whose writer is gone) and one more look
found no new task run. A job whose runs have all ended and whose batch run is not in this
spool is printed as ``logs JOB`` prints it.

Labels (``N: ``) are shown once the follow has seen the tasks of more than one rank (as
``logs JOB``: a job of one task is shown as it printed). Lines are numbered as ``logs JOB``
numbers them (``rankview.numbered``) when both streams are followed; a line's number counts
both streams, so a follow of one stream numbers none (``logs JOB --stream S -n`` does, from
the log of both).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from . import jobref
from .config.defaults import FLUSH_INTERVAL
from .errors import NotFound
from .logview import Entry, LogView, cursor_of, entry_from_json, is_mode_change
from .query.interface import LOG_PAGE_MAX
from .query.store_reader import FOLLOW_SETTLE
from .rankview import (
    Folder,
    RankEntry,
    StepMarks,
    job_runs,
    numbered,
    read_job,
    several_ranks,
    step_of,
    tagged,
    text_lines,
)
from .records import OUTPUT_STREAMS, STDERR, STDOUT, End
from .runs import ABANDON_CHECK, SPOOL_POLL, SpoolFollow, job_candidates
from .spool.layout import find_run_dirs

DISCOVER = 1.0  # seconds between looks for new task runs in the spool
DISCOVER_STORED = 2.0  # seconds between looks for new task runs in the store
STORE_POLL = 1.0  # seconds between reads of a run from the store (an embedded one: opened)
HOLD = FLUSH_INTERVAL + 1.0  # seconds an entry waits for earlier ones of other runs
HOLD_STORED = 6.0  # the same when the store is asked
MAX_HELD = 100_000  # entries waiting to be shown, at most
FIRST = cursor_of(0.0, "", 0)  # before every entry of a run


class _SpoolTail:
    """A run's new entries from this machine's spool."""

    def __init__(self, run_dir: Path, streams: tuple[str, ...], check: float) -> None:
        self.follow = SpoolFollow(run_dir, check)
        self.view = LogView(streams=streams)
        self.end: tuple[float | None, float | None] | None = None  # End's duration, time

    @property
    def ended(self) -> bool:
        return self.follow.ended

    def read(self) -> list[Entry]:
        records = self.follow.read()
        for rec in records:
            if isinstance(rec, End):
                self.end = (rec.duration, rec.ts)
        return self.view.feed(records)


class _StoredTail:
    """A run's new entries from the store or the read service: the pages of its log after
    the last entry read (``Reader.log``), read at most every ``poll`` seconds."""

    def __init__(self, reader: Any, run: str, streams: tuple[str, ...], poll: float,
                 settle: float) -> None:
        self.reader, self.run, self.streams = reader, run, streams
        self.poll, self.settle = poll, settle
        self.cursor = FIRST
        self.ended = False
        self.end: tuple[float | None, float | None] | None = None  # its duration, end time
        self._next = 0.0  # monotonic time of the next read
        self._end_seen: float | None = None

    def read(self) -> list[Entry]:
        now = time.monotonic()
        if self.ended or now < self._next:
            return []
        self._next = now + self.poll
        out: list[Entry] = []
        new = False
        while True:
            # stdout alone or both streams, the run's notes always (as the page asks); a
            # stream not shown is left out here, save a mode change: the log shows its
            # stdout copy, which stands for stderr's when stderr is followed alone
            page = self.reader.log(self.run, stderr=STDERR in self.streams, after=self.cursor,
                                   limit=LOG_PAGE_MAX)
            if page["entries"]:
                new, self.cursor = True, str(page["entries"][-1]["cursor"])
            out += [e for e in map(entry_from_json, page["entries"])
                    if e.stream in self.streams or e.stream not in OUTPUT_STREAMS
                    or (STDOUT not in self.streams and is_mode_change(e))]
            if not page["more"]:
                break
        if page["ended"]:
            if self._end_seen is None:
                self._end_seen = now
            elif not new and now - self._end_seen >= self.settle:
                self.ended = True
                info = self.reader.summary(self.run)
                self.end = (info.get("duration"), info.get("end"))
        return out


class _Run:
    """One followed run: its summary (``jobref`` columns) and where its entries come from."""

    def __init__(self, i: int, summary: Mapping[str, Any], tail: _SpoolTail | _StoredTail,
                 shown: bool) -> None:
        self.i = i
        self.summary = summary
        self.tail = tail
        self.shown = shown  # the batch run is followed for its end even when not shown
        self.count = 0  # entries read so far
        self.told_end = False  # its end told to the steps' marks


class JobFollow:
    """The follow of one job (the module docstring). ``batch_dir``: the batch run's spool
    directory, None when it is read from the store. ``lines()`` gives what ``logs -f``
    prints; ``entries()`` the merged, folded entries; ``several``: labels are shown (more
    than one rank seen)."""

    def __init__(self, reader: Any, ref: str, batch: str, batch_dir: Path | None,
                 streams: tuple[str, ...], ranks: tuple[str, ...] = (),
                 nodes: tuple[str, ...] = (), poll: float = SPOOL_POLL,
                 discover: float = DISCOVER, hold: float = HOLD,
                 check: float = ABANDON_CHECK, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 store_poll: float = STORE_POLL, discover_stored: float = DISCOVER_STORED,
                 hold_stored: float = HOLD_STORED, settle: float = FOLLOW_SETTLE) -> None:
        self.reader, self.ref, self.streams = reader, ref, streams
        self.wanted = jobref.parse_ranks(ranks) if ranks else None
        self.on = set(nodes) if nodes else None
        self.poll, self.discover, self.check = poll, discover, check
        self.store_poll, self.discover_stored, self.settle = store_poll, discover_stored, settle
        self.clock, self.sleep = clock, sleep
        self._seen: dict[str, dict[str, Any] | None] = {}  # run dir -> its light summary
        self._stored: dict[str, dict[str, Any]] = {}  # run -> its summary from the store
        self._runs: dict[str, _Run] = {}
        self._ranks: set[int] = set()
        shown = not (ranks or nodes)
        # The steps' sections (rankview.StepMarks), in the whole job's log only; a step's
        # task runs all ended at this wall time (it is complete once a look came after).
        self.marks = None if not shown else StepMarks()
        self._ended_at: dict[str, float] = {}
        if batch_dir is not None:
            start = next(iter(job_candidates([batch_dir], ref)), {"run": batch})
            summary: Mapping[str, Any] = {**start, **jobref.job_fields(start)}
            if summary["rank"] is None:  # (a job without a batch run, an interactive
                # step's, resolves to one of its tasks: _look follows it as a task)
                self._add(summary, _SpoolTail(batch_dir, streams, check), shown)
        else:
            summary = {**reader.summary(batch), "rank": None}
            self._add(summary, self._stored_tail(batch), shown)
        self.stored = False  # whether the store is asked (the module docstring)
        if hasattr(reader, "stored_runs") and (batch_dir is None or not _one_node(summary)):
            found = reader.stored_runs(ref)
            self.stored = found is not None
            self._stored = {str(d["run"]): d for d in found or ()}
        self.hold = hold_stored if self.stored else hold

    @property
    def several(self) -> bool:
        return len(self._ranks) > 1

    def _stored_tail(self, run: str) -> _StoredTail:
        return _StoredTail(self.reader, run, self.streams, self.store_poll, self.settle)

    def _add(self, summary: Mapping[str, Any], tail: _SpoolTail | _StoredTail,
             shown: bool = True) -> None:
        run = str(summary["run"])
        self._runs[run] = _Run(len(self._runs), summary, tail, shown)
        if summary.get("rank") is not None:
            self._ranks.add(int(summary["rank"]))
        if self.marks is not None and shown:
            self.marks.add_run(summary)

    def _look(self, stored: bool) -> bool:
        """Follows the task runs of the job that appeared since the last look (in the
        store too when ``stored``); True when there were any."""
        dirs = {d.name: d for d in find_run_dirs(self.reader.root)}
        new = []
        for name, d in dirs.items():
            if name not in self._seen:
                if self.reader.owns(d):  # another user's run is not even opened
                    new.append(d)
                else:
                    self._seen[name] = None
        for cand in job_candidates(new, self.ref):
            if cand.get("start") is not None:  # else looked at again next time
                self._seen[str(cand["run"])] = cand
        if stored:
            for d in self.reader.stored_runs(self.ref) or ():
                self._stored[str(d["run"])] = d
        known = {**self._stored, **{k: v for k, v in self._seen.items() if v is not None}}
        try:
            tasks = jobref.tasks(self.ref, list(known.values()), self.wanted, self.on)
        except NotFound:
            tasks = []  # none of the job's runs is readable yet
        found = False
        for task in tasks:
            run = str(task["run"])
            if run in self._runs:
                continue
            if run in dirs:  # in this spool: read from it
                if self._seen.get(run) is None:
                    continue  # another user's, or its Start record not yet read
                self._add(task, _SpoolTail(dirs[run], self.streams, self.check))
            else:
                self._add(task, self._stored_tail(run))
            found = True
        return found

    def entries(self) -> Iterator[RankEntry]:
        """The merged, folded entries as they come, numbered when both streams are shown
        (the module docstring)."""
        if set(self.streams) >= set(OUTPUT_STREAMS):
            return numbered(self._merged())
        return (i._replace(entry=i.entry._replace(line=0)) if i.entry.line else i
                for i in self._merged())

    def _merged(self) -> Iterator[RankEntry]:
        held: list[tuple[float, int, int, int, RankEntry]] = []
        folder = Folder()
        looked = float("-inf")  # wall time of the last look for new task runs
        every = float("-inf")  # the same of the last look everywhere they may be
        next_look = next_stored = 0.0
        release = getattr(self.reader, "release_store", None)
        while True:
            now = time.monotonic()
            if now >= next_look:
                stored = self.stored and now >= next_stored
                looked = self.clock()
                self._look(stored)
                if stored or not self.stored:
                    every = looked
                self._complete(every)
                next_look = now + self.discover
                if stored:
                    next_stored = now + self.discover_stored
            self._read(held)
            ended = bool(self._runs) and all(r.tail.ended for r in self._runs.values())
            if ended and self._look(self.stored):
                continue  # a task run that appeared at the end: read it too
            if release is not None and self.stored:
                release()  # the embedded store: the shipper's turn
            until = float("inf") if ended else min(self.clock(), looked) - self.hold
            yield from self._shown(held, folder, ended, until)
            if ended:
                return
            self.sleep(self.poll)

    def _read(self, held: list[tuple[float, int, int, int, RankEntry]]) -> None:
        """Each followed run's new entries, into ``held`` in merge order."""
        for r in list(self._runs.values()):
            got = r.tail.read()
            if r.shown and got:
                for t in tagged(r.i, r.summary, got, r.count):
                    heapq.heappush(held, t)
            r.count += len(got)
            self._told(r, len(got))

    def _shown(self, held: list[tuple[float, int, int, int, RankEntry]], folder: Folder,
               ended: bool, until: float) -> Iterator[RankEntry]:
        """The held entries that no earlier one can precede any more (time ``until``), with
        the steps' marks and folded."""
        marks = self.marks
        if ended and marks is not None:  # every step too: nothing more can come
            for step in marks.steps():
                marks.set_complete(step)
        while held and (held[0][0] <= until or len(held) > MAX_HELD):
            if marks is None:
                yield from folder.push(heapq.heappop(held)[-1])
                continue
            if not (ended or marks.ready(held[0][-1]) or len(held) > MAX_HELD):
                break  # wait for its steps' next entries or ends
            for item in marks.push(heapq.heappop(held)[-1]):
                yield from folder.push(item)
        for item in marks.settle() if marks is not None else ():
            yield from folder.push(item)
        yield from folder.release(None if ended else until)

    def _told(self, r: _Run, entries: int) -> None:
        """Tells the steps' marks of a followed run's new entries and of its end."""
        step = step_of(r.summary)
        if self.marks is None or not r.shown or step is None:
            return
        self.marks.add_entries(step, entries)
        if r.tail.end is not None and not r.told_end:
            r.told_end = True
            self.marks.run_ended(r.summary, *r.tail.end)
            if self.marks.all_ended(step):
                self._ended_at[step] = self.clock()

    def _complete(self, looked: float) -> None:
        """The steps whose task runs all ended before the look at ``looked`` (everywhere:
        ``HOLD_STORED`` before a look of the store): complete (a task run of theirs that was
        not known then would have been found)."""
        if self.marks is None:
            return
        wait = self.hold if self.stored else 0.0
        for step in self.marks.steps():
            if self.marks.all_ended(step) and self._ended_at.get(step, looked) + wait < looked:
                self.marks.set_complete(step)

    def lines(self, text: Any = None, numbers: bool = False) -> Iterator[str]:
        """``text``: what an entry prints as (``rankview.label``); ``numbers``: after its
        number (``logs -n``)."""
        return text_lines(self.entries(), lambda: self.several, text, numbers)


def _one_node(batch: Mapping[str, Any]) -> bool:
    """Whether the job of the batch run ``batch`` (``jobref`` columns) has one node: its node
    list is the node its batch script ran on."""
    node = str((batch.get("slurm") or {}).get("node") or batch.get("host") or "")
    return bool(node) and str(batch.get("nodes") or "") == node


def follow_lines(reader: Any, ref: str | None, batch: str, streams: tuple[str, ...],
                 ranks: tuple[str, ...] = (), nodes: tuple[str, ...] = (), text: Any = None,
                 numbers: bool = False) -> Iterator[str] | None:
    """What ``logs -f REF`` prints when REF is a job (its batch run: ``batch``): the job
    followed, from this spool and from the store (``JobFollow``), or, when every run of it
    has ended and its batch run is not in this spool, its log as ``logs`` prints it. None
    when REF is no job (the caller follows ``batch`` alone). ``text``: what an entry prints
    as (``rankview.label``); ``numbers``: each line after its number in the job's log."""
    if ref is None or jobref.parse(ref) is None:
        if ranks or nodes:
            job_runs(reader, ref, ranks, nodes)  # the UsageError for a filter of no job
        return None
    batch_dir = reader.spool_dir(batch) if hasattr(reader, "spool_dir") else None
    if batch_dir is None:
        runs = job_runs(reader, ref, ranks, nodes)
        if runs is not None and all(r.get("state") not in ("RUNNING", "EMPTY") for r in runs):
            return text_lines(read_job(reader, runs, streams), several_ranks(runs), text,
                              numbers)
    return JobFollow(reader, ref, batch, batch_dir, streams, ranks, nodes).lines(text, numbers)
