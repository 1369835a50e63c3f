"""summarize(samples): the figures ``logcapture show`` prints for a run."""

from __future__ import annotations

import json
from collections.abc import Iterable

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any


def _as_dict(sample: Any) -> dict[str, Any] | None:
    d = sample.to_dict() if hasattr(sample, "to_dict") else sample
    if not isinstance(d, dict) or d.get("kind", "sample") != "sample":
        return None
    return d


def _loads(value: Any, empty: Any) -> Any:
    # rows read back from the store may carry the nested fields as JSON text
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return empty
    return empty if value is None else value


def _num(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _max(values: Iterable[Any]) -> Any:
    nums = [v for v in values if _num(v) is not None]
    return max(nums) if nums else None


def summarize(samples: Iterable[Any], *, cpus_allocated: int | None = None,
              wall_seconds: float | None = None) -> dict[str, Any]:
    """Summarize Sample records or their dicts (other record kinds are ignored), of one or
    several nodes.

    - ``cpu_efficiency`` = CPU seconds / (wall seconds * CPUs allocated), summed over nodes.
      By default over the sampled window (last minus first sample of each node); pass
      ``wall_seconds`` (the run's duration from its Start and End) to use the whole run and
      the final ``cpu_seconds_total``. ``cpus_allocated`` overrides the samples' own figure.
    - ``memory_rss_peak_bytes`` / ``memory_pss_peak_bytes``: the highest of any node.
    - ``gpu_memory_used_peak_bytes``: the highest reading of any one GPU (with that GPU's
      ``gpu_memory_total_bytes``); ``gpu_job_memory_peak_bytes`` the same for the job's own
      processes; ``gpu_utilization_mean_percent``: mean over every reading of every GPU.
    - ``gpus``: the same per GPU; ``nodes``: the CPU and memory figures per node.
    Figures that cannot be computed are None.
    """
    by_node: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        d = _as_dict(s)
        if d is None:
            continue
        node = d.get("node") or str(d.get("stream", "")).removeprefix("sample:")
        by_node.setdefault(node, []).append(d)

    nodes: dict[str, dict[str, Any]] = {}
    gpus: dict[tuple[str, str], dict[str, Any]] = {}
    util_readings: list[float] = []
    cpu_used_sum = 0.0
    capacity_sum = 0.0
    for node, rows in sorted(by_node.items()):
        rows.sort(key=lambda d: (d.get("seq", 0), d.get("ts", 0)))
        jobs = [_loads(d.get("job"), {}) for d in rows]
        cpu = [c for c in (_num(j.get("cpu_seconds_total")) for j in jobs) if c is not None]
        cpus = cpus_allocated or _max(j.get("cpus_allocated") for j in jobs)
        wall = wall_seconds if wall_seconds is not None else (
            float(rows[-1].get("ts", 0)) - float(rows[0].get("ts", 0)))
        used = None
        if cpu:
            used = cpu[-1] if wall_seconds is not None else cpu[-1] - cpu[0]
        efficiency = None
        if used is not None and cpus and wall > 0:
            efficiency = used / (wall * cpus)
            cpu_used_sum += used
            capacity_sum += wall * cpus
        nodes[node] = {
            "samples": len(rows),
            "wall_seconds": wall,
            "cpus_allocated": cpus,
            "cpu_seconds_total": cpu[-1] if cpu else None,
            "cpu_efficiency": efficiency,
            "memory_rss_peak_bytes": _max(j.get("memory_rss_bytes") for j in jobs),
            "memory_pss_peak_bytes": _max(j.get("memory_pss_bytes") for j in jobs),
        }
        for d in rows:
            for g in _loads(d.get("gpus"), []):
                if not isinstance(g, dict):
                    continue
                key = (node, str(g.get("uuid", g.get("index", ""))))
                acc = gpus.setdefault(key, {"node": node, "uuid": g.get("uuid"),
                                            "name": g.get("name"), "util": [], "mem": [],
                                            "job": [], "total": None})
                util = _num(g.get("utilization_gpu_percent"))
                if util is not None:
                    acc["util"].append(util)
                    util_readings.append(util)
                acc["mem"].append(g.get("memory_used_bytes"))
                acc["job"].append(g.get("job_memory_used_bytes"))
                acc["total"] = _num(g.get("memory_total_bytes")) or acc["total"]

    gpu_rows = []
    for acc in gpus.values():
        gpu_rows.append({
            "node": acc["node"], "uuid": acc["uuid"], "name": acc["name"],
            "memory_used_peak_bytes": _max(acc["mem"]),
            "memory_total_bytes": acc["total"],
            "job_memory_used_peak_bytes": _max(acc["job"]),
            "utilization_gpu_mean_percent":
                sum(acc["util"]) / len(acc["util"]) if acc["util"] else None,
        })
    peak_gpu = max((g for g in gpu_rows if g["memory_used_peak_bytes"] is not None),
                   key=lambda g: g["memory_used_peak_bytes"], default=None)
    return {
        "samples": sum(len(r) for r in by_node.values()),
        "nodes": nodes,
        "cpu_efficiency": cpu_used_sum / capacity_sum if capacity_sum > 0 else None,
        "cpu_seconds_total": sum(n["cpu_seconds_total"] or 0 for n in nodes.values())
                             if any(n["cpu_seconds_total"] is not None for n in nodes.values())
                             else None,
        "memory_rss_peak_bytes": _max(n["memory_rss_peak_bytes"] for n in nodes.values()),
        "memory_pss_peak_bytes": _max(n["memory_pss_peak_bytes"] for n in nodes.values()),
        "gpu_memory_used_peak_bytes": peak_gpu["memory_used_peak_bytes"] if peak_gpu else None,
        "gpu_memory_total_bytes": peak_gpu["memory_total_bytes"] if peak_gpu else None,
        "gpu_job_memory_peak_bytes": _max(g["job_memory_used_peak_bytes"] for g in gpu_rows),
        "gpu_utilization_mean_percent":
            sum(util_readings) / len(util_readings) if util_readings else None,
        "gpus": gpu_rows,
    }
