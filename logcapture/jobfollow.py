"""``logcapture logs -f JOB`` of a job with ``srun`` steps: the batch script's lines and every
task run's (``jobref.tasks``), read from the spool as they are written, shown as ``logs JOB``
shows them once the job has ended (``rankview``: merged by read time, labelled ``N: ``, the
same line of several ranks folded), until the job has ended.

How it reads, on the node that runs the job (its spool):

- Every ``SPOOL_POLL`` (0.25 s, as the follow of one run) each followed run's new records are
  read (``runs.SpoolFollow``: a run whose writer is gone is closed as that follow closes it)
  and turned into log entries (``logview.LogView``, one per run).
- Every ``DISCOVER`` (1 s) the spool is looked at for task runs that appeared since (a new
  ``srun`` step's tasks): only the Start record of a run directory not seen before is read.
- An entry is shown once no entry of an earlier time can still come: ``HOLD`` seconds after
  its time (the spool writer flushes within ``FLUSH_INTERVAL``) and after the last
  look for new task runs, and a line that several ranks may print is held for the folding
  window (``rankview.Folder``). New lines therefore show a few seconds after they were
  printed, in the order ``logs JOB`` prints them. At most ``MAX_HELD`` entries wait (a
  flood is shown a little out of that order rather than held without bound).
- Each ``srun`` step's section (``rankview.StepMarks``; not with ``--rank``/``--node``) is
  put where ``logs JOB`` puts it, right after the step's last entry: an entry that comes
  after a step's latest one (the batch script's next line, another step's first line) waits
  until the step prints again or every task run of it has its end record and a look for new
  task runs came after. A step that is quiet for a while holds the batch script's lines that
  long.
- It returns once the batch run and every task run it follows have their end record (or the
  end that ``spool.abandoned.close_abandoned`` writes for a run whose writer is gone), and
  one more look found no new task run.

Labels (``N: ``) are shown once the follow has seen the tasks of more than one rank (as
``logs JOB``: a job of one task is shown as it printed). Lines are numbered as ``logs JOB``
numbers them (``rankview.numbered``) when both streams are followed; a line's number counts
both streams, so a follow of one stream numbers none (``logs JOB --stream S -n`` does, from
the log of both). A job whose batch run is not in this
spool (read from the store, or on another node) is followed as one run (``logs -f`` of its
batch run) unless it has ended: then its log is printed as ``logs JOB`` prints it.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from . import jobref
from .config.defaults import FLUSH_INTERVAL
from .errors import NotFound, UsageError
from .logview import LogView
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
from .records import OUTPUT_STREAMS, End
from .runs import ABANDON_CHECK, SPOOL_POLL, SpoolFollow, job_candidates
from .spool.layout import find_run_dirs

DISCOVER = 1.0  # seconds between looks for new task runs
HOLD = FLUSH_INTERVAL + 1.0  # seconds an entry waits for earlier ones of other runs
MAX_HELD = 100_000  # entries waiting to be shown, at most


class _Run:
    """One followed run: its summary (``jobref`` columns), its spool follow, its log view."""

    def __init__(self, i: int, summary: Mapping[str, Any], run_dir: Path,
                 streams: tuple[str, ...], shown: bool, check: float) -> None:
        self.i = i
        self.summary = summary
        self.follow = SpoolFollow(run_dir, check)
        self.view = LogView(streams=streams)
        self.shown = shown  # the batch run is followed for its end even when not shown
        self.count = 0  # entries read so far


class JobFollow:
    """The follow of one job from the spool (the module docstring). ``lines()`` gives what
    ``logs -f`` prints; ``entries()`` the merged, folded entries; ``several``: labels are
    shown (more than one rank seen)."""

    def __init__(self, reader: Any, ref: str, batch: str, batch_dir: Path,
                 streams: tuple[str, ...], ranks: tuple[str, ...] = (),
                 nodes: tuple[str, ...] = (), poll: float = SPOOL_POLL,
                 discover: float = DISCOVER, hold: float = HOLD,
                 check: float = ABANDON_CHECK, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.reader, self.ref, self.streams = reader, ref, streams
        self.wanted = jobref.parse_ranks(ranks) if ranks else None
        self.on = set(nodes) if nodes else None
        self.poll, self.discover, self.hold, self.check = poll, discover, hold, check
        self.clock, self.sleep = clock, sleep
        self._seen: dict[str, dict[str, Any] | None] = {}  # run dir -> its light summary
        self._runs: dict[str, _Run] = {}
        self._ranks: set[int] = set()
        filtered = bool(ranks or nodes)
        # The steps' sections (rankview.StepMarks), in the whole job's log only; a step's
        # task runs all ended at this wall time (it is complete once a look came after).
        self.marks = None if filtered else StepMarks()
        self._ended_at: dict[str, float] = {}
        start = next(iter(job_candidates([batch_dir], ref)), {"run": batch})
        start = {**start, **jobref.job_fields(start)}
        if start["rank"] is None:  # (a job without a batch run, an interactive step's,
            self._add(start, batch_dir, shown=not filtered)  # is its tasks: _look finds them)

    @property
    def several(self) -> bool:
        return len(self._ranks) > 1

    def _add(self, summary: Mapping[str, Any], run_dir: Path, shown: bool = True) -> None:
        run = str(summary["run"])
        self._runs[run] = _Run(len(self._runs), summary, run_dir, self.streams, shown,
                               self.check)
        if summary.get("rank") is not None:
            self._ranks.add(int(summary["rank"]))
        if self.marks is not None and shown:
            self.marks.add_run(summary)

    def _look(self) -> bool:
        """Follows the task runs of the job that appeared since the last look; True when
        there were any."""
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
        known = [s for s in self._seen.values() if s is not None]
        try:
            tasks = jobref.tasks(self.ref, known, self.wanted, self.on)
        except NotFound:
            tasks = []  # none of the job's runs is readable yet
        found = False
        for task in tasks:
            if str(task["run"]) not in self._runs:
                self._add(task, dirs[str(task["run"])])
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
        next_look = 0.0
        while True:
            if time.monotonic() >= next_look:
                looked = self.clock()
                self._look()
                self._complete(looked)
                next_look = time.monotonic() + self.discover
            for r in list(self._runs.values()):
                records = r.follow.read()
                got = r.view.feed(records)
                if r.shown and got:
                    for t in tagged(r.i, r.summary, got, r.count):
                        heapq.heappush(held, t)
                r.count += len(got)
                self._told(r, records, len(got))
            ended = bool(self._runs) and all(r.follow.ended for r in self._runs.values())
            if ended and self._look():
                continue  # a task run that appeared at the end: read it too
            marks = self.marks
            if ended and marks is not None:  # every step too: nothing more can come
                for step in marks.steps():
                    marks.set_complete(step)
            until = float("inf") if ended else min(self.clock(), looked) - self.hold
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
            if ended:
                return
            self.sleep(self.poll)

    def _told(self, r: _Run, records: list[Any], entries: int) -> None:
        """Tells the steps' marks of a followed run's new entries and of its end."""
        step = step_of(r.summary)
        if self.marks is None or not r.shown or step is None:
            return
        self.marks.add_entries(step, entries)
        for rec in records:
            if isinstance(rec, End):
                self.marks.run_ended(r.summary, rec.duration, rec.ts)
                if self.marks.all_ended(step):
                    self._ended_at[step] = self.clock()

    def _complete(self, looked: float) -> None:
        """The steps whose task runs all ended before the look at ``looked``: complete (a
        task run of theirs that was not known then would have been found)."""
        if self.marks is None:
            return
        for step in self.marks.steps():
            if self.marks.all_ended(step) and self._ended_at.get(step, looked) < looked:
                self.marks.set_complete(step)

    def lines(self, text: Any = None, numbers: bool = False) -> Iterator[str]:
        """``text``: what an entry prints as (``rankview.label``); ``numbers``: after its
        number (``logs -n``)."""
        return text_lines(self.entries(), lambda: self.several, text, numbers)


def follow_lines(reader: Any, ref: str | None, batch: str, streams: tuple[str, ...],
                 ranks: tuple[str, ...] = (), nodes: tuple[str, ...] = (), text: Any = None,
                 warn: Callable[[str], None] | None = None, numbers: bool = False
                 ) -> Iterator[str] | None:
    """What ``logs -f REF`` prints when REF is a job (its batch run: ``batch``): the job
    followed from the spool, or, when its batch run is not in the spool and every run of it
    has ended, its log as ``logs`` prints it. None when REF is no job, or a job whose batch
    run is read from elsewhere while it runs: the caller follows ``batch`` alone (``warn``
    is told so when the job has task runs). ``text``: what an entry prints as
    (``rankview.label``); ``numbers``: each line after its number in the job's log."""
    filtered = bool(ranks or nodes)
    if ref is None or jobref.parse(ref) is None:
        if filtered:
            job_runs(reader, ref, ranks, nodes)  # the UsageError for a filter of no job
        return None
    batch_dir = reader.spool_dir(batch) if hasattr(reader, "spool_dir") else None
    if batch_dir is not None:
        return JobFollow(reader, ref, batch, batch_dir, streams, ranks, nodes).lines(
            text, numbers)
    runs = job_runs(reader, ref, ranks, nodes)
    if runs is not None and all(r.get("state") not in ("RUNNING", "EMPTY") for r in runs):
        return text_lines(read_job(reader, runs, streams), several_ranks(runs), text,
                          numbers)
    if filtered:
        raise UsageError(f"--follow with --rank/--node reads the job's tasks from the spool "
                         f"of the node that runs it: run it there, or name a task run "
                         f"(`logcapture ls {ref}` lists them)")
    if runs is not None and warn is not None:
        warn(f"following the batch script's run of job {ref} only: its tasks are followed "
             f"from the spool of the node that runs it (`logcapture logs {ref}` prints them "
             f"all once shipped, `logcapture ls {ref}` lists them)")
    return None

