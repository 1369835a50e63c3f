"""Reading through the read service: how long `ls` and `logs JOB` take among many jobs, and
how soon `logs -f` shows what a running job prints.

    .venv/bin/python bench/bench_reader.py store [--jobs 10000] [--lines 100] [--rounds 7]
    sudo .venv/bin/python bench/bench_reader.py follow [--seconds 60]

`store`: an embedded store with JOBS jobs of LINES lines each (one owner in 20 is `lcuser1`,
or `bench-user` where there is no such user) and one job of 10,000 lines of that owner. Times,
in the same run, median of ROUNDS:

- baseline: the same question asked of the store in this process (``query.StoreReader``, the
  store already open): what the data costs;
- service: the question asked by ``ServiceReader`` of the read service, running as deployed
  (`logcapture reader serve`, a process of its own, as root), from a process running as the
  owner (the kernel names the caller; the service filters by owner), and as root (every
  owner's jobs): the socket, the protocol, the owner filter;
- cli: the whole command (`logcapture ls`, `logcapture logs JOB`) as a new process of the
  owner asking the service, and `logcapture --version` (the interpreter and the CLI
  starting) for scale;

and prints each case's ratio to its baseline.

`follow`: starts a dev cluster (its own directory and ports) with its read service, an agent
shipping every second (`logcapture agent --interval 1`, as docs/admin.md suggests for
following), submits a training-like job as `lcuser1` (a burst of 5 log lines every 0.5 s, a
JSON metrics line every 10th, each line carrying the time it was printed) and follows it two
ways at once: `logcapture logs -f JOB` as the job's user through the service, and, as the
baseline, `tail -F` of the job's Slurm output file on the node. Prints the print-to-visible
latency of each (p50, p99, max over every line) and their ratio. Needs root, slurm-wlm and
munge (slurm/ci-setup.sh), and the e2e lock: `flock /tmp/logcapture-e2e.lock ...`.

Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from logcapture import store as S  # noqa: E402
from logcapture.query import StoreReader  # noqa: E402
from logcapture.reader.client import ServiceReader  # noqa: E402

LC = [sys.executable, "-m", "logcapture"]
DEV = REPO / "slurm" / "dev-cluster"
T0 = 1_790_000_000.0


def owner_name() -> str:
    try:
        pwd.getpwnam("lcuser1")
        return "lcuser1"
    except KeyError:
        return "bench-user"


def fill(dsn: str, jobs: int, lines: int, owner: str) -> str:
    """JOBS jobs into the store; returns the big job's run id (10,000 lines, ``owner``'s)."""
    def ndjson(run: str, n: int, t: float) -> bytes:
        out = [json.dumps({"kind": "start", "run": run, "stream": "run", "seq": 0, "ts": t,
                           "command": ["python", "train.py"], "host": "n1",
                           "slurm": {"job_id": run}})]
        out += [json.dumps({"kind": "line", "run": run, "stream": "stdout", "seq": i,
                            "ts": t + i / 100, "text": f"epoch 1 step {i} loss 0.{i:04d}"})
                for i in range(n)]
        out.append(json.dumps({"kind": "end", "run": run, "stream": "run", "seq": 1,
                               "ts": t + n / 100 + 1, "exit_status": 0, "state": "COMPLETED",
                               "duration": n / 100 + 1,
                               "counts": {"stdout": {"lines": n}}}))
        return ("\n".join(out) + "\n").encode()

    big = str(100_000 + jobs)
    with S.open_store(dsn) as st:
        batch: list[tuple[bytes, S.Identity]] = []
        for j in range(jobs + 1):
            run = str(100_000 + j)
            user = owner if j % 20 == 0 or run == big else f"bench{j % 20:02d}"
            n = 10_000 if run == big else lines
            batch.append((ndjson(run, n, T0 + j * 60),
                          S.Identity(run=run, user=user, uid=2000 + j % 20, job_id=run)))
            if len(batch) >= 500:
                st.insert_many(batch)
                batch = []
        if batch:
            st.insert_many(batch)
    return big


def median_ms(fn, rounds: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


# Questions asked of the service from a process of their own, as ``owner`` (its uid is what
# the service sees): the median milliseconds of each.
ASK_AS_OWNER = """
import json, statistics, sys, time
from logcapture.reader.client import ServiceReader
r = ServiceReader(sys.argv[1])
big, rounds = sys.argv[2], int(sys.argv[3])
def ms(fn):
    fn()
    xs = []
    for _ in range(rounds):
        t = time.perf_counter(); fn(); xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1000
