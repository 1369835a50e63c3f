"""A run's summary row, decided once: its name, exit, duration and state as ``logcapture ls``,
the runs and job pages, search results and Grafana's job header and jobs table show them,
once in Python (for run summaries, from the spool or the store) and once in ClickHouse SQL
(for the store's ``runs`` table), held equal by ``tests/test_summary_row.py`` through a real
store.

The rules:

- **name**: the Slurm job name (``sbatch --job-name``, else the script's name: what ``sacct``
  shows as JobName); outside Slurm the command's name, its first word without its directory
  (``python`` for ``/usr/bin/python train.py``), as Slurm names a job it was not given a name
  for. The whole command line is a run's ``command``, shown beside the name where there is
  room (the job page).
- **exit**: ``0``, ``1``...: the exit status; ``signal 15`` for a run killed by a signal;
  empty while the run has not ended.
- **duration**: the run's recorded duration (its End record's); for a run that has not ended,
  the time from its start to its newest record (its last output or sample): a figure that
  is the same whoever reads it and whenever, rather than a clock's now.
- **state**: the End record's state (as ``sacct`` names it); ``RUNNING`` without one.

How a size or a duration is written for people (``1.2 GiB``, ``3 min 05 s``) is
``views.size`` and ``views.duration``, which the page's ``common.js`` writes the same way
(``tests/format_cases.json``, checked in both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

RUNNING = "RUNNING"


def run_name(slurm: Mapping[str, Any] | None, command: Sequence[str] | None) -> str:
    """The Slurm job name, else the command's first word without its directory."""
    job_name = (slurm or {}).get("job_name")
    if isinstance(job_name, str) and job_name:
        return job_name
    return str(command[0]).rsplit("/", 1)[-1] if command else ""


def exit_text(exit_status: int | None, signal: int | None) -> str:
    """``0``, ``1``, ``signal 15``; empty while the run has not ended."""
    if signal is not None:
        return f"signal {signal}"
    return "" if exit_status is None else str(exit_status)


def run_duration(duration: float | None, start: float | None, last: float | None
                 ) -> float | None:
    """The recorded duration, else the newest record's time less the start's (None when
    neither is known)."""
    if duration is not None:
        return float(duration)
    if start is None or last is None:
        return None
    return max(0.0, last - start)


def summary_row(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The row of a run summary (``query.SUMMARY_KEYS``: ``slurm``, ``command``,
    ``exit_status``, ``signal``, ``duration``, ``start``, ``last``, ``state``)."""
    return {"name": run_name(summary.get("slurm"), summary.get("command")),
            "exit": exit_text(summary.get("exit_status"), summary.get("signal")),
            "duration": run_duration(summary.get("duration"), summary.get("start"),
                                     summary.get("last")),
            "state": summary.get("state") or RUNNING}


# --- The same rules in ClickHouse SQL, over the columns of the store's ``runs`` table -------
# (``slurm`` and ``command`` JSON text, ``start_ts``/``last_ts`` DateTime64): each function
# takes the column expressions, so a query can name them through its own aliases.

def name_sql(slurm: str = "slurm", command: str = "command") -> str:
    job_name = f"JSONExtractString(ifNull({slurm}, ''), 'job_name')"
    first = f"JSONExtract(ifNull({command}, '[]'), 'Array(String)')[1]"
    return f"if({job_name} != '', {job_name}, arrayElement(splitByChar('/', {first}), -1))"


def exit_sql(exit_status: str = "exit_status", signal: str = "signal") -> str:
    return (f"multiIf({signal} IS NOT NULL, concat('signal ', toString({signal})), "
            f"{exit_status} IS NOT NULL, toString({exit_status}), '')")


def duration_sql(duration: str = "duration", start: str = "start_ts",
                 last: str = "last_ts") -> str:
    # A run without a start record in the store yet starts at its newest record (as
    # ``Store.runs`` gives its start), so lasts 0.
    return (f"ifNull({duration}, greatest(0, dateDiff('millisecond', ifNull({start}, {last}), "
            f"{last}) / 1000))")


def state_sql(state: str = "state") -> str:
    return f"ifNull({state}, '{RUNNING}')"


def summary_row_sql() -> str:
    """The row's columns, ``name``, ``exit``, ``duration`` and ``state``, as a select list
    over the ``runs`` table's own columns."""
    return (f"{name_sql()} AS name, {exit_sql()} AS exit, {duration_sql()} AS duration, "
            f"{state_sql()} AS state")
