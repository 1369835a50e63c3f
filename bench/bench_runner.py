"""What capture costs a job: logcapture run against a file, a bare pty tee and script(1).

Every variant runs in the same process, interleaved, N rounds; medians are printed with
ratios. Workloads:
  prints    1M print() lines (line-buffered on a tty: 1M write() calls)
  bulk      200 MB of 80-character lines in large writes
  training  ~1k lines/s for 10 s with a progress bar redrawn at 10 Hz (capture CPU share):
            log lines, every 10th a JSON metrics line (metadata), like a training loop
  training-json  the same with every line a JSON metrics line (the classifier's worst case)
  seq-flood  3M short lines from seq(1) (not in the default set: --only seq-flood)

  .venv/bin/python bench/bench_runner.py [--rounds 3] [--scale 1.0] [--only prints,bulk]
  .venv/bin/python bench/bench_runner.py --pipeline   # the capture worker's work alone

  # as deployed: logcapture from a regular install (an editable install's import hook costs
  # every start of logcapture ~15-20 ms of CPU here)
  python3 -m venv /tmp/lc-installed && /tmp/lc-installed/bin/pip install -q .
  .venv/bin/python bench/bench_runner.py --only training --python /tmp/lc-installed/bin/python

  # against an earlier version, both installed the same way
  mkdir /tmp/old && git archive <commit> | tar -x -C /tmp/old
  python3 -m venv /tmp/lc-old && /tmp/lc-old/bin/pip install -q /tmp/old
  .venv/bin/python bench/bench_runner.py --only training --python /tmp/lc-installed/bin/python \
      --before-python /tmp/lc-old/bin/python

--scale shrinks the throughput workloads for a quick look (0.1 = 100k lines, 20 MB).
Every variant writes stdout and stderr to one file (2>&1: logcapture runs the job under one
pty for both, as the bare tee and script do); --stderr-apart gives stderr a file of its own
(two ptys under logcapture).
Targets: logcapture <= 1.05 x the bare tee and no slower than script on throughput;
capture CPU <= 2% of a core on the training-like job.

The package is byte-compiled first (compileall), as an installed package is: a stale .pyc
under PYTHONDONTWRITEBYTECODE would otherwise be recompiled at every start.
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


# Like tqdm with tqdm.write(): clear the bar, print 100 lines, redraw the bar; ten times a
# second for ten seconds. Every json_every-th line is a JSON metrics line (metadata), the
# others a log line.
TRAINING = """
import json, sys, time
t0 = time.time()
i = 0
while time.time() - t0 < 10:
    sys.stdout.write('\\r\\x1b[K')
    for _ in range(100):
        if i % {json_every} == 0:
            print(json.dumps({{'step': i, 'loss': 1 / (i + 1), 'lr': 1e-4}}))
        else:
            print(time.strftime('%H:%M:%S'), 'INFO train: epoch', i // 5000, 'step', i,
                  'loss', round(1 / (i + 1), 6), 'grad_norm', round((i % 97) / 31, 4))
        i += 1
    bar = '#' * (i // 400)
    sys.stdout.write(f'\\r{{i // 100}}% |{{bar}}|'); sys.stdout.flush()
    time.sleep(0.1)
print()
"""


def workloads(scale: float) -> dict[str, list[str]]:
    n = int(1_000_000 * scale)
    mb = max(1, int(200 * scale))
    return {
        "prints": [PY, "-c", f"for i in range({n}): print('line', i, 'x' * 60)"],
        "bulk": [PY, "-c", (
            "import sys\nline = b'y' * 79 + b'\\n'\nblock = line * 13107\n"
            f"for _ in range({mb} * 1048576 // len(block)): sys.stdout.buffer.write(block)")],
        "training": [PY, "-c", TRAINING.format(json_every=10)],
        "training-json": [PY, "-c", TRAINING.format(json_every=1)],
        # A flood faster than the spool's disk: every line is stored (flow control slows
        # the job to the spool's pace instead of dropping lines), so this is its cost.
        "seq-flood": ["seq", "1", str(int(3_000_000 * scale))],
    }


def variants(cmd: list[str], spool: str, before: str | None = None,
             python: str | None = None, before_python: str | None = None
             ) -> dict[str, list[str]]:
    out = {
        "file": cmd,
        "tee": [PY, "-c", TEE, *cmd],
        "logcapture": [python or PY, "-m", "logcapture", "run", "--", *cmd],
    }
    if before_python:  # another version, installed in another environment
        out["before"] = [before_python, "-m", "logcapture", "run", "--", *cmd]
    elif before:  # the same command from another checkout, in the same rounds
        out["before"] = [*LOGCAPTURE, "run", "--", *cmd]
    if shutil.which("script"):
        out["script"] = ["script", "-q", "-e", "-c", subprocess.list2cmdline(cmd), "/dev/null"]
    return out


STDERR_APART = False  # --stderr-apart: stderr to its own file (two ptys under logcapture)


def timed(argv: list[str], env: dict[str, str], out_path: str,
          cwd: str | None = None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (the process and its children). stdout and stderr go to
    one file (``2>&1``: one pty for both under logcapture), or with STDERR_APART to two."""
    with open(out_path, "wb") as out, open(out_path + ".err", "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out,
                                stderr=err if STDERR_APART else subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:3]}... failed with {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_utime + usage.ru_stime


def capture_cpu(spool: Path) -> dict[str, float]:
    """Capture's own CPU seconds, as recorded in the newest run's end record: ``cpu`` (all
    capture processes: the reader and, since the capture worker, the worker) and, when
    recorded, ``reader`` and ``worker`` apart."""
    from logcapture.runs import find_run
    from logcapture.spool.reading import iter_run
    for rec in iter_run(find_run(spool, None)):
        if rec.kind == "end":
            c = rec.counts.get("capture", {})  # type: ignore[attr-defined]
            out = {"cpu": c.get("cpu_ms", 0) / 1000}
            for k in ("reader", "worker"):
                if f"{k}_cpu_ms" in c:
                    out[k] = c[f"{k}_cpu_ms"] / 1000
            return out
    return {}


def load() -> str:
    """The machine is shared: say how busy it was (1-minute load average, 2 cores here)."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def training_bytes(n: int, json_every: int) -> bytes:
    """What TRAINING prints for ``n`` lines (the same shapes, without the clock)."""
    out = []
    for k in range(n // 100):
        lines = []
        for i in range(100 * k, 100 * k + 100):
            if i % json_every == 0:
                lines.append(json.dumps({"step": i, "loss": 1 / (i + 1), "lr": 1e-4}))
            else:
                lines.append(f"17:00:00 INFO train: epoch {i // 5000} step {i} loss "
                             f"{round(1 / (i + 1), 6)} grad_norm {round((i % 97) / 31, 4)}")
        out.append("\r\x1b[K" + "".join(line + "\n" for line in lines)
                   + f"\r{k}% |{'#' * (k // 4)}|")
    return "".join(out).encode()


def pipeline_streams(scale: float) -> dict[str, bytes]:
    """The bytes the workloads print (a smaller share of them), for --pipeline."""
    n = int(200_000 * scale)
    return {
        "prints": b"".join(b"line %d %s\n" % (i, b"x" * 60) for i in range(n)),
        "bulk": (b"y" * 79 + b"\n") * n * 5,
        "training": training_bytes(n, 10),
        "training-json": training_bytes(n, 1),
    }


class PassThrough:
    """A redact stage that changes nothing: the pipeline's baseline without redaction."""

    def __init__(self) -> None:
        from collections import Counter
        self.counts: Counter[str] = Counter()

    def lines(self, stream: str, lines: list) -> list:  # type: ignore[type-arg]
        return lines

    def start_fields(self, fields: dict) -> dict:  # type: ignore[type-arg]
        return fields


# The job's environment the redact stage is given: two secrets, as an ML job commonly has
# (their values and encodings are literals the stage searches every line for).
BENCH_ENV = {"HF_TOKEN": "hf_" + "Ab3dE" * 7, "WANDB_API_KEY": "0123456789abcdef" * 2 + "12345678"}


def _pipeline_cpu(name: str, chunks: list[bytes], tmp: Path, tag: str, redactor: object
                  ) -> float:
    """CPU seconds of one Pipeline fed ``chunks`` and finished."""
    import inspect

    from logcapture.pipeline import Pipeline
    from logcapture.spool.layout import create_run_dir
    from logcapture.spool.writer import SpoolWriter

    spool = SpoolWriter(create_run_dir(tmp, f"{name}-{tag}"))
    p = Pipeline("r", spool, mode="enabled", columns=120, rows=24,
                 redactor=redactor)  # type: ignore[arg-type]
    with_mono = "mono" in inspect.signature(Pipeline.feed).parameters
    t0 = time.process_time()
    for k, chunk in enumerate(chunks):
        if with_mono:
            p.feed("stdout", chunk, 1.0 + k, 1.0 + k)
        else:
            p.feed("stdout", chunk, 1.0 + k)
    p.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0, bytes_read={})
    return time.process_time() - t0


