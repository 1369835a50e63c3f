"""What logcapture costs a Slurm job: sbatch-to-completion time with and without it.

Starts its own dev cluster (slurm/dev-cluster, free ports, a temporary directory), then
times, from `sbatch` to the job's final state (polled every 20 ms with scontrol, the epilog
included), each case in the same run:

- baseline: logcapture off entirely (a pass-through job_submit.lua, prolog and epilog that
  exit at once): what the cluster costs without logcapture;
- not opted in: logcapture installed, the user has no ~/.logoptin (the wrapper execs the
  script's interpreter; the prolog and epilog run and find nothing to do);
- opted in: the job captured, spooled, and shipped by the epilog (store off: runs stay for
  the agent, so the epilog's shipping time is not counted, as on a cluster with an agent);

for a trivial job (`echo hello`), and for a job printing 1,000,000 lines (`seq 1000000`),
then prints each case's median and its ratio to the baseline.

    sudo .venv/bin/python bench/bench_slurm.py [--runs N] [--lines N]

Needs root, Debian's slurm-wlm and munge (slurm/ci-setup.sh). Never asserts a time.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEV = REPO / "slurm" / "dev-cluster"
USER = "lcuser1"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
NOOP_LUA = "function slurm_job_submit(j, p, u) return slurm.SUCCESS end\n" \
           "function slurm_job_modify(j, r, p, u) return slurm.SUCCESS end\n" \
           "return slurm.SUCCESS\n"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Bench:
    def __init__(self, base: Path):
        self.dir = base / "cluster"
        ctld, slurmd = free_ports(2)
        self.env = dict(os.environ, LOGCAPTURE_DEV_DIR=str(self.dir),
                        LOGCAPTURE_DEV_CTLD_PORT=str(ctld),
                        LOGCAPTURE_DEV_SLURMD_PORT=str(slurmd), LOGCAPTURE_DEV_CLUSTER="bench")
        self.pw = pwd.getpwnam(USER) if self._has_user() else None
        self.saved: dict[Path, bytes] = {}
        self.last_job = ""

    @staticmethod
    def _has_user() -> bool:
        try:
            pwd.getpwnam(USER)
            return True
        except KeyError:
            return False

    def up(self) -> None:
        subprocess.run([str(DEV), "up"], env=self.env, check=True, timeout=120)
        out = subprocess.run([str(DEV), "status", "--env"], env=self.env, check=True,
                             capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            k, _, v = line.removeprefix("export ").partition("=")
            self.env[k] = v
        self.pw = pwd.getpwnam(USER)
        # Runs stay in the spool (for the agent): the epilog does not ship here.
        config = self.dir / "etc" / "config.yaml"
        config.write_text("".join(ln for ln in config.read_text().splitlines(True)
                                  if not ln.startswith("store:")))

    def down(self) -> None:
        subprocess.run([str(DEV), "down"], env=self.env, timeout=60)

    def logcapture_off(self) -> None:
        for path, text in ((self.dir / "etc" / "job_submit.lua", NOOP_LUA),
                           (self.dir / "bin" / "logcapture-prolog", "#!/bin/sh\nexit 0\n"),
                           (self.dir / "bin" / "logcapture-epilog", "#!/bin/sh\nexit 0\n")):
            self.saved[path] = path.read_bytes()
            path.write_text(text)
            if path.suffix != ".lua":
                path.chmod(0o755)
        time.sleep(1.1)  # job_submit.lua is re-read when its mtime changes (1 s resolution)

    def logcapture_on(self) -> None:
        for path, data in self.saved.items():
            path.write_bytes(data)
            os.utime(path)
        self.saved.clear()
        time.sleep(1.1)

    def optin(self, on: bool) -> None:
        path = Path(self.pw.pw_dir) / ".logoptin"
        if on:
            path.write_text("")
            os.chown(path, self.pw.pw_uid, self.pw.pw_gid)
        else:
            path.unlink(missing_ok=True)

    def job_seconds(self, script: str, output: str = "/dev/null") -> float:
        home = Path(self.pw.pw_dir)
        path = home / "bench-job.sh"
        path.write_text(script)
        os.chown(path, self.pw.pw_uid, self.pw.pw_gid)
        t0 = time.perf_counter()
        r = subprocess.run(
            ["setpriv", f"--reuid={self.pw.pw_uid}", f"--regid={self.pw.pw_gid}",
             "--init-groups", "env", f"SLURM_CONF={self.env['SLURM_CONF']}", f"HOME={home}",
             "sbatch", "--parsable", f"--output={output}", str(path)],
            cwd=home, capture_output=True, text=True, check=True, timeout=60)
        job = r.stdout.strip().split(";")[0]
        while True:
            out = subprocess.run(["scontrol", "show", "job", "-o", job], env=self.env,
                                 capture_output=True, text=True, timeout=30).stdout
            state = next((t.split("=", 1)[1] for t in out.split()
                          if t.startswith("JobState=")), "")
            if state in FINAL:
                self.last_job = job
                return time.perf_counter() - t0
            time.sleep(0.02)


def new_bench(name: str) -> Bench | None:
    """A Bench in a new temporary directory others can reach; None (and why) without root
    or Slurm."""
    if os.geteuid() != 0 or not shutil.which("slurmctld", path="/usr/sbin:/usr/bin"):
        print(f"{name}: needs root and slurm-wlm (run slurm/ci-setup.sh)", file=sys.stderr)
        return None
    base = Path(tempfile.mkdtemp(prefix="logcapture-bench-", dir="/tmp"))
    base.chmod(0o755)
    return Bench(base)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="jobs per case for the trivial job")
    ap.add_argument("--lines", type=int, default=1_000_000, help="lines of the big job")
    ap.add_argument("--big-runs", type=int, default=2, help="jobs per case for the big job")
    args = ap.parse_args()
    b = new_bench("bench_slurm")
    if b is None:
        return 2
    base = b.dir.parent
    trivial = "#!/bin/bash\necho hello\n"
    big = f"#!/bin/bash\nseq {args.lines}\n"
    cases = {}
    try:
        b.up()
        b.optin(False)
        b.job_seconds(trivial)  # warm up: first job, caches
        b.logcapture_off()
        cases["trivial: baseline (logcapture off)"] = [b.job_seconds(trivial)
                                                      for _ in range(args.runs)]
        cases[f"{args.lines} lines: baseline"] = [b.job_seconds(big)
                                                   for _ in range(args.big_runs)]
        b.logcapture_on()
        cases["trivial: not opted in"] = [b.job_seconds(trivial) for _ in range(args.runs)]
        b.optin(True)
        cases["trivial: opted in (captured)"] = [b.job_seconds(trivial)
                                                for _ in range(args.runs)]
        cases[f"{args.lines} lines: opted in (captured)"] = [b.job_seconds(big)
                                                              for _ in range(args.big_runs)]
    finally:
        b.optin(False)
        b.down()
        shutil.rmtree(base, ignore_errors=True)

    medians = {k: statistics.median(v) for k, v in cases.items()}
    base_trivial = medians["trivial: baseline (logcapture off)"]
    base_big = medians[f"{args.lines} lines: baseline"]
    print(f"{'case':44} {'median s':>9} {'ratio':>7}   (sbatch to final state, "
          f"{args.runs} trivial / {args.big_runs} big jobs per case)")
    for name, m in medians.items():
        ref = base_big if name.startswith(str(args.lines)) else base_trivial
        print(f"{name:44} {m:9.3f} {m / ref:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
