"""Job ids as Slurm users write them (``jobref``), the state sacct would give a job
(``slurm.end_state``), and how ``ls`` and ``show`` print them (``views``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from logcapture import jobref, views
from logcapture.errors import NotFound, UsageError
from logcapture.query.show import job_usage
from logcapture.runner.outcome import children_usage
from logcapture.slurm.jobs import end_state


def run(run_id: str, job_id: str = "", start: float = 0.0, **slurm: str) -> dict:
    if job_id:
        slurm = {"job_id": job_id, **slurm}
    return {"run": run_id, "job_id": job_id, "slurm": slurm, "start": start,
            "host": "laptop", "command": ["/usr/bin/python3", "train.py"]}


# Array 6 of three tasks: task 1 got job id 7, task 2 job id 8, task 3 kept the array's id 6
# (Slurm gives the last task the array's own record). Job 12 was requeued twice. Job 20 is
# plain. One run outside Slurm.
RUNS = [
    run("7", "7", 10, array_job_id="6", array_task_id="1", job_name="sweep"),
    run("8", "8", 11, array_job_id="6", array_task_id="2", job_name="sweep"),
    run("6", "6", 12, array_job_id="6", array_task_id="3", job_name="sweep"),
    run("12", "12", 20, job_name="train"),
    run("12.1", "12", 30, job_name="train"),
    run("12.2", "12", 40, job_name="train", restart_count="2"),
    run("20", "20", 50, nodelist="n[1-2]"),
    run("20261124T090000-laptop-42", "", 60),
]


def test_parse_takes_job_ids_as_slurm_users_write_them() -> None:
    assert jobref.parse("1234") == ("1234", None, None)
    assert jobref.parse("1234_5") == ("1234", "5", None)
    assert jobref.parse("1234.2") == ("1234", None, 2)
    assert jobref.parse("1234_5.1") == ("1234", "5", 1)
    for text in (None, "", "latest", "1234_", "_5", "12a", "1234.batch", "x_1", "1 2",
                 "1234;DROP", "../1234", "9" * 40):
        assert jobref.parse(text) is None, text


@pytest.mark.parametrize(("ref", "run_id"), [
    ("6_1", "7"), ("6_2", "8"), ("6_3", "6"),  # array tasks: never task 3 for "6_1"
    ("7", "7"),  # a task by its own job id
    ("12", "12.2"), ("12.0", "12"), ("12.1", "12.1"), ("12.2", "12.2"),  # requeues
    ("20", "20"), ("20261124T090000-laptop-42", "20261124T090000-laptop-42"),
])
def test_choose_finds_the_run_a_reference_names(ref: str, run_id: str) -> None:
    assert jobref.choose(ref, RUNS) == run_id


def test_an_array_job_id_names_all_its_tasks_and_one_run_needs_a_task() -> None:
    assert [s["run"] for s in jobref.select("6", RUNS)] == ["7", "8", "6"]
    with pytest.raises(UsageError) as e:
        jobref.choose("6", RUNS)
    assert "6 is an array job of 3 tasks" in e.value.message
    assert "6_1, 6_2, 6_3" in e.value.message
    with pytest.raises(NotFound):
        jobref.choose("6_4", RUNS)
    with pytest.raises(NotFound):
        jobref.choose("12.3", RUNS)
    with pytest.raises(NotFound):
        jobref.choose("99", RUNS)


def test_a_numeric_run_id_outside_slurm_is_still_found() -> None:
    assert jobref.choose("42", [run("42")]) == "42"


def test_job_fields_are_the_same_for_every_source() -> None:
    f = jobref.job_fields(RUNS[0])
    assert f == {"job": "6_1", "job_name": "sweep", "nodes": "laptop", "array_job_id": "6",
                 "array_task_id": "1", "restart": 0, "step": None, "rank": None}
    assert tuple(f) == jobref.JOB_KEYS
    assert jobref.job_fields(RUNS[5])["restart"] == 2
    assert jobref.job_fields(RUNS[4])["restart"] == 1  # from the run id
    assert jobref.job_fields(RUNS[6])["nodes"] == "n[1-2]"
    plain = jobref.job_fields(RUNS[7])
    assert plain["job"] == "20261124T090000-laptop-42" and plain["job_name"] == "python3"


def test_ls_labels_name_exactly_their_run() -> None:
    latest = jobref.latest_runs(RUNS)
    labels = [jobref.label(s, s["run"] in latest) for s in RUNS]
    assert labels == ["6_1", "6_2", "6_3", "12.0", "12.1", "12", "20",
                      "20261124T090000-laptop-42"]
    for label, s in zip(labels, RUNS, strict=True):
        if jobref.parse(label) is not None:
            assert jobref.choose(label, RUNS) == s["run"]


# --- the state sacct gives a job --------------------------------------------------------------
def test_a_run_ended_by_a_requeue_is_requeued() -> None:
    job = {"JobState": "COMPLETING", "Reason": "None", "Restarts": "1"}
    assert end_state(None, 15, job) == "REQUEUED"
    # the requeued run itself, ending by itself: the job is RUNNING while its wrapper asks
    assert end_state(0, None, {**job, "JobState": "RUNNING"}, restarts=1) == "COMPLETED"


@pytest.mark.parametrize(("exit_status", "signal", "job", "state"), [
    (0, None, {"JobState": "RUNNING"}, "COMPLETED"),
    (3, None, {"JobState": "RUNNING"}, "FAILED"),
    (None, 9, {"JobState": "RUNNING"}, "FAILED"),  # killed itself: sacct says FAILED
    (None, 15, {"JobState": "CANCELLED"}, "CANCELLED"),  # scancel
    # scancel as the wrapper sees it: slurmctld shows the COMPLETING flag, no Reason
    (None, 15, {"JobState": "COMPLETING", "Reason": "None"}, "CANCELLED"),
    (0, None, {"JobState": "COMPLETING", "Reason": "None"}, "CANCELLED"),
    (None, 15, {"JobState": "RUNNING", "Reason": "None"}, "FAILED"),  # scancel --signal=TERM
    (0, None, {"JobState": "CANCELLED"}, "CANCELLED"),  # cancelled, trapped TERM, exit 0
    (143, None, {"JobState": "TIMEOUT"}, "TIMEOUT"),
    (None, 15, {"JobState": "COMPLETING", "Reason": "TimeLimit"}, "TIMEOUT"),
    (None, 9, {"JobState": "OUT_OF_MEMORY"}, "OUT_OF_MEMORY"),
    (None, 15, {"JobState": "PREEMPTED"}, "PREEMPTED"),
    (None, 9, {"JobState": "NODE_FAIL"}, "NODE_FAIL"),
    (None, 15, {"JobState": "PENDING", "Reason": "BeginTime"}, "REQUEUED"),
    (None, 15, {"JobState": "REQUEUE_HOLD"}, "REQUEUED"),
    (None, 15, {}, "FAILED"),  # Slurm could not be asked
    (0, None, {}, "COMPLETED"),
])
def test_end_state_is_what_sacct_would_say(exit_status: int | None, signal: int | None,
                                           job: dict[str, str], state: str) -> None:
    assert end_state(exit_status, signal, job) == state


def test_a_task_that_exited_by_itself_does_not_ask_slurmctld(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every task of a step ends at once: one `scontrol show job` each would be a burst of
    requests to slurmctld. Only a signal can be Slurm's doing, so only then it is asked."""
    from logcapture.slurm import jobs

    asked: list[str] = []

    def slurm_job(job_id: str, timeout: float = 10.0) -> dict[str, str]:
        asked.append(job_id)
        return {"JobState": "COMPLETING", "Reason": "TimeLimit"}

    monkeypatch.setattr(jobs, "slurm_job", slurm_job)
    env = {"SLURM_JOB_ID": "42"}
    assert jobs.job_end_state(0, None, env, task=True) == "COMPLETED"
    assert jobs.job_end_state(3, None, env, task=True) == "FAILED"
    assert asked == []
    assert jobs.job_end_state(None, 15, env, task=True) == "TIMEOUT"
    assert jobs.job_end_state(0, None, env) == "TIMEOUT"  # the job's own run always asks
    assert asked == ["42", "42"]


