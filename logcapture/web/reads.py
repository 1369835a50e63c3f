"""What the pages show, asked of a ``query.Reader`` (the read layer of ``ls``, ``logs``,
``show`` and ``export``), so the page shows exactly what that user may read, from wherever
the CLI reads it. This module only shapes the Reader's answers for drawing (tables, graph
columns); it reads nothing itself.

The Reader is one object used by one request at a time (``Pages`` holds a lock): an embedded
store is one process's, and the Reader keeps it open between questions; ``release_idle``
lets it go as soon as another process waits for it (``upload`` or ``export`` in another
shell, the agent) or after a quiet spell. Not after every pause between two clicks: each
opening starts the engine anew, which leaves threads and descriptors behind in the process
(docs/admin.md, "Long-lived processes start afresh in place").
"""

from __future__ import annotations

import io
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import UsageError
from ..store import EXPORTS, write_rows
from ..summary_row import summary_row
from ..xaxis import (
    LEVEL_NAMES,
    choose_x_axis,
    is_number,
    key_levels,
    own_ranks,
    series_of_records,
)

RUN_REF = re.compile(r"[A-Za-z0-9._-]{1,128}")
FORMATS = {"csv": "text/csv", "ndjson": "application/x-ndjson",
           "parquet": "application/vnd.apache.parquet"}
METADATA_TABLE_ROWS = 5000
IDLE_RELEASE = 60.0  # seconds without a question before the Reader lets its store go

GPU_METRICS = ("utilization_gpu_percent", "memory_used_bytes", "power_watts",
               "temperature_celsius")
JOB_METRICS = ("cpu_percent", "memory_rss_bytes")


def check_ref(ref: str) -> str:
    """A run reference as users type them (run id, job id, ``J_T``); anything else is refused
    before it reaches a reader."""
    if not RUN_REF.fullmatch(ref):
        raise UsageError(f"not a run id or job id: {ref[:80]!r}")
    return ref


