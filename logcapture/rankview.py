"""The log of a job of several ranks, decided once for every reader (``logcapture logs``, the
job page): its task runs' entries merged in time order, labelled with their rank, and the line
that several ranks printed close together shown once.

Each task of a job's ``srun`` steps is a run of its own (``jobref.tasks`` finds them), and each
keeps every line it printed: the merge and the folding are read-time views, nothing stored
changes.

The rules:

- **Merge.** Each run's entries are its own log (``logview.LogView``: a run's metadata twin,
  its notes), in that run's order; the runs' entries are merged by their read time, the batch
  script's first on a tie, then by rank.
- **Label.** When more than one rank is shown, a task's entry is labelled with its rank as
  ``srun --label`` does (``RANK: `` before the text, :func:`label`); the batch script's own
  entries carry no label. One rank alone (``--rank N``) is shown as it printed.
- **Fold.** A line (kind ``line``) that ranks printed with the same text on the same stream,
  each within ``FOLD_WINDOW`` (1 s) of the first rank's, is shown once, at the first rank's
  place, followed by a note naming the ranks (``[logcapture: same line from 64 ranks
  (0-63)]``, :func:`fold_note`). The time is read time: the ranks of one step print a line
  common to all (a banner, a step counter) within milliseconds of each other, and a second is
  long enough to take in a slow node while two different phases of a job rarely print the
  same text within one. A rank that printed something else stays a line of its own; a rank
  that printed the same text twice within the window starts a new group with its second
  line; commands, notes and metadata are never folded; the batch script's lines are not
  folded with the tasks'. Folding is only done when several ranks are shown.
  Lines of different ``srun`` steps are never folded together.
- **Steps.** In the whole job's log (the batch script's with every task's, not the tasks
  chosen by rank or node) each ``srun`` step is a section, as a CI system's fold markers make
  one (docs/rendering.md, "Sections"), bounded by the step's own entries: it opens right
  before the first entry of any of its tasks and closes right after the last one, titled
  ``srun step N (T tasks: COMMAND)`` (:func:`step_title`) and ended with the step's duration
  (its first task's start to its last task's end, by their Start and End records). Whatever
  the batch script printed between the step's first and last entries is inside it. Read
  times decide, not the runs' Start and End records: a task's first line can be read before
  its Start record is written, its End record after the batch script's next line. Steps do
  not nest: a step whose first entry comes while another step is still printing (``srun
  ... &``) gets no section (its lines show, labelled, where they were printed), nor does a
  step that printed nothing; a step still running has no end yet. :class:`StepMarks` is the
  one place of this rule, for ``logs JOB``, the job page and ``logs -f JOB``, which shows
  the same marks at the same places.
- **Number.** Every line and command of the job's log has one number, 1-based, in the order
  this log shows them (:func:`numbered`): the batch script's and every task's lines merged,
  a folded line once (its note has none), both streams counted (``--stream`` shows one with
  the numbers of both, as a run's log does). ``logs JOB -n``, the job page's ``#L123`` and
  its ``joblog`` answer give the same number; ``--rank``/``--node`` show another log (the
  chosen tasks merged), numbered on its own: one rank alone is numbered as its run is.

The folding reads entries in time order and holds only the last ``FOLD_WINDOW`` of them, so a
log of any length is folded in bounded memory.
"""

from __future__ import annotations

import heapq
import re
import shlex
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from .jobref import format_ranks
from .logview import LINE, NUMBERED, SECTION, SECTION_END, Entry, line_prefix, note_text
from .records import NOTE_SECTION, NOTE_SECTION_END, RUN

FOLD_WINDOW = 1.0  # seconds between the first rank's line and another rank's same line
TITLE_COMMAND = 60  # characters of a step's command in its section's title, at most
_SPACES = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")


class RankEntry(NamedTuple):
    """An entry of a job's merged log: the ``logview`` entry, the run it came from, its task's
    rank (None: the batch script's own) and node, and ``ranks``: every rank that printed it
    (more than one when folded, in rank order); ``step``: its task's ``srun`` step (None: the
    batch script's, or a step's section mark's own run-less entry)."""

    entry: Entry
    run: str
    rank: int | None
    node: str
    ranks: tuple[int, ...] = ()
    step: str | None = None

    @property
    def folded(self) -> bool:
        return len(self.ranks) > 1


