"""The log of a job of several ranks (logcapture/rankview.py): its task runs merged in time
order, labelled as ``srun --label`` does, the same line of several ranks folded, from a spool
and from the real embedded store, and as one user only."""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from logcapture import query as Q
from logcapture import rankview as RV
from logcapture import store as S
from logcapture.cli import main
from logcapture.errors import NotFound, UsageError
from logcapture.logview import COMMAND, LINE, NOTE, Entry
from logcapture.records import End, Line, Start
from logcapture.spool.layout import create_run_dir
from logcapture.spool.writer import SpoolWriter

T0 = 1_790_000_000.25
ME = pwd.getpwuid(os.getuid()).pw_name
NODE = {0: "n1", 1: "n1", 2: "n2", 3: "n2"}


def _e(ts: float, text: str, kind: str = LINE, stream: str = "stdout", seq: int = 0) -> Entry:
    return Entry(ts, stream, seq, kind, text)


def _task(rank: int | None, run: str = "") -> dict:
    return {"run": run or (f"9.0.{rank}" if rank is not None else "9"), "rank": rank,
            "nodes": NODE.get(rank, "n1") if rank is not None else "n[1-2]"}


def _fold(logs: list) -> list[str]:
    return list(RV.text_lines(RV.fold(RV.merge(logs)), True))


# --- the rules, on entries -----------------------------------------------------------------
def test_sixty_four_ranks_printing_one_line_show_it_once_with_the_ranks_named() -> None:
    logs = [(_task(r), [_e(T0 + r / 100, "identical line from every rank")])
            for r in range(64)]
    assert _fold(logs) == ["0: identical line from every rank",
                           "[logcapture: same line from 64 ranks (0-63)]"]
    assert RV.fold_note([5, 1, 2, 3, 9]) == "[logcapture: same line from 5 ranks (1-3, 5, 9)]"


def test_a_rank_that_printed_something_else_stays_its_own_line_in_time_order() -> None:
    logs = [(_task(0), [_e(T0, "same"), _e(T0 + 3, "later")]),
            (_task(1), [_e(T0 + 0.2, "same")]),
            (_task(2), [_e(T0 + 0.1, "different")]),
            (_task(3), [_e(T0 + 0.9, "same")])]
    assert _fold(logs) == ["0: same", "[logcapture: same line from 3 ranks (0-1, 3)]",
                           "2: different", "0: later"]


def test_only_lines_within_the_window_of_the_first_are_folded() -> None:
    w = RV.FOLD_WINDOW
    logs = [(_task(0), [_e(T0, "tick")]), (_task(1), [_e(T0 + w, "tick")]),
            (_task(2), [_e(T0 + w + 0.01, "tick")]), (_task(3), [_e(T0 + 2 * w, "tick")])]
    assert _fold(logs) == ["0: tick", "[logcapture: same line from 2 ranks (0-1)]",
                           "2: tick", "[logcapture: same line from 2 ranks (2-3)]"]


def test_a_rank_repeating_its_line_another_stream_notes_commands_and_the_batch_never_fold() -> None:
    logs = [(_task(None), [_e(T0, "x")]),
            (_task(0), [_e(T0, "x"), _e(T0 + 0.1, "x", seq=1), _e(T0 + 0.2, "n", NOTE),
                        _e(T0 + 0.3, "c", COMMAND)]),
            (_task(1), [_e(T0 + 0.05, "x", stream="stderr"), _e(T0 + 0.2, "n", NOTE),
                        _e(T0 + 0.3, "c", COMMAND)])]
    assert _fold(logs) == ["x", "0: x", "1: x", "0: x", "0: n", "1: n", "0: c", "1: c"]


def test_folding_holds_only_the_window_and_keeps_every_entry() -> None:
    # 20,000 entries of 4 ranks, each line common to all: one line and one note per step,
    # and at most a window's entries held at once (the generator yields as it reads).
    def entries(rank: int) -> Iterator[Entry]:
        for i in range(5000):
            yield _e(T0 + i * 0.5 + rank * 0.01, f"step {i}", seq=i)

    out = RV.fold(RV.merge([(_task(r), entries(r)) for r in range(4)]))
    first = [next(out) for _ in range(3)]
    assert [(f.entry.text, f.ranks) for f in first] == [
        ("step 0", (0, 1, 2, 3)), ("step 1", (0, 1, 2, 3)), ("step 2", (0, 1, 2, 3))]
    assert sum(1 for _ in out) == 5000 - 3


