"""What a pseudo-terminal costs a program that floods its stdout, with nothing of
logcapture's in the way: the same Python child writing N lines of 70 characters into a pipe
and into a pty (output post-processing off, as logcapture sets it), read by a plain loop of
64 KiB reads, alternating for each round.

Prints, as medians: the wall time from fork to the child reaped, the child's own user and
system CPU (``wait4``), the reads it took, and the pty's ratio to the pipe. The floor of any
capture that gives a task a terminal (bench_tasks.py ``--pty-floor`` measures it inside a
Slurm step).

    .venv/bin/python bench/bench_pty.py [--lines N] [--rounds N]

Never asserts a time.
"""

from __future__ import annotations

import argparse
import os
import pty
import statistics
import sys
import termios
import time

CHILD = ("import sys\nw = sys.stdout.write\n"
         "for i in range({lines}): w(f'task line {{i:>8}} ' + 'x' * 52 + '\\n')\n")


def one(kind: str, lines: int) -> tuple[float, float, float, int]:
    """(wall, child user, child system, reads) of one flood into ``kind``: pipe or pty."""
    if kind == "pipe":
        r, w = os.pipe()
    else:
        r, w = pty.openpty()
        attrs = termios.tcgetattr(w)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(w, termios.TCSANOW, attrs)
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        os.execv(sys.executable, [sys.executable, "-I", "-c", CHILD.format(lines=lines)])
    os.close(w)
    reads = 0
    while True:
        try:
            data = os.read(r, 65536)
        except OSError:  # EIO: the pty's last writer is gone
            break
        if not data:
            break
        reads += 1
    os.close(r)
    _, _, usage = os.wait4(pid, 0)
    return time.perf_counter() - t0, usage.ru_utime, usage.ru_stime, reads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    got: dict[str, list[tuple[float, float, float, int]]] = {"pipe": [], "pty": []}
    for _ in range(args.rounds):
        for kind in got:
            got[kind].append(one(kind, args.lines))
    print(f"{'into':5} {'wall':>7} {'user':>7} {'system':>7} {'reads':>7}   "
          f"({args.lines} lines, medians of {args.rounds} rounds, seconds)")
    m = {kind: [statistics.median(x[i] for x in runs) for i in range(4)]
         for kind, runs in got.items()}
    for kind, (wall, user, system, reads) in m.items():
        print(f"{kind:5} {wall:7.3f} {user:7.3f} {system:7.3f} {reads:7.0f}")
    print(f"pty / pipe: wall {m['pty'][0] / m['pipe'][0]:.3f}, the writer's CPU "
          f"{(m['pty'][1] + m['pty'][2]) / (m['pipe'][1] + m['pipe'][2]):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
