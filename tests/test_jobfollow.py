"""``logcapture logs -f JOB`` of a job with srun steps (logcapture/jobfollow.py): the batch
script's lines and every task run's, read from a spool that real ``SpoolWriter``s write while
it is followed, a new step's tasks picked up as they appear, merged, labelled and folded as
``logs JOB`` shows them, until the job has ended."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from logcapture import query as Q
from logcapture.cli import main
from logcapture.jobfollow import HOLD_STORED, JobFollow
from logcapture.records import End, Line, Start
from logcapture.spool.abandoned import ABANDONED_SLURM_GRACE
from logcapture.spool.layout import create_run_dir
from logcapture.spool.writer import SpoolWriter

from .test_rankview import ALL_RANKS, RANK_1, store_of

ME = pwd.getpwuid(os.getuid()).pw_name
JOB = "70"


class Writer:
    """One run of job ``JOB`` written as the capture writes it: a Start, lines, an End."""

    def __init__(self, root: Path, run: str, slurm: dict[str, str], command: str,
                 start: float | None = None) -> None:
        self.run = run
        self.w = SpoolWriter(create_run_dir(root / JOB, run), fsync=False, flush_interval=0.2)
        self.seq = 0
        self.start = time.time() if start is None else start
        self.w.write([Start(run=run, stream="run", seq=0, ts=self.start, command=[command],
                            user=ME, uid=os.getuid(), host="n1",
                            slurm={"job_id": JOB, **slurm})])

    def line(self, text: str, ts: float | None = None) -> None:
        self.w.write([Line(run=self.run, stream="stdout", seq=self.seq,
                           ts=time.time() if ts is None else ts, text=text)])
        self.seq += 1

    def end(self) -> None:
        now = time.time()
        self.w.write([End(run=self.run, stream="run", seq=1, ts=now, exit_status=0,
                          state="COMPLETED", duration=now - self.start)])
        self.w.close()


def task(root: Path, step: int, rank: int, tasks: int = 0, start: float | None = None,
         command: str = "train.py") -> Writer:
    return Writer(root, f"{JOB}.{step}.{rank}", {"step": str(step), "rank": str(rank),
                                                   "local_rank": str(rank),
                                                   "node": "n1" if rank < 2 else "n2",
                                                   **({"step_tasks": str(tasks)} if tasks
                                                      else {})},
                  command, start)


def each_line(tasks: list[Writer], text: str) -> None:
    """A while after they started, each task prints ``text`` with its rank, then ends."""
    time.sleep(0.3)
    for t in tasks:
        t.line(text.format(t.run[-1]))
        time.sleep(0.1)
    for t in tasks:
        t.end()
    time.sleep(0.3)


def run_job(root: Path, seen: threading.Event, done: threading.Event) -> None:
    """The job: the batch script prints, step 0's two tasks print a line both print (folded)
    and one each; step 1's three tasks start only once the follower has shown step 0's last
    line (so they appear while it follows), then print; the batch script ends last."""
    batch = Writer(root, JOB, {"nodelist": "n[1-2]"}, "job.sh")
    batch.line("batch begins")
    time.sleep(0.3)
    step0 = [task(root, 0, r, 2) for r in range(2)]
    for t in step0:
        t.line("identical line from every rank")
    each_line(step0, "rank {} of step 0")
    seen.wait(60)  # the follower showed step 0 while the job runs
    each_line([task(root, 1, r, 3) for r in range(3)], "step 1 rank {}")
    batch.line("batch ends")
    batch.end()
    done.set()


def section(step: int, title: str) -> list[str]:
    """The marks of a step's section (durations, real time here, as ``D``: :func:`norm`)."""
    return [f"[logcapture: section srun step {step} ({title})]",
            f"[logcapture: end of section srun step {step} ({title}), D]"]


