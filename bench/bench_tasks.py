"""What capturing each task of a step costs: a 4-task srun step with and without logcapture.

Starts its own dev cluster (slurm/dev-cluster: free ports, a temporary directory, a node of at
least 4 CPUs) and runs, alternating in each round, the same batch job for a user who did not
opt in (logcapture installed; the tasks run as without it) and for the same user opted in
(the SPANK plugin captures each task as a run of its own; srun's copy of their output goes
to the job's output file through the batch capture's pipes, logcapture.slurm.forward):

- empty: `srun -n 4` of a program that does nothing: the fixed cost of a captured step
  (each task's capture process started and ready before the program runs, its run ended
  before slurmstepd lets the step end);
- flood: `srun -n 4`, each task printing 100,000 lines (``--lines``) of 70 characters as fast
  as it can;
- training: `srun -n 4`, each task running bench_runner.py's training-like workload (~1k lines
  a second for 10 s, a progress bar redrawn at 10 Hz, every 10th line a JSON metrics line).

For each it prints the median wall time of the srun step (timed inside the job script, from
before srun to after it) and of the whole job (sbatch to its final state, prolog and epilog
included), the ratio with logcapture to without, and each task's capture CPU: the capture
processes' CPU seconds from the task run's End record (counts.capture.cpu_ms) over the task's
duration, as a share of one core, and its memory: the larger of the two capture processes'
peak resident sizes (counts.capture.max_rss_kib; the reader and the worker it forked share
pages, so both together hold less than twice that). The 1-minute load average is printed with
each round.

With ``--pty-floor`` each round also runs the job of the user who did not opt in with every
task under util-linux's ``script -qefc`` (a C program that gives its command a pty and copies
it to its stdout, nothing else): what running a task under a pseudo-terminal costs by itself,
which every capture that gives the task a terminal pays (``isatty()`` true changes the
program's buffering, and a pty hands its reader at most a few KiB a read). The table then
also gives the captured step over that floor.

With ``--before-plugin FILE`` (a build of slurm/spank/logcapture_task.c from another tree) each
round also runs the opted-in job with that plugin: the file slurmstepd loads for each step is
switched between jobs, so the two builds are compared in the same rounds, on the same cluster.
``--before-python PY`` does the same for the interpreter (and so the logcapture) the plugin
starts in each task (plugstack.conf's ``python=``, read by each step's slurmstepd); with both,
the before case has both.

    sudo .venv/bin/python bench/bench_tasks.py [--rounds N] [--only empty,flood,training]
                                               [--lines N] [--pty-floor]
                                               [--before-plugin FILE]
                                               [--before-python PY]

``LOGCAPTURE_BIN=DIR`` runs the cluster with the logcapture installed in DIR (slurm/dev-cluster):
an editable install's import hook costs every capture process's start.

Needs root, Debian's slurm-wlm and munge and the task plugin's build tools
(slurm/ci-setup.sh). Never asserts a time.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_runner import TRAINING, load  # noqa: E402
from bench_slurm import new_bench  # noqa: E402

TASKS = 4
TASK = "/usr/bin/python3 bench-work.py"
# The floor of a task under a pty: util-linux's script (-q quiet, -e the command's exit
# status, -f flush at once), its typescript thrown away, the pty's output on its stdout.
PTY_TASK = f"script -qefc '{TASK}' /dev/null"
WHAT = {"off": "without", "on": "with logcapture", "before": "with the --before-*",
        "pty": "under script (a bare pty)"}
WORK = {
    "empty": "pass\n",
    "flood": "import sys\nw = sys.stdout.write\n"
             "for i in range({lines}): w(f'task line {{i:>8}} ' + 'x' * 52 + '\\n')\n",
    "training": TRAINING.format(json_every=10),
}
JOB = f"""#!/bin/bash
#SBATCH -n {TASKS}
t0=$(date +%s.%N)
srun {{task}}
t1=$(date +%s.%N)
echo "BENCH-STEP $t0 $t1"
"""


def step_seconds(out: Path) -> float:
    """The srun step's wall time, from the job's last line (JOB)."""
    last = out.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1].decode()
    tag, t0, t1 = last.split()
    assert tag == "BENCH-STEP", last
    return float(t1) - float(t0)


def task_usage(spool: Path, job: str) -> list[tuple[float, float, float, float]]:
    """Each task run's capture CPU over its duration (a share of one core), its capture
    processes' peak resident size (MiB), and its reader's and its worker's CPU (ms), from its
    End record."""
    from logcapture.spool.reading import iter_run

    usage = []
    for run in sorted((spool / job).glob(f"{job}.0.*")):
        for rec in iter_run(run):
            if rec.kind == "end":
                d = rec.to_dict()
                capture = d["counts"].get("capture", {})
                usage.append((capture.get("cpu_ms", 0) / 1000 / max(d["duration"], 1e-9),
                              capture.get("max_rss_kib", 0) / 1024,
                              capture.get("reader_cpu_ms", 0), capture.get("worker_cpu_ms", 0)))
    return usage


def use_python(plugstack: Path, python: str) -> None:
    """Make ``python`` the interpreter the plugin starts in the cluster's next steps."""
    words = plugstack.read_text().split()
    plugstack.write_text(" ".join(w if not w.startswith("python=") else f"python={python}"
                                  for w in words) + "\n")


