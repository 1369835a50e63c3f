"""The pipeline and its capture worker (docs/performance.md).

- The worker process renders what the reader sends and writes the same spool as the
  pipeline run in-process would.
- A worker that dies or hangs never touches the command or its output: one warning, and the
  reader goes on copying. A slow worker slows the command (flow control) and loses nothing.
- Signals for the command never reach the worker.
- The worker ticks on the reader's clock.
"""

from __future__ import annotations

import gzip
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
from helpers import LOGCAPTURE, lc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from logcapture import frame
from logcapture import pipeline as pipeline_module
from logcapture.capture import _discard, _Server
from logcapture.classify import Classifier
from logcapture.filter import LineFilter
from logcapture.pipeline import Pipeline
from logcapture.records import (
    NOTE_BLANK,
    NOTE_REPEAT,
    Dropped,
    Line,
    Lines,
    Metadata,
    Record,
    Rendered,
    dumps,
    new_metadata,
    rendered_many,
)
from logcapture.runner.outcome import Options, Outcome
from logcapture.runner.readloop import TICK
from logcapture.runner.spawn import run
from logcapture.runner.worker import Worker, fork_worker
from logcapture.runs import find_run
from logcapture.spool.layout import Segment, create_run_dir, segments
from logcapture.spool.reading import iter_run
from logcapture.spool.writer import SpoolWriter

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
    res = lc(["run", "--", PY, "-c", JOB], lc_env)
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


