"""The questions every reader asks: which runs are mine, which run a job reference names, its
lines (all of them, the last N, or followed while it runs), its summary, its metadata, its
resource samples, the rows an export writes, and the lines of all of one's runs that match a
search.

One interface, ``Reader`` (the protocol below), answered three ways:

- ``StoreReader``: the store alone, as one owner (or every owner, for an administrator). The
  read service (``logcapture.reader``) answers its clients with one per request.
- ``LocalReader``: the caller's own spool and store, as on a laptop or on the node that runs the
  job: a run is read from the store once shipped, else from the spool.
- ``logcapture.reader.client.ServiceReader``: the same questions asked of the read service over
  its Unix socket, on a login node that sees neither the spools nor the store's credentials.

Everything a Reader returns is plain JSON data, so the read service sends it as it is:

- a run summary (``runs()``): a dict with the keys of ``SUMMARY_KEYS``, whatever the source;
- records (``lines``, ``follow``, ``metadata``, ``samples``): record dicts as the spool writes
  them (``records.Record.to_dict``; ``records.from_dict`` makes them records again);
- ``describe(run)``: the mapping ``logcapture show`` prints (``describe`` below, the one place
  that builds it, from ``RunFacts`` that the spool or the store supply);
- ``export_rows(run, what)``: the rows ``logcapture export`` writes (``store.write_rows``).
- ``search(request)``: ``search.answer``'s mapping (matching lines with their context, grouped
  by run), from the store (``Store.search``) and, for runs not yet shipped, the spool
  (``search.Pattern.matches``: the same pattern).

Every run a Reader names is the caller's own: ``owner`` (a user name; None means every owner)
filters every question, and a run of someone else is "not found", never "forbidden", so a
reader learns nothing of other people's job ids.
"""

from __future__ import annotations

import json
import os
import pwd
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from . import jobref
from .errors import LogcaptureError, NotFound, SpoolError
from .insights import Diagnoser, Insight, Outcome, incomplete, run_insights
from .insights.efficiency import admin_thresholds
from .insights.matchers import LOWERED_NEEDLES
from .insights.report import store_insights
from .jobref import JOB_KEYS
from .logview import Entry, LogView, cursor_of, parse_cursor, sort_key, ts_ns
from .progress import bars as progress_bars
from .records import (
    NOTE_BLANK,
    NOTE_MODE,
    NOTE_REPEAT,
    NOTE_WARNING,
    OUTPUT_STREAMS,
    STDERR,
    Command,
    End,
    Line,
    Metadata,
    Note,
    Progress,
    Sample,
    Start,
    from_dict,
    redactions_by_kind,
    streams_of,
)
from .runs import RunSummary, find_run, follow_records, job_candidates, summarize
from .search import Found, Hit, Pattern, Request, answer, context_of, line_of, merge
from .ship import is_shipped
from .spool import (
    ReadStats,
    Segment,
    find_run_dirs,
    iter_run,
    lines_of_kinds,
    parse_lines,
    read_lines,
    records_of_kinds,
    segment_data,
    segments,
)
from .store import EXPORTS, Store, export_rows, redact

# The keys of a run summary (``Reader.runs``), the same from the spool and from the store.
SUMMARY_KEYS = ("run", "owner", "uid", "job_id", "cluster", "host", "state", "exit_status",
                "signal", "start", "end", "duration", "lines", "redactions", "command", "slurm",
                "source", "insights", *JOB_KEYS)
FOLLOW_POLL = 0.5  # seconds between a follower's reads of the store
LOG_PAGE = 1000  # entries in a page of a log (``Reader.log``) unless asked otherwise
LOG_PAGE_MAX = 5000
# After the end record is in the store, the batch that carried it may still be inserting its
# lines (the shipper inserts the other records first, store.Store.insert_many): a follower
# reads on until a read finds nothing this long after it saw the end.
FOLLOW_SETTLE = 3.0
# A follower asks the store only for records at most this much older than the newest it has
# seen (the store's key begins with the run and the time, so the read stays small); records
# reach the store in spool order, each within seconds of its time stamp.
FOLLOW_LOOKBACK = 300.0
FOLLOW_PAGE = 10_000  # records per read of a follower (a long log is read in pages)


class Reader(Protocol):
    """The questions every reader asks. RUN arguments are run ids as ``resolve`` returns them;
    ``resolve`` takes what a user types (a run id, a Slurm job id, ``latest`` or None)."""

    def runs(self) -> list[dict[str, Any]]:
        """Run summaries (``SUMMARY_KEYS``), newest first."""
        ...

    def resolve(self, ref: str | None) -> str:
        """The run id REF names; NotFound when none of the caller's runs matches."""
        ...

    def summary(self, run: str) -> dict[str, Any]:
        """One run's summary (as in ``runs``), without listing every run."""
        ...

    def lines(self, run: str, stream: str | None = None, tail: int | None = None
              ) -> list[dict[str, Any]]:
        """The run's output records (line, command, note, metadata) in order, run-level notes
        included when ``stream`` is None; ``tail`` keeps the last N."""
        ...

    def follow(self, run: str) -> Iterator[dict[str, Any]]:
        """Every record of the run, then new ones as they come, until its end record (the last
        one yielded)."""
        ...

    def log(self, run: str, stderr: bool = False, before: str | None = None,
            after: str | None = None, limit: int = LOG_PAGE) -> dict[str, Any]:
        """One page of the run's log as ``logview`` shows it (the job page's question):
        ``entries``, each ``{cursor, stream, kind, text, ts}`` in order, the newest ``limit`` before
        the cursor ``before`` (default: the newest) or the oldest after ``after``; ``more``:
        entries lie beyond the page; ``ended``: the run's end record is in."""
        ...

    def describe(self, run: str) -> dict[str, Any]:
        """What ``logcapture show`` prints (``describe``)."""
        ...

    def metadata(self, run: str) -> list[dict[str, Any]]:
        """Metadata records, newest first."""
        ...

    def samples(self, run: str) -> list[dict[str, Any]]:
        """Resource sample records, oldest first."""
        ...

    def export_rows(self, run: str, what: str) -> list[dict[str, Any]]:
        """The rows of ``lines``, ``metadata`` or ``samples`` that ``export`` writes."""
        ...

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        """The lines of the caller's runs that match a search (``search.Request.to_dict``),
        as ``search.answer`` gives them: newest first, grouped by run, with context."""
        ...

    def close(self) -> None:
        ...