def fold_note(ranks: Iterable[int]) -> str:
    """The note after a folded line: how many ranks printed it, and which."""
    ranks = sorted(set(ranks))
    return f"[logcapture: same line from {len(ranks)} ranks ({format_ranks(ranks)})]"


def merge(logs: Iterable[tuple[Mapping[str, Any], Iterable[Entry]]]) -> Iterator[RankEntry]:
    """The entries of several runs as one sequence by read time (each run's own order kept):
    ``logs`` holds each run's summary (``jobref``'s columns: ``run``, ``rank`` (None for the
    batch script), ``nodes``) with its entries in its order."""
    streams = [tagged(i, run, entries) for i, (run, entries) in enumerate(logs)]
    for *_, item in heapq.merge(*streams):
        yield item


MergeKey = tuple[float, int, int, int]


def tagged(i: int, run: Mapping[str, Any], entries: Iterable[Entry], first: int = 0
           ) -> Iterator[tuple[float, int, int, int, RankEntry]]:
    """The entries of run number ``i`` as :func:`merge` orders them: by read time, the batch
    script's first on a tie, then by rank, then by run and each run's own order (``first``:
    the number of the run's entries that came before these)."""
    rank = run.get("rank")
    node = str(run.get("nodes") or "")
    order = -1 if rank is None else int(rank)
    step = step_of(run)
    for n, e in enumerate(entries, first):
        item = RankEntry(e, str(run["run"]), rank, node, () if rank is None else (rank,), step)
        yield (e.ts, order, i, n, item)


def step_of(run: Mapping[str, Any]) -> str | None:
    """The ``srun`` step of a task run (``jobref`` columns); None for the batch script's."""
    if run.get("rank") is None:
        return None
    step = run.get("step")
    return None if step in (None, "") else str(step)


class _Group:
    __slots__ = ("item", "key", "ranks")

    def __init__(self, item: RankEntry, key: tuple[str | None, str, str] | None) -> None:
        self.item = item
        self.key = key
        self.ranks = list(item.ranks)

    def result(self) -> RankEntry:
        return self.item._replace(ranks=tuple(sorted(self.ranks)))


class Folder:
    """:func:`fold` a piece at a time, for a log read while it grows (``jobfollow``):
    :meth:`push` takes the next entry in time order, :meth:`release` gives the entries no
    later one can join any more."""

    def __init__(self, window: float = FOLD_WINDOW) -> None:
        self.window = window
        self._pending: deque[_Group] = deque()  # in time order; final once the window passed
        # (step, stream, text) -> the group a line may join
        self._open: dict[tuple[str | None, str, str], _Group] = {}

    def release(self, before: float | None = None) -> Iterator[RankEntry]:
        """The entries whose window ended before the time ``before`` (None: all of them)."""
        pending = self._pending
        while pending and (before is None or pending[0].item.entry.ts + self.window < before):
            done = pending.popleft()
            if done.key is not None and self._open.get(done.key) is done:
                del self._open[done.key]
            yield done.result()

    def push(self, item: RankEntry) -> Iterator[RankEntry]:
        """Takes ``item`` (no earlier than those before it); gives the entries it made final."""
        ts = item.entry.ts
        yield from self.release(ts)
        if item.rank is None or item.entry.kind != LINE:
            self._pending.append(_Group(item, None))
            return
        key = (item.step, item.entry.stream, item.entry.text)
        group = self._open.get(key)
        if group is not None and item.rank not in group.ranks and (
                ts - group.item.entry.ts <= self.window):
            group.ranks.append(item.rank)
            return
        group = self._open[key] = _Group(item, key)
        self._pending.append(group)


def fold(items: Iterable[RankEntry], window: float = FOLD_WINDOW) -> Iterator[RankEntry]:
    """``items`` (in time order, as :func:`merge` gives them) with the same line of several
    ranks close together given once (the module docstring), its ``ranks`` naming them."""
    folder = Folder(window)
    for item in items:
        yield from folder.push(item)
    yield from folder.release()


def numbered(items: Iterable[RankEntry]) -> Iterator[RankEntry]:
    """``items`` (a job's log in the order shown) with each line and command numbered from 1
    in that order (the module docstring), in place of its number in its own run."""
    n = 0
    for item in items:
        if item.entry.kind in NUMBERED:
            n += 1
            item = item._replace(entry=item.entry._replace(line=n))
        yield item


