"""A real Slurm cluster for the end-to-end tests: ``slurm/dev-cluster`` on this machine.

The tests need root (to start slurmctld/slurmd and act as the test users) and Debian's
slurm-wlm and munge (``slurm/ci-setup.sh`` installs them); without either they skip with the
reason. The cluster gets its own directory and ports, so it does not disturb a dev cluster a
person may have running. Jobs are followed by polling ``scontrol`` (``sbatch --wait`` polls
every ~10 s).
"""

from __future__ import annotations

import gzip
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEV_CLUSTER = REPO / "slurm" / "dev-cluster"
USERS = ("lcuser1", "lcuser2")
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
          "RESIZING", "SIGNALING", "STAGE_OUT"}


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (starts slurmctld/slurmd and submits as test users)"
    for binary in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged",
                   "/usr/bin/sbatch"):
        if not os.access(binary, os.X_OK):
            return f"{binary} missing: run slurm/ci-setup.sh (Debian's slurm-wlm and munge)"
    if not (REPO / ".venv" / "bin" / "logcapture-job").exists() and not shutil.which(
            "logcapture-job"):
        return "logcapture-job not installed (pip install -e .)"
    return None


@dataclass
class Job:
    id: str
    user: str
    out: Path


@dataclass
class Cluster:
    dir: Path
    env: dict[str, str]
    submitted: list[Job] = field(default_factory=list)

    @property
    def spool_root(self) -> Path:
        return self.dir / "spool"

    # --- the admin config --------------------------------------------------------------------
    def set_store(self, enabled: bool) -> None:
        """With the store, epilogs ship each job and remove its spool; without, runs stay in
        the spool (for the agent), where most tests read them. Epilogs re-read the config."""
        path = self.dir / "etc" / "config.yaml"
        kept = [ln for ln in path.read_text().splitlines()
                if not ln.startswith(("store:", "#store:"))]
        dsn = self.env["LOGCAPTURE_STORE"]
        kept.append(f"store: {dsn}" if enabled else f"#store: {dsn}")
        path.write_text("\n".join(kept) + "\n")

    def set_sample_interval(self, seconds: float) -> None:
        """The admin config's sample_interval, which each job's node samplers read at start."""
        path = self.dir / "etc" / "config.yaml"
        kept = [ln for ln in path.read_text().splitlines()
                if not ln.startswith("sample_interval:")]
        kept.append(f"sample_interval: {seconds}")
        path.write_text("\n".join(kept) + "\n")

    def set_task_python(self, python: str | None) -> None:
        """The interpreter plugstack.conf gives the task plugin (None: this install's); each
        step's slurmstepd reads plugstack.conf when it starts."""
        path = self.dir / "etc" / "plugstack.conf"
        line = path.read_text().strip()
        assert line.startswith("optional "), f"the task plugin is not installed: {line!r}"
        python = python or self.env["LOGCAPTURE_BIN"] + "/python3"
        path.write_text(line.rsplit(" python=", 1)[0] + f" python={python}\n")

    def set_slurmd_debug(self, level: str | None) -> None:
        """slurmd's log level (slurm.conf SlurmdDebug; None: as the cluster was made), which
        each step's slurmstepd takes from slurmd when it starts."""
        path = self.dir / "etc" / "slurm.conf"
        lines = [ln for ln in path.read_text().splitlines()
                 if not ln.startswith("SlurmdDebug=")]
        path.write_text("\n".join([*lines, f"SlurmdDebug={level or 'info'}"]) + "\n")
        subprocess.run(["scontrol", "reconfigure"], env=self.env, check=True, timeout=60,
                       capture_output=True)

    def task_run_dirs(self, job: Job | str) -> dict[str, Path]:
        """{run id: directory} of the job's task runs (JOB.STEP.RANK), in the job's spool
        directory or, a heterogeneous job's later components', in theirs."""
        job_id = job.id if isinstance(job, Job) else job
        return {p.name: p for p in sorted(self.spool_root.glob(f"*/{job_id}.*.*"))
                if p.is_dir()}

    def samples_dir(self, job: Job | str) -> Path:
        """Where the node sampler of this node spools the job's samples (root's)."""
        job_id = job.id if isinstance(job, Job) else job
        return self.spool_root / ".samples" / job_id / job_id

    def store_query(self, code: str, *args: str) -> str:
        """Run Python ``code`` (with ``store`` open on the cluster's store) in a subprocess: an
        embedded chDB store is held by one process at a time, and epilogs need it too."""
        import sys

        prog = ("import sys, json\nfrom logcapture.store import open_store\n"
                "with open_store(sys.argv[1], must_exist=True, wait=30) as store:\n"
                + "".join(f"    {line}\n" for line in code.splitlines()))
        r = subprocess.run([sys.executable, "-c", prog, self.env["LOGCAPTURE_STORE"], *args],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def root_cli(self, *args: str) -> subprocess.CompletedProcess:
        """``logcapture ARGS --store STORE`` as root. An epilog's helper may hold the embedded
        store (one process at a time) for longer than a command waits for it; the command
        then warns "store not read" and goes on without it: asked again, as a person would."""
        argv = [self.env["LOGCAPTURE_BIN"] + "/logcapture", *args, "--store",
                self.env["LOGCAPTURE_STORE"]]
        deadline = time.monotonic() + 60
        while True:
            r = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=120)
            if "store not read" not in r.stderr or time.monotonic() > deadline:
                return r
            time.sleep(1)

    # --- users -----------------------------------------------------------------------------
    def home(self, user: str) -> Path:
        return Path(pwd.getpwnam(user).pw_dir)

    def optin(self, user: str, text: str | None = "") -> None:
        """Create (text) or remove (None) the user's ~/.logoptin."""
        path = self.home(user) / ".logoptin"
        if text is None:
            path.unlink(missing_ok=True)
            return
        self.write_as(user, path, text)

    def write_as(self, user: str, path: Path, text: str, mode: int = 0o644) -> Path:
        pw = pwd.getpwnam(user)
        path.write_text(text)
        os.chown(path, pw.pw_uid, pw.pw_gid)
        path.chmod(mode)
        return path

    def as_user(self, user: str, argv: list[str], **kw: object) -> subprocess.CompletedProcess:
        """Run argv as ``user`` with a clean login-like environment plus SLURM_CONF."""
        pw = pwd.getpwnam(user)
        env = {"HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "SHELL": "/bin/bash",
               "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "SLURM_CONF": self.env["SLURM_CONF"]}
        kw.setdefault("capture_output", True)
        kw.setdefault("timeout", 60)
        kw.setdefault("text", True)
        return subprocess.run(
            ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
             "--reset-env", "env", *[f"{k}={v}" for k, v in env.items()], *argv],
            cwd=pw.pw_dir, **kw)  # type: ignore[call-overload]

    # --- jobs ------------------------------------------------------------------------------
    def submit(self, user: str, script: str, *sbatch_args: str, name: str = "job") -> Job:
        home = self.home(user)
        # Job ids start at 1 in every new cluster: outputs of an earlier session would pass
        # for this one's.
        mine = {j.out for j in self.submitted}
        for stale in home.glob(f"{name}-*.out"):
            if stale not in mine:
                stale.unlink()
        path = self.write_as(user, home / f"{name}-{len(self.submitted)}.sh", script, 0o755)
        r = self.as_user(user, ["sbatch", "--parsable", f"--output={home}/{name}-%j.out",
                                *sbatch_args, str(path)])
        assert r.returncode == 0, f"sbatch failed: {r.stderr}"
        job_id = r.stdout.strip().split(";")[0]
        job = Job(job_id, user, home / f"{name}-{job_id}.out")
        self.submitted.append(job)
        return job

    def show(self, job_id: str) -> dict[str, str]:
        r = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                           text=True, env=self.env, timeout=30)
        fields: dict[str, str] = {}
        for token in r.stdout.split():
            key, sep, value = token.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def array_tasks(self, array_id: str, count: int, timeout: float = 30.0) -> dict[str, str]:
        """{task id: job id} of an array job, once all ``count`` tasks have their own job."""
        deadline = time.monotonic() + timeout
        while True:
            r = subprocess.run(["scontrol", "show", "job", "-o", array_id], capture_output=True,
                               text=True, env=self.env, timeout=30)
            tasks: dict[str, str] = {}
            for line in r.stdout.splitlines():
                fields = dict(t.partition("=")[::2] for t in line.split() if "=" in t)
                task = fields.get("ArrayTaskId", "")
                if task.isdigit() and fields.get("ArrayJobId") == array_id:
                    tasks[task] = fields["JobId"]
            if len(tasks) == count:
                return tasks
            if time.monotonic() > deadline:
                raise AssertionError(f"array {array_id}: tasks {tasks} after {timeout}s")
            time.sleep(0.2)

    def state(self, job_id: str) -> str:
        return self.show(job_id).get("JobState", "")

    def wait(self, *jobs: Job, timeout: float = 60.0) -> dict[str, tuple[str, str]]:
        """Wait until every job is finished (epilog included); (JobState, ExitCode) each."""
        deadline = time.monotonic() + timeout
        done: dict[str, tuple[str, str]] = {}
        while True:
            for job in jobs:
                if job.id in done:
                    continue
                info = self.show(job.id)
                if info.get("JobState") and info["JobState"] not in ACTIVE:
                    done[job.id] = (info["JobState"], info.get("ExitCode", ""))
            if len(done) == len(jobs):
                return done
            if time.monotonic() > deadline:
                pending = [j.id for j in jobs if j.id not in done]
                raise AssertionError(f"jobs {pending} not finished after {timeout}s")
            time.sleep(0.2)

    def wait_running(self, job: Job, text: str | None = None, timeout: float = 30.0) -> None:
        """Until the job runs (and its output file holds ``text``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state(job.id) == "RUNNING" and (
                    text is None or (job.out.exists() and text in job.out.read_text())):
                return
            time.sleep(0.1)
        raise AssertionError(f"job {job.id} not running with {text!r} after {timeout}s")

    # --- what logcapture left ----------------------------------------------------------------
    def run_dir(self, job: Job | str) -> Path:
        job_id = job.id if isinstance(job, Job) else job
        return self.spool_root / job_id / job_id

    def records(self, job: Job | str, run: str | None = None) -> list[dict]:
        """The records of the job's batch run, or of its run ``run`` (a task run)."""
        from logcapture.spool.reading import iter_run

        path = self.run_dir(job) if run is None else self.task_run_dirs(job)[run]
        return [r.to_dict() for r in iter_run(path)]

    def spool_bytes(self, job: Job | str) -> bytes:
        """Every byte logcapture keeps for the job, decompressed."""
        job_id = job.id if isinstance(job, Job) else job
        data = b""
        for path in sorted((self.spool_root / job_id).rglob("*")):
            if path.is_file() and not path.is_symlink():
                raw = path.read_bytes()
                data += gzip.decompress(raw) if path.name.endswith(".gz") else raw
        return data

    def job_record(self, job: Job | str) -> dict | None:
        job_id = job.id if isinstance(job, Job) else job
        path = self.spool_root / ".jobs" / f"{job_id}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def slurmd_log(self) -> str:
        """slurmd's log, where slurmstepd and SPANK plugins write too."""
        path = self.dir / "log" / "slurmd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def slurm_log(self) -> str:
        path = self.dir / "log" / "logcapture-slurm.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    # Not under pytest's basetemp: that is 0700, and the test users must reach the spool.
    base = Path(tempfile.mkdtemp(prefix="logcapture-e2e-", dir="/tmp"))
    base.chmod(0o755)
    directory = base / "cluster"
    env = dict(os.environ)
    env.update({"LOGCAPTURE_DEV_DIR": str(directory),
                "LOGCAPTURE_DEV_CLUSTER": "e2e",
                # Runs stay in the spool unless a test turns the store on (set_store); a test
                # that wants the agent starts one.
                "LOGCAPTURE_DEV_AGENT": "0"})
    # Free ports of our own: another cluster on this machine (a person's dev cluster, another
    # test session) must never answer our sbatch. A port found free can be taken before the
    # daemons bind it: then the cluster is started again on other ports.
    failures = []
    for _ in range(3):
        ctld_port, slurmd_port, node2_port = _free_ports(3)
        env.update({"LOGCAPTURE_DEV_CTLD_PORT": str(ctld_port),
                    "LOGCAPTURE_DEV_SLURMD_PORT": str(slurmd_port),
                    # a second node, in partition `two` (slurm/dev-cluster, "A second node")
                    "LOGCAPTURE_DEV_NODE2_PORT": str(node2_port)})
        r = subprocess.run([str(DEV_CLUSTER), "up"], env=env, capture_output=True, text=True,
                           timeout=120)
        if r.returncode == 0:
            break
        failures.append(f"ports {ctld_port}, {slurmd_port}, {node2_port}:\n{r.stdout}\n"
                        f"{r.stderr}")
        subprocess.run([str(DEV_CLUSTER), "down"], env=env, capture_output=True, timeout=60)
    else:
        pytest.fail("dev-cluster up failed three times:\n" + "\n".join(failures))
    out = subprocess.run([str(DEV_CLUSTER), "status", "--env"], env=env, capture_output=True,
                         text=True, timeout=30, check=True).stdout
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    for user in USERS:
        Cluster(directory, env).optin(user, None)
    try:
        yield Cluster(directory, env)
    finally:
        subprocess.run([str(DEV_CLUSTER), "down"], env=env, capture_output=True, timeout=60)
        for user in USERS:
            Cluster(directory, env).optin(user, None)
        if not os.environ.get("LOGCAPTURE_E2E_KEEP"):
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def lc(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster, with both test users opted out before and after the test, and runs left
    in the spool (no store for the epilog)."""
    cluster.set_store(False)
    cluster.set_sample_interval(10)
    for user in USERS:
        cluster.optin(user, None)
    yield cluster
    for user in USERS:
        cluster.optin(user, None)
