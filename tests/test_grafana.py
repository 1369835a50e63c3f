"""Grafana: every panel and variable query of the generated dashboards, with Grafana's macros
and variables expanded as the ClickHouse plugin would, run on the real engine (chDB) against
runs shipped through the store; and the provisioning files checked against the formats
Grafana documents."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import lc

from logcapture.grafana import (
    Connection,
    all_dashboards,
    connection_from_url,
    install,
    interpolate,
    password_reference,
)
from logcapture.grafana.dashboards import COMPARE_UID, JOB_UID, JOBS_UID, SEARCH_UID
from logcapture.grafana.provisioning import datasource_provisioning
from logcapture.grafana.query import DATASOURCE_UID, PLUGIN_ID
from logcapture.records import End, Line, Metadata, Note, Sample, Start
from logcapture.store import Identity, open_store
from logcapture.xaxis import choose_x_axis

T0 = 1_700_000_000.0
FROM = datetime.fromtimestamp(T0 - 3600, UTC)
TO = datetime.fromtimestamp(T0 + 3600, UTC)


def gpu(index: int, util: float | None, node: str) -> dict[str, Any]:
    return {"uuid": f"GPU-{node}-{index}", "index": index, "name": "A100",
            "utilization_gpu_percent": util, "memory_used_bytes": 1000 * (index + 1),
            "memory_total_bytes": 80_000, "power_watts": 100.5, "temperature_celsius": 50,
            "sm_clock_mhz": 1400, "job_memory_used_bytes": 500}


def samples(run: str, node: str, t0: float, utils: list[float]) -> list[Sample]:
    return [Sample(run=run, stream=f"sample:{node}", seq=i, ts=t0 + 10 * i, node=node,
                   gpus=[gpu(0, u, node), gpu(1, u / 2, node)],
                   job={"cpu_percent": 150.0 + i, "memory_rss_bytes": 2**30,
                        "io_read_bytes": 100 * i, "io_write_bytes": 10 * i, "threads": 4})
            for i, u in enumerate(utils)]


TRAIN_META = [{"epoch": 1, "loss": 2.5, "acc": 0.1, "phase": "train"},
              {"epoch": 2, "loss": 1.5, "acc": 0.4, "phase": "train"},
              {"epoch": 3, "loss": 0.5, "acc": 0.8, "phase": "eval", "lr": "NaN"}]
SWEEP_META = [{"progress": 10, "loss": 3.0, "step": 5}, {"progress": 50, "loss": 2.0, "step": 9},
              {"progress": 90, "loss": 1.0, "step": 12}]


def run_1001() -> list[Any]:
    """alice's finished two-node training job."""
    r = "1001"
    out: list[Any] = [
        Start(run=r, stream="run", seq=0, ts=T0, command=["python", "train.py", "--lr", "0.1"],
              user="alice", uid=1000, host="node1",
              slurm={"job_id": "1001", "job_name": "train", "node": "node1"},
              inventory={"job_gpus": ["GPU-node1-0", "GPU-node1-1"]}),
        Line(run=r, stream="stdout", seq=0, ts=T0 + 1, text="starting"),
        Note(run=r, stream="stdout", seq=1, ts=T0 + 2, note="repeat", count=3),
        Line(run=r, stream="stderr", seq=0, ts=T0 + 3, text="warning: slow disk"),
        Note(run=r, stream="run", seq=1, ts=T0 + 4, note="warning", text="bad /LOGCOMMAND"),
    ]
    for i, fields in enumerate(TRAIN_META):
        out.append(Metadata(run=r, stream="stdout", seq=2 + i, ts=T0 + 10 + 10 * i,
                            fields=fields))
    out.append(Line(run=r, stream="stdout", seq=5, ts=T0 + 50, text="done"))
    out += samples(r, "node1", T0 + 5, [90.0, 70.0])
    out += samples(r, "node2", T0 + 5, [40.0])
    out.append(End(run=r, stream="run", seq=2, ts=T0 + 120, exit_status=0, state="COMPLETED",
                   duration=120.0))
    return out


def run_1002() -> list[Any]:
    """alice's sweep, still running (no End record)."""
    r = "1002"
    out: list[Any] = [Start(run=r, stream="run", seq=0, ts=T0 + 200,
                            command=["bash", "sweep.sh"], user="alice", uid=1000,
                            host="node3")]
    for i, fields in enumerate(SWEEP_META):
        out.append(Metadata(run=r, stream="stdout", seq=i, ts=T0 + 210 + 10 * i, fields=fields))
    out += samples(r, "node3", T0 + 205, [20.0, 30.0])
    return out