# --- describe: one summary from either source -----------------------------------------------
class RunFacts(NamedTuple):
    """What ``describe`` needs to know of a run, from the spool (``spool_facts``) or from the
    store (``store_facts``). Records are record dicts."""

    run: str
    owner: str  # the trusted owner (the spool's owner rule, or the store's owner column)
    uid: int
    start: dict[str, Any] | None
    end: dict[str, Any] | None
    lines: dict[str, int]  # output lines per stream
    repeats: dict[str, int]  # dropped repetitions per stream
    blanks: dict[str, int]  # dropped blank lines per stream
    commands: int
    modes: list[dict[str, Any]]  # mode changes in order: {"ts", "text"}
    metadata_keys: list[str]  # sorted
    metadata: list[dict[str, Any]]  # metadata fields in time order
    samples: list[dict[str, Any]]  # sample records, oldest first
    warnings: int
    spool_problems: str | None = None
    stored_in: str | None = None
    insights: list[dict[str, Any]] = []  # Insight.to_dict() (logcapture.insights)
    progress: list[dict[str, Any]] = []  # progress record dicts (logcapture.progress)


def describe(facts: RunFacts) -> dict[str, Any]:
    """The mapping ``logcapture show`` prints for a run, whatever its source: snake_case keys,
    numbers as numbers, times in seconds since the epoch and durations in seconds
    (docs/cli.md says what each field means; ``views.show_lines`` writes it for people)."""
    from .sampling.summary import summarize as summarize_samples
    from .xaxis import choose_x_axis

    start, end = facts.start, facts.end
    slurm = dict((start or {}).get("slurm") or {})
    summary = {"run": facts.run, "job_id": slurm.get("job_id", ""), "slurm": slurm,
               "host": (start or {}).get("host", ""),
               "command": list((start or {}).get("command") or ())}
    # the answers first (docs/insights.md): why it failed, what it wasted, what it does now
    info: dict[str, Any] = {"insights": list(facts.insights), "run": facts.run,
                            **jobref.job_fields(summary)}
    info["owner"] = facts.owner
    info["uid"] = facts.uid
    info["state"] = end["state"] if end is not None else "RUNNING"
    info["exit_status"] = end.get("exit_status") if end is not None else None
    info["signal"] = end.get("signal") if end is not None else None
    info["start"] = start["ts"] if start is not None else None
    info["end"] = end["ts"] if end is not None else None
    info["duration"] = (end.get("duration") or 0.0) if end is not None else None
    info["command"] = " ".join(summary["command"])
    info["cwd"] = (start or {}).get("cwd", "")
    info["host"] = summary["host"]
    info["initial_mode"] = (start or {}).get("mode", "")
    info["streams"] = streams_of((start or {}).get("config") or {}) if start else None
    info["slurm"] = slurm
    info["lines"] = {s: facts.lines.get(s, 0) for s in OUTPUT_STREAMS}
    info["dropped_repetitions"] = {s: facts.repeats.get(s, 0) for s in OUTPUT_STREAMS}
    info["dropped_blank_lines"] = {s: facts.blanks.get(s, 0) for s in OUTPUT_STREAMS}
    info["commands"] = facts.commands
    info["mode_changes"] = [dict(m) for m in facts.modes]
    info["metadata_keys"] = list(facts.metadata_keys)
    info["x_axis"] = choose_x_axis(facts.metadata)
    usage = ((end or {}).get("counts") or {}).get("job") or {}
    resources: dict[str, Any] = {}
    if facts.samples:
        recs = [Sample(**{k: v for k, v in d.items() if k != "kind"}) for d in facts.samples]
        summed = summarize_samples(recs, wall_seconds=info["duration"])
        resources = {k: v for k, v in summed.items()
                     if not isinstance(v, (dict, list)) and v is not None}
        cpus = [n.get("cpus_allocated") for n in summed["nodes"].values()]
        if cpus and all(isinstance(c, int) for c in cpus):
            resources["cpus_allocated"] = sum(cpus)
    resources.update(job_usage(usage, resources, info["duration"],
                               (start or {}).get("inventory") or {}))
    info["resources"] = resources
    # Secrets replaced by *** before the spool (logcapture.redact), counted by the end record.
    info["redactions_by_kind"] = redactions_by_kind((end or {}).get("counts"))
    info["redactions"] = sum(info["redactions_by_kind"].values())
    info["warnings"] = facts.warnings
    info["spool_problems"] = facts.spool_problems
    info["stored_in"] = facts.stored_in
    info["progress"] = progress_bars(facts.progress)
    return info


def job_usage(usage: dict[str, Any], resources: dict[str, Any], wall: float | None,
              inventory: dict[str, Any]) -> dict[str, Any]:
    """The resource figures the End record adds to the samples' (``counts["job"]``: the
    kernel's account of the job's processes once they were waited for, ``getrusage`` of the
    wrapper's children): total CPU time and the peak resident memory of its largest process.
    A job shorter than the sampling interval has these even without a sample of its own."""
    out: dict[str, Any] = {}
    cpu_ms, rss_kib = usage.get("cpu_ms"), usage.get("max_rss_kib")
    if isinstance(cpu_ms, int):
        cpu = max(cpu_ms / 1000.0, resources.get("cpu_seconds_total") or 0.0)
        out["cpu_seconds_total"] = cpu
        cpus = resources.get("cpus_allocated") or inventory.get("cpus_allocated")
        if isinstance(cpus, int) and cpus > 0 and wall:
            out["cpus_allocated"] = cpus
            out["cpu_efficiency"] = cpu / (wall * cpus)
    if isinstance(rss_kib, int):
        out["memory_rss_peak_bytes"] = max(rss_kib * 1024,
                                           resources.get("memory_rss_peak_bytes") or 0)
    return out


