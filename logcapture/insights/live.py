"""What the agent finds while a job runs: ``stalled`` and ``nan-metric``.

``LiveWatch.observe(key, data, now)`` takes the new spool bytes of a run as the agent ships
them (complete NDJSON lines) and looks only where it must: the last output and sample records
(``rfind``), metadata lines that hold a non-finite number (``records.dumps`` writes NaN and
±Infinity as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``), the Start and End
records. ``check(key, now, running)`` says whether the run has stalled: no new output for
``stall_seconds`` while its job runs, with the CPU and GPU figures of its last sample (idle:
waiting on something, a hung collective or a lock; busy: computing without printing).
Each finding is reported once; a stall is reported again only after output resumed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from ..records import kind_suffix
from .matchers import duration_text
from .model import LIVE, Evidence, Insight

_LINE = kind_suffix("line")
_METADATA = kind_suffix("metadata")
_SAMPLE = kind_suffix("sample")
_START = kind_suffix("start")
_END = kind_suffix("end")
# How records.dumps writes a non-finite value in a record: as a string, after its key (the
# longer the needle, the faster bytes.find skips: bench_insights).
_NON_FINITE = (b':"NaN"', b'Infinity"')
SAMPLE_WINDOW = 8 << 20  # the last sample is looked for in the last 8 MiB of new bytes
_NON_FINITE_TEXT = ("NaN", "Infinity", "-Infinity")
# The metadata keys that say where a training run is, first found wins.
STEP_KEYS = ("step", "global_step", "iteration", "iter", "batch", "epoch", "progress")
IDLE_CPU_PERCENT = 5.0  # a job under this much of one core is waiting, not computing
IDLE_GPU_PERCENT = 5.0
MAX_EVIDENCE = 6  # metadata lines quoted by a finished run's nan-metric
NAN_HINT = ("a NaN loss usually means a learning rate too high, a division by zero or a log "
            "of zero, or overflow in half precision (try gradient clipping or bf16)")


def _line_at(data: bytes, pos: int) -> dict[str, Any] | None:
    """The JSON record of the line holding byte ``pos``."""
    start = data.rfind(b"\n", 0, pos) + 1
    end = data.find(b"\n", pos)
    try:
        obj = json.loads(data[start:end if end >= 0 else len(data)])
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


class _Run:
    __slots__ = ("start", "ended", "last_output", "last_sample", "nan_keys", "stalled",
                 "first_seen")

    def __init__(self, now: float):
        self.start: dict[str, Any] | None = None
        self.ended = False
        self.last_output: float | None = None
        self.last_sample: dict[str, Any] | None = None
        self.nan_keys: set[str] = set()
        self.stalled = False
        self.first_seen = now


class LiveWatch:
    """The live state of the runs an agent tails, by a key of the caller's (run, uid)."""

    def __init__(self, stall_seconds: float = 1800.0):
        self.stall_seconds = stall_seconds
        self._runs: dict[Any, _Run] = {}

    def start_record(self, key: Any) -> dict[str, Any] | None:
        run = self._runs.get(key)
        return run.start if run else None

    def forget(self, key: Any) -> None:
        self._runs.pop(key, None)

    def resume(self, key: Any, start: dict[str, Any], now: float, *,
               last_output: float | None = None, nan_keys: Iterable[str] = (),
               stalled: bool = False) -> None:
        """A run that an earlier agent began to ship (this one started afresh, or was
        restarted), as the store has it: its Start record, when it last printed, the
        metrics already reported NaN and whether its stall since then was reported, so that
        it is watched as if this agent had seen it all."""
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = _Run(now)
        if run.start is None:
            run.start = start
        if last_output is not None:
            run.last_output = max(run.last_output or 0.0, last_output)
        run.nan_keys.update(nan_keys)
        run.stalled = run.stalled or stalled

    def observe(self, key: Any, data: bytes, now: float) -> list[Insight]:
        """Read a run's new spool lines; returns the nan-metric insights they hold."""
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = _Run(now)
        if not data:
            return []
        if run.start is None and _START in data:
            obj = _line_at(data, data.find(_START))
            if obj is not None and obj.get("kind") == "start":
                run.start = obj
        if _END in data:
            run.ended = True
        pos = data.rfind(_LINE)
        pos = max(pos, data.rfind(_METADATA, max(pos, 0)))  # output after the last line
        if pos >= 0:
            obj = _line_at(data, pos)
            ts = obj.get("ts") if obj else None
            if isinstance(ts, (int, float)):
                run.last_output = max(run.last_output or 0.0, float(ts))
                run.stalled = False  # output resumed
        pos = data.rfind(_SAMPLE, max(0, len(data) - SAMPLE_WINDOW))
        if pos >= 0:
            obj = _line_at(data, pos)
            if obj is not None:
                run.last_sample = obj
        if _METADATA not in data or not any(n in data for n in _NON_FINITE):
            return []
        return self._nan_metrics(run, data)

    def _nan_metrics(self, run: _Run, data: bytes) -> list[Insight]:
        records = []
        for raw in data.split(b"\n"):
            if _METADATA not in raw or not any(n in raw for n in _NON_FINITE):
                continue
            try:
                records.append(json.loads(raw))
            except ValueError:
                continue
        return nan_metrics(records, run.nan_keys)

    def check(self, key: Any, now: float, running: bool) -> Insight | None:
        """A ``stalled`` insight when the run has printed nothing for ``stall_seconds`` while
        its job runs (once per stall)."""
        run = self._runs.get(key)
        if run is None or run.ended or not running or run.stalled:
            return None
        since = run.last_output if run.last_output is not None else run.first_seen
        quiet = now - since
        if quiet < self.stall_seconds:
            return None
        run.stalled = True
        state, figures, details = self._activity(run)
        message = f"no new output for {duration_text(quiet)} while the job runs"
        if state:
            message += f"; last sample: {figures} ({state})"
        hint = {"idle": "the job waits for something: a hung collective (NCCL), a lock, input "
                        "or a dead peer; py-spy dump --pid PID shows where a Python process "
                        "waits",
                "busy": "the job computes without printing: print progress more often to "
                        "tell a slow step from a hang"}.get(state, "")
        details.update(quiet_seconds=quiet, activity=state or "unknown")
        return Insight("stalled", message, (), hint, LIVE, details)

    @staticmethod
    def _activity(run: _Run) -> tuple[str, str, dict[str, Any]]:
        s = run.last_sample
        if not s:
            return "", "", {}
        job = s.get("job")
        cpu = job.get("cpu_percent") if isinstance(job, dict) else None
        gpus: list[float] = [float(g["utilization_gpu_percent"]) for g in s.get("gpus") or ()
                             if isinstance(g, dict) and isinstance(
                                 g.get("utilization_gpu_percent"), (int, float))]
        parts = []
        details: dict[str, Any] = {}
        busy = False
        if isinstance(cpu, (int, float)):
            parts.append(f"CPU {cpu:.0f} %")
            details["cpu_percent"] = cpu
            busy = busy or cpu >= IDLE_CPU_PERCENT
        if gpus:
            mean = sum(gpus) / len(gpus)
            parts.append(f"GPU {mean:.0f} %")
            details["gpu_utilization_percent"] = mean
            busy = busy or mean >= IDLE_GPU_PERCENT
        if not parts:
            return "", "", {}
        return ("busy" if busy else "idle"), ", ".join(parts), details