def run_2001() -> list[Any]:
    """bob's job, killed by signal 9, no GPU."""
    r = "2001"
    return [Start(run=r, stream="run", seq=0, ts=T0 + 300, command=["./sim"], user="bob",
                  uid=1001, host="node4"),
            Line(run=r, stream="stdout", seq=0, ts=T0 + 301, text="simulating"),
            End(run=r, stream="run", seq=1, ts=T0 + 330, signal=9, state="SIGNALED",
                duration=30.0)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with open_store(f"chdb://{tmp_path_factory.mktemp('grafana')}/store") as s:
        for records, who in ((run_1001(), ("alice", 1000)), (run_1002(), ("alice", 1000)),
                             (run_2001(), ("bob", 1001))):
            result = s.insert_records(records, Identity(run=records[0].run, user=who[0],
                                                        uid=who[1]))
            assert not result.bad
        # what the shipper stores for a run (logcapture.insights)
        s.insert_insights(Identity(run="2001", user="bob", uid=1001), [
            {"kind": "signal", "category": "failure", "message": "killed by SIGKILL (signal 9)",
             "hint": "", "evidence": [], "details": {"number": 9}}], T0 + 331)
        s.insert_insights(Identity(run="1001", user="alice", uid=1000), [
            {"kind": "gpu-idle", "category": "efficiency", "message": "1 of 4 GPU(s) idle",
             "hint": "", "evidence": [], "details": {"gpu_hours_idle": 0.5}}], T0 + 121)
        yield s


DASHBOARDS = all_dashboards()

# Variable values per dashboard uid, as a viewer would pick them.
VARIABLES: dict[str, dict[str, Any]] = {
    JOB_UID: {"run": "1001", "stderr": "0", "node": "node1", "x_axis": "epoch", "rank": ["0"]},
    JOBS_UID: {"user": ["alice", "bob"]},
    COMPARE_UID: {"runs": ["1001", "1002"], "key": "loss"},
    SEARCH_UID: {"pattern": "slow warning", "user": ["alice", "bob"]},
}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title or 'var NAME', raw SQL) for every query of every dashboard."""
    out = []
    for d in DASHBOARDS.values():
        for p in panels(d):
            for t in p.get("targets", []):
                out.append((d["uid"], p["title"], t["rawSql"]))
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                out.append((d["uid"], f"var {v['name']}", v["query"]))
    return out


def run_sql(store, uid: str, sql: str, **variables: Any) -> list[dict[str, Any]]:
    values = {**VARIABLES[uid], **variables}
    text = interpolate(sql, values, FROM, TO)
    assert "$" not in text.replace("$$", ""), f"unexpanded Grafana syntax left in:\n{text}"
    result = store.client.query(text)
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def query_of(uid: str, title: str) -> str:
    matches = [sql for u, t, sql in queries() if u == uid and t == title]
    assert len(matches) == 1, (uid, title, [t for u, t, _ in queries() if u == uid])
    return matches[0]


# --- every query runs -------------------------------------------------------------------------


@pytest.mark.parametrize("uid,title,sql", queries(), ids=[f"{u}:{t}" for u, t, _ in queries()])
def test_every_query_runs_on_the_real_schema(store, uid, title, sql):
    run_sql(store, uid, sql)


def test_every_dashboard_has_queries():
    uids = {u for u, _, _ in queries()}
    assert uids == {JOB_UID, JOBS_UID, COMPARE_UID, SEARCH_UID}
    assert len(queries()) >= 25


# --- job details --------------------------------------------------------------------------------


def test_header(store):
    [row] = run_sql(store, JOB_UID, query_of(JOB_UID, "Job"))
    assert row == {"user": "alice", "job": "train", "state": "COMPLETED", "exit_status": "0",
                   "duration": 120.0, "nodes": "node1, node2", "gpus": 4}
    [row] = run_sql(store, JOB_UID, query_of(JOB_UID, "Job"), run="2001")
    assert row["exit_status"] == "signal 9" and row["state"] == "SIGNALED"
    assert row["job"] == "sim" and row["nodes"] == "node4" and row["gpus"] == 0
    [row] = run_sql(store, JOB_UID, query_of(JOB_UID, "Job"), run="1002")
    assert row["state"] == "RUNNING" and row["exit_status"] == "" and row["job"] == "bash"


def test_logs_stdout_notes_and_the_stderr_switch(store):
    sql = query_of(JOB_UID, "Output")
    rows = run_sql(store, JOB_UID, sql)
    bodies = [r["body"] for r in rows]
    assert bodies[0] == "done" and bodies[-1] == "starting"  # newest first
    assert "[logcapture: previous line repeated 3 more times, dropped]" in bodies
    assert "[logcapture: warning: bad /LOGCOMMAND]" in bodies
    assert any(json.loads(b) == TRAIN_META[0] for b in bodies if b.startswith("{"))
    assert "warning: slow disk" not in bodies
    assert {r["level"] for r in rows} <= {"info", "debug", "warning"}
    rows = run_sql(store, JOB_UID, sql, stderr="1")
    errs = [r for r in rows if r["source"] == "stderr"]
    assert [r["body"] for r in errs] == ["warning: slow disk"] and errs[0]["level"] == "error"


def test_logs_show_each_metadata_line_and_mode_change_once(store):
    # Mode enabled keeps a metadata line as printed (Line seq N) and as a record (Metadata
    # seq N+1); a mode change is noted in both streams. Each shows once, with or without stderr.
    r, t0 = "3001", T0 - 10**6  # long before the dashboards' time range
    records = [
        Start(run=r, stream="run", seq=0, ts=t0, command=["train"], user="bob", uid=1001),
        Line(run=r, stream="stdout", seq=0, ts=t0 + 1, text='{"epoch": 1}'),
        Metadata(run=r, stream="stdout", seq=1, ts=t0 + 1, fields={"epoch": 1}),
        Note(run=r, stream="stdout", seq=2, ts=t0 + 2, note="mode", text="mode changed"),
        Note(run=r, stream="stderr", seq=0, ts=t0 + 2, note="mode", text="mode changed"),
        Metadata(run=r, stream="stdout", seq=3, ts=t0 + 3, fields={"epoch": 2}),
    ]
    assert not store.insert_records(records, Identity(run=r, user="bob", uid=1001)).bad
    for stderr in ("0", "1"):
        rows = run_sql(store, JOB_UID, query_of(JOB_UID, "Output"), run=r, stderr=stderr)
        assert [x["body"] for x in rows] == [
            '{"epoch":2}', "[logcapture: mode changed]", '{"epoch": 1}'], stderr


def test_metadata_table_newest_first(store):
    rows = run_sql(store, JOB_UID, query_of(JOB_UID, "Metadata (newest first)"))
    assert [json.loads(r["fields"]) for r in rows] == TRAIN_META[::-1]
    assert rows[0]["time"] > rows[-1]["time"]


def test_metadata_by_time_numbers_only(store):
    rows = run_sql(store, JOB_UID, query_of(JOB_UID, "Metadata by time"))
    assert {r["key"] for r in rows} == {"epoch", "loss", "acc"}  # not phase, not lr "NaN"
    loss = [r["value"] for r in rows if r["key"] == "loss"]
    assert loss == [2.5, 1.5, 0.5]


def test_x_axis_follows_the_rule(store):
    for run, meta in (("1001", TRAIN_META), ("1002", SWEEP_META)):
        [row] = run_sql(store, JOB_UID, query_of(JOB_UID, "X axis"), run=run)
        assert row["x_axis"] == choose_x_axis(meta)
        [var] = run_sql(store, JOB_UID, query_of(JOB_UID, "var x_axis"), run=run)
        assert var["x_key"] == row["x_axis"]
    [row] = run_sql(store, JOB_UID, query_of(JOB_UID, "X axis"), run="1001")
    assert row == {"x_axis": "epoch", "chosen_because": "epoch"}
    assert run_sql(store, JOB_UID, query_of(JOB_UID, "X axis"), run="2001") == []


def test_metadata_by_x(store):
    rows = run_sql(store, JOB_UID, query_of(JOB_UID, "Metadata by $x_axis"))
    assert {r["key"] for r in rows} == {"loss", "acc"}  # the X key itself is not a Y series
    assert [(r["x"], r["value"]) for r in rows if r["key"] == "loss"] == [
        (1.0, 2.5), (2.0, 1.5), (3.0, 0.5)]
    rows = run_sql(store, JOB_UID, query_of(JOB_UID, "Metadata by $x_axis"), run="1002")
    assert [(r["x"], r["value"]) for r in rows if r["key"] == "step"] == [
        (10.0, 5.0), (50.0, 9.0), (90.0, 12.0)]


def test_gpu_and_cpu_panels_per_node(store):
    util = run_sql(store, JOB_UID, query_of(JOB_UID, "GPU utilisation"))
    assert [(r["gpu"], r["value"]) for r in util] == [
        ("GPU 0 A100", 90.0), ("GPU 1 A100", 45.0), ("GPU 0 A100", 70.0), ("GPU 1 A100", 35.0)]
    util2 = run_sql(store, JOB_UID, query_of(JOB_UID, "GPU utilisation"), node="node2")
    assert [r["value"] for r in util2] == [40.0, 20.0]
    mem = run_sql(store, JOB_UID, query_of(JOB_UID, "GPU memory used"))
    assert {r["value"] for r in mem} == {1000.0, 2000.0}
    cpu = run_sql(store, JOB_UID, query_of(JOB_UID, "CPU (100% = one core)"))
    assert [r["value"] for r in cpu] == [150.0, 151.0]
    nodes = run_sql(store, JOB_UID, query_of(JOB_UID, "var node"))
    assert [r["node"] for r in nodes] == ["node1", "node2"]
    # The row repeats per node.
    [row] = [p for p in DASHBOARDS["job-details"]["panels"] if p["type"] == "row"]
    assert row["repeat"] == "node"


def test_gpu_panel_skips_missing_values(store):
    # A GPU whose utilisation NVML could not read (None) gives no point rather than a zero.
    sql = query_of(JOB_UID, "GPU utilisation")
    assert "JSONType(g, 'utilization_gpu_percent')" in sql


def test_time_filter_applies(store):
    sql = query_of(JOB_UID, "Metadata by time")
    text = interpolate(sql, VARIABLES[JOB_UID], datetime.fromtimestamp(T0 + 15, UTC),
                       datetime.fromtimestamp(T0 + 25, UTC))
    rows = store.client.query(text).result_rows
    assert {r[1] for r in rows} == {"epoch", "loss", "acc"} and len(rows) == 3


def test_run_variable_newest_first(store):
    rows = run_sql(store, JOB_UID, query_of(JOB_UID, "var run"))
    assert [r["run"] for r in rows] == ["2001", "1002", "1001"]


# --- jobs overview ---------------------------------------------------------------------------


def test_jobs_table(store):
    rows = run_sql(store, JOBS_UID, query_of(JOBS_UID, "Jobs"))
    by_run = {r["run"]: r for r in rows}
    assert list(by_run) == ["2001", "1002", "1001"]
    assert by_run["1001"]["state"] == "COMPLETED" and by_run["1001"]["duration"] == 120.0
    assert by_run["1001"]["gpus"] == 4 and by_run["1001"]["nodes"] == "node1, node2"
    assert by_run["1001"]["gpu_utilization"] == pytest.approx((90 + 45 + 70 + 35 + 40 + 20) / 6)
    assert by_run["1002"]["state"] == "RUNNING"
    assert by_run["2001"]["exit_status"] == "signal 9" and by_run["2001"]["gpus"] == 0
    only_bob = run_sql(store, JOBS_UID, query_of(JOBS_UID, "Jobs"), user=["bob"])
    assert [r["run"] for r in only_bob] == ["2001"]
    # The run links to the job details for that run and its time span.
    [table] = [p for p in DASHBOARDS["jobs"]["panels"] if p["title"] == "Jobs"]
    links = json.dumps(table["fieldConfig"]["overrides"])
    assert f"/d/{JOB_UID}?var-run=" in links


def test_insights_panels(store):
    rows = run_sql(store, JOB_UID, query_of(JOB_UID, "Insights"), run="2001")
    assert [(r["kind"], r["message"]) for r in rows] == [("signal",
                                                          "killed by SIGKILL (signal 9)")]
    assert run_sql(store, JOB_UID, query_of(JOB_UID, "Insights"), run="1002") == []
    by_kind = run_sql(store, JOBS_UID, query_of(JOBS_UID, "Insights by kind"))
    assert [(r["kind"], r["jobs"], r["gpu_hours_idle"]) for r in by_kind] == [
        ("gpu-idle", 1, 0.5), ("signal", 1, 0.0)]
    only_bob = run_sql(store, JOBS_UID, query_of(JOBS_UID, "Insights by kind"), user=["bob"])
    assert [r["kind"] for r in only_bob] == ["signal"]


def test_jobs_by_state_and_gpu_utilisation(store):
    rows = run_sql(store, JOBS_UID, query_of(JOBS_UID, "Jobs by state"))
    assert {r["state"]: r["jobs"] for r in rows} == {"COMPLETED": 1, "RUNNING": 1,
                                                     "SIGNALED": 1}
    rows = run_sql(store, JOBS_UID, query_of(JOBS_UID, "GPU utilisation per job"))
    assert {r["run"] for r in rows} == {"1001", "1002"}
    users = run_sql(store, JOBS_UID, query_of(JOBS_UID, "var user"))
    assert [r["owner"] for r in users] == ["alice", "bob"]


# --- compare jobs ----------------------------------------------------------------------------


def test_compare_jobs(store):
    keys = run_sql(store, COMPARE_UID, query_of(COMPARE_UID, "var key"))
    assert [r["key"] for r in keys] == ["acc", "epoch", "loss", "progress", "step"]
    rows = run_sql(store, COMPARE_UID, query_of(COMPARE_UID, "$key by each job's X axis"))
    assert [(r["run"], r["x"], r["value"]) for r in rows] == [
        ("1001", 1.0, 2.5), ("1001", 2.0, 1.5), ("1001", 3.0, 0.5),
        ("1002", 10.0, 3.0), ("1002", 50.0, 2.0), ("1002", 90.0, 1.0)]
    rows = run_sql(store, COMPARE_UID, query_of(COMPARE_UID, "$key by time since start"))
    assert [(r["run"], r["elapsed_seconds"]) for r in rows] == [
        ("1001", 10.0), ("1001", 20.0), ("1001", 30.0),
        ("1002", 10.0), ("1002", 20.0), ("1002", 30.0)]
    axes = run_sql(store, COMPARE_UID, query_of(COMPARE_UID, "X axis per job"))
    assert [(r["run"], r["x_axis"]) for r in axes] == [("1001", "epoch"), ("1002", "progress")]


# --- the dashboards' shape -----------------------------------------------------------------------


def test_dashboards_reference_the_provisioned_datasource():
    for d in DASHBOARDS.values():
        assert d["uid"] and d["title"].startswith("logcapture")
        for p in panels(d):
            if p["type"] == "row":
                continue
            assert p["datasource"] == {"type": PLUGIN_ID, "uid": DATASOURCE_UID}
            for t in p["targets"]:
                assert t["datasource"]["uid"] == DATASOURCE_UID
                assert t["editorType"] == "sql" and t["format"] in (0, 1, 2)
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                assert v["datasource"]["uid"] == DATASOURCE_UID


def test_variables_are_always_quoted():
    # Every variable reaches SQL as a quoted string (or the 0/1 switch), never raw text.
    for _uid, _title, sql in queries():
        for m in re.finditer(r"\$\{?(\w+)(?::(\w+))?\}?", sql):
            name, fmt = m.group(1), m.group(2)
            if name.startswith("__"):
                continue
            if fmt == "percentencode":  # free text: only inside decodeURLComponent('...')
                assert sql[m.start() - 20:m.start()] == "decodeURLComponent('", sql
                assert sql[m.end():m.end() + 2] == "')", sql
                continue
            assert fmt in ("sqlstring", "singlequote") or name == "stderr", (name, sql)


def test_dashboards_refresh_while_jobs_run():
    assert DASHBOARDS["job-details"]["refresh"] == "10s"
    assert DASHBOARDS["jobs"]["refresh"] == DASHBOARDS["compare-jobs"]["refresh"] == "1m"


def test_panel_types():
    types = {d["uid"]: sorted({p["type"] for p in panels(d)}) for d in DASHBOARDS.values()}
    assert types[JOB_UID] == ["logs", "row", "stat", "table", "timeseries", "xychart"]
    assert "table" in types[JOBS_UID] and "xychart" in types[COMPARE_UID]


# --- provisioning ------------------------------------------------------------------------------


def test_install_writes_what_grafana_reads(tmp_path: Path):
    written = install(tmp_path / "prov", Connection(host="ch.example", port=8123,
                                                    protocol="http", forward_user=True))
    names = sorted(str(p.relative_to(tmp_path / "prov")) for p in written)
    assert names == ["dashboards/logcapture.yaml", "dashboards/logcapture/compare-jobs.json",
                     "dashboards/logcapture/job-details.json", "dashboards/logcapture/jobs.json",
                     "dashboards/logcapture/search.json", "datasources/logcapture.yaml"]
    ds = yaml.safe_load((tmp_path / "prov/datasources/logcapture.yaml").read_text())
    assert ds["apiVersion"] == 1
    [d] = ds["datasources"]
    assert d["type"] == "grafana-clickhouse-datasource" and d["uid"] == DATASOURCE_UID
    assert d["name"] and d["access"] == "proxy"
    jd = d["jsonData"]
    assert jd["host"] == "ch.example" and jd["port"] == 8123 and jd["protocol"] == "http"
    assert jd["forwardGrafanaHeaders"] is True
    assert jd["logs"]["otelEnabled"] is False and jd["logs"]["defaultTable"] == "lines"
    assert jd["logs"]["defaultDatabase"] == "logcapture"
    assert d["secureJsonData"]["password"] == "$__env{LOGCAPTURE_CLICKHOUSE_PASSWORD}"
    prov = yaml.safe_load((tmp_path / "prov/dashboards/logcapture.yaml").read_text())
    assert prov["apiVersion"] == 1
    [p] = prov["providers"]
    assert p["type"] == "file" and p["name"]
    assert Path(p["options"]["path"]) == tmp_path / "prov/dashboards/logcapture"
    for f in (tmp_path / "prov/dashboards/logcapture").glob("*.json"):
        model = json.loads(f.read_text())
        assert model["uid"] in (JOB_UID, JOBS_UID, COMPARE_UID, SEARCH_UID) and model["panels"]
    assert (tmp_path / "prov/datasources/logcapture.yaml").stat().st_mode & 0o777 == 0o644


def test_password_choices(tmp_path: Path):
    assert password_reference() == "$__env{LOGCAPTURE_CLICKHOUSE_PASSWORD}"
    assert password_reference(env="CH_PW") == "$__env{CH_PW}"
    assert password_reference(file=tmp_path / "pw") == f"$__file{{{tmp_path / 'pw'}}}"
    assert password_reference(none=True) is None
    assert password_reference(clear="pa$s") == "pa$$s"  # Grafana reads $$ as a literal $
    from logcapture.errors import UsageError

    with pytest.raises(UsageError):
        password_reference(env="A", file="b")
    with pytest.raises(UsageError):
        password_reference(env="not a name")


def test_no_password_means_no_secure_json(tmp_path: Path):
    assert "secureJsonData" not in datasource_provisioning(Connection(password=None))


def test_clear_password_file_is_private(tmp_path: Path):
    install(tmp_path, Connection(password="hunter2"))
    f = tmp_path / "datasources/logcapture.yaml"
    assert f.stat().st_mode & 0o777 == 0o600
    assert yaml.safe_load(f.read_text())["datasources"][0]["secureJsonData"]["password"] == \
        "hunter2"


def test_connection_from_url():
    c = connection_from_url("https://grafana@ch.example/logs")
    assert (c.host, c.port, c.protocol, c.secure, c.username, c.database) == (
        "ch.example", 8443, "http", True, "grafana", "logs")
    c = connection_from_url("clickhouse://ch:9001", username="viewer")
    assert (c.protocol, c.port, c.username, c.database) == ("native", 9001, "viewer",
                                                            "logcapture")
    from logcapture.errors import UsageError

    for bad in ("chdb:///tmp/x", "ftp://x", "http://u:secret@h:8123"):
        with pytest.raises(UsageError):
            connection_from_url(bad)


# --- the command ---------------------------------------------------------------------------


def test_cli_install(tmp_path: Path):
    res = lc(["grafana", "install", str(tmp_path / "p"), "--store-url",
              "https://viewer@ch.example:8443/logcapture", "--forward-user",
              "--password-file", "/etc/grafana/ch-password"], text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].endswith("datasources/logcapture.yaml")
    [d] = yaml.safe_load((tmp_path / "p/datasources/logcapture.yaml").read_text())["datasources"]
    assert d["jsonData"]["username"] == "viewer" and d["jsonData"]["secure"] is True
    assert d["secureJsonData"]["password"] == "$__file{/etc/grafana/ch-password}"

    res = lc(["grafana", "install", str(tmp_path / "q"), "--protocol", "http",
              "--database", "lc2", "--no-password"], text=True)
    assert res.returncode == 0, res.stderr
    [d] = yaml.safe_load((tmp_path / "q/datasources/logcapture.yaml").read_text())["datasources"]
    assert d["jsonData"]["port"] == 8123 and "secureJsonData" not in d
    job = json.loads((tmp_path / "q/dashboards/logcapture/job-details.json").read_text())
    assert "lc2.metadata" in json.dumps(job) and "logcapture.metadata" not in json.dumps(job)


@pytest.mark.parametrize("args", [
    ["--store-url", "chdb:///tmp/store"],            # Grafana cannot reach an embedded store
    ["--forward-user"],                              # native protocol: headers not forwarded
    ["--password-env", "A", "--password", "b"],      # one password source only
    ["--database", "x; DROP TABLE y"],               # not an identifier
])
def test_cli_install_refuses(tmp_path: Path, args: list[str]):
    res = lc(["grafana", "install", str(tmp_path / "p"), *args], text=True)
    assert res.returncode == 2 and res.stderr.startswith("logcapture: error: "), res.stderr
    assert not (tmp_path / "p" / "datasources").exists()


# --- search -----------------------------------------------------------------------------------

SEARCH_TEXTS = ["[rank3] NCCL WARN Watchdog caught collective operation timeout",
                "NCCL INFO Init COMPLETE", "timeout waiting for NCCL", "héllo wörld",
                "x'; DROP TABLE lines; -- \\' OR 1=1", "lr=0.001 loss=0.5"]


@pytest.fixture(scope="module")
def search_store(store):
    """The module's store (chDB: one engine per process) with a run of carol and one of dave."""
    for who, uid in (("carol", 1002), ("dave", 1003)):
        run = f"s-{who}"
        records = [Start(run=run, stream="run", seq=0, ts=T0 + 1000, command=["train.py"],
                         slurm={"job_id": run, "job_name": f"{who}-job"})]
        records += [Line(run=run, stream="stdout", seq=i + 1, ts=T0 + 1000 + i, text=text)
                    for i, text in enumerate(SEARCH_TEXTS)]
        records.append(End(run=run, stream="run", seq=1, ts=T0 + 1060, state="FAILED"))
        store.insert_records(records, Identity(run=run, user=who, uid=uid))
        if who == "carol":  # shipped twice: the copies show once
            store.insert_records(records, Identity(run=run, user=who, uid=uid))
    return store


