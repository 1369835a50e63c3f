"""A job of several ranks as one answer: ``show JOB`` and ``export JOB`` across its task runs.

Each task of a job's ``srun`` steps is a run of its own (``slurm.task``; ``jobref.tasks`` finds
them). For a job that has task runs:

- ``describe_job``: the batch run's summary (``query.describe``) with the job's insights across
  its ranks (``insights.ranks.job_insights``: the rank that failed first is the root cause),
  one row per task (``ranks``: rank, node, step, state, its first failure), the resource
  figures of each node beside the ranks that ran there (``nodes``, from the node samplers'
  samples of the batch run), and the metadata of the chosen ranks (rank 0 unless asked:
  ``--rank N``, ``--rank all``): their keys and the X axis by the per-rank rule
  (``xaxis``: one series per task run);
- ``job_records``: the metadata (or line) records of the chosen ranks, each carrying ``rank``,
  ``node`` and ``step`` from the task run it belongs to (``export`` writes them as columns).

Only the ``query.Reader`` questions are asked, so the spool, the store and the service answer
alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import jobref
from .errors import NotFound

ALL = "all"


def task_runs(reader: Any, ref: str | None, ranks: set[int] | None = None
              ) -> list[Mapping[str, Any]]:
    """The task runs of the job ``ref`` names with one of ``ranks`` (None: all); [] when
    ``ref`` is no job reference or the job has none."""
    if ref is None or jobref.parse(ref) is None:
        return []
    try:
        return jobref.tasks(ref, reader.runs(), ranks)
    except NotFound:
        return []


def chosen_ranks(values: tuple[str, ...] | list[str]) -> set[int] | None:
    """``--rank`` of ``show``/``export`` for a job: rank 0 when not given, None for ``all``."""
    if not values:
        return {0}
    if any(v.strip() == ALL for v in values):
        return None
    return jobref.parse_ranks(values)


def _tag(record: Mapping[str, Any], task: Mapping[str, Any]) -> dict[str, Any]:
    return {**record, "run": task["run"], "rank": task["rank"], "node": task.get("nodes", ""),
            "step": task.get("step")}


def job_records(reader: Any, tasks: list[Mapping[str, Any]], what: str
                ) -> list[dict[str, Any]]:
    """The ``metadata`` or ``lines`` records of ``tasks``, each with its task's ``run``,
    ``rank``, ``node`` and ``step``, by time."""
    out = []
    for task in tasks:
        recs = reader.metadata(task["run"]) if what == "metadata" else reader.lines(task["run"])
        out += [_tag(r, task) for r in recs]
    out.sort(key=lambda r: (r.get("ts", 0.0), r["rank"], r.get("seq", 0)))
    return out


def labelled_rows(records: list[dict[str, Any]], ranks: set[int] | None
                  ) -> tuple[list[dict[str, Any]], list[int]]:
    """Of one run's metadata records (any order, kept), those of ``ranks`` (None: all) where
    launchers' labels name series (``xaxis.own_labels``), by the labels' numbers
    (``ranklabel.number_of``; rows without one always), and the numbers there are: the
    choice of ``show RUN --rank`` and the job page for a run without task runs."""
    from .ranklabel import number_of
    from .xaxis import own_labels

    labels = [number_of(label) for label in own_labels(records)]
    numbers = sorted({int(n) for n in labels if n})
    picked = [r for r, n in zip(records, labels, strict=True)
              if not n or ranks is None or int(n) in ranks]
    return picked, numbers


def describe_labelled(reader: Any, batch: dict[str, Any], ranks: set[int] | None
                      ) -> dict[str, Any]:
    """``batch`` (a run without task runs, as ``describe`` gives it) with the metadata keys
    and X axis of the labelled rows of ``ranks`` (``labelled_rows``) and ``metadata_ranks``;
    ``batch`` itself when its rows carry no labels that name series."""
    from .xaxis import choose_x_axis_of_records

    picked, numbers = labelled_rows(reader.metadata(str(batch["run"])), ranks)
    if not numbers:
        return batch
    out = dict(batch)
    out["metadata_ranks"] = ALL if ranks is None else jobref.format_ranks(ranks)
    out["metadata_keys"] = sorted({k for r in picked for k in r.get("fields") or {}})
    out["x_axis"] = choose_x_axis_of_records(picked)
    return out


def describe_job(reader: Any, ref: str, batch: dict[str, Any],
                 ranks: set[int] | None) -> dict[str, Any]:
    """``batch`` (the job's batch run, as ``describe`` gives it) as the job's answer, when the
    job has task runs (the module docstring); else ``batch`` itself."""
    from .insights.ranks import job_insights
    from .xaxis import choose_x_axis_of_records

    tasks = task_runs(reader, ref)
    if not tasks:
        return batch
    rows, facts = [], []
    for task in tasks:
        info = reader.describe(str(task["run"]))
        failures = [i for i in info.get("insights") or () if i.get("category") == "failure"]
        rows.append({"rank": task["rank"], "node": task.get("nodes", ""),
                     "step": task.get("step"), "run": task["run"],
                     "gpus": (info.get("slurm") or {}).get("cuda_visible_devices"),
                     "state": info.get("state"),
                     "exit_status": info.get("exit_status"), "signal": info.get("signal"),
                     "duration": info.get("duration"),
                     "failure": failures[0]["message"] if failures else None})
        facts.append({"rank": task["rank"], "node": task.get("nodes", ""),
                      "end": info.get("end"), "insights": info.get("insights") or []})
    out = dict(batch)
    out["insights"] = job_insights(facts, batch.get("insights") or [])
    out["ranks"] = rows
    out["nodes_by_rank"] = node_figures(reader.samples(str(batch["run"])), rows)
    picked = [t for t in tasks if ranks is None or t["rank"] in ranks]
    metadata = job_records(reader, picked, "metadata")
    out["metadata_ranks"] = ALL if ranks is None else jobref.format_ranks(ranks)
    out["metadata_keys"] = sorted({k for r in metadata for k in r.get("fields") or {}})
    out["x_axis"] = choose_x_axis_of_records(metadata)
    return out


def node_figures(samples: list[dict[str, Any]], rows: list[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    """Per node of the job: the ranks that ran there and the node's resource figures (the
    node sampler's samples: CPU efficiency, peak memory, mean GPU utilisation, peak GPU
    memory), one row per node in rank order."""
    from .sampling.summary import summarize

    summed = summarize(samples) if samples else {"nodes": {}, "gpus": []}
    nodes: dict[str, list[int]] = {}
    for r in rows:
        nodes.setdefault(str(r["node"]), [])
        if r["rank"] not in nodes[str(r["node"])]:
            nodes[str(r["node"])].append(r["rank"])
    out = []
    for node, ranks in sorted(nodes.items(), key=lambda kv: min(kv[1])):
        fig = summed["nodes"].get(node) or {}
        gpus = [g for g in summed["gpus"] if g["node"] == node]
        utils = [g["utilization_gpu_mean_percent"] for g in gpus
                 if g["utilization_gpu_mean_percent"] is not None]
        peaks = [g["memory_used_peak_bytes"] for g in gpus
                 if g["memory_used_peak_bytes"] is not None]
        out.append({"node": node, "ranks": jobref.format_ranks(ranks),
                    "cpus_allocated": fig.get("cpus_allocated"),
                    "cpu_efficiency": fig.get("cpu_efficiency"),
                    "memory_rss_peak_bytes": fig.get("memory_rss_peak_bytes"),
                    "gpus": len(gpus),
                    "gpu_utilization_mean_percent": sum(utils) / len(utils) if utils else None,
                    "gpu_memory_used_peak_bytes": max(peaks) if peaks else None})
    return out


def export_job(reader: Any, ref: str, run: str, what: str, values: tuple[str, ...],
               nodes: tuple[str, ...] = ()) -> list[dict[str, Any]] | None:
    """The records ``export JOB --what lines|metadata`` writes for a job of task runs: the
    batch script's own (step ``batch``, no rank) and every task's, or only the tasks of
    ``--rank`` (``values``) on the nodes of ``--node`` (``nodes``); each with ``rank``,
    ``node`` and ``step``. None when the job has no task runs (the run's records as ever); a
    UsageError when ``--rank`` or ``--node`` names none."""
    from .errors import UsageError

    every = task_runs(reader, ref)
    filters = " ".join([*(f"--rank {v}" for v in values), *(f"--node {n}" for n in nodes)])
    if not every or what not in ("lines", "metadata"):
        if filters:
            raise UsageError(f"{filters} reads the lines or metadata of a job's tasks of srun "
                             f"steps: {ref} has none captured (`logcapture ls JOB` lists "
                             f"them), or --what {what} was asked")
        return None
    ranks = chosen_ranks(values) if values else None
    tasks = [t for t in every if (ranks is None or t["rank"] in ranks)
             and (not nodes or t.get("nodes", "") in nodes)]
    if not tasks:
        raise UsageError(f"{filters}: no such rank or node among the tasks of {ref} (ranks "
                         f"{jobref.format_ranks(t['rank'] for t in every)}; nodes "
                         f"{', '.join(sorted({str(t.get('nodes', '')) for t in every}))})")
    own: list[dict[str, Any]] = []
    if not filters:
        recs = reader.metadata(run) if what == "metadata" else reader.lines(run)
        host = str(reader.summary(run).get("nodes") or "")
        own = [{**r, "rank": None, "node": host, "step": "batch"} for r in recs]
    return own + job_records(reader, tasks, what)