def test_the_end_records_peak_memory_is_logcaptures_own_not_its_parents(
        tmp_path: Path, lc_env: dict[str, str], spool: Path) -> None:
    """A wrapper exec'd by a large process (slurmstepd, a big Python) reports its own peak
    memory: getrusage's ru_maxrss survives exec on Linux, VmHWM does not."""
    code = ("import os, sys\n"
            "big = bytearray(300 * 1024 * 1024)\n"
            "for i in range(0, len(big), 4096):\n"
            "    big[i] = 1\n"
            "os.execv(sys.executable, [sys.executable, '-m', 'logcapture', 'run', '--', "
            "'true'])\n")
    res = subprocess.run([PY, "-c", code], env=lc_env, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    end = list(iter_run(find_run(spool, None)))[-1]
    peak = end.counts["capture"]["max_rss_kib"]  # type: ignore[attr-defined]
    assert 1000 < peak < 200 * 1024, peak  # logcapture's own few tens of MiB, not 300


# ------------------------------------------------------------------ a worker that fails


def _run(tmp_path: Path, argv: list[str], target: Any,
         **opts: Any) -> tuple[Outcome, bytes, list[str], Worker]:
    worker = fork_worker(target)
    out = tmp_path / "out"
    warnings: list[str] = []
    with open(out, "wb") as fo, open(os.devnull, "wb") as fe:
        outcome = run(argv, worker, Options(
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


def test_the_worker_starts_with_what_it_shares_out_of_the_collectors_sight(
        tmp_path: Path) -> None:
    # Objects made before the fork are frozen in both processes: a collection that walked
    # them would write to every page holding one and copy it (copy-on-write).
    import gc

    def check(fd: int) -> int:
        frozen = gc.get_freeze_count()
        _discard(fd)
        return 0 if frozen > 1000 else 3

    try:
        outcome, out, warnings, worker = _run(tmp_path, [PY, "-c", "print('hi')"], check)
        assert outcome.exit_status == 0 and out == b"hi\n"
        assert warnings == [], warnings  # the worker exited 0: it found them frozen
        assert gc.get_freeze_count() > 1000  # and so are they here
    finally:
        gc.unfreeze()


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
            frames, pos = frame.split(buf)
            for kind, *_, start, stop in frames:
                if kind == frame.END:
                    end = frame.decode_end(buf[start:stop])
                    break
                seen[kind] += buf[start:stop]
            del buf[:pos]
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

    def tick_due(self) -> float:  # always wants its ticks
        return time.monotonic() + TICK

    def feed(self, stream: str, data: bytes, now: float, mono: float,
             marks: object = None) -> None:
        self.calls.append((f"feed {stream} {data!r}", now, mono))

    def tick(self, now: float, mono: float) -> None:
        self.calls.append(("tick", now, mono))


def test_a_backlog_is_ticked_on_the_readers_clock() -> None:
    r, w = os.pipe()
    base = time.monotonic()
    frames = [(0, b"a\n", 100.0, base), (1, b"b\n", 100.1, base + 0.1),
              (0, b"c\n", 102.0, base + 2.0)]
    data = b"".join(frame.encode(k, d, wall, mono) for k, d, wall, mono in frames)
    data += frame.encode(frame.END, frame.encode_end({"exit_status": 0}), 0.0, 0.0)
    os.write(w, data)
    calls = _Calls()
    assert _Server(r, calls).run() == {"exit_status": 0}  # type: ignore[arg-type]
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


def test_a_settled_pipeline_needs_no_ticks(tmp_path: Path) -> None:
    # _Server.run polls without a timeout while the pipeline is settled: a quiet job costs the
    # capture worker no wake-ups (docs/performance.md).
    p = Pipeline("r", SpoolWriter(create_run_dir(tmp_path, "r"), fsync=False), mode="enabled",
                 columns=80, rows=24)
    idle_commit = pipeline_module.IDLE_COMMIT
    assert p.tick_due() is None
    p.feed("stdout", b"line\n", 100.0, 10.0)
    assert p.tick_due() is not None
    assert p.tick_due() == pytest.approx(10.0 + idle_commit)  # when it has been quiet
    p.tick(100.1, 10.1)  # quiet for less than IDLE_COMMIT: still something to commit
    assert p.tick_due() is not None
    p.tick(100.0 + idle_commit, 10.0 + idle_commit)
    assert p.tick_due() is None
    # A stream that never goes quiet is committed every IDLE_EVERY by the ticks between its
    # frames (_Server.run); the timer waits for it to go quiet.
    for k in range(1, 5):
        p.feed("stdout", b"more\n", 101.0, 20.0 + k * idle_commit / 2)
    assert p.tick_due() == pytest.approx(20.0 + 2 * idle_commit + idle_commit)
    p.tick(101.0, 20.0 + 2 * idle_commit)  # data just now, last commit long ago: busy commit
    assert p.tick_due() is not None and p._last_idle["stdout"] == 20.0 + 2 * idle_commit
    assert p.tick_due() == pytest.approx(20.0 + 3 * idle_commit)
    p.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0, bytes_read={})
    assert [getattr(x, "text", None) for x in iter_run(tmp_path / "r")
            if x.kind == "line"] == ["line", "more"]  # and a note: 3 repeats dropped


def test_what_the_other_stream_printed_before_a_command_keeps_its_mode(tmp_path: Path) -> None:
    # disabled; stderr prints a secret and then keeps redrawing a bar (so it is never quiet
    # and its finished line waits in the renderer); stdout enables capture. The secret was
    # printed before the command: it must not be kept when stderr's lines are committed later.
    p = Pipeline("r", SpoolWriter(create_run_dir(tmp_path, "r"), fsync=False),
                 mode="disabled", columns=80, rows=24)
    t = 1000.0
    p.feed("stderr", b"hello\n", t, t)
    p.tick(t + 0.05, t + 0.05)
    p.feed("stderr", b"secret-before-the-command\nbar 0", t + 0.1, t + 0.1)
    p.feed("stdout", b'/LOGCOMMAND {"mode": "enabled"}\n', t + 0.2, t + 0.2)
    for k in range(1, 5):
        p.feed("stderr", b"\rbar %d" % k, t + 0.2 + k / 10, t + 0.2 + k / 10)
        p.tick(t + 0.25 + k / 10, t + 0.25 + k / 10)
    p.feed("stderr", b"\ndone\n", t + 1.0, t + 1.0)
    p.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0, bytes_read={})
    records = list(iter_run(tmp_path / "r"))
    texts = [getattr(x, "text", "") for x in records]
    assert not any("secret-before" in text for text in texts)
    assert any(x.kind == "command" for x in records)
    assert "done" in texts and "bar 4" in texts  # printed after the command: kept


def test_at_the_end_too_the_other_streams_earlier_lines_keep_their_mode(tmp_path: Path) -> None:
    # A tqdm bar's last line on stderr, then a command on stdout, then the job exits: both
    # lines are still waiting in their renderers and are committed at the end, the bar first.
    for order in ("stdout first", "stderr first"):
        run_dir = create_run_dir(tmp_path, order.replace(" ", "-"))
        p = Pipeline("r", SpoolWriter(run_dir, fsync=False), mode="enabled", columns=80,
                     rows=24)
        t = 1000.0
        feeds = [("stderr", b"\r 98%|#########9| 49/50\r100%|##########| 50/50\n", t),
                 ("stdout", b'/LOGCOMMAND {"mode": "metadata"}\n', t + 0.01)]
        for stream, data, when in (feeds if order == "stderr first" else feeds[::-1]):
            p.feed(stream, data, when, when)
        p.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0, bytes_read={})
        kept = [(x.stream, x.kind) for x in iter_run(run_dir) if x.stream != "run"]
        assert ("stderr", "line") in kept and ("stdout", "command") in kept, (order, kept)