def norm(lines: list[str]) -> list[str]:
    return [re.sub(r"^(\[logcapture: end of section .*), [^,\]]+\]$", r"\1, D]", line)
            for line in lines]


STEP0, END0 = section(0, "2 tasks: train.py")
STEP1, END1 = section(1, "3 tasks: train.py")
EXPECTED = ["batch begins", STEP0, "0: identical line from every rank",
            "[logcapture: same line from 2 ranks (0-1)]", "0: rank 0 of step 0",
            "1: rank 1 of step 0", END0, STEP1, "0: step 1 rank 0", "1: step 1 rank 1",
            "2: step 1 rank 2", END1, "batch ends"]


def test_following_a_job_shows_its_tasks_as_they_come_as_logs_shows_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "spool"
    seen, done = threading.Event(), threading.Event()
    writer = threading.Thread(target=run_job, args=(root, seen, done), daemon=True)
    Writer(root, "69", {}, "other.sh").end()  # another run in the spool, not of the job
    writer.start()
    while not (root / JOB / JOB).exists():
        time.sleep(0.05)
    time.sleep(0.3)  # its Start record written
    got: list[tuple[str, bool]] = []  # each line, and whether the job had ended then
    with closing(Q.LocalReader(root, source="spool")) as reader:
        batch = reader.resolve(JOB)
        dirs = reader.spool_dir(batch)
        assert dirs is not None
        follow = JobFollow(reader, JOB, batch, dirs, ("stdout", "stderr"))
        for line in follow.lines():
            got.append((line, done.is_set()))
            if line == "1: rank 1 of step 0":
                seen.set()
    writer.join(10)
    assert done.is_set()  # it returned once the job had ended, not before
    assert norm([line for line, _ in got]) == EXPECTED
    # Step 0 was shown while the job ran; step 1's tasks, which appeared after the follow
    # began, were picked up.
    assert not any(ended for line, ended in got if "of step 0" in line or "same line" in line)
    # ``logs -f`` prints what ``logs`` prints of the ended job, the steps' durations too;
    # --rank and --node as well (the tasks chosen as they printed: no steps' marks)
    where = ["--spool", str(root), "--source", "spool"]
    assert norm(cli(capsys, JOB, *where)) == EXPECTED
    assert [line for line, _ in got] == cli(capsys, JOB, *where)
    assert cli(capsys, JOB, "-f", *where) == cli(capsys, JOB, *where)
    assert cli(capsys, JOB, "-f", "--rank", "1", *where) == [
        "identical line from every rank", "rank 1 of step 0", "step 1 rank 1"]
    assert cli(capsys, JOB, "-f", "--node", "n2", *where) == ["step 1 rank 2"]
    assert cli(capsys, JOB, "-f", "--rank", "0-1", *where) == cli(
        capsys, JOB, "--rank", "0-1", *where)
    # numbered as `logs JOB -n` numbers the job's log (a folded line once)
    numbered = cli(capsys, JOB, "-n", *where)
    assert cli(capsys, JOB, "-f", "-n", *where) == numbered
    lines = [n.partition("\t") for n in numbered]
    assert [text for _, _, text in lines] == cli(capsys, JOB, *where)
    assert [int(n) for n, _, text in lines if not text.startswith("[logcapture:")] == list(
        range(1, 9))  # a folded line once; its note and the steps' marks have none
    assert all(not n.strip() for n, _, text in lines if text.startswith("[logcapture:"))


