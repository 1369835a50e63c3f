"""What following progress bars (render/progress.py, docs/rendering.md "Progress as data")
costs the capture worker: the Pipeline's CPU time per MB with the trackers on, against the same
Pipeline with them off (``Pipeline._track`` a no-op), in the same run, interleaved; the median
of the rounds and the ratio.

    python bench/bench_progress.py [--rounds N]

Workloads, a 64 KiB read every 25 ms (2.6 MB/s, 3 s of reads): a flood of plain lines that
mention n/total (no carriage return: the stream is never looked at), the same flood after one
carriage return (its committed lines are searched for a bar's final state for
``pipeline.REDRAWN``, 1 s, after it; its live lines are looked at every 0.25 s),
tqdm-style bars redrawn with a carriage return, and log lines printed above a live bar
(tqdm.write; each read ends with the whole bar, so a bar is live all along and its live
lines are read after every read).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from logcapture.pipeline import Pipeline  # noqa: E402
from logcapture.spool.layout import create_run_dir  # noqa: E402
from logcapture.spool.writer import SpoolWriter  # noqa: E402

CHUNK = 65536
FLOOD = b"".join(b"step %d loss 0.%d lr 3e-4 %d/1000 tokens\n" % (i, i % 97, i % 1000)
                 for i in range(200_000))
BARS = b"".join(
    b"\rtrain: %3d%%|%-20s| %d/100000 [00:%02d<00:10, 9876.54it/s]"
    % (i // 1000, b"#" * (i // 5000), i, (i // 10000) % 60) for i in range(0, 100_000, 5)
) + b"\n"
# Log lines printed above a live bar, as tqdm.write does: the bar cleared, the line, the bar
# drawn again; each read ends with a whole bar (the program's write), so a bar is live all
# along and the live lines are read after every read.
_STEPS = [b"\r%s\rstep %d loss 0.%d lr 3e-4 %d/1000 tokens\n\rtrain: %3d%%|%-20s| %d/100000 "
          b"[00:%02d<00:10, 9876.54it/s]" % (b" " * 100, i, i % 97, i % 1000, i // 1000,
                                             b"#" * (i // 5000), i, (i // 10000) % 60)
          for i in range(0, 100_000, 2)]
UNDER_A_BAR = [b"".join(_STEPS[i:i + 400]) for i in range(0, len(_STEPS), 400)]
WORKLOADS: dict[str, bytes | list[bytes]] = {
    "plain flood": FLOOD, "flood after a \\r": b"\r" + FLOOD, "tqdm bars": BARS,
    "lines under a bar": UNDER_A_BAR}


def cpu_per_mb(data: bytes | list[bytes], track: bool) -> float:
    """CPU seconds per MB of ``data``: bytes read CHUNK at a time, or the reads listed."""
    reads = data if isinstance(data, list) else [
        data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]
    with tempfile.TemporaryDirectory() as d:
        p = Pipeline("r", SpoolWriter(create_run_dir(Path(d), "r"), fsync=False),
                     mode="enabled", columns=80, rows=24)
        if not track:
            p._track = lambda *a, **k: None  # type: ignore[method-assign]
        ts = 1000.0
        t0 = time.process_time()
        for chunk in reads:
            ts += 0.025
            p.feed("stdout", chunk, ts)
        p.finish(exit_status=0, signal=None, state="COMPLETED", duration=0.0, bytes_read={})
        return (time.process_time() - t0) / (sum(map(len, reads)) / 1e6)


def print_ratios(workloads: dict[str, Any], measure: Callable[[Any, bool], float],
                 rounds: int) -> None:
    """For each workload, ``measure(data, on)`` (CPU seconds per MB) without and with the
    part measured, interleaved, ``rounds`` times: the medians and their ratio."""
    width = max(map(len, workloads))
    for name, data in workloads.items():
        on, off = [], []
        for _ in range(rounds):
            off.append(measure(data, False))
            on.append(measure(data, True))
        a, b = statistics.median(off), statistics.median(on)
        print(f"{name:{width}} without {1 / a:6.1f} MB/s  with {1 / b:6.1f} MB/s  "
              f"ratio {b / a:.3f} (CPU time, median of {rounds})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print_ratios(WORKLOADS, cpu_per_mb, args.rounds)


if __name__ == "__main__":
    main()