def test_a_stricter_command_applies_to_the_other_streams_lines_of_its_round(
        tmp_path: Path) -> None:
    # A command read in the same round of the reader as the other stream's line (one read
    # time): which was written first is unknown, so the line follows the stricter mode, in
    # whichever order the two are fed and committed.
    for order in ("stdout first", "stderr first"):
        run_dir = create_run_dir(tmp_path, order.replace(" ", "-"))
        p = Pipeline("r", SpoolWriter(run_dir, fsync=False), mode="enabled", columns=80,
                     rows=24)
        t = 1000.0
        p.feed("stderr", b"before\n", t - 1, t - 1)
        feeds = [("stderr", b"token-1234\n"), ("stdout", b'/LOGCOMMAND {"mode": "disabled"}\n')]
        if order == "stdout first":
            feeds.reverse()
        for stream, data in feeds:
            p.feed(stream, data, t, t, [(len(data), t, stream == feeds[-1][0])])
        p.feed("stderr", b"after\n", t + 1, t + 1)
        p.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0, bytes_read={})
        texts = [getattr(x, "text", "") for x in iter_run(run_dir)]
        assert "before" in texts and not any("token" in x or "after" in x for x in texts), texts


def test_in_one_round_the_stricter_command_goes_first(tmp_path: Path) -> None:
    # Both streams send a command in one round: stderr disables, stdout prints a token and then
    # enables. Whatever the order of the feeds, the token follows the disabling command, and
    # stdout's own enabling command, after its token, holds for what comes next.
    for order in ("stdout first", "stderr first"):
        run_dir = create_run_dir(tmp_path, order.replace(" ", "-"))
        p = Pipeline("r", SpoolWriter(run_dir, fsync=False), mode="enabled", columns=80,
                     rows=24)
        t = 1000.0
        feeds = [("stdout", b'token-5678\n/LOGCOMMAND {"mode": "enabled"}\n'),
                 ("stderr", b'/LOGCOMMAND {"mode": "disabled"}\n')]
        if order == "stderr first":
            feeds.reverse()
        for stream, data in feeds:
            p.feed(stream, data, t, t, [(len(data), t, stream == feeds[-1][0])])
        p.feed("stdout", b"later\n", t + 1, t + 1)
        p.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0, bytes_read={})
        texts = [getattr(x, "text", "") for x in iter_run(run_dir)]
        assert not any("token" in x for x in texts) and "later" in texts, (order, texts)