def spool_facts(run_dir: Path, owner: str, uid: int) -> RunFacts:
    """A run's facts from one pass over its spool."""
    stats = ReadStats()
    start = end = None
    lines: Counter[str] = Counter()
    repeats: Counter[str] = Counter()
    blanks: Counter[str] = Counter()
    warnings = commands = 0
    modes: list[dict[str, Any]] = []
    keys: set[str] = set()
    metadata: list[dict[str, Any]] = []  # stream order is time order
    metadata_records: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    progress: list[dict[str, Any]] = []
    diagnoser = Diagnoser()
    for rec in iter_run(run_dir, stats):
        if isinstance(rec, Line):
            lines[rec.stream] += 1
            diagnoser.feed(rec.stream, rec.seq, rec.text)
        elif isinstance(rec, Start):
            start = rec.to_dict()
        elif isinstance(rec, End):
            end = rec.to_dict()
        elif isinstance(rec, Metadata):
            keys.update(rec.fields)
            metadata.append(dict(rec.fields))
            metadata_records.append(rec.to_dict())
        elif isinstance(rec, Sample):
            samples.append(rec.to_dict())
        elif isinstance(rec, Progress):
            progress.append(rec.to_dict())
        elif isinstance(rec, Command):
            commands += 1
        elif isinstance(rec, Note):
            if rec.note == NOTE_REPEAT:
                repeats[rec.stream] += rec.count
            elif rec.note == NOTE_BLANK:
                blanks[rec.stream] += rec.count
            elif rec.note == NOTE_MODE and rec.stream == "stdout":
                # the classifier notes a change in both streams
                modes.append({"ts": rec.ts, "text": rec.text})
            elif rec.note == NOTE_WARNING:
                warnings += 1
    unread = [f"{seg} ({why})" for seg, line, why in stats.bad if line == 0]
    bad = len(stats.bad) - len(unread)
    problems = "; ".join(
        [*([f"{stats.torn} torn line(s), {bad} invalid line(s)"] if stats.torn or bad else []),
         *([f"{len(unread)} segment(s) could not be read, their lines are missing: "
            + ", ".join(unread)] if unread else [])]) or None
    insights = run_insights(diagnoser, start, end, samples, metadata=metadata_records,
                            thresholds=admin_thresholds(), missing_segments=len(unread))
    return RunFacts(run_dir.name, owner, uid, start, end, dict(lines), dict(repeats),
                    dict(blanks), commands, modes, sorted(keys), metadata, samples, warnings,
                    spool_problems=problems, insights=[i.to_dict() for i in insights],
                    progress=progress)


def store_facts(st: Store, run: str, owner: str | None) -> RunFacts:
    """A run's facts from the store's counts, without reading every line."""
    info = st.run_info(run, owner, counts=False)
    t = st.tallies(run, owner)
    notes = t["notes"]
    metadata = sorted(st.metadata(run, owner), key=lambda d: (d["ts"], d["seq"]))
    samples = st.samples(run, owner)
    return RunFacts(
        run, info["owner"], int(info["uid"]), info["start_record"], info["end_record"],
        {s: int(n) for s, n in t["lines"].items()},
        {s: sum(r[2] for r in notes if r[0] == s and r[1] == NOTE_REPEAT)
         for s in OUTPUT_STREAMS},
        {s: sum(r[2] for r in notes if r[0] == s and r[1] == NOTE_BLANK)
         for s in OUTPUT_STREAMS},
        t["commands"], t["modes"], t["metadata_keys"], [d["fields"] for d in metadata],
        samples, sum(r[3] for r in notes if r[1] == NOTE_WARNING),
        stored_in=redact(st.dsn),
        insights=store_insights(st, run, info["start_record"], info["end_record"], samples,
                                owner),
        progress=st.progress(run, owner))


def spool_insights(run_dir: Path, start: Any, end: Any, thresholds: Any = None
                   ) -> list[Insight]:
    """What ``show`` lists for a finished run in the spool (``spool_facts``), without parsing
    every line: the diagnosis reads only the candidates (``Diagnoser``), found by their
    needles in each segment's bytes (``matchers.LOWERED_NEEDLES``), with the lines of a
    traceback that follow one, and the metadata and samples by their kind
    (``spool.records_of_kinds``). ``ls`` lists its first kind."""
    diagnoser = Diagnoser()
    samples: list[dict[str, Any]] = []
    metadata: list[dict[str, Any]] = []
    missing = 0
    for seg in segments(run_dir):
        try:
            data, _ = segment_data(seg)
        except SpoolError:
            missing += 1
            continue
        _feed_candidates(diagnoser, data)
        found = records_of_kinds(data, ("metadata", "sample"))
        samples += filter(None, map(_record_dict, found["sample"]))
        metadata += filter(None, map(_record_dict, found["metadata"]))
    return run_insights(diagnoser, start, end, samples, metadata=metadata,
                        thresholds=thresholds or admin_thresholds(), missing_segments=missing)


# A finished run's insight kinds, kept in its directory by its owner's `ls`: reading them
# means reading every segment (~2.7 s for a 1M-line run, bench_insights), and a finished
# run's segments change only when the shipper removes them (the key then differs).
KINDS_CACHE = ".logcapture-insights.json"


def spool_insight_kinds(run_dir: Path, start: Any, end: Any, thresholds: Any = None
                        ) -> list[str]:
    """The kinds ``spool_insights`` gives, from the run's cache when its segments are the
    ones it was made from. Only the directory's owner reads or writes it (root never
    trusts a file a user could have written: userfiles.py)."""
    try:
        mine = os.stat(run_dir, follow_symlinks=False).st_uid == os.geteuid()
        key = [[seg.path.name, st.st_size, st.st_mtime_ns] for seg in segments(run_dir)
               for st in [os.stat(seg.path, follow_symlinks=False)]]
    except (OSError, SpoolError):
        mine, key = False, []
    cache = run_dir / KINDS_CACHE
    if mine:
        try:
            with open(cache, "rb") as f:
                kept = json.loads(f.read(1 << 16))
            if kept.get("key") == key and isinstance(kept.get("kinds"), list):
                return [str(k) for k in kept["kinds"]]
        except (OSError, ValueError, AttributeError):
            pass
    kinds = [i.kind for i in spool_insights(run_dir, start, end, thresholds)]
    if mine:
        tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps({"key": key, "kinds": kinds}))
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only spool: computed again next time
    return kinds


def _record_dict(raw: bytes) -> dict[str, Any] | None:
    try:
        d = json.loads(raw)
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


_LINE_END = b'"kind":"line"}'  # records.Line.to_json writes the kind last


def _feed_candidates(diagnoser: Diagnoser, data: bytes) -> None:
    """Feed ``diagnoser`` the candidate lines of one segment's bytes, and every line after a
    traceback's head until it ends; then the last sequence number of each stream."""
    pos = _feed_from(diagnoser, data, 0) if diagnoser.in_traceback else 0
    lowered = data.lower()
    starts: set[int] = set()
    for needle in LOWERED_NEEDLES:
        at = lowered.find(needle, pos)
        while at >= 0:
            start = lowered.rfind(b"\n", 0, at) + 1
            eol = lowered.find(b"\n", at)
            if lowered.find(b',"text":', start, at) < 0:
                # in the record's identity (a run named "failed"), not its text
                at = lowered.find(needle, at + len(needle))
                continue
            starts.add(start)
            at = lowered.find(needle, eol) if eol >= 0 else -1
    for start in sorted(starts):
        if start >= pos:
            pos = _feed_from(diagnoser, data, start)
    for stream in OUTPUT_STREAMS:
        head = b'"stream":"' + stream.encode() + b'","seq":'
        at = data.rfind(head)
        while at >= 0:
            end = data.find(b"\n", at)
            if end >= 0 and data.endswith(_LINE_END, at, end):
                digits = data[at + len(head):data.find(b",", at + len(head))]
                if digits.isdigit():
                    diagnoser.note_last_seq(stream, int(digits))
                break
            at = data.rfind(head, 0, at)