def bench_pipeline(rounds: int, scale: float) -> None:
    """The capture worker's work alone, in this process: the bytes of each workload fed to a
    Pipeline (render, redact, filter, classify, spool) in 64 KiB chunks (what a worker that
    has fallen behind gets) and in 4 KiB chunks (one pty read each). CPU seconds per line,
    best of ``rounds``, without redaction (a pass-through stage) and with it (the job's
    environment holding BENCH_ENV's secrets), interleaved in each round. Runs against any
    tree (PYTHONPATH=<old checkout> gives the before figure)."""
    from logcapture.redact import Redactor

    tmp = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    import logcapture
    print(f"\n== pipeline alone (best of {rounds}; load average {load()}; "
          f"{Path(logcapture.__file__).parent})")
    for name, data in pipeline_streams(scale).items():
        lines = data.count(b"\n")
        for size in (65536, 4096):
            chunks = [data[i:i + size] for i in range(0, len(data), size)]
            bare = redacted = float("inf")
            for r in range(rounds):
                bare = min(bare, _pipeline_cpu(name, chunks, tmp, f"{size}-{r}-bare",
                                               PassThrough()))
                redacted = min(redacted, _pipeline_cpu(name, chunks, tmp, f"{size}-{r}-redact",
                                                       Redactor(BENCH_ENV)))
            print(f"  {name:<13} {size // 1024:>2} KiB chunks: without redaction "
                  f"{1e6 * bare / lines:6.2f} us/line, with {1e6 * redacted / lines:6.2f} "
                  f"({len(data) / redacted / 1e6:5.1f} MB/s)   ratio {redacted / bare:5.2f}"
                  f"  (target <= 1.15)")
    shutil.rmtree(tmp, ignore_errors=True)