print(json.dumps({"runs": len(r.runs()), "ls": ms(r.runs), "logs": ms(lambda: r.lines(big))}))
"""


def as_owner(owner: str) -> list[str]:
    """The command prefix that runs as ``owner`` (nothing when it is not a real user)."""
    try:
        pw = pwd.getpwnam(owner)
    except KeyError:
        return []
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups"]


def bench_store(args: argparse.Namespace) -> int:
    base = Path(tempfile.mkdtemp(prefix="logcapture-bench-reader-", dir="/tmp"))
    base.chmod(0o755)
    owner = owner_name()
    dsn = f"chdb://{base / 'store'}"
    sock = base / "reader.sock"
    service = None
    rows: list[tuple[str, float, float]] = []
    try:
        t = time.perf_counter()
        big = fill(dsn, args.jobs, args.lines, owner)
        print(f"store: {args.jobs + 1} jobs, {args.jobs * args.lines + 10_000} lines, "
              f"filled in {time.perf_counter() - t:.1f}s; owner {owner!r} has "
              f"{args.jobs // 20 + 1} jobs; `logs` reads job {big} (10,000 lines)")
        # The baseline: the questions asked of the open store in this process.
        with S.open_store(dsn) as st:
            @contextmanager
            def held():  # type: ignore[no-untyped-def]
                yield st

            mine, everyone = StoreReader(held, owner), StoreReader(held, None)
            n_mine = len(mine.runs())
            base_ls = median_ms(mine.runs, args.rounds)
            base_all = median_ms(everyone.runs, args.rounds)
            base_logs = median_ms(lambda: mine.lines(big), args.rounds)
        # The service, as deployed: a process of its own (root: the store is root's).
        env = dict(os.environ, LOGCAPTURE_READER_SOCKET=str(sock),
                   LOGCAPTURE_CONFIG="/nonexistent")
        with open(base / "reader.log", "ab") as log:
            service = subprocess.Popen([*LC, "reader", "serve", "--socket", str(sock),
                                        "--store", dsn], env=env, stderr=log)
        while not sock.exists():
            time.sleep(0.05)
        user = as_owner(owner)
        if user:
            got = json.loads(subprocess.run(
                [*user, sys.executable, "-c", ASK_AS_OWNER, str(sock), big, str(args.rounds)],
                env=env, cwd="/", check=True, capture_output=True, text=True).stdout)
            rows.append((f"ls ({got['runs']} jobs of {owner}): service", base_ls, got["ls"]))
            rows.append((f"logs {big} (10,000 lines): service", base_logs, got["logs"]))
        client = ServiceReader(sock)  # root: every owner's jobs
        rows.append((f"ls (all {args.jobs + 1} jobs, as root): service", base_all,
                     median_ms(client.runs, args.rounds)))
        if not user:
            rows.append((f"logs {big} (10,000 lines, as root): service", base_logs,
                         median_ms(lambda: client.lines(big), args.rounds)))
        version = median_ms(lambda: subprocess.run([*user, *LC, "--version"], env=env,
                                                   cwd="/", check=True, capture_output=True),
                            args.rounds)
        for name, cmd, ref in ((f"cli: logcapture ls ({n_mine if user else 'all'} jobs)",
                                ["ls"], base_ls if user else base_all),
                               (f"cli: logcapture logs {big}", ["logs", big], base_logs)):
            rows.append((name, ref, median_ms(lambda c=cmd: subprocess.run(  # type: ignore[misc]
                [*user, *LC, *c], env=env, cwd="/", check=True, capture_output=True),
                args.rounds)))
        rows.append(("cli: logcapture --version (start-up alone)", version, version))
    finally:
        if service is not None:
            service.terminate()
            service.wait(30)
        shutil.rmtree(base, ignore_errors=True)
    print(f"{'case':52} {'baseline ms':>12} {'ms':>9} {'ratio':>7}   (median of "
          f"{args.rounds}; baseline: the question asked of the open store in-process)")
    for name, ref, ms in rows:
        print(f"{name:52} {ref:12.1f} {ms:9.1f} {ms / ref:7.2f}x")
    return 0


TRAINING = r"""import json, sys, time
end = time.time() + {seconds}
step = 0
while time.time() < end:
    for _ in range(5):
        step += 1
        if step % 10 == 0:
            print(json.dumps({{"step": step, "loss": 1.0 / step, "t": time.time()}}), flush=True)
        else:
            print(f"step {{step}} loss {{1.0 / step:.5f}} t={{time.time():.6f}}", flush=True)
    time.sleep(0.5)
