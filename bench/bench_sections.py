"""What looking for CI fold markers (sections.py) costs the capture worker: the Pipeline's CPU
time per MB with the classifier's marker checks, against the same Pipeline with them off
(``classify.may_hold_marker`` and ``classify.marker`` finding nothing), in the same run,
interleaved; the median of the rounds and the ratio.

    python bench/bench_sections.py [--rounds N]

Workloads, a 64 KiB read every 25 ms: a flood of plain lines (the batch path: one search of
each batch for the markers), the same lines coloured (SGR: line by line, ``marker`` on each),
and plain lines with ``--- `` inside them (rulers, ``a --- b``: a marker's text not at the
start of a line). Then the batch test alone (``sections.may_hold_marker``) on a 64 KiB batch
of the flood's lines, against a substring search of the batch for each marker's text (the
test it replaced), best of 5.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_progress import print_ratios  # noqa: E402

from logcapture import classify, sections  # noqa: E402
from logcapture.pipeline import Pipeline  # noqa: E402
from logcapture.spool.layout import create_run_dir  # noqa: E402
from logcapture.spool.writer import SpoolWriter  # noqa: E402

CHUNK = 65536
N = 150_000
PLAIN = b"".join(b"step %d loss 0.%d lr 3e-4 tokens %d\n" % (i, i % 97, i * 7)
                 for i in range(N))
COLOURED = b"".join(b"\x1b[32mINFO\x1b[0m step %d loss \x1b[1m0.%d\x1b[0m lr 3e-4\n"
                    % (i, i % 97) for i in range(N))
RULERS = b"".join(b"epoch %d --- loss 0.%d --- lr 3e-4\n" % (i, i % 97) for i in range(N))
WORKLOADS = {"plain flood": PLAIN, "coloured flood": COLOURED, "'--- ' inside lines": RULERS}


def cpu_per_mb(data: bytes, check: bool) -> float:
    saved = classify.may_hold_marker, classify.marker
    if not check:
        classify.may_hold_marker = lambda joined: False  # type: ignore[assignment]
        classify.marker = lambda text: None  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory() as d:
            p = Pipeline("r", SpoolWriter(create_run_dir(Path(d), "r"), fsync=False),
                         mode="enabled", columns=80, rows=24)
            ts = 1000.0
            t0 = time.process_time()
            for i in range(0, len(data), CHUNK):
                ts += 0.025
                p.feed("stdout", data[i:i + CHUNK], ts)
            p.finish(exit_status=0, signal=None, state="COMPLETED", duration=0.0,
                     bytes_read={})
            return (time.process_time() - t0) / (len(data) / 1e6)
    finally:
        classify.may_hold_marker, classify.marker = saved  # type: ignore[assignment]


def searches(joined: str) -> bool:
    """The batch test before: a substring search for each marker's text, anywhere."""
    return ("group::" in joined or "section_" in joined or "--- " in joined
            or "+++ " in joined or "~~~ " in joined or "^^^ +++" in joined)


def batch_test_us(test: Callable[[str], bool], joined: str) -> float:
    return min(timeit.repeat(lambda: test(joined), number=200, repeat=5)) / 200 * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print_ratios(WORKLOADS, cpu_per_mb, args.rounds)
    joined = PLAIN[:CHUNK].decode().rsplit("\n", 1)[0]
    now, before = batch_test_us(sections.may_hold_marker, joined), batch_test_us(searches, joined)
    print(f"the batch test on 64 KiB of the flood: {now:.0f} us, a search for each marker "
          f"{before:.0f} us, ratio {now / before:.3f}")


if __name__ == "__main__":
    main()