def search(store, pattern: str, users: list[str] | None = None) -> list[dict[str, Any]]:
    return run_sql(store, SEARCH_UID, query_of(SEARCH_UID, "Matching lines (newest 1000)"),
                   pattern=pattern, user=users or ["carol"])


def test_search_finds_lines_with_every_token(search_store):
    rows = search(search_store, "NCCL timeout")
    assert [r["text"] for r in rows] == [SEARCH_TEXTS[2], SEARCH_TEXTS[0]]  # newest first
    assert {(r["run"], r["job"], r["state"], r["user"]) for r in rows} == {
        ("s-carol", "carol-job", "FAILED", "carol")}
    assert rows[0]["seq"] == 3 and rows[0]["stream"] == "stdout"
    assert rows[0]["start_ms"] == int((T0 + 1000) * 1000)  # the link's range: the run's
    assert [r["text"] for r in search(search_store, "wörld héllo")] == [SEARCH_TEXTS[3]]
    assert [r["text"] for r in search(search_store, "lr=0.001")] == [SEARCH_TEXTS[5]]
    assert search(search_store, "NCC") == []  # whole tokens only
    assert search(search_store, "  ") == []  # no token: nothing
    assert {r["user"] for r in search(search_store, "NCCL", ["carol", "dave"])} == {
        "carol", "dave"}
    assert search(search_store, "NCCL", ["alice", "bob"]) == []