# --- units ------------------------------------------------------------------------------------
def test_units_a_person_reads() -> None:
    assert views.size(512) == "512 B"
    assert views.size(1.2 * 1024 ** 3) == "1.2 GiB"
    assert views.size(37 * 1024 ** 2) == "37 MiB"
    assert views.size(None) == "-"
    assert views.percent(0.37) == "37 %"
    assert views.percent(0.0015692) == "0.2 %"
    assert views.duration(0.04) == "0.04 s" and views.duration(4.25) == "4.2 s"
    assert views.duration(45) == "45 s"
    assert views.duration(185) == "3 min 05 s"
    assert views.duration(2 * 3600 + 3 * 60 + 20) == "2 h 03 min"
    assert views.duration(3 * 86400 + 4 * 3600) == "3 d 04 h"


def test_ls_rows_have_the_job_columns() -> None:
    summaries = [dict(s, state="COMPLETED", exit_status=0, signal=None, duration=7384.0,
                      lines=3, **jobref.job_fields(s)) for s in RUNS]
    summaries[2].update(state="RUNNING", exit_status=None, duration=None, last=12 + 65)
    summaries[3].update(state="CANCELLED", exit_status=None, signal=15)
    rows = views.ls_rows(summaries)
    assert rows[0] == views.LS_COLUMNS
    assert rows[1][:4] == ("6_1", "sweep", "COMPLETED", "0")
    assert rows[1][5] == "2 h 03 min"
    # running: from its start to its newest record (summary_row.run_duration)
    assert rows[3][2:4] == ("RUNNING", "-") and rows[3][5] == "1 min 05 s"
    assert rows[4][2:4] == ("CANCELLED", "signal 15")
    assert [r[0] for r in rows[4:7]] == ["12.0", "12.1", "12"]
    lines = views.table(rows)
    assert lines[0].split() == list(views.LS_COLUMNS)


