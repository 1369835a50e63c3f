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

The folding reads entries in time order and holds only the last ``FOLD_WINDOW`` of them, so a
log of any length is folded in bounded memory.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from .jobref import format_ranks
from .logview import LINE, Entry

FOLD_WINDOW = 1.0  # seconds between the first rank's line and another rank's same line


class RankEntry(NamedTuple):
    """An entry of a job's merged log: the ``logview`` entry, the run it came from, its task's
    rank (None: the batch script's own) and node, and ``ranks``: every rank that printed it
    (more than one when folded, in rank order)."""

    entry: Entry
    run: str
    rank: int | None
    node: str
    ranks: tuple[int, ...] = ()

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
    for n, e in enumerate(entries, first):
        item = RankEntry(e, str(run["run"]), rank, node, () if rank is None else (rank,))
        yield (e.ts, order, i, n, item)


class _Group:
    __slots__ = ("item", "key", "ranks")

    def __init__(self, item: RankEntry, key: tuple[str, str] | None) -> None:
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
        self._open: dict[tuple[str, str], _Group] = {}  # (stream, text) -> group to join

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
        key = (item.entry.stream, item.entry.text)
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


def label(item: RankEntry, several: bool, text: Any = None) -> str:
    """The text of an entry as ``logs`` prints it: ``RANK: `` before a task's entry when
    ``several`` ranks are shown (as ``srun --label``). ``text``: what an entry prints as
    (``sgr.shown_text``; default its text)."""
    shown = item.entry.text if text is None else text(item.entry)
    if several and item.rank is not None:
        return f"{item.rank}: {shown}"
    return shown


def text_lines(items: Iterable[RankEntry], several: bool | Callable[[], bool],
               text: Any = None) -> Iterator[str]:
    """The lines ``logs`` prints for a job's merged entries: each labelled, a folded line
    followed by its note (``several``: asked at each entry when it is a function, for a log
    read while it grows)."""
    for item in items:
        yield label(item, several() if callable(several) else several, text)
        if item.folded:
            yield fold_note(item.ranks)


def job_log(logs: list[tuple[Mapping[str, Any], Iterable[Entry]]]) -> Iterator[RankEntry]:
    """A job's log from its runs' entries (``merge``), folded when several ranks are in it."""
    merged = merge(logs)
    ranks = {run.get("rank") for run, _ in logs if run.get("rank") is not None}
    return fold(merged) if len(ranks) > 1 else merged


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
    from .records import from_dict

    def entries(run: str) -> list[Entry]:
        # both streams read: a line's number counts both (the view shows ``streams``)
        return LogView(streams=streams).feed(from_dict(d) for d in reader.lines(run, None))

    return job_log([(run, entries(str(run["run"]))) for run in runs])


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


def page(reader: Any, ref: str, ranks: str = "", nodes: str = "", limit: int = 10_000
         ) -> dict[str, Any]:
    """The job page's log of a job of several ranks: the newest ``limit`` entries of
    ``read_job`` over the job's runs (``ranks``: ``0-3,8`` as ``--rank`` takes it, ``nodes``:
    a comma list; empty: all, with the batch script's), each ``{cursor, stream, kind, text,
    ts, run, rank, node}`` and, when folded, ``ranks`` and ``note`` (``fold_note``); ``more``:
    older entries were left out (``logcapture logs JOB`` prints them all); ``ended``: every
    run of them has ended."""
    from .logview import cursor_of
    from .records import OUTPUT_STREAMS

    rank_values = [ranks] if ranks else []
    node_values = [n for n in nodes.split(",") if n]
    runs = job_runs(reader, ref, rank_values, node_values)
    if runs is None:
        return {"entries": [], "more": False, "ended": True}
    newest: deque[RankEntry] = deque(maxlen=limit + 1)
    newest.extend(read_job(reader, runs, OUTPUT_STREAMS))
    more = len(newest) > limit
    if more:
        newest.popleft()
    entries = []
    for item in newest:
        e = item.entry
        d = {"cursor": cursor_of(e.ts, e.stream, e.seq), "stream": e.stream, "kind": e.kind,
             "text": e.text, "ts": e.ts, "run": item.run, "rank": item.rank, "node": item.node}
        if item.folded:
            d["ranks"], d["note"] = list(item.ranks), fold_note(item.ranks)
        if e.style:  # a line's colours (logcapture.sgr), as query's entries carry them
            d["style"] = [list(s) for s in e.style]
        entries.append(d)
    return {"entries": entries, "more": more,
            "ended": all(r.get("state") not in ("RUNNING", "EMPTY") for r in runs)}