print("done", flush=True)
"""


def _printed_at(text: str) -> float | None:
    if text.startswith("step ") and " t=" in text:
        return float(text.rsplit("t=", 1)[1])
    return None


def _collect(proc: subprocess.Popen, out: list[tuple[float, float]]  # type: ignore[type-arg]
             ) -> None:
    """(printed at, shown at) of each step line the process writes."""
    assert proc.stdout is not None
    for line in proc.stdout:
        at = time.time()
        printed = _printed_at(line.strip())
        if printed is not None:
            out.append((printed, at))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def bench_follow(args: argparse.Namespace) -> int:
    if os.geteuid() != 0 or not shutil.which("slurmctld", path="/usr/sbin:/usr/bin"):
        print("bench_reader follow: needs root and slurm-wlm (slurm/ci-setup.sh)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO / "bench"))
    from bench_slurm import free_ports

    base = Path(tempfile.mkdtemp(prefix="logcapture-bench-follow-", dir="/tmp"))
    base.chmod(0o755)
    d = base / "cluster"
    ctld, slurmd = free_ports(2)
    env = dict(os.environ, LOGCAPTURE_DEV_DIR=str(d), LOGCAPTURE_DEV_CTLD_PORT=str(ctld),
               LOGCAPTURE_DEV_SLURMD_PORT=str(slurmd), LOGCAPTURE_DEV_CLUSTER="bench")
    pw = pwd.getpwnam("lcuser1")
    home = Path(pw.pw_dir)
    agent = None
    try:
        subprocess.run([str(DEV), "up"], env=env, check=True, timeout=120)
        for line in subprocess.run([str(DEV), "status", "--env"], env=env, check=True,
                                   capture_output=True, text=True).stdout.splitlines():
            k, _, v = line.removeprefix("export ").partition("=")
            env[k] = v
        with open(d / "log" / "bench-agent.log", "ab") as log:
            agent = subprocess.Popen([env["LOGCAPTURE_BIN"] + "/logcapture", "agent",
                                      "--interval", str(args.agent_interval)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=log)
        optin = home / ".logoptin"
        optin.write_text("")
        os.chown(optin, pw.pw_uid, pw.pw_gid)
        script = home / "bench-train.sh"
        script.write_text("#!/usr/bin/python3\n" + TRAINING.format(seconds=args.seconds))
        os.chown(script, pw.pw_uid, pw.pw_gid)
        out_file = home / "bench-train.out"
        out_file.unlink(missing_ok=True)
        as_user = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
                   "--init-groups", "--reset-env", "env", f"HOME={home}",
                   "PATH=/usr/bin:/bin", "LANG=C.UTF-8", f"SLURM_CONF={env['SLURM_CONF']}",
                   f"LOGCAPTURE_READER_SOCKET={env['LOGCAPTURE_READER_SOCKET']}"]
        job = subprocess.run([*as_user, "sbatch", "--parsable", f"--output={out_file}",
                              str(script)], cwd=home, capture_output=True, text=True,
                             check=True).stdout.strip().split(";")[0]
        tail = subprocess.Popen(["tail", "-n", "+1", "-F", str(out_file)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        while True:  # until the job is in the store (the agent's first batch)
            r = subprocess.run([*as_user, env["LOGCAPTURE_BIN"] + "/logcapture", "show",
                                job], cwd="/", capture_output=True, text=True)
            if r.returncode == 0:
                break
            time.sleep(0.1)
        joined = time.time()
        follow = subprocess.Popen([*as_user, env["LOGCAPTURE_BIN"] + "/logcapture", "logs",
                                   "-f", job], cwd="/", stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        seen_follow: list[tuple[float, float]] = []
        seen_tail: list[tuple[float, float]] = []
        threads = [threading.Thread(target=_collect, args=(follow, seen_follow)),
                   threading.Thread(target=_collect, args=(tail, seen_tail))]
        for t in threads:
            t.start()
        follow.wait(args.seconds + 120)
        time.sleep(1)
        tail.terminate()
        for t in threads:
            t.join(10)
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(60)
        (home / ".logoptin").unlink(missing_ok=True)
        subprocess.run([str(DEV), "down"], env=env, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
    # The follower joined a moment after the job started: the lines printed before were
    # there already (a catch-up, not a latency); both count the lines printed after it joined.
    lat_follow = [at - printed for printed, at in seen_follow if printed >= joined]
    tail_cmp = [at - printed for printed, at in seen_tail if printed >= joined]
    print(f"training-like job, {args.seconds} s, agent --interval {args.agent_interval}: "
          f"{len(lat_follow)} lines followed")
    print(f"{'print-to-visible':40} {'p50 s':>7} {'p99 s':>7} {'max s':>7}")
    for name, lat in (("baseline: tail -F of the output file", tail_cmp),
                      ("logcapture logs -f (read service)", lat_follow)):
        print(f"{name:40} {percentile(lat, 50):7.3f} {percentile(lat, 99):7.3f} "
              f"{max(lat):7.3f}")
    print(f"ratio p50 {percentile(lat_follow, 50) / percentile(tail_cmp, 50):.1f}x, "
          f"p99 {percentile(lat_follow, 99) / percentile(tail_cmp, 99):.1f}x")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("store", help="ls and logs among many jobs")
    s.add_argument("--jobs", type=int, default=10_000)
    s.add_argument("--lines", type=int, default=100)
    s.add_argument("--rounds", type=int, default=7)
    f = sub.add_parser("follow", help="logs -f latency on a dev cluster")
    f.add_argument("--seconds", type=int, default=60)
    f.add_argument("--agent-interval", type=float, default=1.0)
    args = ap.parse_args()
    return bench_store(args) if args.what == "store" else bench_follow(args)


if __name__ == "__main__":
    sys.exit(main())