def test_search_box_text_that_looks_like_sql_is_only_text(search_store):
    for pattern in ("x'; DROP TABLE lines; --", "\\' OR 1=1 --", "\\", "'", "%27",
                    "${user}", "') OR 1=1 OR ('"):
        rows = search(search_store, pattern)
        expect = [SEARCH_TEXTS[4]] if any(c.isalnum() for c in pattern) and all(
            t in SEARCH_TEXTS[4].replace("\\", " ") for t in
            re.findall(r"[0-9A-Za-z]+", pattern)) else []
        assert [r["text"] for r in rows] == expect, pattern
    assert search_store.client.command("SELECT count() FROM lines") >= 12  # still there


def test_search_uses_the_token_index(search_store):
    sql = interpolate(query_of(SEARCH_UID, "Matching lines (newest 1000)"),
                      {"pattern": "NCCL timeout", "user": ["carol"]}, FROM, TO)
    plan = "\n".join(r[0] for r in search_store.client.query(
        "EXPLAIN indexes = 1 " + sql).result_rows)
    assert "text_tokens" in plan  # the engine folded the box's tokens into the index's terms


# --- a job of several ranks: its task runs' metadata, one series per rank ----------------------

RANKED = [{"step": s, "loss": 1.0 / (s + 1) + r, "rank": r} for s in range(3) for r in (1, 0)]


