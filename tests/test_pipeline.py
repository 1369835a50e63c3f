"""The pipeline and its capture worker (docs/performance.md).

- The worker process renders what the reader sends and writes the same spool as the
  pipeline run in-process would.
- A worker that dies or hangs never touches the command or its output: one warning, and the
  reader goes on copying. A slow worker slows the command (flow control) and loses nothing.
- Signals for the command never reach the worker.
- The worker ticks on the reader's clock.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from logcapture import runner
from logcapture.pipeline import Pipeline, serve
from logcapture.records import Record
from logcapture.runs import find_run
from logcapture.spool import SpoolWriter, create_run_dir, iter_run

from .conftest import LOGCAPTURE, run_lc

PY = sys.executable


def _content(records: list[Record]) -> list[tuple[Any, ...]]:
    """What reaches the spool for the output streams, minus the clock."""
    out = []
    for rec in records:
        if rec.stream in ("stdout", "stderr"):
            d = rec.to_dict()
            d.pop("ts")
            d.pop("run")
            out.append(tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in d.items())))
    return out


def _in_process(tmp_path: Path, out: bytes, err: bytes, chunk: int = 4096) -> list[Record]:
    root = tmp_path / "inproc"
    spool = SpoolWriter(create_run_dir(root, "r"), fsync=False)
    p = Pipeline("r", spool, mode="enabled", columns=80, rows=24)
    for stream, data in (("stdout", out), ("stderr", err)):
        for i in range(0, len(data), chunk):
            p.feed(stream, data[i:i + chunk], 1.0)
    p.finish(exit_status=0, signal=None, state="COMPLETED", duration=0.0, bytes_read={})
    return list(iter_run(root / "r"))


JOB = textwrap.dedent("""
    import sys
    for i in range(3000):
        print("line", i % 7, "x" * (i % 50))
        if i % 500 == 0:
            print("same"); print("same"); print(); print(); print()
            print('{"step": %d, "loss": 0.5}' % i)
            sys.stdout.write("\\r 10%% \\x1b[32m|##  |\\x1b[0m\\r 100%% |####|\\n")
    print("to err", file=sys.stderr)