def test_lines_carry_their_own_read_times_and_both_streams_go_out_in_that_order(
        tmp_path: Path) -> None:
    # One chunk joining three reads (as _Server.run joins frames), committed together at the end:
    # each line keeps the time its read had; the two streams' lines reach the spool in read
    # order, whichever stream was fed or committed first.
    p = Pipeline("r", SpoolWriter(create_run_dir(tmp_path, "r"), fsync=False), mode="enabled",
                 columns=80, rows=24)
    p.feed("stderr", b"e1\ne2\n", 11.0, 11.0, [(3, 10.5, True), (6, 11.0, True)])
    p.feed("stdout", b"o1\no2\no3\n", 12.0, 12.0,
           [(3, 10.0, True), (6, 10.7, True), (9, 12.0, True)])
    p.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0, bytes_read={})
    got = [(x.text, x.ts) for x in iter_run(tmp_path / "r") if x.kind == "line"]
    assert got == [("o1", 10.0), ("e1", 10.5), ("o2", 10.7), ("e2", 11.0), ("o3", 12.0)]


def test_end_of_file_without_an_end_frame_keeps_the_lines(tmp_path: Path) -> None:
    root = tmp_path / "s"
    spool = SpoolWriter(create_run_dir(root, "r"), fsync=False)
    p = Pipeline("r", spool, mode="enabled", columns=80, rows=24)
    r, w = os.pipe()
    d = b"one\ntwo"
    os.write(w, frame.encode(0, d, time.time(), time.monotonic()))
    os.close(w)
    assert _Server(r, p).run() is None
    os.close(r)
    p.close_unfinished()
    records = list(iter_run(root / "r"))
    assert [getattr(x, "text", None) for x in records] == ["one", "two"]
    assert not any(x.kind == "end" for x in records)


# ------------------------------------------------------------------ batch paths = per-item paths
# The per-line hot paths (LineFilter's fast cases, Classifier.feed_many and its Lines records,
# rendered_many, the spool's bulk encoding) must write exactly what the per-item code writes.

SPECIAL = ["a", "a", "b", "", "  ", "\t", '{"x": 1, "y": {"z": [1, 2]}}', "{}", "{not json}",
           '/LOGCOMMAND {"mode": "metadata"}', '/LOGCOMMAND {"mode": "enabled"}',
           '/LOGCOMMAND {"mode": "disabled"}', "/LOGCOMMAND bad", " /LOGCOMMAND {}",
           "x /LOGCOMMAND", '"quoted" \\ back', "é ü 漢 \u2028", "\x00\x1f\x7f", "{", "}"]
texts_st = st.one_of(st.sampled_from(SPECIAL), st.text(max_size=12))
rendered_st = st.builds(Rendered, texts_st, st.sampled_from([0, 0, 0, 3]))
items_st = st.lists(st.one_of(rendered_st, rendered_st, rendered_st,
                              st.builds(Dropped, st.sampled_from([NOTE_REPEAT, NOTE_BLANK]),
                                        st.integers(1, 5))), max_size=40)


def _expand(records: list[Record]) -> list[Record]:
    out: list[Record] = []
    for r in records:
        out += r.lines() if isinstance(r, Lines) else [r]
    return out


def _splits(items: list[Any], cuts: list[int]) -> list[list[Any]]:
    bounds = sorted({min(c, len(items)) for c in cuts} | {0, len(items)})
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=300, deadline=None)
@given(items=items_st, cuts=st.lists(st.integers(0, 40), max_size=6),
       mode=st.sampled_from(["enabled", "metadata", "disabled"]),
       streams=st.lists(st.sampled_from(["stdout", "stderr"]), min_size=1, max_size=7))
@example(items=[Rendered('/LOGCOMMAND {"mode": "enabled"}')] * 2 + [Rendered("a")], cuts=[1],
         mode="metadata", streams=["stdout", "stderr"])