# --- each srun step a section, bounded by its own entries ----------------------------------
BATCH = {"run": "9", "rank": None, "nodes": "n1", "start": T0, "duration": 100.0}


def _step_task(step: str, rank: int, start: float, duration: float | None,
               tasks: str = "2", command: tuple[str, ...] = ("python3", "train.py")) -> dict:
    return {"run": f"9.{step}.{rank}", "rank": rank, "step": step, "nodes": "n1",
            "start": start, "duration": duration, "command": list(command),
            "slurm": {"step_tasks": tasks}}


def _job(logs: list) -> list[str]:
    return list(RV.text_lines(RV.job_log(logs, RV.StepMarks.of_job(logs)), True))


def _marks(step: str, title: str, took: str) -> tuple[str, str]:
    return (f"[logcapture: section srun step {step} ({title})]",
            f"[logcapture: end of section srun step {step} ({title}), {took}]")


def test_a_step_is_bounded_by_its_own_lines_not_by_its_runs_start_and_end() -> None:
    # Rank 0's first line was read before its Start record was written (T0 + 1.1 < 1.2),
    # and both End records came after the batch script's next line (T0 + 6 > 5): the section
    # still opens right before the step's first line and closes right after its last one,
    # with the step's duration from its first start to its last end (T0 + 1 to T0 + 6).
    logs = [(BATCH, [_e(T0 + 0.5, "before"), _e(T0 + 5, "after", seq=1)]),
            (_step_task("0", 0, T0 + 1.2, 4.7), [_e(T0 + 1.1, "first"),
                                                  _e(T0 + 3, "rank 0 last", seq=1)]),
            (_step_task("0", 1, T0 + 1, 5.0), [_e(T0 + 2, "x"), _e(T0 + 4, "last", seq=1)])]
    start, end = _marks("0", "2 tasks: python3 train.py", "5.0 s")
    assert _job(logs) == ["before", start, "0: first", "1: x", "0: rank 0 last", "1: last",
                          end, "after"]
    # what the batch script printed between the step's lines is inside its section
    logs[0][1].insert(1, _e(T0 + 2.5, "meanwhile"))
    assert _job(logs)[4:6] == ["meanwhile", "0: rank 0 last"]


def test_steps_never_nest_a_step_printing_alone_is_a_section_the_others_are_not() -> None:
    # step 1 runs in the background (srun ... &) while step 0 prints: step 0's section holds
    # its lines where they were printed, step 1 has none; step 2 starts once both are done.
    # Step 3 printed nothing: nothing shows of it. Step 4 still runs: its section is open.
    logs = [(BATCH, [_e(T0, "batch")]),
            (_step_task("0", 0, T0, 6.0), [_e(T0 + 1, "a"), _e(T0 + 5, "b", seq=1)]),
            (_step_task("1", 0, T0 + 2, 7.0), [_e(T0 + 3, "c"), _e(T0 + 8, "d", seq=1)]),
            (_step_task("2", 0, T0 + 10, 2.0), [_e(T0 + 11, "e")]),
            (_step_task("3", 0, T0 + 12, 1.0), []),
            (_step_task("4", 0, T0 + 14, None, "1", ("sleep", "9")), [_e(T0 + 15, "f")])]
    s0, e0 = _marks("0", "2 tasks: python3 train.py", "6.0 s")
    s2, e2 = _marks("2", "2 tasks: python3 train.py", "2.0 s")
    s4, _ = _marks("4", "1 task: sleep 9", "")
    assert _job(logs) == ["batch", s0, "0: a", "0: c", "0: b", e0, "0: d", s2, "0: e", e2,
                          s4, "0: f"]
    # the page folds what lies between each start and its end: well nested
    depth = 0
    for item in RV.job_log(logs, RV.StepMarks.of_job(logs)):
        depth += {"section": 1, "section_end": -1}.get(item.entry.kind, 0)
        assert depth in (0, 1)


