"""What capture costs a job: logcapture run against a file, a bare pty tee and script(1).

Every variant runs in the same process, interleaved, N rounds; medians are printed with
ratios. Workloads (issue 2 §7):
  prints    1M print() lines (line-buffered on a tty: 1M write() calls)
  bulk      200 MB of 80-character lines in large writes
  training  ~1k lines/s for 10 s with a progress bar redrawn at 10 Hz (capture CPU share)

  .venv/bin/python bench/bench_runner.py [--rounds 3] [--scale 1.0] [--only prints,bulk]

--scale shrinks the throughput workloads for a quick look (0.1 = 100k lines, 20 MB).
Targets: logcapture <= 1.05 x the bare tee and no slower than script on throughput;
capture CPU <= 2% of a core on the training-like job.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
LOGCAPTURE = [PY, "-m", "logcapture"]

TEE = r"""
import os, pty, select, subprocess, sys, termios
m, s = os.openpty()
a = termios.tcgetattr(s); a[1] &= ~termios.OPOST; termios.tcsetattr(s, termios.TCSANOW, a)
p = subprocess.Popen(sys.argv[1:], stdout=s, stderr=s, start_new_session=True)
os.close(s)
while True:
    try:
        d = os.read(m, 65536)
    except OSError:
        break
    if not d:
        break
    os.write(1, d)
sys.exit(p.wait())
"""


def workloads(scale: float) -> dict[str, list[str]]:
    n = int(1_000_000 * scale)
    mb = max(1, int(200 * scale))
    return {
        "prints": [PY, "-c", f"for i in range({n}): print('line', i, 'x' * 60)"],
        "bulk": [PY, "-c", (
            "import sys\nline = b'y' * 79 + b'\\n'\nblock = line * 13107\n"
            f"for _ in range({mb} * 1048576 // len(block)): sys.stdout.buffer.write(block)")],
        "training": [PY, "-c", (
            # Like tqdm with tqdm.write(): clear the bar, print 100 lines, redraw the bar;
            # ten times a second for ten seconds.
            "import json, sys, time\nt0 = time.time()\ni = 0\n"
            "while time.time() - t0 < 10:\n"
            "    sys.stdout.write('\\r\\x1b[K')\n"
            "    for _ in range(100):\n"
            "        print(json.dumps({'step': i, 'loss': 1 / (i + 1)})); i += 1\n"
            "    bar = '#' * (i // 400)\n"
            "    sys.stdout.write(f'\\r{i // 100}% |{bar}|'); sys.stdout.flush()\n"
            "    time.sleep(0.1)\n"
            "print()")],
    }


def variants(cmd: list[str], spool: str) -> dict[str, list[str]]:
    out = {
        "file": cmd,
        "tee": [PY, "-c", TEE, *cmd],
        "logcapture": [*LOGCAPTURE, "run", "--", *cmd],
    }
    if shutil.which("script"):
        out["script"] = ["script", "-q", "-e", "-c", subprocess.list2cmdline(cmd), "/dev/null"]
    return out


def timed(argv: list[str], env: dict[str, str], out_path: str) -> tuple[float, float]:
    """Wall seconds and CPU seconds (the process and its children)."""
    with open(out_path, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:3]}... failed with {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_utime + usage.ru_stime


def capture_cpu(spool: Path) -> float | None:
    """The wrapper's own CPU seconds, as recorded in the newest run's end record."""
    from logcapture.runs import find_run
    from logcapture.spool import iter_run
    for rec in iter_run(find_run(spool, None)):
        if rec.kind == "end":
            return rec.counts.get("capture", {}).get("cpu_ms", 0) / 1000  # type: ignore[attr-defined]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--only", default="prints,bulk,training")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-runner-"))
    env = dict(os.environ, LOGCAPTURE_SPOOL=str(tmp / "spool"),
               LOGCAPTURE_OPTIN=str(tmp / "none"), LOGCAPTURE_CONFIG=str(tmp / "none.yaml"),
               LOGCAPTURE_COLUMNS="120")
    results = {}
    for name, cmd in workloads(args.scale).items():
        if name not in args.only.split(","):
            continue
        rounds = 1 if name == "training" else args.rounds
        walls: dict[str, list[float]] = {}
        cpus: dict[str, list[float]] = {}
        for _ in range(rounds):
            for vname, argv in variants(cmd, str(tmp / "spool")).items():
                w, c = timed(argv, env, str(tmp / "out"))
                walls.setdefault(vname, []).append(w)
                cpus.setdefault(vname, []).append(c)
                if vname == "logcapture" and name == "training":
                    cpus.setdefault("capture_only", []).append(capture_cpu(tmp / "spool") or 0)
        med = {k: statistics.median(v) for k, v in walls.items()}
        print(f"\n== {name} ({rounds} round(s), median wall seconds)")
        for k, v in med.items():
            print(f"  {k:<11} {v:8.3f} s   cpu {statistics.median(cpus[k]):7.3f} s")
        r_tee = med["logcapture"] / med["tee"]
        print(f"  ratio logcapture / tee    = {r_tee:.3f}  (target <= 1.05)")
        if "script" in med:
            print(f"  ratio logcapture / script = {med['logcapture'] / med['script']:.3f}  "
                  "(target <= 1.0)")
        print(f"  ratio logcapture / file   = {med['logcapture'] / med['file']:.3f}")
        row = {"median_wall": med, "ratio_tee": r_tee}
        if name == "training" and cpus.get("capture_only"):
            share = statistics.median(cpus["capture_only"]) / med["logcapture"]
            print(f"  capture CPU share of a core = {100 * share:.2f}%  (target <= 2%)")
            row["capture_cpu_share"] = share
        results[name] = row
    print("\n" + json.dumps(results, default=float))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