def _timed_variant(vname: str, argv: list[str], args: argparse.Namespace, tmp: Path,
                   env: dict[str, str]) -> tuple[float, float]:
    """One run of one variant: (wall, cpu) seconds."""
    if vname == "before" and args.before_python:
        return timed(argv, env, str(tmp / "out"), cwd=str(tmp))
    if vname == "before":
        # PYTHONPATH and a working directory without a logcapture/ in it, so
        # `python -m logcapture` imports the other checkout's package.
        return timed(argv, dict(env, PYTHONPATH=args.before), str(tmp / "out"),
                     cwd=args.before)
    if vname == "logcapture" and args.python:
        # from a directory without a logcapture/ in it: the installed package
        return timed(argv, env, str(tmp / "out"), cwd=str(tmp))
    return timed(argv, env, str(tmp / "out"))


Series = dict[str, list[float]]


def _measure(name: str, cmd: list[str], rounds: int, args: argparse.Namespace, tmp: Path,
             env: dict[str, str]) -> tuple[Series, Series, Series]:
    """Every variant of one workload, ``rounds`` times, interleaved: wall seconds, CPU seconds
    and the capture processes' own CPU (from the end record) per variant."""
    walls: Series = {}
    cpus: Series = {}
    split: Series = {}
    for _ in range(rounds):
        for vname, argv in variants(cmd, str(tmp / "spool"), args.before,
                                    args.python, args.before_python).items():
            w, c = _timed_variant(vname, argv, args, tmp, env)
            walls.setdefault(vname, []).append(w)
            cpus.setdefault(vname, []).append(c)
            if vname == "logcapture":
                for k, v in capture_cpu(tmp / "spool").items():
                    split.setdefault(k, []).append(v)
                if name.startswith("training"):
                    cpus.setdefault("capture_only", []).append(split["cpu"][-1])
            if vname == "before" and name.startswith("training"):
                cpus.setdefault("before_capture_only", []).append(
                    capture_cpu(tmp / "spool").get("cpu", 0.0))
    return walls, cpus, split