def late_job(root: Path, done: threading.Event) -> None:
    """Step 0: rank 0's first line is read before its Start record is written, and the
    batch script prints its next line seconds before the tasks' End records come (longer
    than the follow holds a line for the runs' order). Steps 1 and 2 run at once (``srun ...
    &``); step 3 prints its first line seconds before step 2's End record comes; step 4
    prints nothing."""
    batch = Writer(root, JOB, {"nodelist": "n1"}, "job.sh")
    batch.line("batch begins")
    time.sleep(0.3)
    first = time.time()
    t0 = task(root, 0, 0, 2, start=first + 0.3)
    t0.line("rank 0 first", first)
    t1 = task(root, 0, 1, 2)
    time.sleep(0.3)
    t1.line("rank 1 last")
    time.sleep(0.3)
    batch.line("batch next")
    time.sleep(4)
    t0.end()
    t1.end()
    s1 = task(root, 1, 0, 1, command="prep.sh")
    s1.line("step 1 a")
    time.sleep(0.3)
    s2 = task(root, 2, 1, 1, command="eval.py")
    s2.line("step 2 a")
    time.sleep(0.3)
    s1.line("step 1 b")
    s1.end()
    time.sleep(0.3)
    s2.line("step 2 b")
    time.sleep(0.3)
    s3 = task(root, 3, 0, 1)
    s3.line("step 3")
    time.sleep(4)
    s2.end()
    s3.end()
    task(root, 4, 0, 1).end()
    time.sleep(0.3)
    batch.line("batch ends")
    batch.end()
    done.set()


