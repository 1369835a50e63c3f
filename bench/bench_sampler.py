"""Sampler CPU cost: per sample, and per second at a 1 s interval, with 8 fake GPUs.

Figure: the sampler's share of one core while it samples every second, net of a baseline
(an idle thread waking on the same interval, in the same run). Target: <= 0.5 % of a core.
The job collector reads a real process tree (a child with two grandchildren); the GPUs are
tests/fakenvml.py, so the NVML figure is the Python side only (a real NVML call costs more,
mostly in the driver; see docs/sampling.md).

    .venv/bin/python bench/bench_sampler.py [--seconds 10] [--samples 200] [--gpus 8]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fakenvml import FakeNVML, GiB, gpus  # noqa: E402

from logcapture.sampling.gpu import GpuCollector  # noqa: E402
from logcapture.sampling.job import JobCollector  # noqa: E402
from logcapture.sampling.sampler import Sampler  # noqa: E402

TREE = ("import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])"
        " for _ in range(2)]\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "for k in kids: k.kill()\n")


def idle_loop(interval: float, seconds: float) -> float:
    """CPU seconds of a thread that only wakes every ``interval`` for ``seconds``."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            pass

    t = threading.Thread(target=loop)
    c0 = time.process_time()
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join()
    return time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="wall seconds per phase")
    ap.add_argument("--samples", type=int, default=200, help="back-to-back samples to time")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()

    tree = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert tree.stdout is not None and tree.stdout.readline().strip() == "ready"
        job = JobCollector(root_pid=tree.pid)
        pids = job.pids()
        nv = FakeNVML(gpus(args.gpus, processes=[(pids[-1], 2 * GiB), (1, GiB)]))
        gpu = GpuCollector(nv, None, pids_fn=job.pids)
        emitted: list = []
        sampler = Sampler("bench", "node", gpu=gpu, job=job, interval=args.interval,
                          emit=emitted.append)

        # per sample, back to back; per collector for the breakdown
        sampler.sample_once()  # warm up: NVML init, device list, psutil objects
        c0 = time.process_time()
        for _ in range(args.samples):
            sampler.sample_once()
        per_sample = (time.process_time() - c0) / args.samples
        c0 = time.process_time()
        for _ in range(args.samples):
            job.collect()
        per_job = (time.process_time() - c0) / args.samples
        c0 = time.process_time()
        for _ in range(args.samples):
            gpu.collect()
        per_gpu = (time.process_time() - c0) / args.samples

        # per second at the interval: baseline idle loop, then the sampler thread
        baseline = idle_loop(args.interval, args.seconds)
        sampler = Sampler("bench", "node", gpu=gpu, job=job, interval=args.interval,
                          emit=emitted.append)
        c0 = time.process_time()
        w0 = time.monotonic()
        sampler.start()
        time.sleep(args.seconds)
        sampler.stop(final_sample=False)
        wall = time.monotonic() - w0
        used = time.process_time() - c0
        samples_taken = sampler.next_seq
    finally:
        if tree.stdin is not None:
            tree.stdin.write("\n")
            tree.stdin.close()
        tree.wait()
        if tree.stdout is not None:
            tree.stdout.close()

    net = max(0.0, used - baseline)
    share = net / wall
    print(f"job processes:              {len(pids)}  fake GPUs: {args.gpus}")
    print(f"cpu per sample:             {per_sample * 1e3:8.3f} ms "
          f"(job {per_job * 1e3:.3f} ms, gpus {per_gpu * 1e3:.3f} ms)")
    print(f"samples in {wall:5.1f} s at {args.interval:g} s:  {samples_taken}")
    print(f"cpu, sampler thread:        {used * 1e3:8.2f} ms")
    print(f"cpu, idle-loop baseline:    {baseline * 1e3:8.2f} ms")
    print(f"net cpu per second:         {net / wall * 1e3:8.3f} ms/s")
    print(f"ratio to one core:          {share:8.4%}  (target <= 0.5%: "
          f"{'ok' if share <= 0.005 else 'OVER'})")
    print(f"per-sample cost / interval: {per_sample / args.interval:8.4%} of a core")
    os.sys.stdout.flush()


if __name__ == "__main__":
    main()