class Pages:
    """The pages' questions, each answered under one lock from one Reader."""

    def __init__(self, reader: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.reader = reader
        self._lock = threading.Lock()
        self._clock = clock
        self._last = clock()

    def _ask(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            try:
                return fn(*args)
            finally:
                self._last = self._clock()

    def release_idle(self) -> None:
        with self._lock:
            wanted = getattr(self.reader, "store_wanted", None)
            if self._clock() - self._last > IDLE_RELEASE or (wanted is not None and wanted()):
                self.reader.close()

    def close(self) -> None:
        with self._lock:
            self.reader.close()

    def resolve(self, ref: str) -> str:
        return self._ask(self.reader.resolve, check_ref(ref))

    def runs(self) -> list[dict[str, Any]]:
        return [run_row(s) for s in self._ask(self.reader.runs)]

    def array(self, job: str) -> dict[str, Any]:
        """The array job ``job``'s tasks by state and first insight (``arrays``, as ``ls
        JOB`` ends with), each group with its runs, so the runs page can list them."""
        from .. import jobref
        from ..arrays import first_insight, summary_for, summary_text

        found = jobref.select(job, self._ask(self.reader.runs))
        summary = summary_for(job, found)
        if summary is None:
            raise jobref.not_found(job) if not found else UsageError(
                f"{job[:40]!r} is not an array job")
        latest = jobref.latest_runs(found)
        for group in summary["states"]:
            members = [s for s in found if s["run"] in latest and s.get("rank") is None
                       and s.get("state") == group["state"]]
            group["runs"] = [s["run"] for s in members]
            for i in group["insights"]:
                i["runs"] = [s["run"] for s in members if first_insight(s) == i["kind"]]
        return {**summary, "text": summary_text(summary)}

    def search(self, params: Mapping[str, str]) -> dict[str, Any]:
        """``logcapture search`` from the runs page: the query string's ``q`` (the pattern),
        ``regex``, ``context``, ``limit``, ``since`` (an age such as ``7d``), ``state`` and
        ``stream``, asked of the Reader (the caller's own lines only); each line carries the
        job page's cursor for it (``/job/RUN?at=CURSOR`` opens the log there)."""
        from ..logview import cursor_of
        from ..search import Request, parse_when

        def whole(name: str, default: int) -> int:
            try:
                return int(params.get(name) or default)
            except ValueError:
                raise UsageError(f"{name} must be a whole number") from None

        since = params.get("since") or None
        req = Request(
            params.get("q", ""), params.get("regex", "0") in ("1", "true", "on"), (),
            parse_when(since, "since") if since else None, None,
            params.get("stream") or None,
            tuple(x for x in (params.get("state") or "").upper().split(",") if x),
            whole("context", 0), whole("limit", 100)).checked()
        found = self._ask(self.reader.search, req.to_dict())
        for g in found["groups"]:
            for d in g["lines"]:
                d["cursor"] = cursor_of(d["ts"], d["stream"], d["seq"])
        return found

    def header(self, ref: str) -> dict[str, Any]:
        run = self.resolve(ref)
        summary = self._ask(self.reader.summary, run)
        if summary["state"] == "EMPTY":  # nothing written yet but its directory: starting
            summary = {**summary, "state": "RUNNING"}
        return header(summary, self._ask(self.reader.samples, run))

    def insights(self, ref: str) -> dict[str, Any]:
        """The run's insights, as ``logcapture show`` lists them (query.describe): asked only
        of a run that has some to show (its summary's ``insights``, the kinds ``show`` lists),
        since the spool's answer reads the whole run; of a job with task runs, the job's
        across its ranks (``jobview.describe_job``)."""
        from ..jobview import describe_job, task_runs

        run = self.resolve(ref)
        if self._ask(task_runs, self.reader, run):  # a job's ranks: show JOB's answer
            return {"run": run, "insights": self._ask(
                lambda: describe_job(self.reader, run, self.reader.describe(run), {0})
                )["insights"]}
        summary = self._ask(self.reader.summary, run)
        if not summary or not summary.get("insights"):
            return {"run": run, "insights": []}
        return {"run": run, "insights": self._ask(self.reader.describe, run)["insights"]}

    def log(self, ref: str, stderr: bool, before: str | None, after: str | None,
            limit: int, line: int | None = None) -> dict[str, Any]:
        run = self.resolve(ref)
        page = self._ask(self.reader.log, run, stderr, before, after, limit, line)
        return {"run": run, **page}

    def tasks(self, ref: str) -> dict[str, Any]:
        """The tasks of the job ``ref`` names (``rankview.tasks_of``; none for a run)."""
        from ..rankview import tasks_of

        return {"tasks": self._ask(tasks_of, self.reader, check_ref(ref))}

    def job_log(self, ref: str, ranks: str, nodes: str, limit: int,
                line: int | None = None) -> dict[str, Any]:
        """The log of a job of several ranks (``rankview.page``): its chosen ranks and nodes
        merged, labelled, folded and numbered; ``line``: around that line (``#L``)."""
        from ..rankview import page

        return self._ask(page, self.reader, check_ref(ref), ranks, nodes, limit, line)

    def metadata(self, ref: str, rank: str | None = None) -> dict[str, Any]:
        """The run's metadata; of a job with task runs (``jobview``), the metadata of the
        ranks ``rank`` names (default 0; ``all``; ``0-3``), each row with its rank, one
        series per rank, and ``ranks``: the job's ranks. A run without task runs whose rows
        stood behind launchers' labels that name series is chosen from the same way
        (``jobview.labelled_rows``), by default the lowest rank when no rank 0 printed any;
        ``rank``: the choice made."""
        from ..jobview import chosen_ranks, job_records, labelled_rows, task_runs

        run = self.resolve(ref)
        tasks = self._ask(task_runs, self.reader, run)
        wanted = chosen_ranks([rank] if rank else [])
        if not tasks:
            rows = self._ask(self.reader.metadata, run)[::-1]
            picked, numbers = labelled_rows(rows, wanted)
            if not numbers:
                return metadata(rows)
            if not rank and 0 not in numbers:  # no rank 0 printed any: the lowest that did
                rank = str(numbers[0])
                picked, _ = labelled_rows(rows, {numbers[0]})
            return {**metadata(picked), "ranks": numbers, "rank": rank or "0"}
        picked = [t for t in tasks if wanted is None or t["rank"] in wanted]
        out = metadata(self._ask(job_records, self.reader, picked, "metadata"))
        return {**out, "ranks": sorted({int(t["rank"]) for t in tasks}), "rank": rank or "0"}

    def progress(self, ref: str) -> dict[str, Any]:
        from .progress import progress_graphs

        return progress_graphs(self._ask(self.reader.export_rows, self.resolve(ref), "progress"))

    def resources(self, ref: str) -> dict[str, Any]:
        return resources(self._ask(self.reader.samples, self.resolve(ref)))

    def export(self, ref: str, what: str, fmt: str) -> tuple[bytes, str, str]:
        """The bytes of ``logcapture export RUN --what WHAT --format FMT``, a file name and its
        media type."""
        if what not in EXPORTS:
            raise UsageError(f"what must be lines, metadata, samples or progress, not "
                             f"{what[:40]!r}")
        if fmt not in FORMATS:
            raise UsageError(f"format must be csv, ndjson or parquet, not {fmt[:40]!r}")
        run = self.resolve(ref)
        out = io.BytesIO()
        write_rows(self._ask(self.reader.export_rows, run, what), fmt, out)
        return out.getvalue(), f"{run}-{what}.{fmt}", FORMATS[fmt]

    def compare(self, refs: Iterable[str], key: str) -> dict[str, Any]:
        runs = []
        for ref in refs:
            run = self.resolve(ref)
            rows = self._ask(self.reader.metadata, run)[::-1]
            runs.append(compare_one(self._ask(self.reader.summary, run), rows, key))
        return {"key": key, "runs": runs}


# --------------------------------------------------------------------------- answers


def run_row(s: Mapping[str, Any]) -> dict[str, Any]:
    """A run summary (``query.SUMMARY_KEYS``) as the runs page lists it: its name, exit,
    duration and state as every reader shows them (``summary_row``)."""
    slurm = s.get("slurm") or {}
    row = summary_row(s)
    return {"run": s["run"], "job_id": s.get("job_id") or "", "name": row["name"],
            "job_name": slurm.get("job_name") or "", "command": " ".join(s.get("command") or ()),
            "user": s.get("owner") or "", "state": row["state"], "exit": row["exit"],
            "start": s.get("start"), "duration": row["duration"], "nodes": s.get("host") or "",
            "source": s.get("source", ""), "array_job_id": str(slurm.get("array_job_id") or ""),
            "array_task_id": str(slurm.get("array_task_id") or "")}


def header(summary: Mapping[str, Any], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The job page's header: the Grafana job header's fields (nodes: those that sent
    samples, else the start host; GPUs: distinct GPU UUIDs sampled) and a few more."""
    row = run_row(summary)
    nodes = sorted({s["node"] for s in samples if s.get("node")})
    uuids = {g.get("uuid") for s in samples for g in s.get("gpus") or ()
             if isinstance(g, dict) and g.get("uuid")}
    row["nodes"] = ", ".join(nodes) if nodes else row["nodes"]
    row["gpus"] = len(uuids)
    row["running"] = summary["state"] == "RUNNING"
    row["redactions"] = summary.get("redactions")  # None until the run has ended
    return row


def _column(fields: list[dict[str, Any]], key: str) -> list[Any]:
    return [v if is_number(v := f.get(key)) else None for f in fields]


def whose(row: Mapping[str, Any], own: int | None, label: str) -> str:
    """Whose a metadata row is, as its graph series names it: its launcher's ``label`` where
    labels name series (``xaxis.own_labels``: ``rank 1``, ``local rank 1``), after its task's
    rank when it has one (``rank 0, local rank 1``: each node's torchrun has a local rank 1);
    else its ``own`` rank where that names a series within its run (``xaxis.own_ranks``);
    else its task's ``rank``; "" for none. As Grafana's job dashboard names them
    (``grafana.dashboards._series``)."""
    task = "" if row.get("rank") is None else f"rank {row['rank']}"
    if label:
        return f"{task}, {label}" if task else label
    return f"rank {own}" if own is not None else task


def series_name(key: str, who: str) -> str:
    """A graph series' name: ``key`` of the rows of no one's, ``loss (rank 1)`` of rank 1's."""
    return f"{key} ({who})" if who else key


def _whose_order(who: str) -> list[Any]:
    """Series of one key: no one's first, then by name, numbers as numbers (``rank 2`` before
    ``rank 10``)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", who)]


def metadata(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """From metadata records in time order: the table (newest first) and the graphs: every
    numeric key by time, and by the X key the rule picks, with why. Records of a job's task
    runs (with ``rank``, ``jobview.job_records``): the rule per rank, one series per key and
    rank (``loss (rank 1)``), each table row with its rank. A row's launcher label, or its
    own ``rank`` where that names a series within its run (``xaxis``: workers sharing one
    terminal), names its graph series in place of its task's (``whose``); each table row has
    its ``label`` when any row has one."""
    fields = [dict(r["fields"]) for r in rows]
    series = series_of_records(rows)
    levels = key_levels(fields, series)
    x_key = choose_x_axis(fields, series)
    columns: dict[str, None] = {}
    for f in fields:
        columns.update(dict.fromkeys(f))
    ranks = sorted({r["rank"] for r in rows if r.get("rank") is not None})
    labelled = any(r.get("label") for r in rows)
    drawn = [whose(r, own, label) for r, own, (_, _, label) in zip(
        rows, own_ranks(fields), series, strict=True)]
    # One graph series per key and rank, None in the rows of the other ranks.
    named = [{series_name(k, n): v for k, v in f.items()} for f, n in zip(fields, drawn,
                                                                         strict=True)]
    plotted = {(k, n) for f, n in zip(fields, drawn, strict=True) for k, v in f.items()
               if k in levels and is_number(v)}
    of_key = {series_name(k, n): k for k, n in sorted(
        plotted, key=lambda kn: (kn[0], _whose_order(kn[1])))}
    keys = list(of_key)
    by_x = None
    if x_key is not None:
        xs = [r["fields"].get(x_key) for r in rows]
        pairs = sorted(((x, i) for i, x in enumerate(xs) if is_number(x)))
        ordered = [named[i] for _, i in pairs]
        by_x = {"key": x_key, "because": LEVEL_NAMES[levels[x_key]],
                "x": [x for x, _ in pairs],
                "series": {k: _column(ordered, k) for k in keys if of_key[k] != x_key}}
    newest = rows[::-1][:METADATA_TABLE_ROWS]
    return {"columns": list(columns), "total": len(rows),
            "rows": [{"ts": r["ts"], "seq": r["seq"], "fields": r["fields"],
                      **({"rank": r.get("rank")} if ranks else {}),
                      **({"label": r.get("label") or ""} if labelled else {})}
                     for r in newest],
            "keys": keys, "by_x": by_x,
            "by_time": {"x": [r["ts"] for r in rows],
                        "series": {k: _column(named, k) for k in keys}}}


def resources(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per node: sample times, each GPU's utilisation, memory, power and temperature, and the
    job's CPU and memory, as columns aligned on the times (None where a value is missing)."""
    nodes: dict[str, dict[str, Any]] = {}
    for s in samples:
        n = nodes.setdefault(s["node"], {"t": [], "gpus": {},
                                         "job": {m: [] for m in JOB_METRICS}})
        i = len(n["t"])
        n["t"].append(s["ts"])
        job = s.get("job") or {}
        for m in JOB_METRICS:
            n["job"][m].append(job.get(m) if is_number(job.get(m)) else None)
        for g in s.get("gpus") or ():
            if not isinstance(g, dict):
                continue
            label = f"GPU {g.get('index', '?')} {g.get('name', '')}".strip()
            series = n["gpus"].setdefault(label, {m: [] for m in GPU_METRICS})
            for m in GPU_METRICS:
                col = series[m]
                col.extend([None] * (i - len(col)))
                col.append(g.get(m) if is_number(g.get(m)) else None)
    for n in nodes.values():
        for series in n["gpus"].values():
            for col in series.values():
                col.extend([None] * (len(n["t"]) - len(col)))
    return {"nodes": nodes}


def compare_one(summary: Mapping[str, Any], rows: list[dict[str, Any]], key: str
                ) -> dict[str, Any]:
    """One run's side of the compare graphs: ``key`` by the run's own X axis and by seconds
    since the run started."""
    fields = [dict(r["fields"]) for r in rows]
    series = series_of_records(rows)
    levels = key_levels(fields, series)
    x_key = choose_x_axis(fields, series)
    start = summary.get("start")
    t0 = start if start is not None else (rows[0]["ts"] if rows else 0.0)
    return {"run": summary["run"], "job_name": (summary.get("slurm") or {}).get("job_name", ""),
            "x_key": x_key, "because": LEVEL_NAMES[levels[x_key]] if x_key else None,
            "keys": sorted(levels),
            "by_time": [(r["ts"] - t0, f[key]) for r, f in zip(rows, fields, strict=True)
                        if is_number(f.get(key))],
            "by_x": sorted((f[x_key], f[key]) for f in fields
                           if x_key and is_number(f.get(x_key)) and is_number(f.get(key)))}