def test_classifier_feed_many_equals_feed_one_by_one(items: list[Any], cuts: list[int],
                                                     mode: str, streams: list[str]) -> None:
    one, many = Classifier("r", mode), Classifier("r", mode)
    expected: list[Record] = []
    got: list[Record] = []
    for i, batch in enumerate(_splits(items, cuts)):
        stream = streams[i % len(streams)]
        for item in batch:
            expected += one.feed(stream, item, 1.5)
        got += many.feed_many(stream, batch, 1.5)
    assert _expand(got) == expected
    assert [r.to_json() for r in _expand(got)] == [r.to_json() for r in expected]
    assert many.counts == one.counts and many.mode == one.mode


line_st = st.builds(Rendered, st.sampled_from(["a", "a", "a", "b", "", " ", "  ", "c\t"]),
                    st.sampled_from([0, 0, 0, 1]))
few_st = st.builds(Rendered, st.sampled_from(["a", "b", ""]), st.sampled_from([0, 1]))


@settings(max_examples=500, deadline=None)
@given(lines=st.one_of(st.lists(st.one_of(line_st, rendered_st), max_size=60),
                       st.lists(few_st, max_size=30)),
       cuts=st.lists(st.integers(0, 30), max_size=12), shared=st.booleans())
@example(lines=[Rendered("a"), Rendered("a", 1), Rendered("a", 1)], cuts=[1], shared=False)
@example(lines=[Rendered(""), Rendered(" "), Rendered("")], cuts=[1], shared=False)
@example(lines=[Rendered("a"), Rendered("b"), Rendered("b")], cuts=[1], shared=False)
def test_line_filter_batches_equal_the_line_by_line_rule(lines: list[Rendered],
                                                         cuts: list[int], shared: bool) -> None:
    if shared:  # the renderer hands out one object for a burst of one line
        lines = [lines[0]] * len(lines) if lines else lines
    ref, fast = LineFilter(), LineFilter()
    expected: list[Any] = []
    got: list[Any] = []
    for batch in _splits(lines, cuts):
        for line in batch:
            expected += ref._each([line])
        got += fast.feed(list(batch))
    expected += ref.finish()
    got += fast.finish()
    ref.counts["lines_in"] = fast.counts["lines_in"]  # _each alone does not count lines in
    assert got == expected
    assert fast.counts == {**ref.counts, "lines_in": len(lines)}


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.one_of(st.sampled_from(SPECIAL), st.text()), min_size=1, max_size=20),
       seq=st.integers(0, 2**40), ts=st.floats(0, 2e9), run=st.sampled_from(["r", 'q"\\é']))
def test_lines_encode_as_their_line_records(texts: list[str], seq: int, ts: float,
                                            run: str) -> None:
    batch = Lines(run=run, stream="stdout", seq=seq, ts=ts, texts=tuple(texts))
    lines = batch.lines()
    assert lines == [Line(run=run, stream="stdout", seq=seq + i, ts=ts, text=t)
                     for i, t in enumerate(texts)]
    assert batch.to_json() == "\n".join(line.to_json() for line in lines)
    assert rendered_many(texts) == [Rendered(t) for t in texts]
    fields = {t: i for i, t in enumerate(texts)}
    made = new_metadata(run, "stdout", seq, ts, fields)
    assert made == Metadata(run=run, stream="stdout", seq=seq, ts=ts, fields=fields)
    assert made.to_json() == dumps(made.to_dict())


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.one_of(
    st.builds(Lines, run=st.just("r"), stream=st.just("stdout"), seq=st.integers(0, 99),
              ts=st.just(1.0), texts=st.lists(texts_st, min_size=1, max_size=30).map(tuple)),
    st.builds(Line, run=st.just("r"), stream=st.just("stderr"), seq=st.integers(0, 99),
              ts=st.just(2.0), text=texts_st)), max_size=5), max_size=12),
    segment_bytes=st.integers(1024, 4096))