def test_the_same_line_of_two_steps_is_never_folded_together() -> None:
    logs = [(BATCH, []),
            (_step_task("0", 0, T0, 1.0), [_e(T0 + 0.5, "done")]),
            (_step_task("1", 1, T0 + 0.6, 1.0), [_e(T0 + 0.7, "done")])]
    assert [line for line in _job(logs) if not line.startswith("[")] == ["0: done", "1: done"]


def test_a_steps_title_names_its_tasks_and_its_command_cut() -> None:
    assert RV.step_title("3", "1", ["python3", "-c", "print('a b')"]) == (
        "srun step 3 (1 task: python3 -c 'print('\"'\"'a b'\"'\"')')")
    assert RV.step_title("0", None, []) == "srun step 0"
    assert RV.step_title("1", "2", ["python3", "-c", "\nimport os\n\x1b[2Jprint(1)\n"]) == (
        "srun step 1 (2 tasks: python3 -c ' import os [2Jprint(1) ')")  # one line, no controls
    long = RV.step_title("0", "64", ["python3", "x" * 100])
    assert long.startswith("srun step 0 (64 tasks: python3 xxx") and long.endswith("…)")
    assert len(long) == len("srun step 0 (64 tasks: )") + RV.TITLE_COMMAND


# --- through the readers, from a spool and from the store ----------------------------------
def job_records(owner: str, uid: int, job: str = "50") -> dict[str, list]:
    """Job ``job``: its batch run and four tasks on two nodes. Ranks 0-2 print one line
    together, rank 3 something else; all print "done", rank 3 seconds later."""
    runs = {job: [Start(run=job, stream="run", seq=0, ts=T0, command=["job.sh"], user=owner,
                        uid=uid, host="n1", slurm={"job_id": job, "nodelist": "n[1-2]"}),
                  Line(run=job, stream="stdout", seq=0, ts=T0 + 0.5, text=f"start of {owner}"),
                  Line(run=job, stream="stdout", seq=1, ts=T0 + 8, text="end of job"),
                  End(run=job, stream="run", seq=1, ts=T0 + 9, exit_status=0,
                      state="COMPLETED", duration=9.0)]}
    for r in range(4):
        run = f"{job}.0.{r}"
        other = "rank 3 is different" if r == 3 else "identical line from every rank"
        runs[run] = [
            Start(run=run, stream="run", seq=0, ts=T0 + 1, command=["train.py"], user=owner,
                  uid=uid, host=NODE[r], slurm={"job_id": job, "step": "0", "rank": str(r),
                                                "local_rank": str(r % 2), "node": NODE[r],
                                                "step_tasks": "4"}),
            Line(run=run, stream="stdout", seq=0, ts=T0 + 1 + r / 100, text=f"rank {r} step 0"),
            Line(run=run, stream="stdout", seq=1, ts=T0 + (2.05 if r == 3 else 2 + r / 10),
                 text=other),
            Line(run=run, stream="stdout", seq=2, ts=T0 + (7.3 if r == 3 else 5 + r / 10),
                 text="done"),
            End(run=run, stream="run", seq=1, ts=T0 + 7.5, exit_status=0, state="COMPLETED",
                duration=6.5)]
    return runs


# The step is a section of the whole job's log: from its first line to its last, with its
# duration from its tasks' Start and End records (T0 + 1 to T0 + 1 + 6.5).
STEP = "[logcapture: section srun step 0 (4 tasks: train.py)]"
STEP_END = "[logcapture: end of section srun step 0 (4 tasks: train.py), 6.5 s]"
ALL_RANKS = ["start of " + ME, STEP, "0: rank 0 step 0", "1: rank 1 step 0",
             "2: rank 2 step 0", "3: rank 3 step 0", "0: identical line from every rank",
             "[logcapture: same line from 3 ranks (0-2)]", "3: rank 3 is different", "0: done",
             "[logcapture: same line from 3 ranks (0-2)]", "3: done", STEP_END, "end of job"]
RANK_1 = ["rank 1 step 0", "identical line from every rank", "done"]
NODE_N2 = ["2: rank 2 step 0", "3: rank 3 step 0", "3: rank 3 is different",
           "2: identical line from every rank", "2: done", "3: done"]


