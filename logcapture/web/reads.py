"""What the page asks of a user's runs, answered from their spool (runs not yet shipped) and
their store (the rest), the way ``logcapture ls/logs/show/export`` read them.

Every answer is plain JSON-able data. A run's log is paged by cursor: the entries of
logview (the rules every log reader follows), ordered by ``(ts, stream, seq)``; a cursor is
``"<ts in ns>:<stream>:<seq>"``, opaque to the browser.
"""

from __future__ import annotations

import io
import re
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import NotFound, SpoolError, UsageError
from ..logview import Entry, LogView, entry_from_row, log_sql, metadata_text, sort_key
from ..records import STDERR, End, Metadata, Record, Sample, Start
from ..runs import SpoolTail, find_run, summarize
from ..ship import is_shipped
from ..spool import find_run_dirs
from ..store import export_rows, open_store, write_rows
from ..xaxis import LEVEL_NAMES, choose_x_axis, is_number, key_levels

RUN_REF = re.compile(r"[A-Za-z0-9._-]{1,128}")
EXPORTS = {"lines", "metadata", "samples"}
FORMATS = {"csv": "text/csv", "ndjson": "application/x-ndjson",
           "parquet": "application/vnd.apache.parquet"}
MAX_PAGE = 5000
METADATA_TABLE_ROWS = 5000

GPU_METRICS = ("utilization_gpu_percent", "memory_used_bytes", "power_watts",
               "temperature_celsius")
JOB_METRICS = ("cpu_percent", "memory_rss_bytes")


def check_ref(ref: str) -> str:
    if not RUN_REF.fullmatch(ref):
        raise UsageError(f"not a run id or job id: {ref[:80]!r}")
    return ref


def cursor_of(e: Entry) -> str:
    return f"{round(e.ts * 1e9)}:{e.stream}:{e.seq}"


def parse_cursor(cursor: str) -> tuple[int, str, int]:
    try:
        ns, stream, seq = cursor.split(":")
        return int(ns), stream, int(seq)
    except ValueError:
        raise UsageError(f"bad cursor {cursor[:80]!r}") from None


def _ns_key(e: Entry) -> tuple[int, str, int]:
    return (round(e.ts * 1e9), e.stream, e.seq)


def entry_json(e: Entry) -> list[Any]:
    return [cursor_of(e), e.stream, e.kind, e.text, e.ts]


# --------------------------------------------------------------------------- one run


