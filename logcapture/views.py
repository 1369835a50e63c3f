"""How the reading commands print what the read layer answers: ``ls``'s table and ``show``'s
summary, with units a person reads (``1.2 GiB``, ``37 %``, ``2 h 03 min``).

Pure functions of the plain data ``query`` returns (run summaries, ``query.describe``'s
mapping); the JSON forms print that data as it is (snake_case keys, numbers as numbers,
durations in seconds).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from . import jobref
from .progress import bar_text
from .summary_row import exit_text, summary_row

LS_COLUMNS = ("JOBID", "NAME", "STATE", "EXIT", "START", "DURATION", "NODES", "LINES",
              "INSIGHTS")
NAME_WIDTH = 24  # longer job names are cut (with an ellipsis) to keep one row per run


def size(n: float | None) -> str:
    """Bytes in binary units: ``512 B``, ``1.2 GiB``, ``37 MiB``."""
    if n is None or not isinstance(n, (int, float)) or not math.isfinite(n):
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.1f} {unit}" if abs(n) < 10 else f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} PiB"  # pragma: no cover - the loop returns at TiB


def percent(fraction: float | None) -> str:
    """A fraction (0.37) as ``37 %``; below 10 % with one decimal (``0.2 %``)."""
    if fraction is None or not isinstance(fraction, (int, float)) or not math.isfinite(fraction):
        return "-"
    p = 100.0 * fraction
    return f"{p:.1f} %" if abs(p) < 10 else f"{p:.0f} %"


def duration(seconds: float | None) -> str:
    """``0.04 s``, ``4.2 s``, ``45 s``, ``3 min 05 s``, ``2 h 03 min``, ``3 d 04 h``."""
    if seconds is None or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "-"
    if seconds < 1:
        return f"{max(seconds, 0.0):.2f} s"
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f} s"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m:02d} min"
    d, h = divmod(h, 24)
    return f"{d} d {h:02d} h"


def timestamp(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def ls_rows(summaries: Iterable[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """``ls``'s table, header first: one row per run, in the order given (newest first); its
    name, state, exit and duration as every reader shows them (``summary_row``)."""
    runs = list(summaries)
    latest = jobref.latest_runs(runs)
    rows: list[tuple[str, ...]] = [LS_COLUMNS]
    for d in runs:
        row = summary_row(d)
        rows.append((jobref.label(d, d["run"] in latest), _cut(row["name"], NAME_WIDTH) or "-",
                     row["state"], row["exit"] or "-", timestamp(d.get("start")),
                     duration(row["duration"]), str(d.get("nodes") or "-"),
                     str(d.get("lines") if d.get("lines") is not None else "-"),
                     flag(d.get("insights") or [])))
    return rows


def flag(kinds: list[str]) -> str:
    """An ls cell: the first insight's kind and how many more (`show RUN` says them all)."""
    if not kinds:
        return "-"
    return f"!{kinds[0]}" + (f" +{len(kinds) - 1}" if len(kinds) > 1 else "")


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as aligned text lines (the last column is not padded)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


# --- show -----------------------------------------------------------------------------------
_RESOURCES = (  # key of describe()["resources"], label, formatter
    ("cpu_seconds_total", "CPU time", duration),
    ("cpu_efficiency", "CPU efficiency", percent),
    ("cpus_allocated", "CPUs allocated", lambda v: str(v)),
    ("memory_rss_peak_bytes", "peak memory (RSS)", size),
    ("memory_pss_peak_bytes", "peak memory (PSS)", size),
    ("gpu_memory_used_peak_bytes", "peak GPU memory", size),
    ("gpu_memory_total_bytes", "GPU memory", size),
    ("gpu_job_memory_peak_bytes", "peak GPU memory of the job", size),
    ("gpu_utilization_mean_percent", "mean GPU utilization",
     lambda v: percent(v / 100.0)),
    ("samples", "samples", lambda v: str(v)),
)


