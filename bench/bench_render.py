"""Render throughput: logcapture's Renderer against pure pyte, measured in the same run.

    .venv/bin/python bench/bench_render.py [--mb 4] [--repeat 3] [--before DIR]

Two workloads, fed in 4 KiB chunks, as a reader of a Linux pty typically gets them:
- plain: 80-byte log lines;
- progress: tqdm-style ``\\r`` redraws with colours and erase-line, a newline every 50 redraws.
Baselines: ``pyte`` is pyte.Screen(80, 24) + pyte.ByteStream with LNM set and an ``index``
override collecting the rows that scroll off (the least a log renderer must do); ``pure`` is
logcapture's own renderer with the fast path off. Pure pyte is ~1 MB/s, so the baselines run on
a slice of the input (throughput is per byte). Targets: >= 40 MB/s plain, >= 20 MB/s
progress-heavy. Prints MB/s and the ratios; the median of ``--repeat`` runs.

``--before DIR`` also measures the renderer of another tree (a directory holding a
``logcapture/`` package, e.g. from ``git archive``) in the same run: each repeat renders the
workload once with that tree and once with this one, each in a fresh interpreter, timed in CPU
seconds of that process (``time.process_time``: on a shared machine, wall time measures the
neighbours), and the ``after/before`` ratio of the medians is printed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyte  # noqa: E402
from pyte import modes as mo  # noqa: E402

from logcapture.render import Renderer  # noqa: E402

CHUNK = 4096


def plain_lines(size: int) -> bytes:
    out, i = [], 0
    while sum(map(len, out)) < size:
        out.append(f"2024-05-01 12:00:{i % 60:02d} INFO step {i:>8} loss 0.{i % 9973:04d} "
                   f"lr 3e-4 tokens/s 1234.5\n".ljust(80).encode())
        i += 1
    return b"".join(out)[:size]


def progress_heavy(size: int) -> bytes:
    out: list[bytes] = []
    total, i = 0, 0
    while total < size:
        n = i % 1000
        filled = n * 40 // 1000
        bar = "█" * filled + "▋" + " " * (39 - filled)
        line = (f"\r\x1b[2K\x1b[32mtrain\x1b[0m: {n / 10:5.1f}%|{bar}| {n}/1000 "
                f"[00:{n % 60:02d}<00:10, 98.7it/s]")
        if i % 50 == 49:
            line += "\n"
        b = line.encode()
        out.append(b)
        total += len(b)
        i += 1
    return b"".join(out)


class PyteBaseline:
    """pyte as a log renderer at its plainest."""

    def __init__(self) -> None:
        lines: list[str] = []

        class Screen(pyte.Screen):
            def index(self) -> None:
                if self.cursor.y == self.lines - 1:
                    row = self.buffer[0]
                    lines.append("".join(row[x].data for x in range(self.columns)).rstrip())
                super().index()

        self.lines = lines
        self.screen = Screen(80, 24)
        self.screen.set_mode(mo.LNM)
        self.stream = pyte.ByteStream(self.screen)

    def feed(self, data: bytes) -> None:
        self.stream.feed(data)


class PureRenderer(Renderer):
    fast_path = False


def run(make: Callable[[], object], data: bytes) -> float:
    r = make()
    feed = r.feed  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    for i in range(0, len(data), CHUNK):
        feed(data[i:i + CHUNK])
    if hasattr(r, "finish"):
        r.finish()
    return len(data) / (time.perf_counter() - t0) / 1e6


def median(make: Callable[[], object], data: bytes, repeat: int) -> float:
    return statistics.median(run(make, data) for _ in range(repeat))


# Renders stdin with the Renderer of the tree named by argv[1]; prints MB/s.
_MEASURE = """
import sys, time
sys.path.insert(0, sys.argv[1])
from logcapture.render import Renderer
data = sys.stdin.buffer.read()
r = Renderer()
feed = r.feed
t0 = time.process_time()
for i in range(0, len(data), 4096):
    feed(data[i:i + 4096])
r.finish()
print(len(data) / (time.process_time() - t0) / 1e6)
"""


def measure_tree(tree: Path, data: bytes) -> float:
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(tree)], input=data,
                         capture_output=True, check=True, cwd=tree).stdout
    return float(out)


def before_after(before: Path, name: str, data: bytes, repeat: int) -> None:
    b: list[float] = []
    a: list[float] = []
    for _ in range(repeat):  # interleaved, so both see the same machine
        b.append(measure_tree(before, data))
        a.append(measure_tree(ROOT, data))
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"{name:<10} before {mb:>6.1f} MB/s  after {ma:>6.1f} MB/s (CPU)  after/before "
          f"{ma / mb:.3f}"
          f"  (runs: before {', '.join(f'{x:.1f}' for x in b)}; after "
          f"{', '.join(f'{x:.1f}' for x in a)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=4.0, help="input size per workload (MB)")
    ap.add_argument("--baseline-kb", type=int, default=256,
                    help="slice of the input the pyte baselines render (KB)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", type=Path, default=None, metavar="DIR",
                    help="also measure the renderer of this tree, in the same run")
    args = ap.parse_args()
    size = int(args.mb * 1e6)
    base = args.baseline_kb * 1000
    if args.before is not None:
        for name, data in (("plain", plain_lines(size)), ("progress", progress_heavy(size))):
            before_after(args.before.resolve(), name, data, args.repeat)
        return
    print(f"{'workload':<10} {'renderer':>10} {'pure':>8} {'pyte':>8} "
          f"{'x pure':>8} {'x pyte':>8} target")
    for name, data, target in (("plain", plain_lines(size), 40),
                               ("progress", progress_heavy(size), 20)):
        fast = median(Renderer, data, args.repeat)
        pure = median(PureRenderer, data[:base], args.repeat)
        raw = median(PyteBaseline, data[:base], args.repeat)
        ok = "ok" if fast >= target else "BELOW"
        print(f"{name:<10} {fast:>7.1f}MB/s {pure:>5.2f}MB/s {raw:>5.2f}MB/s "
              f"{fast / pure:>7.1f}x {fast / raw:>7.1f}x >= {target} MB/s {ok}")


if __name__ == "__main__":
    main()
