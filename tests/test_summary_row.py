"""A run's summary row (logcapture/summary_row.py): its name, exit, duration and state, the
same in Python (ls, the runs and job pages, from the spool or the store) and in ClickHouse SQL
(the store's search and Grafana's panels), through a real embedded store; and the sizes and
durations people read, the same in Python (views.py) and in the page's JavaScript
(tests/format_cases.json, also run in Chromium by tests/test_browser.py)."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from logcapture import views
from logcapture.query import LocalReader
from logcapture.records import End, Line, Sample, Start
from logcapture.spool.layout import create_run_dir
from logcapture.spool.writer import SpoolWriter
from logcapture.store import Identity, open_store
from logcapture.summary_row import (
    exit_text,
    run_duration,
    run_name,
    summary_row,
    summary_row_sql,
)
from logcapture.web.reads import run_row

T0 = 1_790_000_000.25
ME = pwd.getpwuid(os.getuid()).pw_name
FORMAT_CASES = Path(__file__).resolve().parent / "format_cases.json"


def run(run_id: str, command: list[str], slurm: dict[str, Any] | None = None,
        end: dict[str, Any] | None = None, lasts: float = 4.0) -> list[Any]:
    """A run's records: its start, two lines (the last ``lasts`` s after the start), a sample,
    and its end when given."""
    out: list[Any] = [Start(run=run_id, stream="run", seq=0, ts=T0, command=command, user=ME,
                            uid=os.getuid(), host="n1", slurm=slurm),
                      Line(run=run_id, stream="stdout", seq=0, ts=T0 + 1, text="a"),
                      Sample(run=run_id, stream="sample:n1", seq=0, ts=T0 + 2, node="n1",
                             job={"cpu_percent": 10.0}),
                      Line(run=run_id, stream="stderr", seq=0, ts=T0 + lasts, text="b")]
    if end is not None:
        out.append(End(run=run_id, stream="run", seq=1, ts=T0 + lasts + 1, **end))
    return out


RUNS = {
    # a Slurm job: its job name, whatever the command
    "slurm": run("slurm", ["python", "train.py"], {"job_id": "11", "job_name": "train"},
                 {"exit_status": 0, "state": "COMPLETED", "duration": 120.0}),
    # Slurm without a name, and no Slurm: the command's first word without its directory
    "noname": run("noname", ["/opt/bin/run.sh", "x"], {"job_id": "12", "job_name": ""},
                  {"exit_status": 3, "state": "FAILED", "duration": 7.5}),
    "plain": run("plain", ["/usr/bin/python3", "-c", "print(1)"], None,
                 {"exit_status": 1, "state": "FAILED", "duration": 0.04}),
    "signal": run("signal", ["./sim"], None,
                  {"signal": 15, "state": "SIGNALED", "duration": 30.0}),
    "both": run("both", ["dir/"], None,  # a status and a signal: the signal says it
                {"exit_status": 0, "signal": 9, "state": "CANCELLED", "duration": 3725.0}),
    # running: from its start to its newest record
    "running": run("running", ["bash", "sweep.sh"], None, None, lasts=65.375),
    "nothing": run("nothing", [], None, None, lasts=0.5),
}
WANT = {  # name, exit, state; durations: the recorded one, or the newest record's less start
    "slurm": ("train", "0", "COMPLETED", 120.0),
    "noname": ("run.sh", "3", "FAILED", 7.5),
    "plain": ("python3", "1", "FAILED", 0.04),
    "signal": ("sim", "signal 15", "SIGNALED", 30.0),
    "both": ("", "signal 9", "CANCELLED", 3725.0),
    "running": ("bash", "", "RUNNING", 65.375),
    "nothing": ("", "", "RUNNING", 2.0),  # its sample (T0 + 2) is its newest record
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The runs in a spool (the running ones' writers still open, as a live run's are) and in
    a store."""
    tmp = tmp_path_factory.mktemp("summary_row")
    spool, dsn = tmp / "spool", f"chdb://{tmp / 'store'}"
    writers = []
    with open_store(dsn) as st:
        for name, records in RUNS.items():
            w = SpoolWriter(create_run_dir(spool, name), fsync=False)
            w.write(records)
            w.flush()
            writers.append(w)
            st.insert_records(records, Identity(run=name, user=ME, uid=os.getuid()))
    yield spool, dsn
    for w in writers:
        w.close()


def rows_of(spool: Path, dsn: str, source: str) -> dict[str, dict[str, Any]]:
    reader = LocalReader(spool, dsn, source=source)
    try:
        return {d["run"]: d for d in reader.runs()}
    finally:
        reader.close()