def ranked_job() -> list[list[Any]]:
    """Job 4001: its batch run (no metadata of its own) and two tasks of step 0 printing
    `step` and `loss` in turn, as each task of an srun step is captured (slurm.task)."""
    runs = [[Start(run="4001", stream="run", seq=0, ts=T0, command=["sbatch"], user="alice",
                   uid=1000, host="node1", slurm={"job_id": "4001", "nodelist": "node[1-2]"})]]
    for r in (0, 1):
        run = f"4001.0.{r}"
        recs: list[Any] = [Start(run=run, stream="run", seq=0, ts=T0 + 1, command=["python"],
                                 user="alice", uid=1000, host=f"node{r + 1}",
                                 slurm={"job_id": "4001", "step": "0", "rank": str(r),
                                        "local_rank": "0", "node": f"node{r + 1}"})]
        recs += [Metadata(run=run, stream="stdout", seq=i, ts=T0 + 10 + 2 * i + r, fields=f)
                 for i, f in enumerate(f for f in RANKED if f["rank"] == r)]
        runs.append(recs)
    return runs


@pytest.fixture(scope="module")
def ranked_store(store):
    """The module's store with job 4001 (one embedded engine per process; these tests come
    last in the file, so the others never see it)."""
    for records in ranked_job():
        assert not store.insert_records(records, Identity(run=records[0].run, user="alice",
                                                          uid=1000)).bad
    return store


