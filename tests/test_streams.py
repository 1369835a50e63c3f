"""stdout and stderr: what reaches their files is what the job wrote there, in its order.

The differential suite runs each program four ways: without and with ``logcapture run``, once
with stdout and stderr to separate files and once with both to one file (``2>&1``), and
compares exit status and bytes. When both go to one place the job runs under one pty for both
streams (same_destination), as under a terminal or ``script``: two ptys read by one
reader cannot keep the order of writes across them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import LOGCAPTURE, lc

from logcapture.config.optin import load_optin
from logcapture.pipeline import Pipeline
from logcapture.records import NOTE_MODE, Line, Note, Start
from logcapture.runner.descriptors import same_destination
from logcapture.spool.layout import create_run_dir, find_run_dirs
from logcapture.spool.reading import iter_run
from logcapture.spool.writer import SpoolWriter

PY = sys.executable

# Each program decides the order of its writes itself (flushes, unbuffered writes), so a run
# without logcapture is deterministic and the comparison is exact.
PROGRAMS = {
    "python_alternating": [PY, "-c", textwrap.dedent("""
        import sys
        for i in range(200):
            print("out", i, flush=True)
            print("err", i, file=sys.stderr, flush=True)
            if i % 7 == 0:
                sys.stdout.write("partial "); sys.stdout.flush()
                sys.stderr.write("e-partial "); sys.stderr.flush()
        """)],
    "shell_loop": ["sh", "-c", "i=0; while [ $i -lt 200 ]; do echo out $i; echo err $i >&2; "
                   "printf 'x%s' $i; printf 'y%s\\n' $i >&2; i=$((i+1)); done; exit 3"],
    "progress_with_warnings": [PY, "-c", textwrap.dedent("""
        import sys
        for i in range(101):
            sys.stdout.write(f"\\rtraining {i:3d}% |{'#' * (i // 5):20s}|"); sys.stdout.flush()
            if i % 10 == 5:
                sys.stderr.write(f"UserWarning: step {i} is slow\\n"); sys.stderr.flush()
        sys.stdout.write("\\n"); sys.stdout.flush()
        """)],
    "traceback_after_stdout": [PY, "-u", "-c", textwrap.dedent("""
        for epoch in range(3):
            print(f"epoch {epoch} loss {1 / (epoch + 1):.3f}")
        print('{"epoch": 3, "loss": 0.25}')
        def step(x):
            return 1 / x
        step(0)
        """)],
    "floods_on_both": [PY, "-c", textwrap.dedent("""
        import os
        for i in range(300):
            os.write(1, (b"o%d " % i) * 2000 + b"\\n")
            os.write(2, (b"e%d " % i) * 1500 + b"\\n")
            os.write(1, b"short %d\\n" % i)
            os.write(2, b"E%d\\n" % i)
        """)],
}


def _run(argv: list[str], env: dict[str, str], out: Path, err: Path | None) -> int:
    """Run ``argv`` with stdout to ``out`` and stderr to ``err`` (None: the same open file,
    ``2>&1``)."""
    with open(out, "wb") as fo:
        if err is None:
            return subprocess.run(argv, stdout=fo, stderr=subprocess.STDOUT, env=env,
                                  timeout=120, stdin=subprocess.DEVNULL).returncode
        with open(err, "wb") as fe:
            return subprocess.run(argv, stdout=fo, stderr=fe, env=env, timeout=120,
                                  stdin=subprocess.DEVNULL).returncode


def _start(spool: Path) -> Start:
    (run_dir,) = find_run_dirs(spool)
    start = next(iter(iter_run(run_dir)))
    assert isinstance(start, Start)
    return start


def _lines(spool: Path, stream: str) -> list[str]:
    (run_dir,) = find_run_dirs(spool)
    return [r.text for r in iter_run(run_dir) if isinstance(r, Line) and r.stream == stream]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_one_file_gets_the_same_bytes_in_the_same_order(tmp_path: Path, lc_env: dict[str, str],
                                                        spool: Path, name: str) -> None:
    argv = PROGRAMS[name]
    bare = _run(argv, lc_env, tmp_path / "bare", None)
    captured = _run([*LOGCAPTURE, "run", "--", *argv], lc_env, tmp_path / "lc", None)
    assert captured == bare
    want, got = (tmp_path / "bare").read_bytes(), (tmp_path / "lc").read_bytes()
    assert len(want) > 100
    assert got == want
    start = _start(spool)
    assert start.config["streams"] == "merged"
    assert _lines(spool, "stderr") == []  # one stream, labelled stdout


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_separate_files_get_the_same_bytes(tmp_path: Path, lc_env: dict[str, str],
                                           spool: Path, name: str) -> None:
    argv = PROGRAMS[name]
    bare = _run(argv, lc_env, tmp_path / "out", tmp_path / "err")
    captured = _run([*LOGCAPTURE, "run", "--", *argv], lc_env, tmp_path / "lc-out",
                    tmp_path / "lc-err")
    assert captured == bare
    assert (tmp_path / "lc-out").read_bytes() == (tmp_path / "out").read_bytes()
    assert (tmp_path / "lc-err").read_bytes() == (tmp_path / "err").read_bytes()
    assert (tmp_path / "err").stat().st_size > 0
    assert _start(spool).config["streams"] == "separate"


def test_the_merged_log_holds_both_streams_in_the_order_written(
        tmp_path: Path, lc_env: dict[str, str], spool: Path) -> None:
    argv = [PY, "-c", "import sys\nfor i in range(30):\n print('out', i, flush=True)\n"
            " print('err', i, file=sys.stderr, flush=True)"]
    assert _run([*LOGCAPTURE, "run", "--", *argv], lc_env, tmp_path / "lc", None) == 0
    want = [f"{s} {i}" for i in range(30) for s in ("out", "err")]
    assert _lines(spool, "stdout") == want
    logs = subprocess.run([*LOGCAPTURE, "logs", "--stream", "stderr"], env=lc_env,
                          capture_output=True, timeout=60)
    assert logs.returncode == 0
    assert logs.stdout == b""
    assert b"captured as one stream" in logs.stderr and b"#SBATCH -e" in logs.stderr
    show = subprocess.run([*LOGCAPTURE, "show"], env=lc_env, capture_output=True, timeout=60)
    assert any(ln.split()[:2] == [b"streams:", b"merged"] for ln in show.stdout.splitlines())


def test_a_merged_run_with_a_mode_change_has_no_stderr(tmp_path: Path, lc_env: dict[str, str],
                                                       spool: Path) -> None:
    """The mode change is noted in the one stream there is, and ``logs --stream stderr``
    still says where stderr went."""
    argv = [PY, "-c", "import sys\nprint('before', flush=True)\n"
            "print('/LOGCOMMAND {\"mode\": \"metadata\"}', file=sys.stderr, flush=True)\n"
            "print('hidden', flush=True)"]
    assert _run([*LOGCAPTURE, "run", "--", *argv], lc_env, tmp_path / "lc", None) == 0
    (run_dir,) = find_run_dirs(spool)
    records = list(iter_run(run_dir))
    assert [r.stream for r in records if r.stream == "stderr"] == []
    assert [r.note for r in records if isinstance(r, Note) and r.stream == "stdout"] == [
        NOTE_MODE]
    logs = subprocess.run([*LOGCAPTURE, "logs", "--stream", "stderr"], env=lc_env,
                          capture_output=True, timeout=60)
    assert logs.returncode == 0 and logs.stdout == b""
    assert b"captured as one stream" in logs.stderr


def test_logs_stream_stderr_explains_a_merged_run_whose_stderr_has_a_mode_note(
        tmp_path: Path, spool: Path) -> None:
    """A run whose mode note went to both streams though they were one (as runs were written
    before the note went to stdout alone): the note is no output of stderr's, and the
    explanation is still given."""
    run_dir = create_run_dir(spool, "old-merged")
    pipeline = Pipeline("old-merged", SpoolWriter(run_dir), mode="enabled", columns=80, rows=24)
    pipeline.start(command=["job"], config={"streams": "merged"})
    pipeline.feed("stdout", b'/LOGCOMMAND {"mode": "metadata"}\n', 1.0)
    pipeline.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0,
                    bytes_read={})
    assert any(r.stream == "stderr" for r in iter_run(run_dir))
    result = lc(["logs", "--spool", str(spool), "--stream", "stderr", "old-merged"], text=True)
    assert result.returncode == 0, result.stderr
    assert "mode changed" in result.stdout
    assert "captured as one stream" in result.stderr


def test_both_appending_to_one_file_is_one_place(tmp_path: Path, lc_env: dict[str, str],
                                                 spool: Path) -> None:
    argv = PROGRAMS["python_alternating"]
    for name, cmd in (("bare", argv), ("lc", [*LOGCAPTURE, "run", "--", *argv])):
        path = tmp_path / name
        with open(path, "ab") as fo, open(path, "ab") as fe:  # >>f 2>>f
            subprocess.run(cmd, stdout=fo, stderr=fe, env=lc_env, timeout=120, check=True)
    assert (tmp_path / "lc").read_bytes() == (tmp_path / "bare").read_bytes()
    assert _start(spool).config["streams"] == "merged"


def test_streams_separate_keeps_two_streams_where_they_share_a_file(
        tmp_path: Path, lc_env: dict[str, str], spool: Path) -> None:
    optin = tmp_path / "optin"
    optin.write_text("streams: separate\n")
    env = {**lc_env, "LOGCAPTURE_OPTIN": str(optin)}
    argv = PROGRAMS["python_alternating"]
    _run(argv, env, tmp_path / "bare", None)
    assert _run([*LOGCAPTURE, "run", "--", *argv], env, tmp_path / "lc", None) == 0
    want, got = (tmp_path / "bare").read_bytes(), (tmp_path / "lc").read_bytes()
    # Each stream's bytes are all there (their order across the two may differ: the price).
    assert sorted(got.replace(b" ", b"\n").split()) == sorted(want.replace(b" ", b"\n").split())
    assert _start(spool).config["streams"] == "separate"
    assert "err 5" in _lines(spool, "stderr")


# ------------------------------------------------------------------ same_destination


def test_same_destination(tmp_path: Path) -> None:
    f = tmp_path / "f"
    with open(f, "wb") as a, open(f, "wb") as b, open(f, "ab") as c, open(f, "ab") as d, \
            open(tmp_path / "g", "wb") as g, open(os.devnull, "wb") as null:
        dup = os.dup(a.fileno())
        try:
            assert same_destination(a.fileno(), dup)  # 2>&1
            assert not same_destination(a.fileno(), b.fileno())  # >f 2>f
            assert same_destination(c.fileno(), d.fileno())  # >>f 2>>f
            assert not same_destination(a.fileno(), g.fileno())
            assert not same_destination(null.fileno(), os.dup(null.fileno()))
        finally:
            os.close(dup)
    r, w = os.pipe()
    m, s = os.openpty()
    try:
        assert same_destination(w, w)
        assert not same_destination(w, r + 1000)  # closed
        again = os.open(os.ttyname(s), os.O_WRONLY | os.O_NOCTTY)  # the same terminal
        try:
            assert same_destination(s, again)
            assert not same_destination(s, w)
        finally:
            os.close(again)
    finally:
        for fd in (r, w, m, s):
            os.close(fd)


def test_the_job_sees_one_terminal_for_both_when_merged(tmp_path: Path,
                                                        lc_env: dict[str, str]) -> None:
    probe = ("import os, sys\na, b = os.fstat(1), os.fstat(2)\n"
             "print(os.isatty(1), os.isatty(2), (a.st_ino, a.st_rdev) == (b.st_ino, b.st_rdev))")
    _run([*LOGCAPTURE, "run", "--", PY, "-c", probe], lc_env, tmp_path / "one", None)
    _run([*LOGCAPTURE, "run", "--", PY, "-c", probe], lc_env, tmp_path / "two",
         tmp_path / "err")
    assert (tmp_path / "one").read_text() == "True True True\n"
    assert (tmp_path / "two").read_text() == "True True False\n"


# ------------------------------------------------------------------ the .logoptin option


@pytest.mark.parametrize("value", ["auto", "separate"])
def test_streams_option_is_valid(tmp_path: Path, value: str) -> None:
    path = tmp_path / ".logoptin"
    path.write_text(f"mode: enabled\nstreams: {value}\n")
    result = load_optin(path)
    assert result.ok and result.config.streams == value
    out = lc(["check", str(path)], text=True).stdout
    assert f"streams: {value}" in out


def test_streams_merged_is_explained(tmp_path: Path) -> None:
    path = tmp_path / ".logoptin"
    path.write_text("streams: merged\n")
    result = load_optin(path)
    assert result.config.mode == "disabled"
    (problem,) = result.problems
    assert problem.startswith(f"{path}:1:10: key 'streams': must be one of auto, separate")
    assert "2>&1" in problem
    path.write_text("streams: seperate\n")
    (problem,) = load_optin(path).problems
    assert "did you mean separate" in problem
    res = lc(["check", str(path)], text=True)
    assert res.returncode == 1 and "did you mean separate" in res.stdout



# ------------------------------------------------------------------ read times and order


def test_a_merged_view_of_two_streams_is_in_read_order(tmp_path: Path, lc_env: dict[str, str],
                                                       spool: Path) -> None:
    # Two ptys (two files). Lines alternate between the streams with pauses between them, so
    # each is read in its own round; bursts of lines in between share their round. The
    # stored lines carry their own read times, and the merged views (logs from the spool and
    # from the store, the store's query) list them in that order.
    job = ("import sys, time\nfor i in range(12):\n"
           " print('out', i, flush=True); time.sleep(0.03)\n"
           " sys.stderr.write(''.join(f'err {i}.{k}\\n' for k in range(3))); sys.stderr.flush()\n"
           " time.sleep(0.03)\n")
    env = dict(lc_env, LOGCAPTURE_STORE=f"chdb://{tmp_path / 'store'}")
    assert _run([*LOGCAPTURE, "run", "--run-id", "ord", "--", PY, "-c", job], env,
                tmp_path / "o", tmp_path / "e") == 0
    want = [x for i in range(12) for x in (f"out {i}", *(f"err {i}.{k}" for k in range(3)))]
    (run_dir,) = find_run_dirs(spool)
    stored = [r for r in iter_run(run_dir) if isinstance(r, Line)]
    ts = {r.text: r.ts for r in stored}
    assert sorted(ts) == sorted(want)
    # A line written before another is never given a later read time, whichever streams they
    # went to (lines of one round share one: their order across the streams is unknown).
    assert [ts[x] for x in want] == sorted(ts[x] for x in want)
    assert ts["out 0"] < ts["err 5.0"] < ts["out 11"]
    for i in range(12):  # the burst was one write: one read, one time
        assert len({ts[f"err {i}.{k}"] for k in range(3)}) == 1
    by_time = [r.text for r in sorted(stored, key=lambda r: r.ts)]  # stable: spool order
    spool_logs = subprocess.run([*LOGCAPTURE, "logs", "ord"], env=env, capture_output=True,
                                timeout=60).stdout.decode().splitlines()
    assert spool_logs == by_time
    up = subprocess.run([*LOGCAPTURE, "upload", "--run", "ord", "--keep"], env=env,
                        capture_output=True, timeout=120)
    assert up.returncode == 0, up.stderr
    store_logs = subprocess.run([*LOGCAPTURE, "logs", "ord", "--source", "store"], env=env,
                                capture_output=True, timeout=60)
    in_store = [r.text for r in sorted(stored, key=lambda r: (r.ts, r.stream, r.seq))]
    assert store_logs.stdout.decode().splitlines() == in_store, store_logs.stderr