def _feed_from(diagnoser: Diagnoser, data: bytes, at: int) -> int:
    """Feed the line record at byte ``at`` and, while a traceback is read, those after it;
    the offset after the last line fed (a torn last line is left)."""
    while True:
        end = data.find(b"\n", at)
        if end < 0:
            return len(data)
        if data.endswith(_LINE_END, at, end):
            d = _record_dict(data[at:end])
            if d is not None and isinstance(d.get("text"), str):
                diagnoser.feed(str(d.get("stream")), int(d.get("seq") or 0), d["text"])
        at = end + 1
        if not diagnoser.in_traceback:
            return at


# --- run summaries --------------------------------------------------------------------------
def summary_of_spool(s: RunSummary, owner: str, uid: int, run_dir: Path | None = None,
                     thresholds: Any = None) -> dict[str, Any]:
    """A spool run's summary, with the keys of a store run's (``SUMMARY_KEYS``): with
    ``run_dir``, the kinds of its insights (``spool_insights``: those ``show`` lists), else
    those its End record says alone."""
    start, end = s.start, s.end
    slurm = dict(start.slurm or {}) if start else {}  # null in a hand-made start record
    out = {"run": s.run_id, "owner": owner, "uid": uid,
            "job_id": str(slurm.get("job_id", "")), "cluster": str(slurm.get("cluster", "")),
            "host": (start.host or "") if start else "", "state": s.state,
            "exit_status": end.exit_status if end else None,
            "signal": end.signal if end else None,
            "start": start.ts if start else None, "end": end.ts if end else None,
            "duration": end.duration if end else None, "lines": s.lines,
            "redactions": sum(redactions_by_kind(end.counts).values()) if end else None,
            "command": list(start.command or ()) if start else [], "slurm": slurm,
            "source": "spool",
            "insights": [] if end is None else (
                spool_insight_kinds(run_dir, start, end, thresholds) if run_dir is not None
                else [i.kind for i in (*Diagnoser().result(Outcome.of(end)),
                                       *filter(None, [incomplete(end)]))])}
    out.update(jobref.job_fields(out))
    return out


def summary_of_store(row: dict[str, Any]) -> dict[str, Any]:
    """A store run's summary (a ``Store.runs`` row) with the keys of ``SUMMARY_KEYS``."""
    out = {k: row.get(k) for k in SUMMARY_KEYS}
    out["start"] = row["start"] if row["start"] is not None else row["last"]
    out["slurm"] = row.get("slurm") or {}
    out["command"] = list(row.get("command") or [])
    out["source"] = "store"
    out["insights"] = list(row.get("insights") or [])
    out.update(jobref.job_fields(out))
    return out