class RunData:
    """Everything the page shows of one run, in the spool's or the store's words: start and
    end records (dicts), log entries, metadata rows in time order, samples."""

    def __init__(self, run: str, source: str) -> None:
        self.run = run
        self.source = source
        self.start: dict[str, Any] | None = None
        self.end: dict[str, Any] | None = None

    # Subclasses: log_page, metadata_rows, sample_rows, refresh.
    def refresh(self) -> None: ...

    def log_page(self, stderr: bool, before: str | None, after: str | None,
                 limit: int) -> tuple[list[Entry], bool]:
        raise NotImplementedError

    def metadata_rows(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def sample_rows(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def line_rows(self) -> list[dict[str, Any]]:
        raise NotImplementedError


class SpoolRun(RunData):
    """A run read from the spool, kept in memory and read on incrementally (a running job)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir.name, "spool")
        self._tail = SpoolTail(run_dir)
        self._view = LogView(stderr=True)
        self._entries: list[Entry] = []  # sorted by sort_key
        self._keys: list[tuple[int, str, int]] = []  # their cursors' keys, same order
        self._records: list[dict[str, Any]] = []  # lines, commands, notes, metadata
        self._metadata: list[dict[str, Any]] = []
        self._samples: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.refresh()

    def refresh(self) -> None:
        with self._lock:
            if self._tail.ended and self.end is not None:
                return
            self._add(self._tail.read())

    def _add(self, records: list[Record]) -> None:
        new = self._view.feed(records)
        for rec in records:
            if isinstance(rec, Start):
                self.start = rec.to_dict()
            elif isinstance(rec, End):
                self.end = rec.to_dict()
            elif isinstance(rec, Sample):
                self._samples.append(rec.to_dict())
            else:
                if isinstance(rec, Metadata):
                    self._metadata.append(rec.to_dict())
                self._records.append(rec.to_dict())
        if not new:
            return
        if self._entries and sort_key(new[0]) < sort_key(self._entries[-1]):
            self._entries.extend(new)
            self._entries.sort(key=sort_key)
            self._keys = [_ns_key(e) for e in self._entries]
        else:
            new.sort(key=sort_key)
            self._entries.extend(new)
            self._keys.extend(_ns_key(e) for e in new)

    def log_page(self, stderr: bool, before: str | None, after: str | None,
                 limit: int) -> tuple[list[Entry], bool]:
        with self._lock:
            entries, keys = self._entries, self._keys
            if after is not None:
                i = bisect_right(keys, parse_cursor(after))
                out = [e for e in entries[i:] if stderr or e.stream != STDERR]
                return out[:limit], len(out) > limit
            j = bisect_left(keys, parse_cursor(before)) if before else len(keys)
            picked: list[Entry] = []
            while j > 0 and len(picked) <= limit:
                j -= 1
                e = entries[j]
                if stderr or e.stream != STDERR:
                    picked.append(e)
            more = len(picked) > limit
            return picked[:limit][::-1], more

    def metadata_rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return sorted(self._metadata, key=lambda d: (d["ts"], d["seq"]))

    def sample_rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._samples)

    def line_rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return sorted(self._records, key=lambda d: (d["ts"], d["stream"], d["seq"]))


class StoreRun(RunData):
    """A run read from the store (shipped, or another node's)."""

    def __init__(self, reads: Reads, run: str) -> None:
        super().__init__(run, "store")
        self._reads = reads
        self.refresh()

    def refresh(self) -> None:
        info = self._reads.with_store(lambda st: st.run_info(self.run))
        self.start, self.end = info["start_record"], info["end_record"]

    def log_page(self, stderr: bool, before: str | None, after: str | None,
                 limit: int) -> tuple[list[Entry], bool]:
        params: dict[str, Any] = {"run": self.run, "stderr": int(stderr), "limit": limit + 1}
        where, order = "1", "DESC"
        cursor = after or before
        if cursor:
            ns, stream, seq = parse_cursor(cursor)
            params.update(ns=ns, stream=stream, seq=seq)
            op = ">" if after else "<"
            where = (f"(ts, stream, seq) {op} (fromUnixTimestamp64Nano({{ns:Int64}}, 9), "
                     "{stream:String}, {seq:UInt64})")
            order = "ASC" if after else "DESC"
        sql = log_sql("", "{run:String}", "{stderr:UInt8}", where, order, "{limit:UInt32}",
                      ts="toUnixTimestamp64Nano(ts)")
        rows = self._reads.with_store(lambda st: st.client.query(sql, parameters=params)
                                      .result_rows)
        entries = [entry_from_row({"ts": r[0] / 1e9, "stream": r[1], "seq": r[2],
                                   "kind": r[3],
                                   "text": metadata_text(r[4]) if r[3] == "metadata"
                                   else r[4]}) for r in rows]
        more = len(entries) > limit
        entries = entries[:limit]
        if not after:
            entries.reverse()
        return entries, more

    def metadata_rows(self) -> list[dict[str, Any]]:
        rows = self._reads.with_store(lambda st: st.metadata(self.run))
        rows.reverse()  # the store gives newest first
        return rows

    def sample_rows(self) -> list[dict[str, Any]]:
        return self._reads.with_store(lambda st: st.samples(self.run))

    def line_rows(self) -> list[dict[str, Any]]:
        return self._reads.with_store(lambda st: st.lines(self.run))


# --------------------------------------------------------------------------- all runs


class Reads:
    """The page's read path over one user's spool and store."""

    IDLE_CLOSE = 2.0  # seconds: an embedded store is one process's at a time; let it go

    def __init__(self, spool_root: Path, store_dsn: str | None = None) -> None:
        self.spool_root = spool_root
        self.store_dsn = store_dsn
        self._store: Any = None
        self._store_lock = threading.RLock()
        self._last_use = 0.0
        self._spool_runs: dict[Path, SpoolRun] = {}
        self._runs_lock = threading.Lock()

    # --- the store, opened on demand and closed when idle
    def with_store(self, fn: Any) -> Any:
        with self._store_lock:
            if self._store is None:
                self._store = open_store(self.store_dsn, wait=10.0, must_exist=True)
            try:
                return fn(self._store)
            finally:
                self._last_use = time.monotonic()

    def store_available(self) -> bool:
        try:
            self.with_store(lambda st: None)
            return True
        except Exception:  # noqa: BLE001 - no store yet, or another process has it
            return False

    def close_idle(self) -> None:
        with self._store_lock:
            if self._store is not None and time.monotonic() - self._last_use > self.IDLE_CLOSE:
                self._store.close()
                self._store = None

    def close(self) -> None:
        with self._store_lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    # --- which run, read from where
    def run(self, ref: str) -> RunData:
        check_ref(ref)
        try:
            run_dir: Path | None = find_run(self.spool_root, ref)
        except NotFound:
            run_dir = None
        if run_dir is not None and not is_shipped(run_dir):
            with self._runs_lock:
                data = self._spool_runs.get(run_dir)
                if data is None:
                    data = self._spool_runs[run_dir] = SpoolRun(run_dir)
            data.refresh()
            return data
        try:
            run = self.with_store(lambda st: st.resolve_run(run_dir.name if run_dir else ref))
        except NotFound:
            raise
        except Exception:  # noqa: BLE001 - store unreadable: the spool still has it
            if run_dir is None:
                raise NotFound(f"no run {ref!r} in your spool or store") from None
            return SpoolRun(run_dir)
        return StoreRun(self, run)

    def runs(self) -> list[dict[str, Any]]:
        """Every run, newest first: the spool's, then the store's the spool lacks."""
        out = []
        seen = set()
        for run_dir in find_run_dirs(self.spool_root):
            try:
                s = summarize(run_dir)
            except SpoolError:
                continue
            if s.state == "EMPTY":
                continue
            seen.add(s.run_id)
            start = s.start.to_dict() if s.start else None
            end = s.end.to_dict() if s.end else None
            out.append(run_row(s.run_id, start, end,
                               "store" if is_shipped(run_dir) else "spool"))
        try:
            stored = self.with_store(lambda st: st.runs())
        except Exception:  # noqa: BLE001 - no store: the spool's runs only
            stored = []
        for r in stored:
            if r["run"] in seen:
                continue
            out.append(run_row_from_store(r))
        out.sort(key=lambda r: r["start"] or 0, reverse=True)
        return out


# --------------------------------------------------------------------------- answers


def exit_text(exit_status: Any, signal: Any) -> str:
    if signal is not None:
        return f"signal {signal}"
    return "" if exit_status is None else str(exit_status)


def run_row(run: str, start: Mapping[str, Any] | None, end: Mapping[str, Any] | None,
            source: str) -> dict[str, Any]:
    slurm = dict(start.get("slurm") or {}) if start else {}
    command = " ".join(start.get("command") or ()) if start else ""
    started = start["ts"] if start else None
    if end is not None:
        duration = end.get("duration")
    elif started is not None:
        duration = max(0.0, time.time() - started)
    else:
        duration = None
    return {"run": run, "job_id": slurm.get("job_id") or "",
            "name": slurm.get("job_name") or command,
            "user": (start.get("user") if start else "") or "",
            "state": end["state"] if end else "RUNNING",
            "exit": exit_text(end.get("exit_status"), end.get("signal")) if end else "",
            "start": started, "duration": duration,
            "nodes": (start.get("host") if start else "") or "", "source": source}


def run_row_from_store(r: Mapping[str, Any]) -> dict[str, Any]:
    start = r["start"] if r["start"] is not None else r["last"]
    duration = r["duration"]
    if duration is None and r["state"] == "RUNNING":
        duration = max(0.0, time.time() - start)
    return {"run": r["run"], "job_id": r["job_id"] or "", "name": " ".join(r["command"]),
            "user": r["owner"], "state": r["state"],
            "exit": exit_text(r["exit_status"], r["signal"]), "start": start,
            "duration": duration, "nodes": r["host"], "source": "store"}


def header(data: RunData) -> dict[str, Any]:
    """The job page's header: the Grafana job header's fields and a few more."""
    row = run_row(data.run, data.start, data.end, data.source)
    samples = data.sample_rows()
    nodes = sorted({s["node"] for s in samples if s.get("node")})
    uuids = {g.get("uuid") for s in samples for g in s.get("gpus") or ()
             if isinstance(g, dict) and g.get("uuid")}
    inventory = (data.start or {}).get("inventory") or {}
    row["nodes"] = ", ".join(nodes) if nodes else row["nodes"]
    row["gpus"] = max(len(uuids), len(inventory.get("job_gpus") or ()))
    start = data.start or {}
    row.update(cwd=start.get("cwd", ""), command=" ".join(start.get("command") or ()),
               mode=start.get("mode", ""), running=data.end is None)
    return row


def metadata(data: RunData) -> dict[str, Any]:
    """The metadata table (newest first) and the graphs: every numeric key by time, and by
    the X key the rule picks, with why."""
    rows = data.metadata_rows()  # time order
    fields = [dict(r["fields"]) for r in rows]
    levels = key_levels(fields)
    keys = sorted(levels)
    x_key = choose_x_axis(fields)
    table_keys: list[str] = []
    for f in fields:
        for k in f:
            if k not in table_keys:
                table_keys.append(k)
    by_time = {"x": [r["ts"] for r in rows],
               "series": {k: [v if is_number(v := f.get(k)) else None for f in fields]
                          for k in keys}}
    by_x = None
    if x_key is not None:
        pairs = [(f[x_key], f) for f in fields if is_number(f.get(x_key))]
        pairs.sort(key=lambda p: p[0])
        by_x = {"key": x_key, "because": LEVEL_NAMES[levels[x_key]],
                "x": [p[0] for p in pairs],
                "series": {k: [v if is_number(v := f.get(k)) else None for _, f in pairs]
                           for k in keys if k != x_key}}
    newest = rows[::-1][:METADATA_TABLE_ROWS]
    return {"columns": table_keys, "total": len(rows),
            "rows": [{"ts": r["ts"], "seq": r["seq"], "fields": r["fields"]} for r in newest],
            "keys": keys, "by_time": by_time, "by_x": by_x}


def resources(data: RunData) -> dict[str, Any]:
    """Per node: sample times, each GPU's utilisation, memory, power and temperature, and the
    job's CPU and memory."""
    nodes: dict[str, dict[str, Any]] = {}
    for s in data.sample_rows():
        n = nodes.setdefault(s["node"], {"t": [], "gpus": {}, "job": {m: [] for m in
                                                                      JOB_METRICS}})
        i = len(n["t"])
        n["t"].append(s["ts"])
        job = s.get("job") or {}
        for m in JOB_METRICS:
            v = job.get(m)
            n["job"][m].append(v if is_number(v) else None)
        for g in s.get("gpus") or ():
            if not isinstance(g, dict):
                continue
            label = f"GPU {g.get('index', '?')} {g.get('name', '')}".strip()
            series = n["gpus"].setdefault(label, {m: [] for m in GPU_METRICS})
            for m in GPU_METRICS:
                col = series[m]
                col.extend([None] * (i - len(col)))
                v = g.get(m)
                col.append(v if is_number(v) else None)
    for n in nodes.values():
        for series in n["gpus"].values():
            for col in series.values():
                col.extend([None] * (len(n["t"]) - len(col)))
    return {"nodes": nodes}


class _Rows:
    """store.export_rows' view of a run (lines, metadata newest first, samples)."""

    def __init__(self, data: RunData) -> None:
        self.data = data

    def lines(self, run: str) -> list[dict[str, Any]]:
        return self.data.line_rows()

    def metadata(self, run: str) -> list[dict[str, Any]]:
        return self.data.metadata_rows()[::-1]

    def samples(self, run: str) -> list[dict[str, Any]]:
        return self.data.sample_rows()


def export(data: RunData, what: str, fmt: str) -> tuple[bytes, str, str]:
    """The bytes of ``logcapture export RUN --what WHAT --format FMT``, a file name and its
    media type."""
    if what not in EXPORTS:
        raise UsageError(f"what must be lines, metadata or samples, not {what[:40]!r}")
    if fmt not in FORMATS:
        raise UsageError(f"format must be csv, ndjson or parquet, not {fmt[:40]!r}")
    out = io.BytesIO()
    write_rows(export_rows(_Rows(data), data.run, what), fmt, out)  # type: ignore[arg-type]
    return out.getvalue(), f"{data.run}-{what}.{fmt}", FORMATS[fmt]


def compare(runs: Iterable[RunData], key: str) -> dict[str, Any]:
    """One metadata key of several runs: by each run's own X axis, and by seconds since the
    run started."""
    out = []
    for data in runs:
        rows = data.metadata_rows()
        fields = [dict(r["fields"]) for r in rows]
        x_key = choose_x_axis(fields)
        levels = key_levels(fields)
        t0 = (data.start or {}).get("ts") or (rows[0]["ts"] if rows else 0.0)
        by_time = [(r["ts"] - t0, f[key]) for r, f in zip(rows, fields, strict=True)
                   if is_number(f.get(key))]
        by_x = sorted((f[x_key], f[key]) for f in fields
                      if x_key and is_number(f.get(x_key)) and is_number(f.get(key)))
        slurm = (data.start or {}).get("slurm") or {}
        out.append({"run": data.run, "job_name": slurm.get("job_name") or "",
                    "x_key": x_key, "because": LEVEL_NAMES[levels[x_key]] if x_key else None,
                    "by_x": by_x, "by_time": by_time,
                    "keys": sorted(levels)})
    return {"key": key, "runs": out}