def test_the_spool_writes_the_bytes_of_each_record_encoded_alone(
        tmp_path_factory: pytest.TempPathFactory, batches: list[list[Record]],
        segment_bytes: int) -> None:
    root = tmp_path_factory.mktemp("spool")
    writer = SpoolWriter(create_run_dir(root, "r"), segment_bytes=segment_bytes, fsync=False,
                         flush_records=7)
    expected: list[bytes] = []
    for batch in batches:
        writer.write(batch)
        expected += [(r.to_json() + "\n").encode("utf-8", "surrogatepass")
                     for r in _expand(batch)]
    writer.close()
    assert writer.written == len(expected)
    # Segments hold whole lines; a segment is closed once it reaches segment_bytes.
    got = [_segment_bytes(seg) for seg in segments(root / "r")]
    assert b"".join(got) == b"".join(expected)
    size, want = 0, [bytearray()]
    for line in expected:  # the rule, line by line
        want[-1] += line
        size += len(line)
        if size >= max(1024, segment_bytes):
            want.append(bytearray())
            size = 0
    assert [bytes(w) for w in want if w] == [g for g in got if g]


class _PerItemPipeline(Pipeline):
    """The pipeline as it was before the batch paths: the filter's line-by-line rule and one
    classifier call per item."""

    def _emit(self, stream: str, now: float, lines: Any, final: bool = False) -> None:
        f = self.filters[stream]
        lines = list(lines)
        f.counts["lines_in"] += len(lines)
        items = f._each(lines)
        if final:
            items += f.finish()
        records: list[Record] = []
        for item in items:
            records += self.classifier.feed(stream, item, now)
        if records:
            self.spool.write(records)


class _FixedClock:
    """Stands for the time module in logcapture.pipeline: records made at finish() get a
    fixed ts, so two runs can be compared byte for byte."""

    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def time() -> float:
        return 1234.5


token_st = st.one_of(st.sampled_from(SPECIAL), st.sampled_from(
    ["\n", "\n", "\n", "\r", "\x1b[32m", "\x1b[0m", "\x1b[K", "\x1b[2K", "\x1b[1A", "\t",
     "line", "line", "progress 50%", "\x1b[?1049h", "\x1b[?1049l"]))


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.lists(token_st, max_size=120), cuts=st.lists(st.integers(0, 2000), max_size=8),
       idles=st.lists(st.integers(0, 2000), max_size=3),
       mode=st.sampled_from(["enabled", "metadata", "disabled"]))
def test_the_pipeline_writes_what_the_per_item_pipeline_writes(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        tokens: list[str], cuts: list[int], idles: list[int], mode: str) -> None:
    monkeypatch.setattr(pipeline_module, "time", _FixedClock)
    data = "".join(tokens).encode()
    out: list[bytes] = []
    for cls in (Pipeline, _PerItemPipeline):
        root = tmp_path_factory.mktemp("p")
        p = cls("r", SpoolWriter(create_run_dir(root, "r"), fsync=False), mode=mode,
                columns=80, rows=5)
        for i, chunk in enumerate(_splits(list(data), cuts)):
            stream = "stdout" if i % 3 else "stderr"
            p.feed(stream, bytes(chunk), 1000.0 + i, 0.0)
            if i in idles:
                p.tick(1000.0 + i, 10.0 * (i + 1))
        p.finish(exit_status=0, signal=None, state="COMPLETED", duration=0.0, bytes_read={})
        out.append(b"".join(_segment_bytes(seg) for seg in segments(root / "r")))
    assert out[0] == out[1]


def _segment_bytes(seg: Segment) -> bytes:
    data = seg.path.read_bytes()
    return gzip.decompress(data) if seg.closed else data


def test_the_pipelines_line_limit_is_the_renderers() -> None:
    from logcapture.render import LINE_LIMIT
    assert pipeline_module.LINE_LIMIT == LINE_LIMIT