def test_a_job_of_several_ranks_shows_rank_0_and_every_rank_on_request(ranked_store):
    st = ranked_store
    job = {"run": "4001"}
    assert [r["rank"] for r in run_sql(st, JOB_UID, query_of(JOB_UID, "var rank"),
                                       **job)] == ["0", "1"]
    # rank 0 by default: its rows, with their rank
    rows = run_sql(st, JOB_UID, query_of(JOB_UID, "Metadata (newest first)"), **job)
    assert {r["rank"] for r in rows} == {"0"} and len(rows) == 3
    everyone = {**job, "rank": ["0", "1"]}
    rows = run_sql(st, JOB_UID, query_of(JOB_UID, "Metadata (newest first)"), **everyone)
    assert sorted(r["rank"] for r in rows) == ["0", "0", "0", "1", "1", "1"]
    # the merged rows read step 0, 0, 1, 1 ...: per rank, step is the X axis, as in Python
    for ranks in (["0"], ["0", "1"]):
        [axis] = run_sql(st, JOB_UID, query_of(JOB_UID, "X axis"), **job, rank=ranks)
        assert axis["x_axis"] == "step"
    # what one series of the merged rows would give (a key named otherwise than rank, which
    # names a row's series within its run: xaxis)
    assert choose_x_axis([{"r" if k == "rank" else k: v for k, v in f.items()}
                          for f in RANKED]) == "r"
    # one series per rank, by time and by the X axis
    by_time = run_sql(st, JOB_UID, query_of(JOB_UID, "Metadata by time"), **everyone)
    assert {r["key"] for r in by_time} == {f"{k} (rank {r})" for k in ("step", "loss", "rank")
                                           for r in (0, 1)}
    by_x = run_sql(st, JOB_UID, query_of(JOB_UID, "Metadata by $x_axis"), **everyone,
                   x_axis="step")
    assert [(r["x"], r["value"]) for r in by_x if r["key"] == "loss (rank 1)"] == [
        (0.0, 2.0), (1.0, 1.5), (2.0, 1 / 3 + 1)]