def _report(name: str, rounds: int, walls: Series, cpus: Series, split: Series,
            load_before: str) -> dict[str, object]:
    """Print one workload's medians and ratios; return them for the JSON summary."""
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"\n== {name} ({rounds} round(s), "
          f"{'stderr apart' if STDERR_APART else 'stdout and stderr to one file'}, "
          f"median wall seconds; load average {load_before} before, {load()} after)")
    for k, v in med.items():
        print(f"  {k:<11} {v:8.3f} s   cpu {statistics.median(cpus[k]):7.3f} s")
    r_tee = med["logcapture"] / med["tee"]
    print(f"  ratio logcapture / tee    = {r_tee:.3f}  (target <= 1.05)")
    if "script" in med:
        print(f"  ratio logcapture / script = {med['logcapture'] / med['script']:.3f}  "
              "(target <= 1.0)")
    print(f"  ratio logcapture / file   = {med['logcapture'] / med['file']:.3f}")
    if "before" in med:
        print(f"  ratio before / tee        = {med['before'] / med['tee']:.3f}")
        print(f"  ratio logcapture / before = {med['logcapture'] / med['before']:.3f}")
    if split:
        print("  capture cpu (end record)  = " + ", ".join(
            f"{k} {statistics.median(v):.3f} s" for k, v in split.items()))
    print("  all rounds (wall s): " + "; ".join(
        f"{k} " + " ".join(f"{x:.2f}" for x in v) for k, v in walls.items()))
    row: dict[str, object] = {"median_wall": med, "ratio_tee": r_tee, "walls": walls,
                              "load": [load_before, load()]}
    if name.startswith("training") and cpus.get("capture_only"):
        share = statistics.median(cpus["capture_only"]) / med["logcapture"]
        print(f"  capture CPU share of a core = {100 * share:.2f}%  (target <= 2%)")
        row["capture_cpu_share"] = share
        if cpus.get("before_capture_only"):
            before = statistics.median(cpus["before_capture_only"]) / med["before"]
            print(f"  before: capture CPU share = {100 * before:.2f}%")
            row["before_capture_cpu_share"] = before
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--only", default="prints,bulk,training,training-json")
    ap.add_argument("--before", default=None, metavar="DIR",
                    help="also run logcapture from another checkout (a directory holding its "
                         "logcapture/ package, e.g. from `git archive`), as variant 'before'")
    ap.add_argument("--before-python", default=None, metavar="PY",
                    help="also run logcapture with this interpreter, as variant 'before': a "
                         "virtual environment with another version regularly installed (the "
                         "fair comparison with --python)")
    ap.add_argument("--python", default=None, metavar="PY",
                    help="run logcapture with this interpreter: a virtual environment with a "
                         "regular (not editable) install, as on a cluster node; an editable "
                         "install's import hook costs every start ~15-20 ms here")
    ap.add_argument("--training-rounds", type=int, default=3,
                    help="rounds of the training workloads (10 s each per variant)")
    ap.add_argument("--pipeline", action="store_true",
                    help="measure the capture worker's work alone, in this process")
    ap.add_argument("--stderr-apart", action="store_true",
                    help="send stderr to a file of its own (logcapture then runs the job under "
                         "two ptys); default: one file for both (2>&1: one pty)")
    args = ap.parse_args()
    global STDERR_APART
    STDERR_APART = args.stderr_apart
    if args.pipeline:
        bench_pipeline(args.rounds, args.scale)
        return
    import compileall
    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "logcapture"),
                           quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-runner-"))
    env = dict(os.environ, LOGCAPTURE_SPOOL=str(tmp / "spool"),
               LOGCAPTURE_OPTIN=str(tmp / "none"), LOGCAPTURE_CONFIG=str(tmp / "none.yaml"),
               LOGCAPTURE_COLUMNS="120")
    results = {}
    for name, cmd in workloads(args.scale).items():
        if name not in args.only.split(","):
            continue
        rounds = args.training_rounds if name.startswith("training") else args.rounds
        load_before = load()
        walls, cpus, split = _measure(name, cmd, rounds, args, tmp, env)
        results[name] = _report(name, rounds, walls, cpus, split, load_before)
    print("\n" + json.dumps(results, default=float))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
