"""A complete and honest record: floods stored whole, every run ends (its writer gone or not),
durations that never go negative, and a full spool disk that loses only what it must, with a
note where it did."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import LOGCAPTURE, lc

from logcapture.records import LOST, End, Line, Note, Start
from logcapture.spool.abandoned import ABANDONED_SLURM_GRACE, close_abandoned, writer_gone
from logcapture.spool.layout import create_run_dir
from logcapture.spool.reading import iter_run
from logcapture.spool.writer import SpoolWriter

HOST = os.uname().nodename


def _show(env: dict[str, str], run: str = "latest") -> dict:
    res = lc(["show", "--json", run], env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _ls(env: dict[str, str]) -> list[dict]:
    res = lc(["ls", "--json"], env)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]  # one run a line


def _wait_for(cond, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


# --- floods -----------------------------------------------------------------------------------
@pytest.mark.parametrize("program", [
    ["seq", "1", "3000000"],
    [sys.executable, "-c", "for i in range(1, 1000001): print(i)"],
], ids=["seq-3M", "python-1M"])
def test_a_flood_is_stored_whole_with_its_end(lc_env: dict[str, str], program: list[str],
                                              tmp_path: Path) -> None:
    """A producer faster than the spool's disk is slowed (flow control), not cut: every line
    and the end record are stored, and the job's own output is every byte."""
    out = tmp_path / "out"
    with out.open("wb") as f:
        res = lc(["run", "--", *program], lc_env, stdout=f, stderr=subprocess.PIPE,
                     capture_output=False, timeout=600)
    assert res.returncode == 0, res.stderr
    n = int(program[-1]) if program[0] == "seq" else 1000000
    assert out.stat().st_size == sum(len(str(i)) + 1 for i in range(1, n + 1))
    info = _show(lc_env)
    assert info["state"] == "COMPLETED"
    assert info["lines"]["stdout"] == n
    assert info["warnings"] == 0
    assert "incomplete" not in [i["kind"] for i in info["insights"]]
    run_dir = next(Path(lc_env["LOGCAPTURE_SPOOL"]).iterdir())
    seqs = [r.seq for r in iter_run(run_dir) if r.stream == "stdout"]
    assert seqs == list(range(n))  # none missing, none twice, in order


# --- every run ends ---------------------------------------------------------------------------
def _start(run: str, pid: int, host: str = HOST, ts: float = 1000.0,
           slurm: dict | None = None) -> Start:
    return Start(run=run, stream="run", seq=0, ts=ts, command=["job"], user="u", uid=0,
                 host=host, pid=pid, slurm=slurm or {})


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _write(run_dir: Path, start: Start, n: int) -> None:
    w = SpoolWriter(run_dir, fsync=False)
    w.write([start, *(Line(run=start.run, stream="stdout", seq=i, ts=start.ts + 1 + i,
                           text=f"line {i}") for i in range(n))])
    w.close()


def test_a_run_whose_writer_is_gone_is_ended_lost_at_its_last_output(tmp_path: Path) -> None:
    run_dir = create_run_dir(tmp_path, "r")
    _write(run_dir, _start("r", _dead_pid()), 3)
    end = close_abandoned(run_dir)
    assert isinstance(end, End) and end.state == LOST
    recs = list(iter_run(run_dir))
    assert recs[-1] == end and end.ts == 1003.0 and end.duration == 3.0
    assert end.counts["stdout"]["lines"] == 3
    note = recs[-2]
    assert isinstance(note, Note) and "is gone" in note.text and LOST in note.text
    assert close_abandoned(run_dir) is None  # ended once
    assert not (run_dir / ".reserve").exists()