def _flatten_loop(obj: dict[str, Any]) -> dict[str, Any]:
    """classify.flatten before its shortcut for flat objects: the loop alone."""
    out: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        prefix, value = stack.pop()
        if isinstance(value, dict) and (value or not prefix):
            for key, item in reversed(list(value.items())):
                stack.append((f"{prefix}.{key}" if prefix else str(key), item))
        else:
            out.pop(prefix, None)
            out[prefix] = value
    return out


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["a", "b", "a.b", "", "c"]), inner,
                                            max_size=4)), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(obj=st.dictionaries(st.one_of(st.sampled_from(["a", "b", "a.b", "", "x.y"]),
                                     st.integers(0, 3)), json_values, max_size=5))
def test_flatten_equals_the_loop(obj: dict[Any, Any]) -> None:
    from logcapture.classify import flatten
    got, want = flatten(obj), _flatten_loop(obj)
    assert got == want and list(got) == list(want)
    assert [type(k) for k in got] == [type(k) for k in want]


@settings(max_examples=300, deadline=None)
@given(obj=st.dictionaries(st.text(max_size=4), json_values, max_size=5))
def test_dumps_equals_json_dumps(obj: dict[str, Any]) -> None:
    from logcapture.records import _finite, _json_default, dumps
    kw: dict[str, Any] = dict(ensure_ascii=False, separators=(",", ":"), default=_json_default)
    try:
        want = json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        want = json.dumps(_finite(obj), **kw)
    assert dumps(obj) == want


@settings(max_examples=300, deadline=None)
@given(fields=st.dictionaries(st.text(max_size=4), json_values, max_size=5),
       ts=st.one_of(st.floats(), st.integers(0, 2**40)), seq=st.integers(0, 2**40),
       run=st.sampled_from(["r", 'q"\\é']))
def test_metadata_encodes_as_the_generic_encoding(fields: dict[str, Any], ts: float, seq: int,
                                                  run: str) -> None:
    from logcapture.records import Metadata, dumps
    rec = Metadata(run=run, stream="stdout", seq=seq, ts=ts, fields=fields)
    assert rec.to_json() == dumps(rec.to_dict())


def test_a_redraw_that_moves_the_cursor_up_cannot_date_later_lines_earlier(
        tmp_path: Path) -> None:
    # stderr redraws a bar by moving the cursor up (two newlines, one row); then stdout
    # disables logging and stderr prints a token. Counting newlines would give the token the
    # bar's read time, before the command: a line of a stream whose renderer had the full
    # emulator gets the last read time fed to it instead, until it is committed in line mode
    # again.
    p = Pipeline("r", SpoolWriter(create_run_dir(tmp_path, "r"), fsync=False), mode="enabled",
                 columns=80, rows=24)
    p.feed("stderr", b"bar 1\n\x1b[1A\x1b[2Kbar 2\n", 10.0, 10.0)
    p.feed("stdout", b'/LOGCOMMAND {"mode": "disabled"}\n', 11.0, 11.0)
    p.feed("stderr", b"TOKEN-42\n", 12.0, 12.0)
    p.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0, bytes_read={})
    texts = [getattr(x, "text", "") for x in iter_run(tmp_path / "r")]
    assert not any("TOKEN" in x for x in texts), texts



# --- several reads of one stream classified as one (Pipeline._emit_run) -----------------------

shared_line = Rendered("same")  # the renderer shares one object for a burst of one line
lines_st = st.lists(st.one_of(st.builds(Rendered, texts_st), st.just(shared_line),
                              st.just(Rendered("")), st.just(Rendered("  "))), max_size=8)