def label(item: RankEntry, several: bool, text: Any = None) -> str:
    """The text of an entry as ``logs`` prints it: ``RANK: `` before a task's entry when
    ``several`` ranks are shown (as ``srun --label``). ``text``: what an entry prints as
    (``sgr.shown_text``; default its text)."""
    shown = item.entry.text if text is None else text(item.entry)
    if several and item.rank is not None:
        return f"{item.rank}: {shown}"
    return shown


def text_lines(items: Iterable[RankEntry], several: bool | Callable[[], bool],
               text: Any = None, numbers: bool = False) -> Iterator[str]:
    """The lines ``logs`` prints for a job's merged entries: each labelled, a folded line
    followed by its note (``several``: asked at each entry when it is a function, for a log
    read while it grows); ``numbers``: each after its number in the job's log (``logs -n``:
    the number, then the rank's label)."""
    for item in items:
        shown = label(item, several() if callable(several) else several, text)
        yield line_prefix(item.entry.line) + shown if numbers else shown
        if item.folded:
            yield line_prefix(0) + fold_note(item.ranks) if numbers else fold_note(item.ranks)


def step_title(step: str, tasks: Any, command: Any) -> str:
    """A step's section title: ``srun step 0 (4 tasks: python3 train.py)``, from its number,
    its number of tasks (``SLURM_STEP_NUM_TASKS``, when its Start records have it) and its
    command (cut to ``TITLE_COMMAND`` characters)."""
    if isinstance(command, str):
        words = command
    else:
        words = shlex.join(str(w) for w in command or ())
    # one line of plain text: a `python3 -c '...'` script's newlines, a terminal's controls
    words = _SPACES.sub(" ", words).strip()
    if len(words) > TITLE_COMMAND:
        words = words[:TITLE_COMMAND - 1] + "…"
    n = str(tasks or "")
    what = f"{n} task{'' if n == '1' else 's'}" if n.isdigit() else ""
    inside = ": ".join(filter(None, (what, words)))
    return f"srun step {step}" + (f" ({inside})" if inside else "")


class _Step:
    __slots__ = ("complete", "end", "ended", "last", "name", "pending", "runs", "start",
                 "started", "title")

    def __init__(self, name: str, title: str) -> None:
        self.name, self.title = name, title
        self.runs: set[str] = set()  # its task runs known
        self.ended: set[str] = set()  # those whose End record is in
        self.start: float | None = None  # the first start of its task runs
        self.end: float | None = None  # the last end (start + duration) of those ended
        self.pending = 0  # its entries told of and not yet pushed
        self.started = False  # its first entry was pushed
        self.last = 0.0  # the read time of its latest entry pushed
        self.complete = False  # no more entries of it can come

    @property
    def done(self) -> bool:
        """Its last entry is pushed."""
        return self.complete and self.pending <= 0

    @property
    def known(self) -> bool:
        """Whether an entry still to come is of it (it has one waiting) or none can be."""
        return self.pending > 0 or self.complete