def test_a_run_is_not_ended_while_its_writer_lives(tmp_path: Path) -> None:
    """The writer's lock says it lives (a SpoolWriter in another process, as the capture
    worker is); a wrapper of a version without the lock is told apart by its pid; a run of
    another host is that host's to end."""
    run_dir = create_run_dir(tmp_path, "live")
    code = ("import sys, time; from pathlib import Path; from logcapture.spool.writer import "
            "SpoolWriter; from logcapture.records import Start; "
            f"w = SpoolWriter(Path({str(run_dir)!r}), fsync=False); "
            "w.write([Start(run='live', stream='run', seq=0, ts=time.time(), command=['x'], "
            f"host={HOST!r}, pid=1)]); w.flush(); print('ok', flush=True); time.sleep(60)")
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "ok\n"
        assert close_abandoned(run_dir) is None  # its lock is held
        writer.kill()
        writer.wait()
        assert close_abandoned(run_dir) is None  # pid 1 runs since before the run
    finally:
        writer.kill()
        writer.wait()
        if writer.stdout is not None:
            writer.stdout.close()
    old = create_run_dir(tmp_path, "old")
    _write(old, _start("old", os.getpid(), ts=time.time()), 1)
    assert close_abandoned(old) is None  # its pid lives and began before it
    other = create_run_dir(tmp_path, "other")
    _write(other, _start("other", _dead_pid(), host="elsewhere"), 1)
    assert close_abandoned(other) is None


def test_a_slurm_run_is_left_to_the_epilog_for_a_while(tmp_path: Path) -> None:
    run_dir = create_run_dir(tmp_path, "1234")
    _write(run_dir, _start("1234", _dead_pid(), slurm={"job_id": "1234"}), 1)
    assert close_abandoned(run_dir) is None
    later = time.time() + ABANDONED_SLURM_GRACE + 1
    end = close_abandoned(run_dir, now=lambda: later)
    assert end is not None and end.state == LOST
    # Slurm's word ends the wait: a node that failed runs no epilog
    failed = create_run_dir(tmp_path, "1235")
    _write(failed, _start("1235", _dead_pid(), slurm={"job_id": "1235"}), 1)
    assert writer_gone(failed)
    end = close_abandoned(failed, state="NODE_FAIL")
    assert end is not None and end.state == "NODE_FAIL"


