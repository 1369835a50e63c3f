"""A task capture's CPU without a cluster: ``logcapture slurm task`` started as the SPANK plugin
starts it, on the training-like workload, against ``logcapture run`` of the same workload.

For each round and each Python given (``--python``, this tree's by default, and
``--before-python``), alternating:

- ``task``: a socketpair stands for the plugin's. The task is a Python that takes the pty
  slave(s) the capture sends, puts them on its fds 1 and 2 and execs the workload; the capture
  is ``PY -I -m logcapture slurm task --socket FD ...`` with the environment a task of a
  captured job has (``SLURM_*``, ``LOGCAPTURE_TASKS``, ``LOGCAPTURE_CONFIG`` naming the public
  admin config the prolog writes); once the task has exited, its wait status is sent to the
  capture's status socket as root, as ``slurm_spank_task_exit`` does;
- ``run``: ``PY -I -m logcapture run --no-sample`` of the same workload (a task's capture
  does not sample either), without the Slurm variables.

The task capture's stdout and stderr are two pipes, as slurmstepd gives a task of an srun
step (``--outputs file``: one file for both); ``run`` writes to a file. ``--tasks N`` captures
N tasks at once in each round, as a step's tasks on one node. Printed, medians over the
runs: the capture CPU of the run's End record (``counts.capture``: reader, worker, both) as
milliseconds and as a share of one core over the run's duration, and for a task the CPU of
the whole capture process tree from ``wait4`` (the reader and the worker it reaped, from
exec to exit: the interpreter's start, what comes after the End record, and any child such
as ``scontrol``, which the End record does not count; ``run``'s tree holds the command).
A job id unknown to Slurm and ``SLURM_CONF`` naming no file make the worker's ``scontrol
show job`` fail at once, as it would not on a cluster.

    sudo .venv/bin/python bench/bench_task_capture.py [--rounds N] [--tasks N]
        [--work training|empty] [--python PY] [--before-python PY] [--no-run] [--keep]
        [--outputs pipes|file] [-X importtime]

``--python``/``--before-python``: a Python whose ``-I`` imports the tree to measure (a
virtual environment with the package installed, not in editable mode: an editable install's
import hook costs every start).

Needs root (the status is only taken from root, as slurmstepd is). Never asserts a time.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_runner import TRAINING, load  # noqa: E402

from logcapture.slurm.jobrecords import PUBLIC_CONFIG  # noqa: E402

WORK = {"training": TRAINING.format(json_every=10), "empty": "pass\n"}
JOB = "999990"
# The task: take the slave(s) from the plugin's socket (fd argv[1]), make them fds 1 and 2,
# exec the rest of its arguments.
TASK = ("import os, socket, sys\n"
        "s = socket.socket(fileno=int(sys.argv[1]))\n"
        "_, fds, _, _ = socket.recv_fds(s, 1, 2)\n"
        "s.close()\n"
        "os.dup2(fds[0], 1); os.dup2(fds[-1], 2)\n"
        "for fd in set(fds): os.close(fd)\n"
        "os.execv(sys.argv[2], sys.argv[2:])\n")
def public_config(tmp: Path) -> bytes:
    """The admin config the dev cluster's prolog leaves beside the spool for jobs (its
    slurm/config.yaml.in, public part), which every task's capture reads."""
    from logcapture.config.admin import load_admin
    from logcapture.config.admin import public_config as public

    text = (HERE.parent / "slurm" / "config.yaml.in").read_text()
    for key, value in {"@CLUSTER@": "dev", "@DIR@": "/tmp/logcapture-dev",
                       "@SAMPLE_INTERVAL@": "10"}.items():
        text = text.replace(key, value)
    (tmp / "admin.yaml").write_text(text)
    return public(load_admin(path=tmp / "admin.yaml", env={}))


