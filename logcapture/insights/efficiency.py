"""How well a run used what it held, like jobstats' notes, from logcapture's own samples and
the job's Slurm request.

``efficiency_notes(samples, duration, request, thresholds)``: ``samples`` are the run's Sample
records (or their dicts), ``duration`` its wall seconds, ``request`` what the job asked Slurm
for (``slurm_request`` reads it from a Start record's Slurm identity or a job record), and
``thresholds`` the administrator's (``Thresholds``, from the admin config). A run shorter
than ``min_seconds`` gets no notes: its figures say too little. A note or hint about what
was asked for (cores, memory, time, fewer GPUs) needs a request: a run outside Slurm asked
for nothing.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ..sampling.summary import summarize
from .matchers import duration_text
from .model import EFFICIENCY, Insight

if TYPE_CHECKING:
    from typing import Any


class Thresholds(namedtuple("Thresholds", (
        "gpu_idle_percent", "gpu_memory_used_fraction", "cpu_efficiency_low",
        "memory_overrequest_factor", "time_limit_overrequest_factor", "min_seconds"),
        defaults=(10.0, 0.25, 0.25, 4.0, 4.0, 600.0))):
    """When a note is made: mean GPU utilisation under ``gpu_idle_percent`` (idle GPUs); peak
    GPU memory under ``gpu_memory_used_fraction`` of the GPU's; CPU efficiency under
    ``cpu_efficiency_low`` with 2 cores or more; memory requested over
    ``memory_overrequest_factor`` times the peak used; a time limit over
    ``time_limit_overrequest_factor`` times the run time; runs of ``min_seconds`` or more."""

    __slots__ = ()

    @classmethod
    def of(cls, admin: Any) -> Thresholds:
        """From the admin config (its ``insight_*`` keys)."""
        return cls(*(getattr(admin, f"insight_{name}", default)
                     for name, default in zip(cls._fields, cls._field_defaults.values(),
                                              strict=True)))


def admin_thresholds() -> Thresholds:
    """The thresholds of the admin config (the defaults when it cannot be read)."""
    from ..config.admin import load_admin
    from ..errors import ConfigError

    try:
        return Thresholds.of(load_admin())
    except ConfigError:
        return Thresholds()


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _int(v: Any) -> int | None:
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        return None


def parse_time_limit(text: str) -> float | None:
    """Slurm's time format (``[days-]hours:minutes:seconds``, ``minutes:seconds``,
    ``minutes``) in seconds; None for UNLIMITED or anything else."""
    text = (text or "").strip()
    if not text or not text[0].isdigit():
        return None
    days, _, rest = text.rpartition("-")
    parts = rest.split(":")
    try:
        nums = [int(p) for p in parts]
        d = int(days) if days else 0
    except ValueError:
        return None
    if len(nums) == 1:  # minutes; after "days-", hours
        h, m, s = (nums[0], 0, 0) if days else (0, nums[0], 0)
    elif len(nums) == 2:
        h, m, s = (nums[0], nums[1], 0) if days else (0, nums[0], nums[1])
    elif len(nums) == 3:
        h, m, s = nums
    else:
        return None
    return float(((d * 24 + h) * 60 + m) * 60 + s)


def slurm_request(slurm: Mapping[str, Any] | None, started: float | None = None
                  ) -> dict[str, float]:
    """What a job asked for, from a Start record's ``slurm`` (the wrapper copies Slurm's
    variables: ``cpus``, ``mem_per_node_mb``, ``mem_per_cpu_mb``, ``gpus``) or a job record
    (``time_limit`` as Slurm writes it), or ``end_time`` (``SLURM_JOB_END_TIME``, epoch
    seconds) with the run's start ``started``. Keys: cpus, memory_bytes, gpus,
    time_limit_seconds."""
    s = dict(slurm or {})
    out: dict[str, float] = {}
    cpus = _int(s.get("cpus"))
    if cpus:
        out["cpus"] = cpus
    mem = _int(s.get("mem_per_node_mb"))
    per_cpu = _int(s.get("mem_per_cpu_mb"))
    if mem:
        out["memory_bytes"] = mem * 2**20
    elif per_cpu and cpus:
        out["memory_bytes"] = per_cpu * cpus * 2**20
    gpus = _int(s.get("gpus"))
    if gpus:
        out["gpus"] = gpus
    limit = s.get("time_limit_seconds")
    seconds = float(limit) if isinstance(limit, (int, float)) else parse_time_limit(
        str(s.get("time_limit") or ""))
    end = _int(s.get("end_time"))
    if not seconds and end and started:
        seconds = end - started
    if seconds and seconds > 0:
        out["time_limit_seconds"] = seconds
    return out


def efficiency_notes(samples: Iterable[Any], duration: float | None,
                     request: Mapping[str, float] | None = None,
                     thresholds: Thresholds | None = None) -> list[Insight]:
    t = thresholds or Thresholds()
    request = request or {}
    if duration is None or duration < t.min_seconds:
        return []
    summary = summarize(list(samples), wall_seconds=duration)
    notes: list[Insight] = []
    held = f"for {duration_text(duration)}"
    gpus = [g for g in summary.get("gpus") or () if g.get("utilization_gpu_mean_percent")
            is not None]
    idle = [g for g in gpus if g["utilization_gpu_mean_percent"] < t.gpu_idle_percent]
    if idle:
        mean = sum(g["utilization_gpu_mean_percent"] for g in idle) / len(idle)
        n = len(idle)
        notes.append(Insight(
            "gpu-idle", f"{n} of {len(gpus)} GPU(s) held {held} were idle: mean utilisation "
            f"{mean:.0f} % (under {t.gpu_idle_percent:g} %)", (),
            "check that the work runs on the GPU (model and data moved with .to('cuda'), the "
            "framework built with CUDA)" + ("; ask for fewer GPUs if the job cannot use them "
                                            "all" if request else ""),
            EFFICIENCY, {"gpus_idle": n, "gpus": len(gpus), "mean_utilization_percent": mean,
                         "gpu_hours_idle": n * duration / 3600, "nodes": _nodes(idle)}))
    used = [g for g in summary.get("gpus") or () if g.get("memory_used_peak_bytes")
            and g.get("memory_total_bytes")]
    low = [g for g in used if g not in idle
           and g["memory_used_peak_bytes"] < t.gpu_memory_used_fraction
           * g["memory_total_bytes"]]
    if low:
        peak = max(g["memory_used_peak_bytes"] for g in low)
        total = max(g["memory_total_bytes"] for g in low)
        notes.append(Insight(
            "gpu-memory-unused", f"GPU memory mostly unused: peak {_gib(peak)} of "
            f"{_gib(total)} on {len(low)} GPU(s)", (),
            "a smaller GPU (or a MIG slice) would do, or a larger batch would use this one",
            EFFICIENCY, {"peak_bytes": peak, "total_bytes": total, "gpus": len(low),
                         "nodes": _nodes(low)}))
    # a note about the cores a job asked for, only where it asked (a Slurm job): a command
    # run by hand held no cores, whatever the machine has
    cpus = request.get("cpus") or (_cpus(summary) if request else None)
    eff = summary.get("cpu_efficiency")
    if eff is not None and cpus and cpus >= 2 and eff < t.cpu_efficiency_low:
        notes.append(Insight(
            "cpu-low", f"CPU efficiency {eff * 100:.0f} %: used about {eff * cpus:.1f} of "
            f"{cpus:g} cores", (),
            "ask for fewer cores (--cpus-per-task), or use them (data loader workers, threads)",
            EFFICIENCY, {"cpu_efficiency": eff, "cpus": cpus}))
    mem = request.get("memory_bytes")
    peak_rss = summary.get("memory_rss_peak_bytes")
    if mem and peak_rss and mem > t.memory_overrequest_factor * peak_rss and mem >= 2**30:
        notes.append(Insight(
            "memory-overrequested", f"memory requested {_gib(mem)}, peak used "
            f"{_gib(peak_rss)}", (),
            f"ask for about {_gib(peak_rss * 1.25)} (--mem): smaller requests start sooner",
            EFFICIENCY, {"requested_bytes": mem, "peak_bytes": peak_rss}))
    limit = request.get("time_limit_seconds")
    if limit and limit > t.time_limit_overrequest_factor * duration and limit >= 3600:
        notes.append(Insight(
            "time-overrequested", f"time limit {duration_text(limit)}, ran "
            f"{duration_text(duration)}", (),
            "a time limit closer to the run time lets the scheduler start the job sooner "
            "(backfill)", EFFICIENCY, {"time_limit_seconds": limit, "duration": duration}))
    return notes


def _nodes(gpus: list[Mapping[str, Any]]) -> list[str]:
    """The nodes of these GPUs (a job of several ranks names its ranks beside them)."""
    return sorted({str(g["node"]) for g in gpus if g.get("node")})


def _cpus(summary: Mapping[str, Any]) -> float | None:
    nodes = summary.get("nodes") or {}
    counts = [n.get("cpus_allocated") for n in nodes.values() if n.get("cpus_allocated")]
    return float(sum(counts)) if counts else None