def store_of(tmp_path: Path, *jobs: tuple[str, int, str]) -> str:
    """A real embedded store holding each (owner, uid, job id)'s job (``job_records``)."""
    dsn = f"chdb://{tmp_path / 'store'}"
    with S.open_store(dsn) as st:
        for who, uid, job in jobs:
            for run, recs in job_records(who, uid, job).items():
                st.insert_records(recs, S.Identity(run=run, user=who, uid=uid, cluster="c1",
                                                   job_id=job))
    return dsn


def write_job(root: Path, owner: str, job: str) -> Path:
    """``job_records`` in a spool as the Slurm layout has them (ROOT/JOB/RUN)."""
    for run, recs in job_records(owner, os.getuid(), job).items():
        w = SpoolWriter(create_run_dir(root / job, run), fsync=False)
        w.write(recs)
        w.close()
    return root


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    return write_job(tmp_path / "spool", ME, "50")


def logs(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    try:
        main(["logs", *args])
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err


def test_logs_of_a_job_merges_labels_and_folds_its_ranks_from_the_spool(
        spool: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--spool", str(spool), "--source", "spool"]
    assert logs(capsys, "50", *where)[:2] == (0, ALL_RANKS)
    assert logs(capsys, "50", "--rank", "1", *where)[:2] == (0, RANK_1)
    assert logs(capsys, "50", "--node", "n2", *where)[:2] == (0, NODE_N2)
    code, out, _ = logs(capsys, "50", "--rank", "0-1", "--rank", "3", *where)
    assert out[3:5] == ["0: identical line from every rank",
                        "[logcapture: same line from 2 ranks (0-1)]"]
    assert logs(capsys, "50.0.2", *where)[1] == ["rank 2 step 0",
                                                 "identical line from every rank", "done"]
    code, out, err = logs(capsys, "50", "--rank", "7", *where)
    assert code != 0 and "no captured task with rank 7" in err
    code, out, err = logs(capsys, "50.0.2", "--rank", "0", *where)
    assert code != 0 and "name the job" in err


def test_logs_of_a_job_reads_the_same_from_the_store(
        spool: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dsn = store_of(tmp_path, (ME, os.getuid(), "50"))
    where = ["--spool", str(tmp_path / "empty"), "--source", "store", "--store", dsn]
    assert logs(capsys, "50", *where)[:2] == (0, ALL_RANKS)
    assert logs(capsys, "50", "--rank", "1", *where)[:2] == (0, RANK_1)
    assert logs(capsys, "50", "--node", "n2", *where)[:2] == (0, NODE_N2)
    from_spool = logs(capsys, "50", "-n", "--spool", str(spool), "--source", "spool")[1]
    assert logs(capsys, "50", "-n", *where)[1] == from_spool
    assert sorted(_numbered(from_spool)) == list(range(1, 11))


@contextmanager
def held(dsn: str) -> Iterator[S.Store]:
    with S.open_store(dsn, must_exist=True) as st:
        yield st


def test_a_user_never_sees_another_users_tasks_of_the_same_job_id(tmp_path: Path) -> None:
    dsn = store_of(tmp_path, ("alice", 1001, "50"), ("bob", 1002, "50"), ("bob", 1002, "60"))
    with closing(Q.StoreReader(lambda: held(dsn), "alice")) as alice:
        runs = RV.job_runs(alice, "50")
        assert runs is not None and len(runs) == 5
        text = [RV.label(e, True) for e in RV.read_job(alice, runs, ("stdout", "stderr"))]
        assert text[0] == "start of alice" and "start of bob" not in text
        assert text.count("0: done") == 1  # bob's four tasks are not folded in
        with pytest.raises(NotFound):
            RV.job_runs(alice, "60", ranks=["0"])
        assert RV.job_runs(alice, "60") is None  # the run's own log says it is not hers
        with pytest.raises(NotFound):
            alice.resolve("60")


def test_a_filter_on_something_that_is_no_job_is_refused(spool: Path) -> None:
    with closing(Q.LocalReader(spool, source="spool")) as r:
        with pytest.raises(UsageError):
            RV.job_runs(r, None, ranks=["0"])
        assert RV.job_runs(r, "50.0.1") is None


def search(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict | str]:
    import json

    try:
        main(["search", "--json", *args])
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out else out.err


def _runs(found: dict | str) -> set[str]:
    assert isinstance(found, dict), found
    return {g["run"] for g in found["groups"]}


@pytest.mark.parametrize("source", ["spool", "store"])
def test_search_by_rank_and_node(spool: Path, tmp_path: Path, source: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--spool", str(spool), "--source", "spool"]
    if source == "store":
        dsn = store_of(tmp_path, (ME, os.getuid(), "50"))
        where = ["--spool", str(tmp_path / "empty"), "--source", "store", "--store", dsn]
    assert _runs(search(capsys, "done", *where)[1]) == {f"50.0.{r}" for r in range(4)}
    assert _runs(search(capsys, "done", "--job", "50", "--rank", "0-1", *where)[1]) == {
        "50.0.0", "50.0.1"}
    assert _runs(search(capsys, "done", "--node", "n2", *where)[1]) == {"50.0.2", "50.0.3"}
    assert _runs(search(capsys, "done", "--rank", "3", "--node", "n2", *where)[1]) == {
        "50.0.3"}
    code, found = search(capsys, "job", "--rank", "0", *where)  # the batch's "end of job"
    assert code == 1 and _runs(found) == set()
    code, err = search(capsys, "done", "--rank", "7", *where)
    assert code == 2 and "no captured task with rank 7" in str(err)


def test_search_by_rank_finds_only_the_users_own_tasks(tmp_path: Path) -> None:
    from logcapture.search import Request

    dsn = store_of(tmp_path, ("alice", 1001, "50"), ("bob", 1002, "50"))
    with closing(Q.StoreReader(lambda: held(dsn), "alice")) as alice:
        runs = RV.task_run_ids(alice, ["50"], ["0-3"])
        found = alice.search(Request("done", jobs=runs).to_dict())
    assert {g["owner"] for g in found["groups"]} == {"alice"} and found["matches"] == 4


def test_the_job_pages_answer_names_rank_node_and_fold_and_keeps_the_newest(spool: Path) -> None:
    with closing(Q.LocalReader(spool, source="spool")) as r:
        assert [(t["run"], t["rank"], t["node"]) for t in RV.tasks_of(r, "50")] == [
            (f"50.0.{k}", k, NODE[k]) for k in range(4)]
        assert RV.tasks_of(r, "50.0.1") == []  # a run, not a job
        whole = RV.page(r, "50")
        assert not whole["more"] and whole["ended"]
        assert [e["text"] for e in whole["entries"]] == [
            t if t in (STEP, STEP_END) else t.split(": ", 1)[-1]
            for t in ALL_RANKS if not t.startswith("[logcapture: same line")]
        marks = [e for e in whole["entries"] if e["kind"] in ("section", "section_end")]
        assert [(e["rank"], e["run"], e["stream"]) for e in marks] == [(None, "", "run")] * 2
        assert marks[0]["ts"] == T0 + 1 and marks[1]["ts"] == T0 + 7.3  # its first, last line
        folded = [e for e in whole["entries"] if "note" in e]
        assert [(e["rank"], e["node"], e["ranks"], e["note"]) for e in folded] == [
            (0, "n1", [0, 1, 2], "[logcapture: same line from 3 ranks (0-2)]")] * 2
        assert whole["entries"][0]["rank"] is None and whole["entries"][0]["run"] == "50"
        newest = RV.page(r, "50", limit=2)
        assert newest["more"] and [e["text"] for e in newest["entries"]] == [STEP_END,
                                                                              "end of job"]
        assert [e["rank"] for e in RV.page(r, "50", "2-3", "n2")["entries"]] == [2, 3, 3, 2,
                                                                                  2, 3]


def test_a_job_of_tasks_only_shows_each_task_once(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A job without a batch run (``srun --pty bash`` from a login node: one interactive
    task) reads as its tasks, each once."""
    root = write_job(tmp_path / "spool", ME, "70")
    shutil.rmtree(root / "70" / "70")  # the batch run
    where = ["--spool", str(root / "70"), "--source", "spool"]
    code, out, err = logs(capsys, "70", *where)
    assert code == 0, err
    assert out.count("3: rank 3 step 0") == 1 and "start of " + ME not in out
    code, followed, err = logs(capsys, "-f", "70", *where)
    assert code == 0, err
    assert followed.count("3: rank 3 step 0") == 1 and followed.count("3: done") == 1
    assert [x for x in followed if not x.startswith("[logcapture: ")] == \
        [x for x in out if not x.startswith("[logcapture: ")]


# --- one line number in the job's log ------------------------------------------------------
def _numbered(out: list[str]) -> dict[int, str]:
    """`logs -n`'s lines: number -> what follows it (rank label and text)."""
    got = {}
    for line in out:
        number, _, text = line.partition("\t")
        if number.strip():
            got[int(number)] = text
    return got


def write_job_with_stderr(root: Path, job: str) -> Path:
    """``job_records`` with a line on stderr from the batch script and from rank 1, so that
    a view of one stream leaves lines of the other out."""
    for run, recs in job_records(ME, os.getuid(), job).items():
        extra = []
        if run in (job, f"{job}.0.1"):
            at = T0 + (0.75 if run == job else 1.5)
            extra = [Line(run=run, stream="stderr", seq=0, ts=at, text=f"warning from {run}")]
        w = SpoolWriter(create_run_dir(root / job, run), fsync=False)
        w.write(sorted([*recs, *extra], key=lambda r: r.ts))
        w.close()
    return root


def test_a_jobs_lines_have_one_number_in_its_merged_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`logs JOB -n` numbers the job's merged log 1, 2, 3, ...: the batch script's and every
    task's lines, a folded line once, both streams counted (one stream shows its lines with
    those numbers); the job page's answer gives each entry the same number, around a linked
    line too; --rank shows another log: one rank alone is numbered as its own run is."""
    spool = write_job_with_stderr(tmp_path / "spool", "51")
    where = ["--spool", str(spool), "--source", "spool"]
    code, out, _ = logs(capsys, "51", "-n", *where)
    numbered = _numbered(out)
    assert code == 0 and sorted(numbered) == list(range(1, 13))
    assert numbered[1] == "start of " + ME and numbered[2] == "warning from 51"
    assert numbered[12] == "end of job"
    assert out[out.index("     8\t0: identical line from every rank") + 1] == (
        "      \t[logcapture: same line from 3 ranks (0-2)]")
    # one stream: its lines with their numbers in the log of both
    stdout = _numbered(logs(capsys, "51", "-n", "--stream", "stdout", *where)[1])
    stderr = _numbered(logs(capsys, "51", "-n", "--stream", "stderr", *where)[1])
    assert stdout == {n: t for n, t in numbered.items() if "warning" not in t}
    assert stderr == {n: t for n, t in numbered.items() if "warning" in t}
    # one rank: as its run is numbered (`logs 51.0.1 -n`)
    assert logs(capsys, "51", "-n", "--rank", "1", *where)[1] == logs(
        capsys, "51.0.1", "-n", *where)[1]
    with closing(Q.LocalReader(spool, source="spool")) as r:
        page = RV.page(r, "51")
        assert {e["line"]: (f"{e['rank']}: " if e["rank"] is not None else "") + e["text"]
                for e in page["entries"] if "line" in e} == numbered
        assert all("line" not in e for e in page["entries"] if e["kind"] != "line")
        # a linked line older than the newest `limit`: the entries around it
        # (the srun step's section marks have no number)
        around = RV.page(r, "51", limit=4, line=2)
        assert [e.get("line") for e in around["entries"]] == [1, 2, None, 3]
        assert (around["more"], around["newer"]) == (False, True)
        around = RV.page(r, "51", limit=3, line=6)
        assert [e.get("line") for e in around["entries"]] == [5, 6, 7]
        assert (around["more"], around["newer"]) == (True, True)
        newest = RV.page(r, "51", limit=3, line=11)
        assert [e.get("line") for e in newest["entries"]] == [11, None, 12]
        assert (newest["more"], newest["newer"]) == (True, False)
