"""The capture process wiring (logcapture/capture.py): what the wrapper hands the worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from logcapture import frame
from logcapture.capture import WorkerSettings, _Server, serve_in_idle_time
from logcapture.config.admin import AdminConfig

FIELDS = dict(run_id="r", run_dir=Path("/tmp/r"), admin=AdminConfig(), mode="enabled", rows=24,
              columns=80, env={}, problems=[], sample=False, start_fields={}, wrapper_pid=1,
              warn=print, merged=False, redact=(), gpus=True)


def test_the_worker_settings_hold_what_they_were_given() -> None:
    s = WorkerSettings(**FIELDS)
    assert {k: getattr(s, k) for k in FIELDS} == FIELDS


def test_a_misspelt_setting_is_an_error_not_a_new_field() -> None:
    with pytest.raises(TypeError, match="colums"):
        WorkerSettings(**{**{k: v for k, v in FIELDS.items() if k != "columns"}, "colums": 80})
    with pytest.raises(TypeError, match="smaple"):
        WorkerSettings(**FIELDS, smaple=True)  # type: ignore[call-arg] # mypy sees it too


def test_a_missing_setting_is_an_error() -> None:
    with pytest.raises(TypeError, match="wrapper_pid"):
        WorkerSettings(**{k: v for k, v in FIELDS.items() if k != "wrapper_pid"})


# ------------------------------------------------------- rendering in the CPU's idle time


class _Feeds:
    """A pipeline that records what it is fed, on which thread, under which policy, and
    burns ``cost`` seconds of CPU a feed (a stand-in for rendering a chunk)."""

    def __init__(self, cost: float = 0.0) -> None:
        self.feeds: list[tuple[str, bytes, int, int]] = []
        self.cost = cost
        self.on_feed: Callable[[], None] = lambda: None

    def tick_due(self) -> None:
        return None  # settled: serve waits for frames without a timeout

    def tick(self, now: float, mono: float) -> None:
        pass

    def feed(self, stream: str, data: bytes, now: float, mono: float,
             marks: object = None) -> None:
        until = time.thread_time() + self.cost
        while time.thread_time() < until:
            pass
        self.feeds.append((stream, data, threading.get_ident(), os.sched_getscheduler(0)))
        self.on_feed()


def _frames(n: int) -> bytes:
    # Alternate streams, so that no two frames are rendered as one chunk.
    now = time.monotonic()
    return b"".join(frame.encode(i % 2, b"line %d\n" % i, time.time(), now)
                    for i in range(n)) + frame.encode(
        frame.END, frame.encode_end({"exit_status": 3}), 0.0, 0.0)


def test_a_stopped_server_goes_on_from_the_frame_where_it_stopped() -> None:
    r, w = os.pipe()
    os.write(w, _frames(6))
    feeds = _Feeds()
    server = _Server(r, feeds)  # type: ignore[arg-type]

    def stop_after_two() -> None:
        if len(feeds.feeds) == 2:
            server.stop = True

    feeds.on_feed = stop_after_two
    assert server.run() is None and server.stopped
    assert [f[1] for f in feeds.feeds] == [b"line 0\n", b"line 1\n"]
    server.stop = server.stopped = False
    assert server.run() == {"exit_status": 3}
    assert [f[1] for f in feeds.feeds] == [b"line %d\n" % i for i in range(6)]
    assert [f[0] for f in feeds.feeds] == ["stdout", "stderr"] * 3
    os.close(r)
    os.close(w)


def test_a_stop_reaches_a_server_waiting_for_frames() -> None:
    # The rendering thread has caught up and waits for frames without a timeout: the stop
    # pipe wakes it, and the next frames go to whoever runs the server next.
    r, w = os.pipe()
    stop_r, stop_w = os.pipe()
    data = _frames(2)
    end_frame = frame.encode(frame.END, frame.encode_end({"exit_status": 3}), 0.0, 0.0)
    os.write(w, data[:-len(end_frame)])
    feeds = _Feeds()
    server = _Server(r, feeds)  # type: ignore[arg-type]
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(server.run(stop_r)))
    t.start()
    deadline = time.monotonic() + 10
    while len(feeds.feeds) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    server.stop = True
    os.write(stop_w, b"x")
    t.join(10)
    assert not t.is_alive() and out == [None] and server.stopped
    os.write(w, end_frame)
    server.stop = server.stopped = False
    assert server.run() == {"exit_status": 3}
    assert [f[1] for f in feeds.feeds] == [b"line 0\n", b"line 1\n"]
    for fd in (r, w, stop_r, stop_w):
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_the_worker_renders_under_sched_idle_in_a_thread_of_its_own() -> None:
    r, w = os.pipe()
    os.write(w, _frames(4))
    feeds = _Feeds()
    end, counts = serve_in_idle_time(r, feeds)  # type: ignore[arg-type]
    assert end == {"exit_status": 3}
    assert counts == {"worker_sched_idle": 1, "worker_handovers": 0}
    assert len(feeds.feeds) == 4
    assert {f[3] for f in feeds.feeds} == {os.SCHED_IDLE}
    assert {f[2] for f in feeds.feeds} != {threading.get_ident()}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # only the rendering thread's policy
    os.close(r)
    os.close(w)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_without_a_thread_cpu_clock_the_worker_still_renders_in_idle_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(time, "pthread_getcpuclockid")
    r, w = os.pipe()
    os.write(w, _frames(4))
    feeds = _Feeds()
    end, counts = serve_in_idle_time(r, feeds, check=0.01)  # type: ignore[arg-type]
    assert end == {"exit_status": 3}
    assert counts["worker_sched_idle"] == 1
    assert [f[1] for f in feeds.feeds] == [f"line {i}\n".encode() for i in range(4)]
    os.close(r)
    os.close(w)


_STARVED = r"""
import json, os, subprocess, sys, time
from tests.test_capture import _Feeds, _frames
from logcapture.capture import serve_in_idle_time
cpu = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})
hog = subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, {%d})\n"
                        "parent = os.getppid()\nwhile os.getppid() == parent: pass" % cpu])