class StepMarks:
    """The sections of a job's ``srun`` steps (the module docstring, "Steps"), put in among
    its merged entries: :meth:`push` each entry in merge order (before folding); it gives the
    entry with the marks due before and after it.

    What it knows of the steps it is told: :meth:`add_run` each task run (its summary, with
    ``start``, ``command`` and ``slurm``), :meth:`add_entries` how many entries of a step are
    coming, :meth:`run_ended` each task run's end, :meth:`set_complete` a step whose every
    task run is known and ended (no entry of it can come but those told of). For a log read
    at once (:meth:`of_job`) that is everything before the first push; for a log read while
    it grows (``jobfollow``) it comes bit by bit, and :meth:`ready` says when what a push
    gives is decided, so both show the same marks at the same places."""

    def __init__(self) -> None:
        self._steps: dict[str, _Step] = {}
        self._open: _Step | None = None  # the step whose section is open
        self._active: list[_Step] = []  # the steps started whose last entry is not pushed

    @classmethod
    def of_job(cls, logs: Iterable[tuple[Mapping[str, Any], list[Entry]]]) -> StepMarks:
        """The marks of a job's log read at once: its runs (summaries, ``jobref`` columns)
        with all their entries; a step whose task runs have all ended is complete."""
        marks = cls()
        for run, entries in logs:
            marks.add_run(run)
            marks.add_entries(step_of(run), len(entries))
            if run.get("duration") is not None or run.get("end") is not None:
                marks.run_ended(run, run.get("duration"), run.get("end"))
        for name in marks._steps:
            if marks.all_ended(name):
                marks.set_complete(name)
        return marks

    def add_run(self, run: Mapping[str, Any]) -> None:
        name = step_of(run)
        if name is None:
            return
        step = self._steps.get(name)
        if step is None:
            slurm = run.get("slurm") or {}
            step = self._steps[name] = _Step(name, step_title(name, slurm.get("step_tasks"),
                                                              run.get("command")))
        step.runs.add(str(run["run"]))
        if run.get("start") is not None:
            start = float(run["start"])
            step.start = start if step.start is None else min(step.start, start)

    def add_entries(self, step: str | None, n: int) -> None:
        if step is not None and step in self._steps:
            self._steps[step].pending += n

    def run_ended(self, run: Mapping[str, Any], duration: float | None,
                  end: float | None) -> None:
        """A task run ended: its ``duration`` (its End record's), or else its ``end`` time."""
        step = self._steps.get(step_of(run) or "")
        if step is None:
            return
        step.ended.add(str(run["run"]))
        start = run.get("start")
        if start is not None and duration is not None:
            last: float | None = float(start) + float(duration)
        else:
            last = None if end is None else float(end)
        if last is not None:
            step.end = last if step.end is None else max(step.end, last)

    def steps(self) -> list[str]:
        return list(self._steps)

    def all_ended(self, step: str) -> bool:
        s = self._steps[step]
        return s.runs <= s.ended

    def set_complete(self, step: str) -> None:
        self._steps[step].complete = True

    def ready(self, item: RankEntry) -> bool:
        """Whether what :meth:`push` gives for ``item`` is decided: whether the open section
        ends before it (its step has an entry still to come, or can have none), and for a
        step's first entry whether another step is still printing."""
        step = self._steps.get(item.step) if item.step is not None else None
        if self._open is not None and self._open is not step and not self._open.known:
            return False
        if step is not None and not step.started:
            return all(s.known for s in self._active if s is not step)
        return True

    def push(self, item: RankEntry) -> list[RankEntry]:
        out = self.settle()
        step = self._steps.get(item.step) if item.step is not None else None
        if step is not None:
            if not step.started:
                step.started = True
                alone = not any(not s.done for s in self._active)
                self._active.append(step)
                if alone and self._open is None:
                    self._open = step
                    out.append(self._mark(step, item.entry.ts, SECTION))
            step.pending -= 1
            step.last = item.entry.ts
        out.append(item)
        out += self.settle()
        return out

    def settle(self) -> list[RankEntry]:
        """The open section's end, once its step's last entry is pushed (else nothing)."""
        out = []
        step = self._open
        if step is not None and step.done:
            out.append(self._mark(step, step.last, SECTION_END))
            self._open = None
        self._active = [s for s in self._active if not s.done]
        return out

    def apply(self, items: Iterable[RankEntry]) -> Iterator[RankEntry]:
        """``items`` (merged, in order) with the marks among them."""
        for item in items:
            yield from self.push(item)
        yield from self.settle()

    @staticmethod
    def _mark(step: _Step, ts: float, kind: str) -> RankEntry:
        if kind == SECTION:
            entry = Entry(ts, RUN, 0, SECTION, note_text(NOTE_SECTION, 0, step.title))
        else:
            took = 0 if step.start is None or step.end is None else max(
                0, round((step.end - step.start) * 1000))
            entry = Entry(ts, RUN, 1, SECTION_END, note_text(NOTE_SECTION_END, took,
                                                               step.title))
        return RankEntry(entry, "", None, "")


def job_log(logs: Sequence[tuple[Mapping[str, Any], Iterable[Entry]]],
            marks: StepMarks | None = None) -> Iterator[RankEntry]:
    """A job's log from its runs' entries (``merge``), with its steps' sections (``marks``:
    none without), folded when several ranks are in it, numbered (:func:`numbered`)."""
    merged = merge(logs)
    if marks is not None:
        merged = marks.apply(merged)
    ranks = {run.get("rank") for run, _ in logs if run.get("rank") is not None}
    return numbered(fold(merged) if len(ranks) > 1 else merged)


