"""What ``logcapture show`` prints for a run, whatever its source: ``describe(RunFacts)``, the
one place that builds it, from the facts the spool (``spool_facts``: one pass over its
records) or the store (``store_facts``: its counts, without reading every line) supply.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from .. import jobref
from ..insights import Diagnoser, run_insights
from ..insights.efficiency import admin_thresholds
from ..insights.report import store_insights
from ..logview import numbered_evidence
from ..progress import bars as progress_bars
from ..records import (
    NOTE_BLANK,
    NOTE_MODE,
    NOTE_REPEAT,
    NOTE_WARNING,
    OUTPUT_STREAMS,
    Command,
    End,
    Line,
    Metadata,
    Note,
    Progress,
    Sample,
    Start,
    redactions_by_kind,
    streams_of,
)
from ..runs import line_numbers
from ..spool.reading import ReadStats, iter_run
from ..store import Store, redact


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
    metadata: list[dict[str, Any]]  # metadata record dicts in time order
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
    from ..sampling.summary import summarize as summarize_samples
    from ..xaxis import choose_x_axis_of_records

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
    info["x_axis"] = choose_x_axis_of_records(facts.metadata)
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
    metadata: list[dict[str, Any]] = []  # record dicts; stream order is time order
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
            metadata.append(rec.to_dict())
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
    insights = run_insights(diagnoser, start, end, samples, metadata=metadata,
                            thresholds=admin_thresholds(), missing_segments=len(unread))
    return RunFacts(run_dir.name, owner, uid, start, end, dict(lines), dict(repeats),
                    dict(blanks), commands, modes, sorted(keys), metadata, samples, warnings,
                    spool_problems=problems, insights=numbered_evidence(
                        [i.to_dict() for i in insights],
                        lambda keys: line_numbers(run_dir, keys)),
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
        t["commands"], t["modes"], t["metadata_keys"], metadata,
        samples, sum(r[3] for r in notes if r[1] == NOTE_WARNING),
        stored_in=redact(st.dsn),
        insights=numbered_evidence(
            store_insights(st, run, info["start_record"], info["end_record"], samples, owner),
            lambda keys: st.line_numbers(run, owner, keys)),
        progress=st.progress(run, owner))