def test_a_task_run_is_not_a_task_of_a_requeued_run_and_a_job_without_tasks_shows_its_own(
        ranked_store, store):
    assert run_sql(ranked_store, JOB_UID, query_of(JOB_UID, "var rank"), run="4001.0") == []
    assert run_sql(ranked_store, JOB_UID, query_of(JOB_UID, "var rank"), run="400") == []
    rows = run_sql(store, JOB_UID, query_of(JOB_UID, "Metadata (newest first)"), rank=[])
    assert [json.loads(r["fields"]) for r in rows] == TRAIN_META[::-1]
    assert {r["rank"] for r in rows} == {""}


def test_a_run_of_labelled_workers_shows_rank_0_and_every_rank_on_request(ranked_store):
    """torchrun --tee's workers in one run without task runs: the rank variable lists the
    numbers of the rows' labels, rank 0's rows by default (and the unlabelled ones), one
    series per label, as the page (tests/test_web.py holds the two equal)."""
    run = "4002"
    recs: list[Any] = [Start(run=run, stream="run", seq=0, ts=T0, command=["torchrun"],
                             user="alice", uid=1000, host="n1")]
    recs += [Metadata(run=run, stream="stdout", seq=i, ts=T0 + 1 + i,
                      fields={"step": i // 2, "loss": 1.0 + i % 2 - i / 10},
                      label=f"local rank {i % 2}") for i in range(6)]
    recs.append(Metadata(run=run, stream="stdout", seq=6, ts=T0 + 9, fields={"step": 9}))
    # a label of no number (only a hand-written spool has one): shown whatever the choice,
    # as on the page (jobview.labelled_rows)
    recs.append(Metadata(run=run, stream="stdout", seq=7, ts=T0 + 10, fields={"step": 10},
                         label="weird"))
    assert not ranked_store.insert_records(recs, Identity(run=run, user="alice",
                                                          uid=1000)).bad
    st, job = ranked_store, {"run": run}
    assert [r["rank"] for r in run_sql(st, JOB_UID, query_of(JOB_UID, "var rank"),
                                       **job)] == ["0", "1"]
    rows = run_sql(st, JOB_UID, query_of(JOB_UID, "Metadata (newest first)"), **job)
    assert [r["label"] for r in rows] == ["weird", "", "local rank 0", "local rank 0",
                                          "local rank 0"]
    every = run_sql(st, JOB_UID, query_of(JOB_UID, "Metadata (newest first)"), **job,
                    rank=["0", "1"])
    assert len(every) == 8
    by_x = run_sql(st, JOB_UID, query_of(JOB_UID, "Metadata by $x_axis"), **job,
                   rank=["0", "1"], x_axis="step")
    assert [(r["x"], r["value"]) for r in by_x if r["key"] == "loss (local rank 1)"] == [
        (0.0, 1.9), (1.0, 1.7), (2.0, 1.5)]
    [axis] = run_sql(st, JOB_UID, query_of(JOB_UID, "X axis"), **job, rank=["0", "1"])
    assert axis["x_axis"] == "step"


@pytest.mark.parametrize("label", ["rank 3", "local rank 12", "", "rank", "rank 0003",
                                   "rank x", "rank \uff13", "rank \u0663", "rank +3",
                                   "rank -1", "rank 1 ", "rank " + "9" * 18,
                                   "rank " + "9" * 19, "3"])
def test_a_labels_number_in_sql_is_the_python_one(store, label):
    from logcapture.grafana.dashboards import LABEL_NUMBER
    from logcapture.ranklabel import number_of

    sql = f"SELECT {LABEL_NUMBER} FROM (SELECT {{label:String}} AS label)"
    [[got]] = store.client.query(sql, parameters={"label": label}).result_rows
    assert got == number_of(label)


def test_tasks_whose_workers_print_behind_labels_are_one_series_per_task_and_label(
        ranked_store):
    """A job of two tasks, each a node's `torchrun --tee` with two workers: each node has a
    `local rank 1`, so a series is named by the task's rank and the label; Grafana names
    and draws them as the page does (web.reads.metadata over the same records)."""
    from logcapture.web.reads import metadata

    job = "4003"
    records: list[Any] = [Start(run=job, stream="run", seq=0, ts=T0, command=["sbatch"],
                                user="alice", uid=1000, host="node1",
                                slurm={"job_id": job})]
    assert not ranked_store.insert_records(records, Identity(run=job, user="alice",
                                                             uid=1000)).bad
    tagged = []
    for task in (0, 1):
        run = f"{job}.0.{task}"
        recs: list[Any] = [Start(run=run, stream="run", seq=0, ts=T0 + 1, command=["torchrun"],
                                 user="alice", uid=1000, host=f"node{task + 1}",
                                 slurm={"job_id": job, "step": "0", "rank": str(task),
                                        "node": f"node{task + 1}"})]
        meta = [Metadata(run=run, stream="stdout", seq=i, ts=T0 + 10 + 2 * i + task,
                         fields={"step": i // 2, "loss": 10.0 * task + i % 2 - i / 10},
                         label=f"local rank {i % 2}") for i in range(6)]
        assert not ranked_store.insert_records([*recs, *meta], Identity(
            run=run, user="alice", uid=1000)).bad
        tagged += [{**m.to_dict(), "run": run, "rank": task} for m in meta]
    tagged.sort(key=lambda d: (d["ts"], d["rank"], d["seq"]))
    page = metadata(tagged)
    assert page["by_x"]["key"] == "step"
    assert set(page["by_x"]["series"]) == {f"{k} (rank {t}, local rank {w})"
                                           for k in ("loss",) for t in (0, 1) for w in (0, 1)}
    every = {"run": job, "rank": ["0", "1"]}
    by_x = run_sql(ranked_store, JOB_UID, query_of(JOB_UID, "Metadata by $x_axis"), **every,
                   x_axis="step")
    grafana: dict[str, list[tuple[float, float]]] = {}
    for r in by_x:
        grafana.setdefault(r["key"], []).append((r["x"], r["value"]))
    assert grafana == {k: sorted((x, v) for x, v in zip(page["by_x"]["x"], vals, strict=True)
                                 if v is not None)
                       for k, vals in page["by_x"]["series"].items()}
    assert grafana["loss (rank 1, local rank 1)"] == [(0.0, 10.9), (1.0, 10.7), (2.0, 10.5)]