def newest_first(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(summaries, key=lambda d: (d["start"] is not None, d["start"] or 0.0,
                                            d["run"]), reverse=True)


# --- the store alone ------------------------------------------------------------------------
StoreSession = Callable[[], AbstractContextManager[Store]]


def _check_run(st: Store, run: str, owner: str | None) -> None:
    """NotFound unless the run is in the store as the owner's (one row of the runs table;
    ``run_info`` would also count every table's rows)."""
    if not st.has_run(run, owner):
        raise NotFound(f"run {run!r} is not in the store")


class StoreReader:
    """The Reader over the store alone, as ``owner`` (None: every owner). ``session`` opens
    the store for one question (``with session() as st``): an embedded store is one process's
    at a time, so it is held only while a question is answered."""

    def __init__(self, session: StoreSession, owner: str | None):
        self.session = session
        self.owner = owner

    def runs(self) -> list[dict[str, Any]]:
        with self.session() as st:
            return [summary_of_store(r) for r in st.runs(self.owner)]

    def resolve(self, ref: str | None) -> str:
        with self.session() as st:
            return st.resolve_run(ref, self.owner)

    def summary(self, run: str) -> dict[str, Any]:
        with self.session() as st:
            rows = st.runs(self.owner, run)
        if not rows:
            raise NotFound(f"run {run!r} is not in the store")
        return summary_of_store(rows[0])

    def lines(self, run: str, stream: str | None = None, tail: int | None = None
              ) -> list[dict[str, Any]]:
        with self.session() as st:
            _check_run(st, run, self.owner)
            return st.lines(run, stream, tail, owner=self.owner)

    def iter_lines(self, run: str, stream: str | None = None, page: int = 50_000
                   ) -> Iterator[list[dict[str, Any]]]:
        """``lines(run, stream)`` in batches: at once for a run of up to ``page`` records, else
        read a page at a time with the store released between pages (the read service sends
        a long log without holding it all in memory)."""
        with self.session() as st:
            _check_run(st, run, self.owner)  # NotFound when it is not the caller's
            if st.record_count(run, self.owner) <= page:
                small = st.lines(run, stream, owner=self.owner)
            else:
                small = None
        if small is not None:
            yield small
            return
        nexts: dict[str, int] = {}
        while True:
            with self.session() as st:
                recs = st.lines(run, stream, owner=self.owner, after=nexts, head=page)
            yield recs
            if len(recs) < page:
                return
            for d in recs:
                nexts[d["stream"]] = max(nexts.get(d["stream"], 0), int(d["seq"]) + 1)

    def follow(self, run: str, poll: float = FOLLOW_POLL, settle: float = FOLLOW_SETTLE,
               sleep: Callable[[float], None] = time.sleep,
               on_idle: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:
        """Every record of the run, then new ones as the shipper brings them, until the end
        record (``follow_batches``, one record at a time)."""
        for batch in self.follow_batches(run, poll, settle, sleep, on_idle):
            yield from batch

    def follow_batches(self, run: str, poll: float = FOLLOW_POLL,
                       settle: float = FOLLOW_SETTLE,
                       sleep: Callable[[float], None] = time.sleep,
                       on_idle: Callable[[], None] | None = None
                       ) -> Iterator[list[dict[str, Any]]]:
        """Every record of the run, then new ones as the shipper brings them, a read every
        ``poll`` seconds (``on_idle`` is called after a read that found nothing), until the
        end record: once every record the end record counts is read, or a read finds nothing
        ``settle`` seconds after it."""
        nexts: dict[str, int] = {}  # stream -> the next seq not yet read
        newest: float | None = None
        ended_at: float | None = None
        end: dict[str, Any] | None = None
        lines: Counter[tuple[str, str]] = Counter()  # records read per stream and kind
        started = False
        while True:
            with self.session() as st:
                # NotFound when it is not the caller's
                info = st.run_info(run, self.owner, counts=False)
                since = newest - FOLLOW_LOOKBACK if newest is not None else None
                recs = st.lines(run, owner=self.owner, after=nexts, since=since,
                                head=FOLLOW_PAGE)
            if not started and info["start_record"] is not None:
                started = True
                yield [info["start_record"]]
            for d in recs:
                nexts[d["stream"]] = max(nexts.get(d["stream"], 0), int(d["seq"]) + 1)
                newest = d["ts"] if newest is None else max(newest, d["ts"])
                lines[d["stream"], d["kind"]] += 1
            if recs:
                yield recs
            if len(recs) == FOLLOW_PAGE:
                continue  # more is waiting: read on at once
            now = time.monotonic()
            if info["end_record"] is not None and ended_at is None:
                ended_at, end = now, info["end_record"]
            if end is not None and (_all_lines_read(end, lines) or (
                    not recs and now - ended_at >= settle)):  # type: ignore[operator]
                yield [end]
                return
            if not recs and on_idle is not None:
                on_idle()
            sleep(poll)

    def log(self, run: str, stderr: bool = False, before: str | None = None,
            after: str | None = None, limit: int = LOG_PAGE) -> dict[str, Any]:
        limit = _page_limit(limit)
        with self.session() as st:
            rows, more, ended = st.log_page(run, self.owner, stderr,
                                            parse_cursor(before) if before else None,
                                            parse_cursor(after) if after else None, limit)
        return {"entries": [_entry_json(*r) for r in rows], "more": more, "ended": ended}

    def describe(self, run: str) -> dict[str, Any]:
        with self.session() as st:
            return describe(store_facts(st, run, self.owner))

    def metadata(self, run: str) -> list[dict[str, Any]]:
        with self.session() as st:
            _check_run(st, run, self.owner)
            return st.metadata(run, self.owner)

    def samples(self, run: str) -> list[dict[str, Any]]:
        with self.session() as st:
            _check_run(st, run, self.owner)
            return st.samples(run, self.owner)

    def export_rows(self, run: str, what: str) -> list[dict[str, Any]]:
        with self.session() as st:
            _check_run(st, run, self.owner)
            if what == "lines":
                recs = st.lines(run, owner=self.owner)
            elif what == "metadata":
                recs = st.metadata(run, self.owner)
            elif what == "progress":
                recs = st.progress(run, self.owner)
            else:
                recs = st.samples(run, self.owner)
        return export_rows(what, recs)

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        return answer(self.found(Request.from_dict(request)))

    def found(self, req: Request) -> Found:
        with self.session() as st:
            return st.search(req, self.owner)

    def close(self) -> None:
        pass


_COUNTED = (("line", "lines"), ("metadata", "metadata"), ("command", "commands"))


def _all_lines_read(end: dict[str, Any], read: Counter[tuple[str, str]]) -> bool:
    """Whether a follower has read every line, metadata and command record the run's end
    record counts, per stream."""
    counts = end.get("counts") or {}
    return all(read[s, kind] >= int((counts.get(s) or {}).get(key, 0))
               for s in OUTPUT_STREAMS for kind, key in _COUNTED)


class HeldStore:
    """A ``StoreSession`` for one command: opens the store on the first question and keeps
    it until ``release`` (between a follower's reads) or ``close``. ``available`` is False when
    there is no store to read (an embedded store never created, or its config is root's)."""

    def __init__(self, dsn: str | None, wait: float = 5.0,
                 warn: Callable[[str], None] | None = None):
        self.dsn = dsn
        self.wait = wait
        self.warn = warn
        self._store: Store | None = None
        self._checked: bool | None = None

    @property
    def available(self) -> bool:
        if self._checked is None:
            try:
                self._open()
                self._checked = True
            except LogcaptureError as e:
                from .errors import ConfigError

                if self.warn is not None and not isinstance(e, (NotFound, ConfigError)):
                    self.warn(f"store not read: {e.message}")
                self._checked = False
        return self._checked

    def _open(self) -> Store:
        if self._store is None:
            from .store import open_store

            self._store = open_store(self.dsn, wait=self.wait, must_exist=True)
        return self._store

    def __call__(self) -> AbstractContextManager[Store]:
        return _Borrowed(self._open())

    def release(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    close = release


class _Borrowed(AbstractContextManager[Store]):
    """A held store lent for one question (leaving the block does not close it)."""

    def __init__(self, store: Store):
        self.store = store

    def __enter__(self) -> Store:
        return self.store

    def __exit__(self, *exc: object) -> None:
        return None


# --- the caller's own spool and store ---------------------------------------------------------
def current_user() -> tuple[str, int]:
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name, uid
    except KeyError:
        return str(uid), uid


# --- a spool run's log, paged ----------------------------------------------------------------
def _page_limit(limit: int) -> int:
    return max(1, min(int(limit), LOG_PAGE_MAX))


def _entry_json(ts: float, stream: str, seq: int, kind: str, text: str,
                style: tuple[Any, ...] = ()) -> dict[str, Any]:
    """An entry as the page and the read service carry it: named fields, so a field added
    later (a line number, styles, a rank) breaks no reader. ``style``: a line's colour spans
    ``[start, end, "sgr"]`` (code points, ``logcapture.sgr``), only when it has any."""
    d = {"cursor": cursor_of(ts, stream, seq), "stream": stream, "kind": kind, "text": text,
         "ts": ts}
    if style:
        d["style"] = [list(s) for s in style]
    return d


def _ts_of(raw: bytes) -> int | None:
    """A spool line's time stamp in ns (``logview.cursor_of``'s unit), or None."""
    try:
        return ts_ns(json.loads(raw)["ts"])
    except (ValueError, KeyError, TypeError):
        return None


def _position(lines: list[bytes], ts: int, right: bool = False) -> int:
    """The index of the first line stamped at or after ``ts`` (after it, with ``right``), by
    bisection: a spool is written in time order. Entries of one time stamp (a batch of
    several streams) are ordered by stream and seq, not by place, so callers read whole
    runs of one stamp and filter by cursor."""
    lo, hi = 0, len(lines)
    while lo < hi:
        mid = (lo + hi) // 2
        t = _ts_of(lines[mid])
        if t is None:  # a bad line: decide by a neighbour
            t = next((x for x in map(_ts_of, lines[mid + 1:mid + 8]) if x is not None), ts)
        if t < ts or (right and t == ts):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _edge_ts(lines: list[bytes], last: bool = False) -> int | None:
    """The earliest time stamp among a segment's first lines (the latest among its last):
    the start record, the sampler's records and a batch's notes are stamped a little out of
    the lines' order."""
    stamps = [t for t in map(_ts_of, lines[-8:] if last else lines[:8]) if t is not None]
    return (max(stamps) if last else min(stamps)) if stamps else None


class SpoolRun:
    """The job page's questions of a spool run, without reading the run whole: a page of
    the log is found by bisection in the segment that holds it and read from a window of
    lines there (a 2M-line run's newest page costs a few thousand lines, not two million);
    metadata and samples are found by their kind at the end of each line and parsed alone.
    Closed segments never change: their lines (a few, most recently used) and their metadata
    and samples are kept."""

    KEEP = 3  # decompressed closed segments kept
    PRIME = 8  # lines before a window fed first, so a metadata line's printed twin is known

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._lines: OrderedDict[int, list[bytes]] = OrderedDict()
        self._scanned: dict[int, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        self._ended = False
        self._lock = threading.Lock()

    def _read(self, seg: Segment) -> list[bytes]:
        got = self._lines.get(seg.index) if seg.closed else None
        if got is not None:
            self._lines.move_to_end(seg.index)
            return got
        try:
            lines, _torn = read_lines(seg)  # complete lines only
        except SpoolError:
            return []
        if seg.closed:
            self._lines[seg.index] = lines
            while len(self._lines) > self.KEEP:
                self._lines.popitem(last=False)
        return lines

    def _entries(self, segs: list[Segment], i: int, a: int, b: int) -> list[Entry]:
        """Log entries of lines [a, b) of segment ``segs[i]``, primed by the lines before."""
        lines = self._read(segs[i])
        prime = lines[max(0, a - self.PRIME):a]
        if a < self.PRIME and i > 0:
            prime = self._read(segs[i - 1])[-self.PRIME:] + prime
        view = LogView(stderr=True)
        view.feed(parse_lines("", prime, 0, ReadStats()))
        return view.feed(parse_lines(segs[i].path.name, lines[a:b], a, ReadStats()))

    def _is_ended(self, segs: list[Segment]) -> bool:
        if not self._ended and segs:
            self._ended = any(line.endswith(b'"kind":"end"}')
                              for line in self._read(segs[-1])[-64:])
        return self._ended

    def page(self, stderr: bool, before: str | None, after: str | None,
             limit: int) -> dict[str, Any]:
        with self._lock:
            segs = segments(self.run_dir)
            if after is not None:
                picked, more = self._after(segs, parse_cursor(after), stderr, limit)
            else:
                picked, more = self._before(segs, parse_cursor(before) if before else None,
                                            stderr, limit)
            return {"entries": [_entry_json(*e) for e in picked], "more": more,
                    "ended": self._is_ended(segs)}

    def _keep(self, e: Entry, stderr: bool) -> bool:
        return stderr or e.stream != STDERR

    def _before(self, segs: list[Segment], key: tuple[int, str, int] | None, stderr: bool,
                limit: int) -> tuple[list[Entry], bool]:
        """The newest ``limit`` entries before ``key``: windows read backwards from the last
        line stamped at the cursor's time, until more than ``limit`` are found and the
        earliest line read is older than the page's first entry (so nothing unread can
        belong to the page)."""
        found: list[Entry] = []
        window = 2 * limit
        for i in range(len(segs) - 1, -1, -1):
            lines = self._read(segs[i])
            if key is None:
                end = len(lines)
            else:
                first = _edge_ts(lines)
                if first is not None and first > key[0]:
                    continue
                end = _position(lines, key[0], right=True)
            while end > 0:
                start = max(0, end - window)
                found += [e for e in self._entries(segs, i, start, end)
                          if self._keep(e, stderr) and (key is None or _cursor_key(e) < key)]
                end = start
                if len(found) > limit:
                    found.sort(key=sort_key)
                    del found[:-limit - 1]  # the page, and one before it
                    earliest = _ts_of(lines[start]) if start < len(lines) else None
                    if earliest is not None and earliest < _cursor_key(found[1])[0]:
                        return found[1:], True
        found.sort(key=sort_key)
        return found[-limit:], len(found) > limit

    def _after(self, segs: list[Segment], key: tuple[int, str, int], stderr: bool,
               limit: int) -> tuple[list[Entry], bool]:
        """The oldest ``limit`` entries after ``key``, read forwards likewise."""
        found: list[Entry] = []
        window = 2 * limit
        for i, seg in enumerate(segs):
            lines = self._read(seg)
            last = _edge_ts(lines, last=True)
            if last is not None and last < key[0]:
                continue
            start = _position(lines, key[0])
            while start < len(lines):
                end = min(len(lines), start + window)
                found += [e for e in self._entries(segs, i, start, end)
                          if self._keep(e, stderr) and _cursor_key(e) > key]
                start = end
                if len(found) > limit:
                    found.sort(key=sort_key)
                    del found[limit + 1:]
                    latest = _ts_of(lines[end - 1])
                    if latest is not None and latest > _cursor_key(found[limit - 1])[0]:
                        return found[:limit], True
        found.sort(key=sort_key)
        return found[:limit], len(found) > limit

    def _scan(self, seg: Segment) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The metadata and sample records of one segment (kept once it is closed)."""
        got = self._scanned.get(seg.index) if seg.closed else None
        if got is not None:
            return got
        try:
            found = lines_of_kinds(seg, ("metadata", "sample"))
        except SpoolError:
            return [], []
        meta = [r.to_dict() for r in parse_lines(seg.path.name, found["metadata"], 0,
                                                 ReadStats())]
        samples = [r.to_dict() for r in parse_lines(seg.path.name, found["sample"], 0,
                                                    ReadStats())]
        if seg.closed:
            self._scanned[seg.index] = (meta, samples)
        return meta, samples

    def progress(self) -> list[dict[str, Any]]:
        """Progress records, in spool order."""
        out: list[dict[str, Any]] = []
        for seg in segments(self.run_dir):
            try:
                found = lines_of_kinds(seg, ("progress",))
            except SpoolError:
                continue
            out += [r.to_dict() for r in parse_lines(seg.path.name, found["progress"], 0,
                                                     ReadStats())]
        return out

    def metadata(self) -> list[dict[str, Any]]:
        """Metadata records, newest first (as ``Reader.metadata``)."""
        with self._lock:
            out = [d for seg in segments(self.run_dir) for d in self._scan(seg)[0]]
        return out[::-1]

    def samples(self) -> list[dict[str, Any]]:
        with self._lock:
            return [d for seg in segments(self.run_dir) for d in self._scan(seg)[1]]


def _cursor_key(e: Entry) -> tuple[int, str, int]:
    return ts_ns(e.ts), e.stream, e.seq


class LocalReader:
    """The Reader over a spool root and a store, as the user running it: their own runs only
    (root reads every run it can open). ``source``: ``auto`` reads a run from the store once
    the spool has shipped all of it (or no longer has it), else from the spool; ``spool`` and
    ``store`` force one. ``remote``: where "the store" is asked instead (the read service's
    ``ServiceReader`` on a cluster's login node)."""

    def __init__(self, spool_root: Path, dsn: str | None = None, source: str = "auto",
                 warn: Callable[[str], None] | None = None, store_wait: float = 5.0,
                 remote: Reader | None = None):
        self.root = spool_root
        self.source = source
        self.user, self.uid = current_user()
        self.owner: str | None = None if self.uid == 0 else self.user
        self.held = HeldStore(dsn, wait=store_wait, warn=warn)
        self.remote = remote
        self.store: Reader = (remote if remote is not None
                              else StoreReader(self.held, self.owner))
        self._where: dict[str, Path | None] = {}  # run id -> its spool dir, None: the store
        self._cache: dict[Path, SpoolRun] = {}  # spool runs asked of, read on as they grow

    # where a run lives
    def _mine(self, run_dir: Path) -> tuple[str, int] | None:
        """The run's trusted owner (``ship.trusted_identity``), or None when it is not the
        caller's."""
        from .ship import trusted_identity

        try:
            ident = trusted_identity(run_dir)
        except (OSError, LogcaptureError):
            return None
        if self.owner is not None and ident.uid != self.uid:
            return None
        return ident.user, ident.uid

    def owns(self, run_dir: Path) -> bool:
        """Whether the spool run ``run_dir`` is the caller's (``runs`` lists only those)."""
        return self._mine(run_dir) is not None

    def spool_dir(self, run: str) -> Path | None:
        """The spool directory ``run`` is read from; None when it is read from the store."""
        return self._dir(run)

    def _spool_run(self, ref: str | None) -> Path | None:
        if self.source == "store":
            return None
        try:
            run_dir = find_run(self.root, ref)
        except NotFound:
            return None
        return run_dir if self._mine(run_dir) is not None else None

    def _in_store(self) -> bool:
        if self.source == "spool":
            return False
        return self.remote is not None or self.held.available

    def _resolve_job(self, ref: str) -> str:
        """A Slurm job reference (``jobref``) among the caller's runs in the spool and the
        store together: an array's tasks or a requeued job's runs may be in both. A run is
        read from the spool until it is shipped, as ``resolve`` does."""
        found: dict[str, Any] = {}
        live: dict[str, Path] = {}  # in the spool, not shipped (or --source spool)
        shipped: dict[str, Path] = {}
        if self.source != "store":
            run_dirs = {d.name: d for d in find_run_dirs(self.root)}
            for c in jobref.select(ref, job_candidates(list(run_dirs.values()), ref)):
                run_dir = run_dirs[str(c["run"])]
                if self._mine(run_dir) is None:
                    continue
                found[run_dir.name] = c
                if self.source == "spool" or not is_shipped(run_dir):
                    live[run_dir.name] = run_dir
                else:
                    shipped[run_dir.name] = run_dir
        stored: set[str] = set()
        if self._in_store():
            for d in self._store_candidates(ref):
                if d["run"] not in live:
                    found[d["run"]] = d
                    stored.add(d["run"])
        run = jobref.choose(ref, found.values())
        self._where[run] = live.get(run) or (None if run in stored else shipped.get(run))
        return run

    def _store_candidates(self, ref: str) -> list[dict[str, Any]]:
        """Summaries of the caller's runs in the store that job reference ``ref`` may name."""
        if isinstance(self.store, StoreReader):
            with self.held() as st:
                return [summary_of_store(r) for r in st.runs(self.owner, job=ref)]
        return [dict(d) for d in jobref.select(ref, self.store.runs())]

    def resolve(self, ref: str | None) -> str:
        if ref is None or ref == "latest":  # the newest run, wherever it is
            # (a job's, not one of its tasks, which start after it: `ls JOB` lists those)
            everything = self._runs(insights=False)
            newest = [d for d in everything if not jobref.is_task(d)] or everything
            if newest:
                ref = newest[0]["run"]
        if ref is not None and jobref.parse(ref) is not None:
            return self._resolve_job(ref)
        run_dir = self._spool_run(ref)
        if run_dir is not None and (self.source == "spool" or not is_shipped(run_dir)):
            self._where[run_dir.name] = run_dir
            return run_dir.name
        if self._in_store():
            name = run_dir.name if run_dir is not None else ref
            try:
                run = self.store.resolve(name)
                self._where[run] = None
                return run
            except NotFound:
                pass
        if run_dir is not None:
            self._where[run_dir.name] = run_dir
            return run_dir.name
        where = f"{self.root}" + (" or in the store" if self.source != "spool" else "")
        if ref is None or ref == "latest":
            raise NotFound(f"no runs in {where}")
        raise NotFound(f"no run {ref!r}: not in {self.root}"
                       + (" and not in the store" if self.source != "spool" else "")
                       + " (see `logcapture ls`)")

    def _dir(self, run: str) -> Path | None:
        if run not in self._where:
            self.resolve(run)
        return self._where.get(run)

    # the questions
    def runs(self) -> list[dict[str, Any]]:
        return self._runs()

    def _runs(self, insights: bool = True) -> list[dict[str, Any]]:
        """The summaries; without ``insights``, a spool run's are only those its End record
        says (enough to find the newest run)."""
        out = []
        if self.source != "store":
            thresholds = admin_thresholds()
            for run_dir in find_run_dirs(self.root):
                who = self._mine(run_dir)
                if who is None:
                    continue
                try:
                    s = summarize(run_dir)
                except SpoolError:
                    continue
                if s.state != "EMPTY":
                    out.append(summary_of_spool(s, *who, run_dir if insights else None,
                                                thresholds))
        if self._in_store():
            known = {d["run"] for d in out}
            out += [d for d in self.store.runs() if d["run"] not in known]
        return newest_first(out)

    def lines(self, run: str, stream: str | None = None, tail: int | None = None
              ) -> list[dict[str, Any]]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.lines(run, stream, tail)
        out = []
        for rec in iter_run(run_dir):
            if isinstance(rec, (Line, Command, Note, Metadata)) and (
                    stream is None and rec.stream in (*OUTPUT_STREAMS, "run")
                    or rec.stream == stream):
                out.append(rec.to_dict())
        if stream is None:  # both streams and the run's notes, by read time (as the store)
            out.sort(key=lambda d: d["ts"])
        return out[-tail:] if tail else out

    def follow(self, run: str) -> Iterator[dict[str, Any]]:
        run_dir = self._dir(run)
        if run_dir is not None:
            for rec in follow_records(run_dir):
                yield rec.to_dict()
            return
        if self.remote is not None:
            yield from self.remote.follow(run)
            return
        self.held.release()  # the store is opened for each read: others take turns
        session = _Reopened(self.held)
        yield from StoreReader(session, self.owner).follow(run)

    def summary(self, run: str) -> dict[str, Any]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.summary(run)
        who = self._mine(run_dir) or (self.user, self.uid)
        return summary_of_spool(summarize(run_dir), *who, run_dir)

    def log(self, run: str, stderr: bool = False, before: str | None = None,
            after: str | None = None, limit: int = LOG_PAGE) -> dict[str, Any]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.log(run, stderr, before, after, limit)
        return self._cached(run_dir).page(stderr, before, after, _page_limit(limit))

    def _cached(self, run_dir: Path) -> SpoolRun:
        cached = self._cache.get(run_dir)
        if cached is None:
            cached = self._cache[run_dir] = SpoolRun(run_dir)
        return cached

    def describe(self, run: str) -> dict[str, Any]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.describe(run)
        who = self._mine(run_dir) or (self.user, self.uid)
        return describe(spool_facts(run_dir, *who))

    def metadata(self, run: str) -> list[dict[str, Any]]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.metadata(run)
        return self._cached(run_dir).metadata()

    def samples(self, run: str) -> list[dict[str, Any]]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.samples(run)
        return self._cached(run_dir).samples()

    def export_rows(self, run: str, what: str) -> list[dict[str, Any]]:
        if what not in EXPORTS:
            from .errors import UsageError

            raise UsageError(f"--what must be lines, metadata, samples or progress, not {what!r}")
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.export_rows(run, what)
        recs = (self.lines(run) if what == "lines" else
                self._cached(run_dir).progress() if what == "progress" else
                self.metadata(run) if what == "metadata" else self.samples(run))
        return export_rows(what, recs)

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        """Shipped runs are searched in the store, the others in the spool (all in one,
        with ``source``), and the newest matches of both kept."""
        req = Request.from_dict(request)
        for ref in req.jobs:
            self.resolve(ref)  # NotFound names a job that is none of the caller's
        if self.remote is not None and self.source != "spool":
            # The read service searches the store as the caller; this machine's spool is not
            # added (on a login node there is none: a running job's lines are found once its
            # node's agent has shipped them).
            return self.remote.search(request)
        found = []
        if self._in_store():
            assert isinstance(self.store, StoreReader)  # no remote: the caller's own store
            found.append(self.store.found(req))
        if self.source != "store":
            found.append(self._spool_found(req, skip_shipped=self._in_store()))
        return answer(merge(found, req.limit))

    def _spool_found(self, req: Request, skip_shipped: bool) -> Found:
        """The search over the caller's runs in the spool (those not yet shipped when
        ``skip_shipped``), with the same pattern as the store's (``search.Pattern``)."""
        pattern = Pattern.parse(req.pattern, req.regex)
        hits: list[Hit] = []
        runs: dict[tuple[str, str], dict[str, Any]] = {}
        for run_dir in find_run_dirs(self.root):
            who = self._mine(run_dir)
            if who is None or skip_shipped and is_shipped(run_dir):
                continue
            try:
                s = summarize(run_dir)
            except SpoolError:
                continue
            summary = summary_of_spool(s, *who)
            if req.states and s.state not in req.states or req.jobs and not (
                    {s.run_id, summary["job_id"], _array_ref(summary["slurm"])}
                    & set(req.jobs)):
                continue
            mine = _search_run(run_dir, pattern, req, who[0])
            if mine:
                hits += mine
                runs[(s.run_id, who[0])] = {
                    "run": s.run_id, "owner": who[0], "job_id": summary["job_id"],
                    "name": summary["slurm"].get("job_name") or " ".join(summary["command"]),
                    "state": s.state, "start": summary["start"], "source": "spool"}
        return merge([Found(hits, runs, False)], req.limit)

    def close(self) -> None:
        self.held.close()
        if self.remote is not None:
            self.remote.close()


class _Reopened:
    """A ``StoreSession`` that opens the held store for one read and closes it after."""

    def __init__(self, held: HeldStore):
        self.held = held

    def __call__(self) -> AbstractContextManager[Store]:
        return _OpenClose(self.held)


class _OpenClose(AbstractContextManager[Store]):
    def __init__(self, held: HeldStore):
        self.held = held

    def __enter__(self) -> Store:
        return self.held._open()

    def __exit__(self, *exc: object) -> None:
        self.held.release()


def _array_ref(slurm: dict[str, Any]) -> str:
    """``J_T`` for an array task (as ``runs.find_run`` takes it), else ''."""
    if slurm.get("array_job_id") and slurm.get("array_task_id") is not None:
        return f"{slurm['array_job_id']}_{slurm['array_task_id']}"
    return ""


def _search_run(run_dir: Path, pattern: Pattern, req: Request, owner: str) -> list[Hit]:
    """One spool run's matching lines, each with its context in its stream."""
    streams: dict[str, list[dict[str, Any]]] = {}
    for rec in iter_run(run_dir):
        if isinstance(rec, (Line, Command)) and rec.stream in OUTPUT_STREAMS and (
                req.stream is None or rec.stream == req.stream):
            streams.setdefault(rec.stream, []).append(
                {"stream": rec.stream, "seq": rec.seq, "ts": rec.ts, "text": rec.text})
    hits = []
    for lines in streams.values():
        for i, d in enumerate(lines):
            if (req.since is None or d["ts"] > req.since) and (
                    req.until is None or d["ts"] <= req.until) and pattern.matches(d["text"]):
                hits.append(Hit(run_dir.name, owner, line_of(d),
                                *context_of(lines, i, req.context)))
    return hits


def records_of(dicts: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> Iterator[Any]:
    """Records from record dicts (for printing): ``records.from_dict`` of each."""
    for d in dicts:
        yield from_dict(d)