def test_a_steps_section_is_where_logs_puts_it_whenever_its_records_come(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "spool"
    done = threading.Event()
    writer = threading.Thread(target=late_job, args=(root, done), daemon=True)
    writer.start()
    while not (root / JOB / JOB).exists():
        time.sleep(0.05)
    time.sleep(0.3)
    with closing(Q.LocalReader(root, source="spool")) as reader:
        follow = JobFollow(reader, JOB, JOB, reader.spool_dir(JOB) or root,
                           ("stdout", "stderr"))
        got = list(follow.lines())
    writer.join(10)
    assert done.is_set()
    step0, end0 = section(0, "2 tasks: train.py")
    step1, end1 = section(1, "1 task: prep.sh")
    step3, end3 = section(3, "1 task: train.py")
    assert norm(got) == ["batch begins", step0, "0: rank 0 first", "1: rank 1 last", end0,
                         "batch next", step1, "0: step 1 a", "1: step 2 a", "0: step 1 b",
                         end1, "1: step 2 b", step3, "0: step 3", end3, "batch ends"]
    where = ["--spool", str(root), "--source", "spool"]
    assert got == cli(capsys, JOB, *where)  # the marks, their places and durations
    assert cli(capsys, JOB, "-f", *where) == got


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    main(["logs", *args])
    out = capsys.readouterr()
    assert out.err == ""
    return out.out.splitlines()


def test_a_job_without_tasks_is_followed_as_its_batch_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "spool"

    def job() -> Iterator[None]:
        batch = Writer(root, JOB, {"nodelist": "n1"}, "job.sh")
        batch.line("only the batch")
        yield
        batch.line("no srun step")
        batch.end()

    steps = job()
    next(steps)
    threading.Timer(0.5, lambda: next(steps, None)).start()
    assert cli(capsys, JOB, "-f", "--spool", str(root), "--source", "spool") == [
        "only the batch", "no srun step"]


def test_a_task_whose_writer_is_gone_is_closed_and_the_follow_returns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A task run left without its end record (its capture was killed, long ago) is closed
    as the follow of one run closes it (``spool.close_abandoned``), and the job's follow
    returns with the note saying so."""
    root = tmp_path / "spool"
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = os.uname().nodename
    batch = Writer(root, JOB, {"nodelist": host}, "job.sh")
    batch.line("batch")
    t0, t1 = task(root, 0, 0), task(root, 0, 1)
    t0.line("rank 0 ends")
    t0.end()
    # rank 1's capture: killed without an end record, its writer's pid gone
    lost = create_run_dir(root / JOB, f"{JOB}.0.2")
    w = SpoolWriter(lost, fsync=False)
    w.write([Start(run=f"{JOB}.0.2", stream="run", seq=0, ts=time.time(), command=["x"],
                   user=ME, uid=os.getuid(), host=host, pid=gone.pid,
                   slurm={"job_id": JOB, "step": "0", "rank": "2", "node": host}),
             Line(run=f"{JOB}.0.2", stream="stdout", seq=0, ts=time.time(), text="rank 2 dies")])
    w.close()
    for seg in lost.iterdir():  # written before the Slurm grace the epilog is given
        old = time.time() - ABANDONED_SLURM_GRACE - 10
        os.utime(seg, (old, old))
    t1.line("rank 1 ends")
    t1.end()
    batch.line("batch ends")
    batch.end()
    with closing(Q.LocalReader(root, source="spool")) as reader:
        dirs = reader.spool_dir(JOB)
        assert dirs is not None
        out = list(JobFollow(reader, JOB, JOB, dirs, ("stdout", "stderr"), poll=0.05,
                             check=0.1).lines())
    step, end = section(0, "train.py")  # its Start records do not say how many tasks
    assert [line[:30] for line in norm(out)] == [
        "batch", step[:30], "0: rank 0 ends", "2: rank 2 dies",
        "2: [logcapture: warning: the r", "1: rank 1 ends", end[:30], "batch ends"]
    assert "closed as LOST" in out[4]
    assert out == cli(capsys, JOB, "--spool", str(root), "--source", "spool")


def test_a_job_read_from_the_store_once_ended_is_printed_as_logs_prints_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not in the spool (read on a login node, from the store): an ended job's follow prints
    its whole log as ``logs JOB`` does, its tasks included, and returns."""
    dsn = store_of(tmp_path, (ME, os.getuid(), "50"))
    where = ["--spool", str(tmp_path / "none"), "--store", dsn, "--source", "store"]
    assert cli(capsys, "50", "-f", *where) == ALL_RANKS
    assert cli(capsys, "50", "-f", "--rank", "1", *where) == RANK_1


def test_a_job_followed_from_the_store_on_stderr_alone_keeps_its_mode_changes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The log of one stream shows a mode change once; read from the store, its query gives
    the stdout copy, which stands for stderr's when stderr is followed alone: ``logs -f JOB
    --stream stderr`` prints what ``logs JOB --stream stderr`` prints."""
    from logcapture import store as S
    from logcapture.classify import Classifier
    from logcapture.records import Rendered

    c = Classifier("71")
    t0 = time.time() - 60
    recs: list[Any] = [Start(run="71", stream="run", seq=0, ts=t0, command=["job.sh"], user=ME,
                             uid=os.getuid(), host="n1", slurm={"job_id": "71"})]
    for i, (stream, text) in enumerate([("stdout", "out 1"), ("stderr", "err 1"),
                                        ("stdout", '/LOGCOMMAND {"mode": "disabled"}'),
                                        ("stderr", "hidden"),
                                        ("stdout", '/LOGCOMMAND {"mode": "enabled"}'),
                                        ("stderr", "err 2")]):
        recs += c.feed(stream, Rendered(text), t0 + 1 + i)
    recs.append(End(run="71", stream="run", seq=1, ts=t0 + 9, exit_status=0,
                    state="COMPLETED", duration=9.0))
    dsn = f"chdb://{tmp_path / 'store'}"
    with S.open_store(dsn) as st:
        assert not st.insert_records(recs, S.Identity(run="71", user=ME, uid=os.getuid(),
                                                      cluster="c1", job_id="71")).bad
    where = ["--spool", str(tmp_path / "none"), "--store", dsn, "--source", "store"]
    shown = cli(capsys, "71", "--stream", "stderr", *where)
    assert [ln for ln in shown if "mode changed" in ln] and "hidden" not in shown
    assert cli(capsys, "71", "-f", "--stream", "stderr", *where) == shown


def test_a_flood_is_shown_with_at_most_max_held_entries_waiting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries wait for earlier ones of other runs, but never more than ``MAX_HELD`` of
    them (and the folding, the lines of its window): a flood of two ranks is shown while the
    job runs even if no wait would end."""
    from itertools import islice

    from logcapture import jobfollow

    monkeypatch.setattr(jobfollow, "MAX_HELD", 50)
    root = tmp_path / "spool"
    batch = Writer(root, JOB, {"nodelist": "n1"}, "job.sh")  # runs on: no end record
    tasks = [task(root, 0, r) for r in range(2)]
    t0 = time.time()
    for i in range(1000):  # ten seconds' worth, 100 lines a second
        for t in tasks:
            t.line(f"line {i}", t0 + i / 100)
    for t in tasks:
        t.w.flush()
    batch.w.flush()
    got: list[str] = []
    with closing(Q.LocalReader(root, source="spool")) as reader:
        dirs = reader.spool_dir(JOB)
        assert dirs is not None
        follow = JobFollow(reader, JOB, JOB, dirs, ("stdout",), poll=0.05, hold=1e9)
        reading = threading.Thread(target=lambda: got.extend(islice(follow.lines(), 400)),
                                   daemon=True)
        reading.start()
        reading.join(60)
    assert len(got) == 400  # not held until the job ends
    shown = [line for line in got if not line.startswith("[")]
    assert shown[:3] == ["0: line 0", "0: line 1", "0: line 2"]
    assert got[:3] == [section(0, "train.py")[0], "0: line 0",
                       "[logcapture: same line from 2 ranks (0-1)]"]
    batch.end()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two real users")
def test_another_users_task_run_of_the_same_job_id_is_never_followed() -> None:
    """In a shared spool, a run of another user with the same job id (a Slurm job id of
    another cluster, or a forged one) is not opened, labelled or folded in."""
    import shutil
    import sys
    import tempfile

    try:
        users = [pwd.getpwnam(u) for u in ("lcuser1", "lcuser2")]
    except KeyError:
        pytest.skip("the test users lcuser1 and lcuser2 are not on this machine")
    base = Path(tempfile.mkdtemp(prefix="lc-jobfollow-", dir="/tmp"))
    try:
        base.chmod(0o755)
        root = base / "spool"
        for owner, runs in ((users[0], [JOB, f"{JOB}.0.0"]), (users[1], [f"{JOB}.0.1"])):
            for run in runs:
                rank = {} if run == JOB else {"step": "0", "rank": run[-1], "node": "n1"}
                w = Writer(root, run, rank or {"nodelist": "n1"}, "x")
                w.line("identical line from every rank")
                w.line(f"{owner.pw_name} was here")
                w.end()
                for p in [root / JOB / run, *(root / JOB / run).iterdir()]:
                    os.chown(p, owner.pw_uid, owner.pw_gid)
                    p.chmod(0o755 if p.is_dir() else 0o644)  # readable: only ownership counts
        (root / JOB).chmod(0o755)
        repo = Path(__file__).resolve().parents[1]
        r = subprocess.run(
            ["setpriv", f"--reuid={users[0].pw_uid}", f"--regid={users[0].pw_gid}",
             "--init-groups", "env", f"PYTHONPATH={repo}", sys.executable, "-m", "logcapture",
             "logs", "-f", JOB, "--spool", str(root), "--source", "spool"],
            capture_output=True, text=True, timeout=60, cwd="/tmp")
        assert r.returncode == 0, r.stderr
        assert "lcuser2" not in r.stdout + r.stderr
        step, end = section(0, "x")
        assert norm(r.stdout.splitlines()) == [
            "identical line from every rank", "lcuser1 was here", step,
            "identical line from every rank", "lcuser1 was here", end]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _replay(tmp_path: Path, name: str, ranks: tuple[str, ...] = (), lag: float = 2.0,
            batch_here: bool = False) -> list[tuple[str, float]]:
    """Job 50 of ``test_rankview`` (a batch run, four tasks on two nodes) as the store
    receives it while it runs on other nodes: at each step of a simulated clock, the records
    written ``lag`` seconds before reach a real embedded store (the shipper's delay); the
    job is followed from that store, as on a login node, or (``batch_here``) on the node
    that runs its batch script, whose spool has the batch run as it is written. Each line
    shown, with the simulated time it was shown at."""
    from logcapture import store as S

    from .test_rankview import T0, job_records

    dsn = f"chdb://{tmp_path / name}"
    spool = tmp_path / f"{name}-spool"
    pending = sorted(((rec.ts, run, i, rec) for run, recs in job_records(ME, os.getuid())
                      .items() for i, rec in enumerate(recs)), key=lambda x: x[:3])
    local = [p for p in pending if p[1] == "50"] if batch_here else []
    pending = [p for p in pending if p not in local]
    writer = SpoolWriter(create_run_dir(spool / "50", "50"), fsync=False) if local else None
    now = [T0]

    def ship(until: float) -> None:
        with S.open_store(dsn) as st:
            while pending and pending[0][0] <= until:
                _, run, _, rec = pending.pop(0)
                st.insert_records([rec], S.Identity(run=run, user=ME, uid=os.getuid(),
                                                    cluster="c1", job_id="50"))
        while writer is not None and local and local[0][0] <= until + lag:
            writer.write([local.pop(0)[3]])
            writer.flush()

    def sleep(_: float) -> None:  # the follower let the store go: time passes, the shipper
        now[0] += 0.5             # writes
        ship(now[0] - lag)

    ship(T0)  # the batch script's Start record
    got: list[tuple[str, float]] = []
    with closing(Q.LocalReader(spool, dsn, source="auto" if local else "store")) as reader:
        batch = reader.resolve("50")
        assert (reader.spool_dir(batch) is not None) == batch_here
        follow = JobFollow(reader, "50", batch, reader.spool_dir(batch), ("stdout", "stderr"),
                           ranks, clock=lambda: now[0], sleep=sleep, discover=0, store_poll=0,
                           discover_stored=0, settle=0)
        for line in follow.lines():
            got.append((line, now[0]))
    assert not pending and not local  # every record written before the follow returned
    if writer is not None:
        writer.close()
    return got


def test_a_running_job_is_followed_from_the_store_as_logs_shows_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job whose runs are not in this spool (its nodes ship them to the store, read on a
    login node) is followed while it runs: every task run, found in the store as it
    appears, merged, labelled and folded as ``logs JOB`` prints the ended job."""
    from .test_rankview import T0

    got = _replay(tmp_path, "store")
    assert [line for line, _ in got] == ALL_RANKS
    # shown while the job ran (its batch script ends at T0 + 9, in the store 2 s later),
    # each line the hold (HOLD_STORED) after its time
    shown = dict(got)
    assert T0 + 1 + HOLD_STORED <= shown["0: rank 0 step 0"] < T0 + 9
    assert shown["end of job"] >= T0 + 9 + 2
    # one rank: as it printed, without the batch script's lines
    assert [line for line, _ in _replay(tmp_path, "store-rank-1", ("1",))] == RANK_1
    # the ended job from that store: ``logs -f`` prints what ``logs`` prints
    where = ["--spool", str(tmp_path / "empty"), "--store", f"chdb://{tmp_path / 'store'}",
             "--source", "store"]
    assert cli(capsys, "50", "-f", *where) == cli(capsys, "50", *where) == ALL_RANKS


def test_on_the_batch_node_a_job_of_several_nodes_reads_its_other_tasks_from_the_store(
        tmp_path: Path) -> None:
    """On the node of its batch script, a job whose node list names other nodes is followed
    from this spool (the batch run) and the store (the tasks, all shipped from elsewhere
    here) together, in the order ``logs JOB`` prints."""
    assert [line for line, _ in _replay(tmp_path, "mixed", batch_here=True)] == ALL_RANKS