def test_show_prints_units_and_one_line_per_mode_change() -> None:
    info = {"run": "7", "job": "6_1", "job_name": "sweep", "owner": "ann", "uid": 1001,
            "state": "CANCELLED", "exit_status": None, "signal": 15, "start": 1.0e9,
            "end": 1.0e9 + 7384, "duration": 7384.0, "nodes": "n1", "command": "train.sh",
            "cwd": "/home/ann", "initial_mode": "enabled",
            "lines": {"stdout": 3, "stderr": 1}, "dropped_repetitions": {"stdout": 0},
            "dropped_blank_lines": {}, "commands": 2,
            "mode_changes": [{"ts": 1.0e9 + 1, "text": "mode enabled -> metadata"},
                             {"ts": 1.0e9 + 2, "text": "mode metadata -> enabled"}],
            "metadata_keys": ["epoch", "loss"], "x_axis": "epoch",
            "resources": {"cpu_seconds_total": 123.0, "cpu_efficiency": 0.37,
                          "memory_rss_peak_bytes": 1.2 * 1024 ** 3}, "warnings": 0}
    text = views.show_lines(info)
    joined = "\n".join(text)
    assert "job:" in text[0] and "6_1 (run 7)" in text[0]
    assert "killed by signal 15" in joined and "2 h 03 min" in joined
    assert "  CPU efficiency: 37 %" in text and "  peak memory (RSS): 1.2 GiB" in text
    assert "  CPU time: 2 min 03 s" in text
    modes = [ln for ln in text if "mode " in ln and "->" in ln]
    assert len(modes) == 2 and modes[0].endswith("mode enabled -> metadata")
    assert modes[1].endswith("mode metadata -> enabled")


# --- the job's own resource use ---------------------------------------------------------------
def test_the_end_records_usage_gives_a_short_job_its_figures() -> None:
    got = job_usage({"cpu_ms": 1500, "max_rss_kib": 2048}, {}, 3.0, {"cpus_allocated": 2})
    assert got == {"cpu_seconds_total": 1.5, "cpus_allocated": 2, "cpu_efficiency": 0.25,
                   "memory_rss_peak_bytes": 2048 * 1024}
    # the samples' figures stay when they are higher
    got = job_usage({"cpu_ms": 1000}, {"cpu_seconds_total": 2.0, "cpus_allocated": 1,
                                       "memory_rss_peak_bytes": 5}, 4.0, {})
    assert got == {"cpu_seconds_total": 2.0, "cpus_allocated": 1, "cpu_efficiency": 0.5}
    assert job_usage({}, {}, 1.0, {}) == {}