""")


def test_the_worker_writes_what_the_in_process_pipeline_writes(
        tmp_path: Path, lc_env: dict[str, str], spool: Path) -> None:
    res = run_lc(["run", "--", PY, "-c", JOB], lc_env)
    assert res.returncode == 0, res.stderr
    assert res.stderr == b"to err\n"
    records = list(iter_run(find_run(spool, None)))
    kinds = [r.kind for r in records]
    assert kinds[0] == "start" and kinds[-1] == "end"
    start = records[0]
    assert start.pid != 0 and start.command[:2] == [PY, "-c"]  # type: ignore[attr-defined]
    end = records[-1]
    assert end.state == "COMPLETED"  # type: ignore[attr-defined]
    capture = end.counts["capture"]  # type: ignore[attr-defined]
    assert capture["cpu_ms"] == capture["reader_cpu_ms"] + capture["worker_cpu_ms"]
    assert end.counts["stdout"]["bytes"] == len(res.stdout)  # type: ignore[attr-defined]
    assert _content(records) == _content(_in_process(tmp_path, res.stdout, res.stderr))


# ------------------------------------------------------------------ a worker that fails


def _run(tmp_path: Path, argv: list[str], target: Any,
         **opts: Any) -> tuple[runner.Outcome, bytes, list[str], runner.Worker]:
    worker = runner.fork_worker(target)
    out = tmp_path / "out"
    warnings: list[str] = []
    with open(out, "wb") as fo, open(os.devnull, "wb") as fe:
        outcome = runner.run(argv, worker, runner.Options(
            stdout_fd=fo.fileno(), stderr_fd=fe.fileno(), warn=warnings.append, **opts))
    return outcome, out.read_bytes(), warnings, worker


LINES = [PY, "-c", "for i in range(200000): print(i)"]
EXPECTED = b"".join(b"%d\n" % i for i in range(200000))


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_a_worker_that_dies_leaves_the_command_and_its_output_alone(tmp_path: Path) -> None:
    def die(fd: int) -> int:
        os.read(fd, 100)
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    outcome, out, warnings, worker = _run(tmp_path, LINES, die)
    assert outcome.exit_status == 0
    assert out == EXPECTED
    assert len(warnings) == 1 and "capture process ended unexpectedly" in warnings[0]
    assert "signal 9" in warnings[0]
    assert _gone(worker.pid)


def test_a_hung_worker_is_given_up_and_the_command_goes_on(tmp_path: Path) -> None:
    def hang(fd: int) -> int:
        time.sleep(3600)
        return 0

    t0 = time.monotonic()
    outcome, out, warnings, worker = _run(tmp_path, LINES, hang, worker_buffer=65536,
                                          worker_timeout=1.0)
    assert outcome.exit_status == 0
    assert out == EXPECTED
    assert len(warnings) == 1 and "stopped responding" in warnings[0]
    assert _gone(worker.pid)
    assert time.monotonic() - t0 < 30


def test_a_worker_that_never_exits_is_stopped_at_the_end(tmp_path: Path) -> None:
    def linger(fd: int) -> int:
        while os.read(fd, 1 << 20):
            pass
        time.sleep(3600)
        return 0

    outcome, out, warnings, worker = _run(tmp_path, [PY, "-c", "print('hi')"], linger,
                                          worker_timeout=0.5)
    assert outcome.exit_status == 0 and out == b"hi\n"
    assert len(warnings) == 1 and "did not finish the spool in time" in warnings[0]
    assert _gone(worker.pid)


def test_a_slow_worker_slows_the_command_and_loses_nothing(tmp_path: Path) -> None:
    got = tmp_path / "got"

    def slow(fd: int) -> int:
        time.sleep(1.0)  # let the reader's buffer fill: it must stop reading, not drop
        seen: dict[int, bytearray] = {0: bytearray(), 1: bytearray()}
        buf = bytearray()
        end = None
        while end is None:
            data = os.read(fd, 4096)
            assert data
            buf += data
            while len(buf) >= runner.FRAME.size:
                kind, n, _, _ = runner.FRAME.unpack_from(buf, 0)
                if len(buf) < runner.FRAME.size + n:
                    break
                payload = bytes(buf[runner.FRAME.size:runner.FRAME.size + n])
                del buf[:runner.FRAME.size + n]
                if kind == runner.FRAME_END:
                    end = json.loads(payload)
                    break
                seen[kind] += payload
        got.write_bytes(bytes(seen[0]))
        (tmp_path / "end").write_text(json.dumps(end))
        return 0

    outcome, out, warnings, worker = _run(tmp_path, LINES, slow, worker_buffer=65536)
    assert outcome.exit_status == 0 and not warnings
    assert out == EXPECTED
    assert got.read_bytes() == EXPECTED
    end = json.loads((tmp_path / "end").read_text())
    assert end["exit_status"] == 0 and end["bytes"]["stdout"] == len(EXPECTED)
    assert end["reader"]["cpu_ms"] >= 0
    assert _gone(worker.pid)


# ------------------------------------------------------------------ signals


def test_signals_for_the_command_never_reach_the_worker(lc_env: dict[str, str],
                                                        spool: Path) -> None:
    script = textwrap.dedent("""
        import signal, sys, time
        got = []
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(s, lambda n, f: got.append(n))
        print("ready", flush=True)
        deadline = time.time() + 20
        while len(got) < 4 and time.time() < deadline:
            time.sleep(0.01)
        print("got", len(got), flush=True)
    """)
    # The wrapper leads its own process group, as under an interactive shell: ^C there goes
    # to the whole group. The worker has its own group and ignores these anyway.
    proc = subprocess.Popen([*LOGCAPTURE, "run", "--", PY, "-c", script], env=lc_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdout is not None
    seen = b""
    while b"ready" not in seen:
        chunk = os.read(proc.stdout.fileno(), 4096)
        assert chunk
        seen += chunk
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        os.killpg(proc.pid, sig)
        time.sleep(0.05)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert b"got 4" in seen + out
    assert b"capture" not in err  # no warning: the worker was untouched
    records = list(iter_run(find_run(spool, None)))
    assert records[-1].kind == "end"
    assert [r.text for r in records if r.kind == "line"] == [  # type: ignore[attr-defined]
        "ready", "got 4"]


# ------------------------------------------------------------------ ticks on the reader's clock


class _Calls:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, float]] = []

    def feed(self, stream: str, data: bytes, now: float, mono: float) -> None:
        self.calls.append((f"feed {stream} {data!r}", now, mono))

    def tick(self, now: float, mono: float) -> None:
        self.calls.append(("tick", now, mono))


def test_a_backlog_is_ticked_on_the_readers_clock() -> None:
    r, w = os.pipe()
    base = time.monotonic()
    frames = [(0, b"a\n", 100.0, base), (1, b"b\n", 100.1, base + 0.1),
              (0, b"c\n", 102.0, base + 2.0)]
    data = b"".join(runner.FRAME.pack(k, len(d), wall, mono) + d for k, d, wall, mono in frames)
    end = json.dumps({"exit_status": 0}).encode()
    data += runner.FRAME.pack(runner.FRAME_END, len(end), 0.0, 0.0) + end
    os.write(w, data)
    calls = _Calls()
    assert serve(r, calls) == {"exit_status": 0}  # type: ignore[arg-type]
    os.close(r)
    os.close(w)
    names = [c[0] for c in calls.calls]
    assert names[0] == "feed stdout b'a\\n'" and names[1] == "feed stderr b'b\\n'"
    # Between b (reader time +0.1) and c (+2.0) the reader would have ticked: a few ticks on
    # its clock, the last at c's time, all before c.
    ticks = [c for c in calls.calls[2:-1]]
    assert ticks and all(c[0] == "tick" for c in ticks)
    assert all(base + 0.1 < c[2] <= base + 2.0 for c in ticks)
    assert ticks[-1][2] == pytest.approx(base + 2.0)
    assert ticks[-1][1] == pytest.approx(102.0)
    assert names[-1] == "feed stdout b'c\\n'"


def test_end_of_file_without_an_end_frame_keeps_the_lines(tmp_path: Path) -> None:
    root = tmp_path / "s"
    spool = SpoolWriter(create_run_dir(root, "r"), fsync=False)
    p = Pipeline("r", spool, mode="enabled", columns=80, rows=24)
    r, w = os.pipe()
    d = b"one\ntwo"
    os.write(w, runner.FRAME.pack(0, len(d), time.time(), time.monotonic()) + d)
    os.close(w)
    assert serve(r, p) is None
    os.close(r)
    p.close_unfinished()
    records = list(iter_run(root / "r"))
    assert [getattr(x, "text", None) for x in records] == ["one", "two"]
    assert not any(x.kind == "end" for x in records)