time.sleep(0.3)  # the hog runs: this CPU is never idle from here on
r, w = os.pipe()
feeds = _Feeds(cost=0.005)
os.write(w, _frames(40))
t0 = time.monotonic()
try:
    end, counts = serve_in_idle_time(r, feeds, check=0.1)
finally:
    hog.kill()
print(json.dumps({"end": end, "counts": counts, "took": time.monotonic() - t0,
                  "policies": [f[3] for f in feeds.feeds],
                  "lines": [f[1].decode() for f in feeds.feeds]}))
"""


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_a_worker_starved_under_sched_idle_hands_its_work_to_a_normal_thread() -> None:
    # One CPU, kept busy by a process at the normal policy: a SCHED_IDLE thread gets a sliver
    # of it (~0.3 %: 40 feeds of 5 ms would take over a minute). The worker's other thread
    # sees frames waiting with nothing rendered, or rendered late, and takes over from the
    # frame where the first stopped.
    out = subprocess.run([sys.executable, "-c", _STARVED], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parent.parent, check=True)
    got = json.loads(out.stdout)
    assert got["end"] == {"exit_status": 3}
    assert got["counts"] == {"worker_sched_idle": 1, "worker_handovers": 1}
    assert got["lines"] == [f"line {i}\n" for i in range(40)]  # each once, in order
    policies = got["policies"]
    assert policies[-1] == os.SCHED_OTHER
    k = policies.index(os.SCHED_OTHER)
    assert set(policies[:k]) <= {os.SCHED_IDLE} and set(policies[k:]) == {os.SCHED_OTHER}


def test_without_gpus_the_inventory_never_starts_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task of a step (prepare's gpus=False): NVML costs a capture ~50 ms of CPU and ~20 MiB
    on a GPU node; its job's batch run and node sampler record the node's GPUs."""
    from logcapture import capture
    from logcapture.sampling import gpu

    started: list[bool] = []

    def nvml() -> None:
        started.append(True)
        return None  # "no NVML on this node"

    monkeypatch.setattr(gpu, "default_nvml", nvml)
    problems: list[str] = []
    sampler, inv = capture._start_sampler("r", 1.0, {}, None, problems,  # type: ignore[arg-type]
                                          False, gpus=False)
    assert sampler is None and inv["cpus"] and "gpus" not in inv and started == []
    sampler, inv = capture._start_sampler("r", 1.0, {}, None, problems,  # type: ignore[arg-type]
                                          False)
    assert sampler is None and inv["gpus"] == [] and started == [True]