def several_ranks(runs: Iterable[Mapping[str, Any]]) -> bool:
    """Whether ``runs`` hold the tasks of more than one rank (labels and folding are shown)."""
    return len({r.get("rank") for r in runs if r.get("rank") is not None}) > 1


# --- Read through a ``query.Reader`` (spool, store or the read service alike) --------------
def job_runs(reader: Any, ref: str | None, ranks: Iterable[str] = (),
             nodes: Iterable[str] = ()) -> list[Mapping[str, Any]] | None:
    """The runs whose entries make the log of ``ref``: with ``ranks`` or ``nodes``
    (``--rank``/``--node`` values) the job's chosen task runs; without, the job's batch run
    and every task run, when ``ref`` is a job with task runs; None when it is not (the run's
    own log, as ever). A UsageError when a filter is given for something that is no job, a
    NotFound when the filter picks no task."""
    from . import jobref
    from .errors import NotFound, UsageError

    ranks, nodes = tuple(ranks), tuple(nodes)
    filtered = bool(ranks or nodes)
    if ref is None or jobref.parse(ref) is None:
        if filtered:
            raise UsageError("--rank and --node read the tasks of a Slurm job: name the job "
                             "(`logcapture logs JOB --rank 0`)")
        return None
    summaries = reader.runs()
    wanted = jobref.parse_ranks(ranks) if ranks else None
    try:
        found = jobref.tasks(ref, summaries, wanted, set(nodes) if nodes else None)
    except NotFound:
        if filtered:
            raise
        return None  # not found among the listed runs: the run's own log says why
    if filtered:
        if not found:
            raise _no_task(f"job {ref}", ranks, nodes)
        return found
    if not found:
        return None
    batch = reader.resolve(ref)
    # (a job without a batch run, an interactive step's, resolves to one of its tasks)
    own = [{**s, **jobref.job_fields(s)} for s in summaries
           if s["run"] == batch and not jobref.is_task(s)]
    return own + found


def read_job(reader: Any, runs: list[Mapping[str, Any]], streams: tuple[str, ...]
             ) -> Iterator[RankEntry]:
    """The merged, folded log of ``runs`` (``job_runs``): each run's entries as ``logview``
    shows them (``streams``: the output streams shown)."""
    from .logview import LogView
    from .records import OUTPUT_STREAMS, from_dict

    def job(streams: tuple[str, ...]) -> Iterator[RankEntry]:
        logs = [(run, LogView(streams=streams).feed(recs)) for run, recs in records]
        # The steps are sections of the whole job's log (the batch script's with its tasks');
        # the tasks chosen by rank or node are shown as they printed.
        return job_log(logs, StepMarks.of_job(logs) if whole else None)

    # both streams read: a line's number counts both (the view shows ``streams``)
    records = [(run, [from_dict(d) for d in reader.lines(str(run["run"]), None)])
               for run in runs]
    whole = any(run.get("rank") is None for run in runs)
    shown = job(streams)
    if set(streams) >= set(OUTPUT_STREAMS):
        return shown
    # One stream shown: its lines keep their numbers in the log of both (a line's number
    # counts both streams), taken from that log by each line's run, stream and seq.
    lines = {(i.run, i.entry.stream, i.entry.seq): i.entry.line
             for i in job(OUTPUT_STREAMS) if i.entry.line}
    return (i._replace(entry=i.entry._replace(
                line=lines.get((i.run, i.entry.stream, i.entry.seq), 0)))
            if i.entry.line else i for i in shown)


def task_run_ids(reader: Any, jobs: Iterable[str], ranks: Iterable[str] = (),
                 nodes: Iterable[str] = ()) -> tuple[str, ...]:
    """The task runs ``search --rank/--node`` looks in: those of ``jobs`` (job references;
    none: every job of the caller's) with one of ``ranks`` and on one of ``nodes``. NotFound
    when there is none."""
    from . import jobref

    ranks, nodes = tuple(ranks), tuple(nodes)
    wanted = jobref.parse_ranks(ranks) if ranks else None
    on = set(nodes) if nodes else None
    summaries = reader.runs()
    if jobs:
        found = [t for job in jobs for t in jobref.tasks(job, summaries, wanted, on)]
    else:
        found = [f for f in ({**s, **jobref.job_fields(s)} for s in summaries)
                 if f["rank"] is not None and (wanted is None or f["rank"] in wanted)
                 and (on is None or f["nodes"] in on)]
    if not found:
        raise _no_task(f"job {', '.join(jobs)}" if jobs else "your jobs", ranks, nodes)
    return tuple(dict.fromkeys(str(t["run"]) for t in found))