def rank_lines(info: Mapping[str, Any]) -> list[str]:
    """A job of several ranks (``jobview.describe_job``): one line per task, then each
    node's resource figures beside the ranks that ran there."""
    ranks = info.get("ranks") or []
    if not ranks:
        return []
    gpus = any(r.get("gpus") for r in ranks)  # the GPUs each rank saw, when a step had some
    rows: list[tuple[str, ...]] = [
        (f"  rank {r['rank']}", f"node {r['node'] or '?'}", f"step {r['step']}",
         *((f"GPU {r.get('gpus') or '-'}",) if gpus else ()),
         str(r.get("state") or "RUNNING"), exit_text(r.get("exit_status"), r.get("signal")) or "-",
         _cut(str(r.get("failure") or ""), 100)) for r in ranks]
    out = ["ranks:", *table(rows)]
    nodes = info.get("nodes_by_rank") or []
    if nodes:
        out.append("nodes:")
    for n in nodes:
        figures = [f"{label} {fmt(n[key])}" for key, label, fmt in (
            ("cpu_efficiency", "CPU efficiency", percent),
            ("cpus_allocated", "of CPUs", str),
            ("memory_rss_peak_bytes", "peak memory", size),
            ("gpu_utilization_mean_percent", "mean GPU utilization",
             lambda v: percent(v / 100.0)),
            ("gpu_memory_used_peak_bytes", "peak GPU memory", size)) if n.get(key) is not None]
        out.append(f"  {n['node']} (rank {n['ranks']}): "
                   + (", ".join(figures) if figures else "no samples"))
    return out


def _per_stream(counts: Mapping[str, int] | None) -> str:
    if not counts:
        return "-"
    return ", ".join(f"{n} {stream}" for stream, n in counts.items())


def show_lines(info: Mapping[str, Any]) -> list[str]:
    """``show``'s text: one ``label: value`` line per field, units written out, one line per
    mode change."""
    out: list[tuple[str, str]] = []

    def add(label: str, value: Any) -> None:
        if value is not None and value != "":
            out.append((label, str(value)))

    job = info.get("job")
    add("job", f"{job} (run {info['run']})" if job and job != info["run"] else info["run"])
    add("name", info.get("job_name"))
    add("owner", f"{info['owner']} (uid {info['uid']})" if info.get("owner") else None)
    add("state", info.get("state"))
    if info.get("state") != "RUNNING":
        sig = info.get("signal")
        status = info.get("exit_status")
        add("exit status", (f"{status}" if status is not None else "-") if sig is None
            else f"killed by signal {sig}")
    add("started", timestamp(info.get("start")) if info.get("start") else None)
    add("ended", timestamp(info.get("end")) if info.get("end") else None)
    add("duration", duration(info.get("duration")) if info.get("duration") is not None
        else None)
    add("nodes", info.get("nodes"))
    add("command", info.get("command"))
    add("working directory", info.get("cwd"))
    add("initial mode", info.get("initial_mode"))
    add("streams", info.get("streams"))
    add("lines", _per_stream(info.get("lines")))
    add("dropped repetitions", _per_stream(info.get("dropped_repetitions")))
    add("dropped blank lines", _per_stream(info.get("dropped_blank_lines")))
    add("commands", info.get("commands"))
    modes = info.get("mode_changes") or []
    add("mode changes", len(modes) if modes else "none")
    for m in modes:
        when = timestamp(m.get("ts")) if isinstance(m, Mapping) else ""
        text = m.get("text") if isinstance(m, Mapping) else m
        out.append(("", f"  {when + '  ' if when else ''}{text}"))
    keys = info.get("metadata_keys") or []
    of = info.get("metadata_ranks")  # a job of several ranks: whose metadata
    of = f" (rank {of})" if of is not None else ""
    add(f"metadata keys{of}", ", ".join(keys) if keys else "none")
    add(f"x axis{of}", info.get("x_axis"))
    res = info.get("resources") or {}
    if res:
        out.append(("resources", ""))
        for key, label, fmt in _RESOURCES:
            if res.get(key) is not None:
                out.append(("", f"  {label}: {fmt(res[key])}"))
    out += [("", line) for line in rank_lines(info)]
    bars = info.get("progress") or []
    if bars:
        out.append(("progress bars", str(len(bars))))
        out += [("", "  " + bar_text(b)) for b in bars]
    kinds = info.get("redactions_by_kind") or {}
    by_kind = ", ".join(f"{k} {n}" for k, n in kinds.items())
    add("redactions", f"{info.get('redactions')} ({by_kind})" if kinds
        else info.get("redactions"))
    add("warnings", info.get("warnings"))
    add("spool problems", info.get("spool_problems"))
    add("stored in", info.get("stored_in"))
    width = max(len(label) for label, _ in out if label) + 1
    lines = []
    for label, value in out:
        if not label:
            lines.append(value)
        elif not value:
            lines.append(f"{label}:")
        else:
            lines.append(f"{label + ':':<{width}} {value}")
    return lines