def test_python_gives_the_rules_rows(sources: tuple[Path, str]) -> None:
    for source in ("spool", "store"):
        summaries = rows_of(*sources, source)
        assert set(summaries) == set(RUNS), source
        for name, (want_name, want_exit, state, length) in WANT.items():
            row = summary_row(summaries[name])
            assert (row["name"], row["exit"], row["state"]) == (want_name, want_exit, state), (
                source, name)
            assert row["duration"] == pytest.approx(length, abs=1e-6), (source, name)


def test_sql_gives_what_python_gives(sources: tuple[Path, str]) -> None:
    spool, dsn = sources
    summaries = rows_of(spool, dsn, "store")
    with open_store(dsn, must_exist=True) as st:
        result = st.client.query(f"SELECT run, {summary_row_sql()} FROM runs FINAL")
    sql = {r[0]: dict(zip(result.column_names[1:], r[1:], strict=True))
           for r in result.result_rows}
    assert set(sql) == set(RUNS)
    for name, got in sql.items():
        want = summary_row(summaries[name])
        assert (got["name"], got["exit"], got["state"]) == (
            want["name"], want["exit"], want["state"]), name
        # the store keeps times to the nanosecond, SQL counts whole milliseconds
        assert got["duration"] == pytest.approx(want["duration"], abs=1e-3), name


def test_ls_the_page_and_grafana_show_the_row(sources: tuple[Path, str]) -> None:
    from logcapture.grafana.dashboards import JOB_UID, JOBS_UID, all_dashboards
    from logcapture.grafana.macros import interpolate

    spool, dsn = sources
    summaries = rows_of(spool, dsn, "auto")
    order = list(summaries.values())
    ls = views.ls_rows(order)[1:]
    for d, cells in zip(order, ls, strict=True):
        name, exit_, state, length = WANT[d["run"]]
        assert cells[1:4] == (name or "-", state, exit_ or "-"), d["run"]
        assert cells[5] == views.duration(length)
        page = run_row(d)
        assert (page["name"], page["exit"], page["state"]) == (name, exit_, state)
        assert page["duration"] == pytest.approx(length, abs=1e-6)
    panels = {(d["uid"], p["title"]): t["rawSql"] for d in all_dashboards().values()
              for p in d["panels"] for t in p.get("targets", [])}
    span = (datetime.fromtimestamp(T0 - 60, UTC), datetime.fromtimestamp(T0 + 7200, UTC))
    with open_store(dsn, must_exist=True) as st:
        for name, (want_name, want_exit, state, length) in WANT.items():
            text = interpolate(panels[JOB_UID, "Job"], {"run": name, "stderr": "0"}, *span)
            res = st.client.query(text)
            [header] = [dict(zip(res.column_names, r, strict=True)) for r in res.result_rows]
            assert (header["job"], header["exit_status"], header["state"]) == (
                want_name, want_exit, state), name
            assert header["duration"] == pytest.approx(length, abs=1e-3), name
        text = interpolate(panels[JOBS_UID, "Jobs"], {"user": [ME]}, *span)
        res = st.client.query(text)
        jobs = {r["run"]: r for r in (dict(zip(res.column_names, row, strict=True))
                                      for row in res.result_rows)}
    assert {k: (r["job"], r["exit_status"], r["state"]) for k, r in jobs.items()} == {
        k: w[:3] for k, w in WANT.items()}


def test_the_rules_one_by_one() -> None:
    assert run_name({"job_name": "train"}, ["python"]) == "train"
    assert run_name({"job_name": 7}, ["/bin/true"]) == "true"  # not a name Slurm gives
    assert run_name(None, None) == "" and run_name({}, ["a/b/"]) == ""
    assert exit_text(0, None) == "0" and exit_text(None, 15) == "signal 15"
    assert exit_text(None, None) == ""
    assert run_duration(5.0, 1.0, 100.0) == 5.0 and run_duration(None, 1.0, 3.5) == 2.5
    assert run_duration(None, None, 3.0) is None and run_duration(None, 5.0, 3.0) == 0.0


def format_cases() -> dict[str, list[list[Any]]]:
    return json.loads(FORMAT_CASES.read_text())


@pytest.mark.parametrize("kind", ["size", "duration"])
def test_sizes_and_durations_are_written_as_the_cases_say(kind: str) -> None:
    # The same cases run through the page's common.js in Chromium (tests/test_browser.py).
    fmt = views.size if kind == "size" else views.duration
    cases = format_cases()[kind]
    assert len(cases) >= 20
    assert [[v, fmt(v)] for v, _ in cases] == cases