@settings(max_examples=300, deadline=None)
@given(groups=st.lists(lines_st, min_size=1, max_size=6), primed=lines_st)
def test_filtering_reads_at_once_cut_back_gives_what_each_read_alone_gives(
        groups: list[list[Rendered]], primed: list[Rendered]) -> None:
    alone, at_once = LineFilter(), LineFilter()
    alone.feed(list(primed))
    at_once.feed(list(primed))
    expected = [alone.feed(list(g)) for g in groups]
    everything = [line for g in groups for line in g]
    got = pipeline_module._by_group(at_once.feed(everything), everything,
                                    [len(g) for g in groups])
    assert got == expected
    assert [[type(x) for x in g] for g in got] == [[type(x) for x in g] for g in expected]


plain_st = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=10)


@settings(max_examples=300, deadline=None)
@given(reads=st.lists(st.lists(st.one_of(plain_st, st.sampled_from(SPECIAL)), min_size=1,
                               max_size=5), min_size=2, max_size=6),
       stream=st.sampled_from(["stdout", "stderr"]), mode=st.sampled_from(
           ["enabled", "metadata", "disabled"]))
def test_plain_reads_classified_as_one_are_the_records_of_each_read(
        reads: list[list[str]], stream: str, mode: str) -> None:
    """feed_plain gives one record whose lines are feed_many's for each read at its time, or
    None when any of them is not a plain line in mode enabled (a command, a metadata line on
    stdout, another mode): then nothing has changed."""
    times = [1000.0 + 0.25 * i for i in range(len(reads))]
    one, each = Classifier("r", mode=mode), Classifier("r", mode=mode)
    got = one.feed_plain(stream, [Rendered(t) for r in reads for t in r],
                         [(ts, len(r)) for ts, r in zip(times, reads, strict=True)])
    expected = [rec for ts, r in zip(times, reads, strict=True)
                for rec in each.feed_many(stream, [Rendered(t) for t in r], ts)]
    if got is None:
        assert one.counts == Classifier("r", mode=mode).counts
        return
    lines = [x for rec in got for x in (rec.lines() if isinstance(rec, Lines) else [rec])]
    assert lines == [x for rec in expected
                     for x in (rec.lines() if isinstance(rec, Lines) else [rec])]
    assert "\n".join(r.to_json() for r in got) == "\n".join(r.to_json() for r in expected)
    assert one.counts == each.counts


def test_plain_reads_under_a_hold_are_not_classified_as_one() -> None:
    """A relaxing command holds the other stream's lines read just after it in the old mode:
    such reads go one by one (feed_many, each at its time), never as plain lines."""
    c = Classifier("r", mode="disabled")
    c.feed("stdout", Rendered('/LOGCOMMAND {"mode": "enabled"}'), 1.0)
    assert c.mode == "enabled"
    assert c.feed_plain("stderr", [Rendered("secret"), Rendered("b")],
                        [(1.01, 1), (1.2, 1)]) is None
    assert c.feed_many("stderr", [Rendered("secret")], 1.01) == []  # held: disabled
    assert c.feed_plain("stdout", [Rendered("a"), Rendered("b")], [(1.2, 1), (1.3, 1)])


def test_a_flood_of_short_reads_keeps_each_line_read_time(tmp_path: Path) -> None:
    """Many reads of a few lines each, coalesced into one chunk: every line keeps the time of
    the read that brought it, and the spool holds one record per line as always."""
    spool = SpoolWriter(create_run_dir(tmp_path, "r"), fsync=False)
    p = Pipeline("r", spool, mode="enabled", columns=120, rows=24)
    chunk, marks = b"", []
    for i in range(50):
        chunk += b"".join(b"line %d.%d\r\n" % (i, k) for k in range(3))
        marks.append((len(chunk), 100.0 + i / 100, True))
    p.feed("stdout", chunk, 100.5, 100.5, marks)
    p.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0, bytes_read={})
    got = [r for r in iter_run(spool.run_dir) if r.kind == "line"]
    assert [r.text for r in got] == [f"line {i}.{k}" for i in range(50) for k in range(3)]
    assert [r.ts for r in got] == [100.0 + i / 100 for i in range(50) for k in range(3)]