def nan_metrics(records: Iterable[Any], seen: set[str] | None = None) -> list[Insight]:
    """A ``nan-metric`` insight for each metadata key whose value became NaN or ±Infinity in
    ``records`` (metadata record dicts, in order), at its first such record; keys in ``seen``
    are skipped and the new ones added to it."""
    seen = set() if seen is None else seen
    out = []
    for rec in records:
        fields = rec.get("fields") if isinstance(rec, dict) else None
        if not isinstance(fields, dict):
            continue
        bad = [k for k, v in fields.items() if _non_finite(v) and k not in seen]
        if not bad:
            continue
        step_key = next((k for k in STEP_KEYS if isinstance(fields.get(k), (int, float))
                         and not isinstance(fields.get(k), bool)), None)
        where = f"{step_key} {fields[step_key]}" if step_key else f"line {rec.get('seq')}"
        for key in bad:
            seen.add(key)
            value = fields[key] if isinstance(fields[key], str) else str(fields[key])
            out.append(Insight(
                "nan-metric", f"metric {key} became {value} at {where}",
                (Evidence(str(rec.get("stream", "")), int(rec.get("seq", 0)),
                          json.dumps(fields, ensure_ascii=False)),),
                NAN_HINT, LIVE,
                {"key": key, "value": value, "step_key": step_key,
                 "step": fields.get(step_key) if step_key else None, "seq": rec.get("seq")}))
    return out


def nan_metric(records: Iterable[Any]) -> Insight | None:
    """A finished run's one ``nan-metric`` insight (the store keeps one row per kind): the
    first key that became non-finite, and the others after it (``details["keys"]``)."""
    found = nan_metrics(records)
    if not found:
        return None
    first = found[0]
    details = dict(first.details or {})
    keys = [str((i.details or {}).get("key")) for i in found]
    message = first.message + (f" (then {', '.join(keys[1:])})" if len(keys) > 1 else "")
    evidence = tuple(dict.fromkeys(e for i in found for e in i.evidence))[:MAX_EVIDENCE]
    return first._replace(message=message, evidence=evidence,
                          details={**details, "keys": keys})


def _non_finite(v: Any) -> bool:
    if isinstance(v, float):
        return not math.isfinite(v)
    return isinstance(v, str) and v in _NON_FINITE_TEXT