def slurm_env(home: Path, spool: Path, rank: int) -> dict[str, str]:
    """A task's environment as slurmstepd and the job's wrapper make it (the variables
    logcapture reads, and about as many more as a real task has)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "LOGCAPTURE"))}
    env.update(HOME=str(home), SLURM_CONF="/nonexistent/slurm.conf", SLURM_JOB_ID=JOB,
               SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank),
               SLURM_STEP_NUM_TASKS="4", SLURMD_NODENAME="n1", SLURM_CLUSTER_NAME="dev",
               SLURM_JOB_NAME="bench-job.sh", SLURM_JOB_PARTITION="debug",
               SLURM_JOB_NODELIST="n1", SLURM_CPUS_ON_NODE="4", SLURM_JOB_NUM_NODES="1",
               SLURM_NTASKS="4", SLURM_NPROCS="4", SLURM_NNODES="1", SLURM_NODEID="0",
               SLURM_STEPID="0", SLURM_STEP_NODELIST="n1", SLURM_STEP_NUM_NODES="1",
               SLURM_TASK_PID="1", SLURM_TASKS_PER_NODE="4", SLURM_SUBMIT_DIR=str(home),
               SLURM_SUBMIT_HOST="n1", SLURM_TOPOLOGY_ADDR="n1", SLURM_UMASK="0022",
               SLURM_JOB_UID="0", SLURM_JOB_USER="root", SLURM_JOB_GID="0",
               SLURM_GTIDS="0,1,2,3", SLURM_LAUNCH_NODE_IPADDR="127.0.0.1",
               SLURM_SRUN_COMM_HOST="127.0.0.1", SLURM_SRUN_COMM_PORT="40000",
               SLURM_PRIO_PROCESS="0", SLURM_DISTRIBUTION="cyclic", SLURM_WORKING_CLUSTER=(
                   "dev:127.0.0.1:6817:9728:109"),
               LOGCAPTURE_TASKS=str(spool), LOGCAPTURE_CONFIG=str(home / PUBLIC_CONFIG),
               LOGCAPTURE_RUN_ID=JOB)
    return env


OUTPUTS = "pipes"  # --outputs


def drain_into(fds: tuple[int, ...], path: Path) -> None:
    """Copy what the pipes ``fds`` give to ``path`` until each has ended (slurmstepd's part)."""
    import select

    left = list(fds)
    with open(path, "wb") as out:
        while left:
            for fd in select.select(left, [], [])[0]:
                data = os.read(fd, 65536)
                if data:
                    out.write(data)
                else:
                    os.close(fd)
                    left.remove(fd)


def end_record(run: Path) -> dict:
    from logcapture.spool.reading import iter_run

    ends = [r.to_dict() for r in iter_run(run) if r.kind == "end"]
    assert len(ends) == 1, f"{run}: {len(ends)} end records"
    return ends[0]


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def tree_cpu(ru: object) -> float:
    return ru.ru_utime + ru.ru_stime  # type: ignore[attr-defined]


def one_task(py: list[str], work: Path, tmp: Path, rank: int) -> tuple[dict, float]:
    """Capture one task as the plugin does; (its End record, the capture tree's CPU seconds)."""
    from logcapture.slurm.task import status_address

    spool = tmp / JOB
    spool.mkdir(exist_ok=True)
    env = slurm_env(tmp, spool, rank)
    plugin, theirs = socket.socketpair()
    task_end, task_theirs = socket.socketpair()
    task = subprocess.Popen([py[0], "-I", "-c", TASK, str(task_theirs.fileno()),
                             "/usr/bin/python3", str(work)],
                            pass_fds=(task_theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
    task_theirs.close()
    out = tmp / f"task-{rank}.out"
    if OUTPUTS == "pipes":
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        drain = threading.Thread(target=drain_into, args=((out_r, err_r), out))
        drain.start()
    else:
        out_w = err_w = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    capture = subprocess.Popen(
        [*py, "-I", "-m", "logcapture", "slurm", "task", "--socket", str(theirs.fileno()),
         "--job", JOB, "--step", "0", "--rank", str(rank), "--local-rank", str(rank),
         "--task-pid", str(task.pid), "--", "/usr/bin/python3", str(work)],
        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
        env=env, cwd=tmp)
    for fd in {out_w, err_w}:
        os.close(fd)
    theirs.close()
    plugin.settimeout(60)
    msg, fds, _, _ = socket.recv_fds(plugin, 1, 2)
    assert msg == b"p", msg
    socket.send_fds(task_end, [b"p"], fds)
    for fd in fds:
        os.close(fd)
    task_end.close()
    _, status = os.waitpid(task.pid, 0)
    task.returncode = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        for _ in range(300):
            try:
                s.connect(status_address(JOB, "0", str(rank)))
                break
            except OSError:
                time.sleep(0.01)
        s.sendall(f"{status}\n".encode())
        assert s.recv(16) == b"done\n"
    _, code, ru = os.wait4(capture.pid, 0)
    capture.returncode = 0
    plugin.close()
    if OUTPUTS == "pipes":
        drain.join()
    assert code == 0, code
    return end_record(spool / f"{JOB}.0.{rank}"), tree_cpu(ru)


def one_run(py: list[str], work: Path, tmp: Path, rank: int) -> tuple[dict, float]:
    """``logcapture run --no-sample`` of the workload; (its End record, the tree's CPU)."""
    spool = tmp / "run-spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "LOGCAPTURE"))}
    env["HOME"] = str(tmp)
    with open(tmp / f"run-{rank}.out", "wb") as out:
        p = subprocess.Popen([*py, "-I", "-m", "logcapture", "run", "--spool", str(spool),
                              "--run-id", f"r{rank}", "--no-sample", "--",
                              "/usr/bin/python3", str(work)],
                             stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd=tmp)
        _, code, ru = os.wait4(p.pid, 0)
    p.returncode = 0
    assert code == 0, code
    return end_record(spool / f"r{rank}"), tree_cpu(ru)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=1,
                    help="tasks captured at once in each round, as a step's on one node")
    ap.add_argument("--work", choices=sorted(WORK), default="training")
    ap.add_argument("--python", default=sys.executable, help="this tree's Python")
    ap.add_argument("--before-python", metavar="PY", help="also run another tree's")
    ap.add_argument("--no-run", action="store_true", help="leave out logcapture run")
    ap.add_argument("--keep", action="store_true", help="keep the runs' directory")
    ap.add_argument("--outputs", choices=("pipes", "file"), default="pipes",
                    help="the task capture's stdout and stderr: two pipes, as slurmstepd gives "
                    "a task of an srun step (two ptys then), or one file for both (one pty)")
    ap.add_argument("-X", dest="xoptions", action="append", default=[], metavar="OPTION",
                    help="-X OPTION for the captures' Pythons (importtime: its report goes "
                    "to the output files, with --keep)")
    args = ap.parse_args()
    global OUTPUTS
    OUTPUTS = args.outputs
    if os.geteuid() != 0:
        ap.error("needs root: the capture takes its task's status only from root")
    compileall.compile_dir(str(HERE.parent / "logcapture"), quiet=1)
    pythons = {"this": args.python}
    if args.before_python:
        pythons["before"] = args.before_python
    cases = [(name, kind) for name in pythons for kind in ("task", "run")
             if kind == "task" or not args.no_run]
    got: dict[tuple[str, str], list[tuple[dict, float]]] = {c: [] for c in cases}
    tmp = Path(tempfile.mkdtemp(prefix="bench-task-"))
    try:
        (tmp / ".logoptin").write_text("")
        (tmp / PUBLIC_CONFIG).write_bytes(public_config(tmp))
        work = tmp / "bench-work.py"
        work.write_text(WORK[args.work])
        for i in range(args.rounds):
            for c, (name, kind) in enumerate(cases):
                fn = one_task if kind == "task" else one_run
                py = [pythons[name], *(w for x in args.xoptions for w in ("-X", x))]
                first = (i * len(cases) + c) * args.tasks  # each run a run id of its own
                ranks = range(first, first + args.tasks)
                with ThreadPoolExecutor(args.tasks) as pool:  # a step's tasks start together
                    got[(name, kind)].extend(pool.map(fn, [py] * len(ranks), [work] * len(ranks),
                                                      [tmp] * len(ranks), ranks))
            print(f"round {i + 1}: load {load()}", flush=True)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{'tree':7} {'capture':8} {'reader':>7} {'worker':>7} {'both':>7} {'share':>7} "
          f"{'tree':>7} {'duration':>8}   (ms; share of a core over the run; medians of "
          f"{args.rounds} rounds of {args.tasks}; tree: the processes' CPU from wait4)")
    for (name, kind), rows in got.items():
        ends = [end for end, _ in rows]
        caps = [end["counts"]["capture"] for end in ends]
        share = [c["cpu_ms"] / 1000 / end["duration"] for c, end in zip(caps, ends, strict=True)]
        tree = f"{1000 * median(t for _, t in rows):7.0f}" if kind == "task" else f"{'-':>7}"
        print(f"{name:7} {kind:8} {median(c['reader_cpu_ms'] for c in caps):7.0f} "
              f"{median(c['worker_cpu_ms'] for c in caps):7.0f} "
              f"{median(c['cpu_ms'] for c in caps):7.0f} {100 * median(share):6.2f}% {tree} "
              f"{median(end['duration'] for end in ends):8.2f}")
    if "before" in pythons:
        for kind in ("task", "run"):
            if ("before", kind) in got:
                this, before = (median(end["counts"]["capture"]["cpu_ms"]
                                       for end, _ in got[(name, kind)])
                                for name in ("this", "before"))
                print(f"{kind}: capture CPU this / before {this / before:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