def _no_task(where: str, ranks: tuple[str, ...], nodes: tuple[str, ...]) -> Exception:
    from .errors import NotFound

    what = " and ".join(filter(None, (f"rank {', '.join(ranks)}" if ranks else "",
                                      f"node {', '.join(nodes)}" if nodes else "")))
    return NotFound(f"{where}: no captured task with {what} (`logcapture ls JOB` lists a "
                    "job's tasks)")


def tasks_of(reader: Any, ref: str) -> list[dict[str, Any]]:
    """The task runs of the job ``ref`` names, as the job page lists them (run, step, rank,
    node, state): [] when ``ref`` is no job with task runs."""
    runs = job_runs(reader, ref) or []
    return [{"run": str(r["run"]), "step": r.get("step"), "rank": r["rank"],
             "node": str(r.get("nodes") or ""), "state": r.get("state")}
            for r in runs if r.get("rank") is not None]


def page(reader: Any, ref: str, ranks: str = "", nodes: str = "", limit: int = 10_000,
         line: int | None = None) -> dict[str, Any]:
    """The job page's log of a job of several ranks: the newest ``limit`` entries of
    ``read_job`` over the job's runs (``ranks``: ``0-3,8`` as ``--rank`` takes it, ``nodes``:
    a comma list; empty: all, with the batch script's), each ``{cursor, stream, kind, text,
    ts, line, run, rank, node}`` (``line``: its number in the job's log, as ``logs JOB -n``
    prints it; none for a note) and, when folded, ``ranks`` and ``note`` (``fold_note``);
    ``more``: older entries were left out (``logcapture logs JOB`` prints them all);
    ``newer``: newer ones were (``line``: the ``limit`` entries around line ``line``, the
    page's ``#L``, when it is not among the newest); ``ended``: every run of them has
    ended."""
    from .logview import cursor_of
    from .records import OUTPUT_STREAMS

    rank_values = [ranks] if ranks else []
    node_values = [n for n in nodes.split(",") if n]
    runs = job_runs(reader, ref, rank_values, node_values)
    if runs is None:
        return {"entries": [], "more": False, "newer": False, "ended": True}
    shown, more, newer = _window(read_job(reader, runs, OUTPUT_STREAMS), limit, line)
    entries = []
    for item in shown:
        e = item.entry
        d = {"cursor": cursor_of(e.ts, e.stream, e.seq), "stream": e.stream, "kind": e.kind,
             "text": e.text, "ts": e.ts, "run": item.run, "rank": item.rank, "node": item.node}
        if e.line:
            d["line"] = e.line
        if item.folded:
            d["ranks"], d["note"] = list(item.ranks), fold_note(item.ranks)
        if e.style:  # a line's colours (logcapture.sgr), as query's entries carry them
            d["style"] = [list(s) for s in e.style]
        entries.append(d)
    return {"entries": entries, "more": more, "newer": newer,
            "ended": all(r.get("state") not in ("RUNNING", "EMPTY") for r in runs)}


def _window(items: Iterable[RankEntry], limit: int, line: int | None
            ) -> tuple[list[RankEntry], bool, bool]:
    """The newest ``limit`` of ``items``, or, when line ``line`` is older than those, the
    ``limit`` around it (half of them before it); with whether older and newer ones were left
    out. Holds the newest ``limit``, and the ones around line ``line`` once it is seen."""
    newest: deque[RankEntry] = deque(maxlen=limit + 1)
    around: list[RankEntry] | None = None
    older = False  # entries before ``around``
    for seen, item in enumerate(items):
        newest.append(item)
        if around is None and line is not None and item.entry.line == line:
            around = list(newest)[-(limit // 2) - 1:]
            older = seen + 1 > len(around)
        elif around is not None and len(around) <= limit:
            around.append(item)
    more = len(newest) > limit
    tail = list(newest)[1:] if more else list(newest)
    if around is None or any(i.entry.line == line for i in tail):
        return tail, more, False
    return around[:limit], older, len(around) > limit