def test_children_usage_counts_the_commands_cpu() -> None:
    before = children_usage(10 ** 9)["cpu_ms"]
    subprocess.run([sys.executable, "-c", "x = 0\nfor i in range(3_000_000): x += i"],
                   check=True)
    after = children_usage(10 ** 9)
    assert after["cpu_ms"] - before >= 50
    assert "max_rss_kib" not in after  # below the floor: not the command's
    assert children_usage(0)["max_rss_kib"] > 0


# Job 30 ran two steps of two tasks each on nodes n1 and n2 (its batch run started first);
# job 31 was requeued once and ran one task before and one after.
TASK_RUNS = [
    run("30", "30", 100, job_name="dist", nodelist="n[1-2]"),
    run("30.0.0", "30", 101, job_name="dist", step="0", rank="0", local_rank="0", node="n1"),
    run("30.0.1", "30", 101, job_name="dist", step="0", rank="1", local_rank="0", node="n2"),
    run("30.1.0", "30", 105, job_name="dist", step="1", rank="0", local_rank="0", node="n1"),
    run("30.1.1", "30", 105, job_name="dist", step="1", rank="1", local_rank="0", node="n2"),
    run("31", "31", 110),
    run("31.0.0", "31", 111, step="0", rank="0", node="n1"),
    run("31.1", "31", 120, restart_count="1"),
    run("31.1.0.0", "31", 121, restart_count="1", step="0", rank="0", node="n3"),
]


def test_a_job_names_its_batch_run_not_a_task_that_started_later() -> None:
    assert jobref.choose("30", TASK_RUNS) == "30"
    assert jobref.choose("31", TASK_RUNS) == "31.1"
    assert jobref.choose("31.0", TASK_RUNS) == "31"
    assert jobref.choose("30.1.1", TASK_RUNS) == "30.1.1"  # a task run by its own id


def test_task_fields_say_step_rank_and_the_node_the_task_ran_on() -> None:
    fields = jobref.job_fields(TASK_RUNS[2])
    assert (fields["job"], fields["step"], fields["rank"], fields["nodes"]) == (
        "30", "0", 1, "n2")
    batch = jobref.job_fields(TASK_RUNS[0])
    assert (batch["step"], batch["rank"], batch["nodes"]) == (None, None, "n[1-2]")
    assert [jobref.is_task(s) for s in TASK_RUNS[:2]] == [False, True]


def test_tasks_by_rank_and_node_in_step_then_rank_order() -> None:
    def ids(*args: object) -> list[str]:
        return [s["run"] for s in jobref.tasks(*args)]  # type: ignore[arg-type]

    assert ids("30", TASK_RUNS) == ["30.0.0", "30.0.1", "30.1.0", "30.1.1"]
    assert ids("30", TASK_RUNS, {1}) == ["30.0.1", "30.1.1"]
    assert ids("30", TASK_RUNS, None, {"n1"}) == ["30.0.0", "30.1.0"]
    assert ids("30", TASK_RUNS, {1}, {"n1"}) == []
    assert ids("31", TASK_RUNS) == ["31.1.0.0"]  # the latest run of a requeued job
    assert ids("31.0", TASK_RUNS) == ["31.0.0"]
    with pytest.raises(NotFound):
        jobref.tasks("99", TASK_RUNS)


def test_ranks_as_numbers_ranges_and_lists() -> None:
    assert jobref.parse_ranks(["3"]) == {3}
    assert jobref.parse_ranks(["0-3", "8"]) == {0, 1, 2, 3, 8}
    assert jobref.parse_ranks(["0-1,5"]) == {0, 1, 5}
    for bad in ("x", "3-1", "-1", "1-", ""):
        with pytest.raises(UsageError):
            jobref.parse_ranks([bad])


def test_ls_labels_a_task_run_by_its_own_id_and_keeps_the_job_label_for_the_batch_run() -> None:
    latest = jobref.latest_runs(TASK_RUNS)
    assert "30" in latest and "31.1" in latest and "31" not in latest
    assert [jobref.label(s, s["run"] in latest) for s in TASK_RUNS[:3]] == [
        "30", "30.0.0", "30.0.1"]
