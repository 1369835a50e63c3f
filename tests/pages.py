"""Helpers for the tests and the benchmark of ``logcapture serve``: runs made the way users make
them (``logcapture run`` under a real pty, ``logcapture upload``), a multi-node GPU run written
to a real spool, and the server started as the real command, its URL read from its first line."""

from __future__ import annotations

import getpass
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from helpers import LOGCAPTURE, lc

from logcapture.records import End, Line, Metadata, Note, Sample, Start
from logcapture.spool.layout import create_run_dir
from logcapture.spool.writer import SpoolWriter

TRAIN = r"""
import json, math, sys
print("loading data")
for i in range(3):
    print("same line")
for e in range(1, 13):
    print(f"epoch {e}: training")
    print(json.dumps({"epoch": e, "loss": round(2.5 * math.exp(-e / 4) + 0.05, 6),
                      "acc": round(1 - math.exp(-e / 3), 6), "lr": 0.1}))
    if e % 4 == 0:
        print(f"warning: checkpoint {e} slow", file=sys.stderr, flush=True)
print("done")
"""


def capture(env: dict[str, str], run_id: str, code: str = TRAIN) -> None:
    lc(["run", "--run-id", run_id, "--", sys.executable, "-c", code], env, check=True)


def write_gpu_run(spool: Path, run: str = "gpu", t0: float | None = None,
                  steps: int = 30) -> None:
    """A two-node run with two GPUs per node, as the sampler and classifier write it."""
    t0 = time.time() - 600 if t0 is None else t0
    w = SpoolWriter(create_run_dir(spool, run), fsync=False)
    recs: list[Any] = [Start(run=run, stream="run", seq=0, ts=t0,
                             command=["python", "train_gpt.py"], user=getpass.getuser(),
                             uid=os.getuid(), host="node1",
                             slurm={"job_id": "4242", "job_name": "train_gpt"})]
    seq = 0
    for i in range(steps):
        ts = t0 + 10 * i
        recs.append(Line(run=run, stream="stdout", seq=seq, ts=ts, text=f"step {i * 100}"))
        recs.append(Metadata(run=run, stream="stdout", seq=seq + 1, ts=ts,
                             fields={"step": i * 100, "loss": round(3 * math.exp(-i / 10), 5),
                                     "tokens_per_s": 1000 + 10 * i}))
        seq += 2
    recs.append(Note(run=run, stream="stdout", seq=seq, ts=t0 + 10 * steps, note="repeat",
                     count=4))
    for n, node in enumerate(("node1", "node2")):
        for i in range(steps):
            gpus = [{"index": g, "uuid": f"GPU-{node}-{g}", "name": "H100",
                     "utilization_gpu_percent": 50 + 40 * math.sin(i / 4 + g + n),
                     "memory_used_bytes": (20 + g + i / 10) * 2**30,
                     "power_watts": 300 + 50 * g + i, "temperature_celsius": 55 + g + i / 10}
                    for g in range(2)]
            recs.append(Sample(run=run, stream=f"sample:{node}", seq=i, ts=t0 + 10 * i + n,
                               node=node, gpus=gpus,
                               job={"cpu_percent": 95.0 + i % 5, "memory_rss_bytes": 2**31 + i}))
    recs.append(End(run=run, stream="run", seq=1, ts=t0 + 10 * steps, exit_status=0,
                    state="COMPLETED", duration=10.0 * steps,
                    counts={"redactions": {"environment": 2, "huggingface": 1}}))
    w.write(recs)
    w.close()


class Serve:
    """``logcapture serve --no-browser --port 0`` as a user starts it (or ``command``, which
    prints the URL first likewise); ``url`` is its first line, ``base`` the URL without the
    token, ``port`` its port. ``stderr``: a file for its stderr (else a pipe)."""

    def __init__(self, env: dict[str, str], *args: str, command: list[str] | None = None,
                 stderr: Path | None = None) -> None:
        command = command or [*LOGCAPTURE, "serve", "--no-browser", "--port", "0", *args]
        err: Any = subprocess.PIPE if stderr is None else stderr.open("w")
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=err,
                                     text=True, start_new_session=True)
        if stderr is not None:
            err.close()
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url:
            said = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"serve printed no URL: {said}")
        self.base = self.url.split("/?")[0]
        self.token = self.url.split("token=")[1]
        self.port = int(self.base.rsplit(":", 1)[1])
        self._wait_ready()

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url, timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("serve did not answer")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                  "--window-size=1400,1000"]


def chromium(profile: Path) -> Any:
    """Debian's headless Chromium through its chromedriver, console messages kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service("/usr/bin/chromedriver"))


def have_chromium() -> bool:
    return Path("/usr/bin/chromium").exists() and Path("/usr/bin/chromedriver").exists()