def use_plugin(lib: Path, build: Path) -> None:
    """Make ``build`` the plugin the cluster's next steps load (a new file, not one
    rewritten under a process that may still map it)."""
    tmp = lib.with_suffix(".next")
    shutil.copyfile(build, tmp)
    os.replace(tmp, lib)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="jobs per case and workload")
    ap.add_argument("--only", default="empty,flood,training")
    ap.add_argument("--lines", type=int, default=100_000, help="lines a task of the flood prints")
    ap.add_argument("--pty-floor", action="store_true",
                    help="also run each task, not opted in, under script (a bare pty)")
    ap.add_argument("--before-plugin", type=Path, metavar="FILE",
                    help="also run the opted-in job with this build of the task plugin")
    ap.add_argument("--before-python", metavar="PY",
                    help="also run the opted-in job with the task plugin starting this Python")
    args = ap.parse_args()
    if args.before_plugin is not None and not args.before_plugin.is_file():
        ap.error(f"--before-plugin {args.before_plugin}: no such file")
    if args.before_python is not None and not os.access(args.before_python, os.X_OK):
        ap.error(f"--before-python {args.before_python}: not an executable")
    # Byte-compiled first, as an installed package is: the tasks' `python -I` runs as the
    # job's user, who cannot write .pyc files into this tree, so a stale or missing one
    # would be compiled again in every task's capture process and counted as its CPU.
    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "logcapture"),
                           quiet=1)
    b = new_bench("bench_tasks")
    if b is None:
        return 2
    base = b.dir.parent
    results: dict[str, dict[str, list[float]]] = {}
    try:
        b.up()
        assert b.pw is not None
        lib = b.dir / "lib" / "logcapture_task.so"
        builds = {"on": b.dir / "lib" / "logcapture_task.tree.so"}
        shutil.copyfile(lib, builds["on"])
        plugstack = b.dir / "etc" / "plugstack.conf"
        pythons = {"on": next(w for w in plugstack.read_text().split()
                              if w.startswith("python="))[len("python="):]}
        cases = ["off", "on"] + (["pty"] if args.pty_floor else [])
        if args.before_plugin is not None or args.before_python is not None:
            builds["before"] = args.before_plugin or builds["on"]
            pythons["before"] = args.before_python or pythons["on"]
            cases.append("before")
        home = Path(b.pw.pw_dir)
        out = home / "bench-tasks.out"
        for name in args.only.split(","):
            work = home / "bench-work.py"
            work.write_text(WORK[name].format(lines=args.lines) if name == "flood"
                            else WORK[name])
            os.chown(work, b.pw.pw_uid, b.pw.pw_gid)
            r = results[name] = {f"{what} {key}": [] for what in ("step", "job", "cpu", "rss",
                                                                  "reader", "worker")
                                 for key in cases}
            for i in range(args.rounds):
                for key in cases:
                    b.optin(key not in ("off", "pty"))
                    if key in builds:
                        use_plugin(lib, builds[key])
                        use_python(plugstack, pythons[key])
                    job = JOB.format(task=PTY_TASK if key == "pty" else TASK)
                    r[f"job {key}"].append(b.job_seconds(job, str(out)))
                    r[f"step {key}"].append(step_seconds(out))
                    if key not in ("off", "pty"):
                        usage = task_usage(b.dir / "spool", b.last_job)
                        assert len(usage) == TASKS, f"{len(usage)} task runs, not {TASKS}"
                        for j, what in enumerate(("cpu", "rss", "reader", "worker")):
                            r[f"{what} {key}"].extend(u[j] for u in usage)
                        shutil.rmtree(b.dir / "spool" / b.last_job, ignore_errors=True)
                    out.unlink(missing_ok=True)
                print(f"{name} round {i + 1}: step " + ", ".join(
                    f"{r[f'step {key}'][-1]:.2f} s {WHAT[key]}" for key in cases)
                    + f"; load {load()}", flush=True)
    finally:
        b.optin(False)
        b.down()
        shutil.rmtree(base, ignore_errors=True)

    print(f"\n{'workload':10} {'plugin':7} {'step off':>9} {'step on':>8} {'ratio':>6} "
          f"{'job off':>8} {'job on':>7} {'ratio':>6} {'capture CPU/task':>27} "
          f"{'capture RSS':>12} {'reader':>7} {'worker':>7}   ({TASKS} tasks, {args.rounds} "
          "rounds, medians, seconds; reader and worker: CPU ms a task)")
    for name, r in results.items():
        m = {k: statistics.median(v) for k, v in r.items() if v}
        for key in cases[1:]:
            if key == "pty":
                print(f"{name:10} {'pty':7} {m['step off']:9.2f} {m['step pty']:8.2f} "
                      f"{m['step pty'] / m['step off']:6.3f} {m['job off']:8.2f} "
                      f"{m['job pty']:7.2f} {m['job pty'] / m['job off']:6.3f}   "
                      f"(this over it: step {m['step on'] / m['step pty']:.3f}, "
                      f"job {m['job on'] / m['job pty']:.3f})")
                continue
            print(f"{name:10} {'this' if key == 'on' else key:7} {m['step off']:9.2f} "
                  f"{m[f'step {key}']:8.2f} {m[f'step {key}'] / m['step off']:6.3f} "
                  f"{m['job off']:8.2f} {m[f'job {key}']:7.2f} "
                  f"{m[f'job {key}'] / m['job off']:6.3f} {100 * m[f'cpu {key}']:8.2f} % (max "
                  f"{100 * max(r[f'cpu {key}']):5.2f} %) {m[f'rss {key}']:6.1f} MiB (max "
                  f"{max(r[f'rss {key}']):.1f}) {m[f'reader {key}']:7.0f} "
                  f"{m[f'worker {key}']:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