def test_killing_the_wrapper_ends_the_run_lost(lc_env: dict[str, str]) -> None:
    """SIGKILL of the wrapper alone: its capture worker sees the pipe close without an
    outcome and ends the run itself."""
    p = subprocess.Popen([*LOGCAPTURE, "run", "--", "sh", "-c", "echo one; exec sleep 60"],
                         env=lc_env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"one\n"
        # What the wrapper read and had not yet handed to the worker dies with it: wait
        # until the line is in the spool.
        _wait_for(lambda: bool(_ls(lc_env)) and _ls(lc_env)[0]["lines"] == 1)
        p.kill()
        p.wait()
        _wait_for(lambda: _ls(lc_env) and _ls(lc_env)[0]["state"] == LOST)
        info = _show(lc_env)
        assert info["exit_status"] is None and info["duration"] >= 0
        assert [i["kind"] for i in info["insights"]][:1] == ["lost"]
        logs = lc(["logs"], lc_env).stdout.decode()
        assert logs.startswith("one\n") and "went away" in logs
    finally:
        subprocess.run(["pkill", "-f", "exec sleep 60"], check=False)
        p.stdout.close()  # type: ignore[union-attr]


def test_when_every_capture_process_dies_a_reader_ends_the_run(lc_env: dict[str, str]) -> None:
    """The whole process group killed (the OOM killer taking a cgroup, a crash): no process of
    logcapture's is left to write an end. `logs -f` notices and returns; `ls` shows LOST."""
    p = subprocess.Popen([*LOGCAPTURE, "run", "--", "sh", "-c", "echo one; exec sleep 60"],
                         env=lc_env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"one\n"
        _wait_for(lambda: bool(_ls(lc_env)) and _ls(lc_env)[0]["lines"] == 1)
        follow = subprocess.Popen([*LOGCAPTURE, "logs", "-f"], env=lc_env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(0.5)
        # The capture worker and the command first, then the wrapper: no logcapture process
        # sees another die and lives to write an end.
        subprocess.run(["pkill", "-KILL", "-P", str(p.pid)], check=False)
        os.killpg(p.pid, signal.SIGKILL)
        out, err = follow.communicate(timeout=60)
        assert follow.returncode == 0, err
        assert out.decode().startswith("one\n") and "is gone" in out.decode()
        assert _ls(lc_env)[0]["state"] == LOST
    finally:
        p.wait()
        p.stdout.close()  # type: ignore[union-attr]


def test_a_duration_never_goes_negative_when_the_wall_clock_steps_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner measures a duration on the monotonic clock; the end record is never before
    the start plus that duration, whatever the wall clock says at the end."""
    from logcapture.pipeline import Pipeline

    spool = SpoolWriter(create_run_dir(tmp_path, "r"), fsync=False)
    p = Pipeline("r", spool, mode="enabled", columns=80, rows=24)
    start = p.start(command=["x"])
    stepped = start.ts - 600.0
    monkeypatch.setattr(time, "time", lambda: stepped)
    end = p.finish(exit_status=0, signal=None, state="COMPLETED", duration=4.0,
                   bytes_read={})
    assert end.ts >= start.ts + 4.0 and end.duration == 4.0


# --- a full spool disk ------------------------------------------------------------------------
def _tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {res.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small filesystem")
    disk = tmp_path / "disk"
    _tmpfs(disk, "4m")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def test_a_full_disk_keeps_what_fits_ends_the_run_and_says_what_was_lost(
        lc_env: dict[str, str], small_disk: Path, tmp_path: Path) -> None:
    """On a 4 MiB spool disk a job printing 300k distinct lines: the job's output is whole;
    the run ends (its end record written into the reserve), and a note and `show`'s warnings
    say how many lines were not stored and why."""
    lc_env["LOGCAPTURE_SPOOL"] = str(small_disk / "spool")
    out = tmp_path / "out"
    with out.open("wb") as f:
        res = lc(["run", "--", "seq", "1", "300000"], lc_env, stdout=f,
                     stderr=subprocess.PIPE, capture_output=False, timeout=300)
    assert res.returncode == 0
    assert out.stat().st_size == sum(len(str(i)) + 1 for i in range(1, 300001))
    assert b"cannot write spool segment" in res.stderr
    info = _show(lc_env)
    assert info["state"] == "COMPLETED" and info["warnings"] >= 1
    stored = info["lines"]["stdout"]
    gap = [i for i in info["insights"] if i["kind"] == "incomplete"]
    assert len(gap) == 1
    n_lost = gap[0]["details"]["lines"]
    assert 0 < stored < 300000 and n_lost > 0 and stored + n_lost == 300000
    notes = [ln for ln in lc(["logs"], lc_env).stdout.decode().splitlines()
             if "not stored" in ln]
    assert len(notes) == 1 and "No space left on device" in notes[0]
    assert notes[0].startswith(f"[logcapture: warning: {n_lost} lines")
    assert "!incomplete" in lc(["ls"], lc_env).stdout.decode()


def test_space_that_returns_mid_run_is_used_and_the_gap_is_noted(
        lc_env: dict[str, str], small_disk: Path) -> None:
    """The disk is full when the job starts; space returns while it runs: the lines printed
    after are stored, the note sits where the gap ends, and the run has its start record."""
    lc_env["LOGCAPTURE_SPOOL"] = str(small_disk / "spool")
    (small_disk / "spool").mkdir()
    filler = _fill(small_disk)
    (small_disk / "go").unlink(missing_ok=True)
    script = ("import os, time\n"
              "for i in range(4000): print('before', i)\n"
              f"while not os.path.exists({str(small_disk / 'go')!r}): time.sleep(0.05)\n"
              "time.sleep(1.5)\n"
              "for i in range(100): print('after', i)\n")
    p = subprocess.Popen([*LOGCAPTURE, "run", "--", sys.executable, "-c", script],
                         env=lc_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(2.0)
    filler.unlink()
    (small_disk / "go").write_text("")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    run_dir = next((small_disk / "spool").iterdir())
    recs = list(iter_run(run_dir))
    assert isinstance(recs[0], Start)
    texts = [r.text for r in recs if isinstance(r, Line)]
    assert texts[-100:] == [f"after {i}" for i in range(100)]
    notes = [i for i, r in enumerate(recs) if isinstance(r, Note) and "not stored" in r.text]
    if len([t for t in texts if t.startswith("before")]) < 4000:  # the 64 KiB reserve aside
        assert len(notes) == 1
        first_after = next(i for i, r in enumerate(recs)
                           if isinstance(r, Line) and r.text == "after 0")
        assert notes[0] < first_after
    assert isinstance(recs[-1], End) and recs[-1].state == "COMPLETED"


def test_spool_keep_free_stops_storing_lines_before_the_disk_is_full(
        lc_env: dict[str, str], small_disk: Path) -> None:
    """An administrator's reserve (spool_keep_free): the spool stores no lines past it, ends
    the run, and says why; the filesystem keeps its free space."""
    lc_env["LOGCAPTURE_SPOOL"] = str(small_disk / "spool")
    lc_env["LOGCAPTURE_SPOOL_KEEP_FREE"] = "75%"  # 3 MiB of the 4 MiB
    res = lc(["run", "--", "seq", "1", "300000"], lc_env, timeout=300)
    assert res.returncode == 0
    st = os.statvfs(small_disk)
    assert st.f_bavail * st.f_frsize >= 3 * (1 << 20) - 128 * 1024  # the end, the note
    info = _show(lc_env)
    assert info["state"] == "COMPLETED"
    assert 0 < info["lines"]["stdout"] < 300000
    notes = [ln for ln in lc(["logs"], lc_env).stdout.decode().splitlines()
             if "not stored" in ln]
    assert len(notes) == 1 and "kept free" in notes[0]


def test_spool_keep_free_takes_bytes_or_a_percentage(tmp_path: Path) -> None:
    from logcapture.config.admin import load_admin
    from logcapture.config.checking import keep_free_bytes
    from logcapture.errors import ConfigError

    assert keep_free_bytes("512M", tmp_path) == 512 << 20
    assert keep_free_bytes("2GiB", tmp_path) == 2 << 30
    assert keep_free_bytes("1048576", tmp_path) == 1 << 20
    st = os.statvfs(tmp_path)
    assert keep_free_bytes("10%", tmp_path) == int(st.f_blocks * st.f_frsize / 10)
    assert keep_free_bytes("0", tmp_path) == 0
    config = tmp_path / "config.yaml"
    config.write_text("spool_keep_free: lots\n")
    with pytest.raises(ConfigError, match=r"config.yaml:1:18: key 'spool_keep_free'"):
        load_admin(config, env={})


# --- the bound on what one run stores ---------------------------------------------------------
def test_the_output_limit_keeps_the_head_and_the_tail_and_counts_the_rest() -> None:
    from logcapture.limit import OutputLimit
    from logcapture.records import Lines, Metadata

    lim = OutputLimit(limit=100, tail=5, metadata_limit=2)
    recs = [Lines(run="r", stream="stdout", seq=i * 10, ts=float(i),
                  texts=tuple(f"{i}-{j:03d}" for j in range(10))) for i in range(20)]
    meta = [Metadata(run="r", stream="stdout", seq=1000 + i, ts=1.0, fields={"a": i})
            for i in range(3)]
    stored = lim.feed(recs[:1]) + lim.feed(recs[1:] + meta)
    assert [r.seq for r in stored if isinstance(r, Lines)] == [0, 10]  # 2 x 50 characters
    assert len([r for r in stored if isinstance(r, Metadata)]) == 2
    tail = lim.tail()
    assert [r.seq for r in tail] == [190]  # the last batch holds the last 5 lines whole
    assert lim.counts() == {"lines_left_out": 170, "chars_left_out": 940,
                            "metadata_left_out": 1}


def test_a_run_past_job_output_limit_stores_its_head_and_tail_with_notes(
        lc_env: dict[str, str], tmp_path: Path) -> None:
    lc_env["LOGCAPTURE_JOB_OUTPUT_LIMIT"] = "20000"
    lc_env["LOGCAPTURE_JOB_OUTPUT_TAIL"] = "5"
    out = tmp_path / "out"
    with out.open("wb") as f:
        res = lc(["run", "--", "seq", "1", "100000"], lc_env, stdout=f,
                     stderr=subprocess.PIPE, capture_output=False)
    assert res.returncode == 0 and out.read_bytes().endswith(b"99999\n100000\n")
    logs = lc(["logs"], lc_env).stdout.decode().splitlines()
    cut = next(i for i, ln in enumerate(logs) if "job_output_limit" in ln and "reached" in ln)
    left = next(i for i, ln in enumerate(logs) if "were left out here" in ln)
    head = [int(x) for x in logs[:cut]]
    assert head == list(range(1, len(head) + 1)) and sum(len(str(x)) for x in head) <= 20000
    kept = [int(x) for x in logs[left + 1:]]
    assert kept[-1] == 100000 and len(kept) >= 5
    assert kept == list(range(kept[0], 100001))
    n_left = int(logs[left].split("warning: ")[1].split()[0])
    assert len(head) + n_left + len(kept) == 100000
    info = _show(lc_env)
    gap = [i for i in info["insights"] if i["kind"] == "incomplete"]
    assert gap and gap[0]["details"]["lines"] == n_left


def test_a_batch_cut_at_the_limit_keeps_every_line_its_read_time() -> None:
    from logcapture.limit import _split
    from logcapture.records import Lines

    rec = Lines(run="r", stream="stdout", seq=10, ts=1.0, texts=tuple("abcdefg"),
                spans=((1.0, 3), (2.0, 1), (3.0, 3)))
    for k in range(1, 7):
        head, rest = _split(rec, k)
        assert head.texts + rest.texts == rec.texts and rest.seq == 10 + k
        assert head.times() + rest.times() == rec.times()
        assert head.to_json() + "\n" + rest.to_json() == rec.to_json()


def test_show_says_which_segments_could_not_be_read(lc_env: dict[str, str]) -> None:
    """A segment that cannot be read (corrupt) hides nothing else, and `show` says that its
    lines are missing rather than only counting fewer lines."""
    root = Path(lc_env["LOGCAPTURE_SPOOL"])
    run_dir = create_run_dir(root, "r")
    w = SpoolWriter(run_dir, fsync=False, segment_bytes=1024)
    w.write([_start("r", os.getpid(), ts=time.time())])
    for i in range(100):
        w.write([Line(run="r", stream="stdout", seq=i, ts=time.time(), text="x" * 40)])
        w.flush()
    w.write([End(run="r", stream="run", seq=1, ts=time.time(), exit_status=0, signal=None,
                 state="COMPLETED", duration=1.0,
                 counts={"stdout": {"lines": 100}, "stderr": {"lines": 0}})])
    w.close()
    (run_dir / "seg-000001.ndjson.gz").write_bytes(b"\x1f\x8b not gzip")
    info = _show(lc_env, "r")
    assert info["lines"]["stdout"] < 100
    assert "seg-000001.ndjson.gz" in info["spool_problems"]
    assert "could not be read, their lines are missing" in info["spool_problems"]
    [gap] = [i for i in info["insights"] if i["kind"] == "incomplete"]
    assert gap["details"]["segments"] == 1
    assert "incomplete" in _ls(lc_env)[0]["insights"]  # ls marks it


def test_ls_keeps_a_finished_runs_insight_kinds_until_its_segments_change(
        lc_env: dict[str, str]) -> None:
    """`ls` of a finished spool run reads every segment for its kinds once; its owner's next
    `ls` reads them from the run's cache, made again when a segment changes."""
    res = lc(["run", "--", "sh", "-c", "echo 'Traceback (most recent call last):'; "
                  "echo '  File \"x.py\", line 1, in <module>'; echo 'ValueError: bad'; "
                  "exit 1"], lc_env)
    assert res.returncode == 1
    first = _ls(lc_env)[0]["insights"]
    assert "python-exception" in first
    run_dir = next(Path(lc_env["LOGCAPTURE_SPOOL"]).iterdir())
    cache = run_dir / ".logcapture-insights.json"
    kept = json.loads(cache.read_text())
    assert kept["kinds"] == first
    cache.write_text(json.dumps({**kept, "kinds": ["from-the-cache"]}))
    assert _ls(lc_env)[0]["insights"] == ["from-the-cache"]
    seg = sorted(run_dir.glob("seg-*"))[0]
    os.utime(seg, ns=(seg.stat().st_atime_ns, seg.stat().st_mtime_ns + 1))
    assert _ls(lc_env)[0]["insights"] == first
