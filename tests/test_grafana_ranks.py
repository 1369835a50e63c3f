"""Grafana's job dashboard for a job of several ranks: the rank and node variables and the
"Output by rank" panel, their SQL run on the real engine (chDB) against a job's batch and
task runs, and the panel's lines held equal to the log view of logcapture/rankview.py."""

from __future__ import annotations

from contextlib import closing
from typing import Any

import pytest
from test_grafana import FROM, TO, query_of
from test_rankview import held, job_records

from logcapture import query as Q
from logcapture import rankview as RV
from logcapture.grafana import interpolate
from logcapture.grafana.dashboards import JOB_UID
from logcapture.logview import LogView
from logcapture.records import Line, Start, from_dict
from logcapture.store import Identity, open_store


@pytest.fixture(scope="module")
def dsn(tmp_path_factory):
    dsn = f"chdb://{tmp_path_factory.mktemp('grafana-ranks')}/store"
    with open_store(dsn) as s:
        for run, recs in job_records("alice", 1000, "50").items():
            s.insert_records(recs, Identity(run=run, user="alice", uid=1000, job_id="50"))
        # the requeued run 50.1 and its task: not tasks of run 50
        for run, rank in (("50.1", None), ("50.1.0.0", "0")):
            slurm = {"job_id": "50", "restart_count": "1"} | (
                {"step": "0", "rank": rank, "node": "n9"} if rank else {})
            s.insert_records([Start(run=run, stream="run", seq=0, ts=1.0, command=["x"],
                                    user="alice", uid=1000, host="n9", slurm=slurm),
                              Line(run=run, stream="stdout", seq=0, ts=2.0, text="requeued")],
                             Identity(run=run, user="alice", uid=1000, job_id="50"))
    yield dsn


def run_sql(dsn: str, title: str, **variables: Any) -> list[dict[str, Any]]:
    values = {"run": "50", "stderr": "0", "node": ["n1", "n2"], "x_axis": "",
              "rank": ["0", "1", "2", "3"], **variables}
    text = interpolate(query_of(JOB_UID, title), values, FROM, TO)
    with open_store(dsn, must_exist=True) as s:
        result = s.client.query(text)
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def test_rank_and_node_variables_list_the_jobs_tasks(dsn: str) -> None:
    assert [r["rank"] for r in run_sql(dsn, "var rank")] == ["0", "1", "2", "3"]
    assert [r["node"] for r in run_sql(dsn, "var node")] == ["n1", "n2"]
    assert [r["rank"] for r in run_sql(dsn, "var rank", run="50.1")] == ["0"]


def test_output_by_rank_labels_each_task_line_as_the_log_view_does(dsn: str) -> None:
    rows = run_sql(dsn, "Output by rank")[::-1]  # newest first on the panel
    with closing(Q.StoreReader(lambda: held(dsn), "alice")) as reader:
        tasks = RV.job_runs(reader, "50.0", ranks=["0-3"])  # run 50, not the requeued 50.1
        assert tasks is not None
        logs = [(t, LogView().feed(from_dict(d) for d in reader.lines(str(t["run"]))))
                for t in tasks]
        expected = [RV.label(e, True) for e in RV.merge(logs)]
    assert [r["body"] for r in rows] == expected
    assert "requeued" not in " ".join(expected)
    one = run_sql(dsn, "Output by rank", rank=["1"])[::-1]
    assert [r["body"] for r in one] == ["1: rank 1 step 0", "1: identical line from every rank",
                                        "1: done"]
    n2 = run_sql(dsn, "Output by rank", node=["n2"])
    assert {(r["rank"], r["node"]) for r in n2} == {("2", "n2"), ("3", "n2")}
