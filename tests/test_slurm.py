"""Unit tests of logcapture/slurm/: the job wrapper, the prolog and the epilog, without Slurm.

The wrapper runs for real (as a subprocess, on scripts written the way job_submit.lua writes
them); the prolog and epilog run for real on a temporary spool root, as root, for a job of
the ``nobody`` user (they skip when not root: they chown to the job's user). The end-to-end
tests on a real cluster are in tests/e2e/.
"""

from __future__ import annotations

import gzip
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import agent_until_shipped

from logcapture.ownership import trusted_identity
from logcapture.records import End, Line, Sample, Start
from logcapture.sampling.node import (
    NodeJobCollector,
    find_job_cgroup_by_id,
    job_pids_from_environ,
)
from logcapture.slurm import hooks, jobrecords, jobs, nodesampler, rootsafe, wrapper
from logcapture.spool.reading import iter_run
from logcapture.spool.writer import SpoolWriter

REPO = Path(__file__).resolve().parent.parent
LUA = REPO / "slurm" / "job_submit.lua"

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the prolog and epilog "
                               "chown the job's directory to the job's user")


# ------------------------------------------------------------------------------ shebangs


@pytest.mark.parametrize("line, argv", [
    (b"#!/bin/bash", ["/bin/bash"]),
    (b"#!/bin/bash\n", ["/bin/bash"]),
    (b"#! /usr/bin/env python3", ["/usr/bin/env", "python3"]),
    (b"#!/usr/bin/env -S python3 -u  ", ["/usr/bin/env", "-S python3 -u"]),
    (b"#!/bin/sh\t-e", ["/bin/sh", "-e"]),
    (b"#!/bin/bash -l\r\n", ["/bin/bash", "-l"]),
    (b"#!", None),
    (b"#!   ", None),
    (b"echo hi", None),
])
def test_parse_shebang_splits_as_linux_does(line: bytes, argv: list[str] | None) -> None:
    assert wrapper.parse_shebang(line) == argv


def test_script_interpreter_reads_line_two(tmp_path: Path) -> None:
    script = tmp_path / "s"
    script.write_bytes(b"#!/opt/lc/bin/logcapture-job\n#!/usr/bin/python3 -u\nprint(1)\n")
    assert wrapper.script_interpreter(str(script)) == ["/usr/bin/python3", "-u"]
    script.write_bytes(b"#!/opt/lc/bin/logcapture-job\necho no shebang\n")
    assert wrapper.script_interpreter(str(script)) == ["/bin/sh"]
    assert wrapper.script_interpreter(str(tmp_path / "missing")) == ["/bin/sh"]


def test_wrapper_options_stop_at_the_script() -> None:
    assert wrapper._wrapper_args(["--spool-root=/s", "/x/script", "--spool-root=/t"]) == (
        {"spool-root": "/s"}, ["/x/script", "--spool-root=/t"])
    assert wrapper._wrapper_args(["--other=1", "a"]) == ({}, ["--other=1", "a"])
    assert wrapper._wrapper_args([]) == ({}, [])


def test_optin_exists_in_any_form(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert not wrapper.optin_exists(env)
    (tmp_path / ".logoptin").symlink_to(tmp_path / "nowhere")
    assert wrapper.optin_exists(env)  # a dangling symlink opts in (then falls back to disabled)
    assert wrapper.optin_exists({"LOGCAPTURE_OPTIN": str(tmp_path / ".logoptin")})
    assert not wrapper.optin_exists({"LOGCAPTURE_OPTIN": str(tmp_path / "other")})


def test_run_id_for_requeued_jobs() -> None:
    assert jobs.run_id_for({"SLURM_JOB_ID": "12"}) == "12"
    assert jobs.run_id_for({"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "0"}) == "12"
    assert jobs.run_id_for({"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "2"}) == "12.2"
    assert jobs.run_id_for({}) is None


# ------------------------------------------------------------------------------ the wrapper


def _wrapped(tmp_path: Path, body: str, interpreter: str = "/bin/bash") -> Path:
    """A batch script as slurmd runs it after job_submit.lua: the wrapper line, then the
    script's own."""
    script = tmp_path / "slurm_script"
    script.write_text(f"#!/opt/logcapture/bin/logcapture-job\n#!{interpreter}\n{body}")
    script.chmod(0o755)
    return script


def _job_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "home"),
           "LANG": "C.UTF-8", "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "home").mkdir(exist_ok=True)
    env.update(extra)
    return env


def _run_wrapper(args: list[str], env: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
    code = "import sys; from logcapture.slurm.wrapper import job_main; sys.exit(job_main())"
    return subprocess.run([sys.executable, *flags, "-c", code, *args], env=env,
                          capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def test_without_logoptin_the_script_runs_as_the_kernel_would_run_it(tmp_path: Path) -> None:
    script = _wrapped(tmp_path, 'echo "argv0=$0 args=$*"\n[ -t 1 ] && echo tty || echo no-tty\n'
                                "env | grep -c '^LOGCAPTURE' || true\nexit 3\n")
    env = _job_env(tmp_path)
    r = _run_wrapper(["--spool-root=/nonexistent", str(script), "a b", "c"], env)
    assert r.returncode == 3
    assert r.stdout.decode().splitlines() == [f"argv0={script} args=a b c", "no-tty", "0"]
    assert r.stderr == b""
    assert not (tmp_path / "state").exists()  # no file anywhere


def test_without_logoptin_nothing_heavy_is_imported_before_the_exec(tmp_path: Path) -> None:
    script = _wrapped(tmp_path, "true\n")
    r = _run_wrapper([str(script)], _job_env(tmp_path), "-X", "importtime")
    imported = {line.split("|")[-1].strip() for line in r.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert "logcapture.slurm.wrapper" in imported
    for heavy in ("click", "yaml", "logcapture.pipeline", "logcapture.config", "pyte",
                  "json", "subprocess"):
        assert heavy not in imported, heavy


def test_without_logoptin_a_signal_death_is_the_scripts(tmp_path: Path) -> None:
    script = _wrapped(tmp_path, "kill -USR1 $$\n")
    r = _run_wrapper([str(script)], _job_env(tmp_path))
    assert r.returncode == -10


def test_a_missing_interpreter_fails_like_the_kernel(tmp_path: Path) -> None:
    script = _wrapped(tmp_path, "true\n", interpreter="/no/such/interpreter")
    r = _run_wrapper([str(script)], _job_env(tmp_path))
    assert r.returncode == 127 and b"/no/such/interpreter" in r.stderr
    (tmp_path / "file").write_text("")  # a path through a file: not found either
    script = _wrapped(tmp_path, "true\n", interpreter=str(tmp_path / "file" / "sh"))
    r = _run_wrapper([str(script)], _job_env(tmp_path))
    assert r.returncode == 127 and b"Not a directory" in r.stderr


def test_with_logoptin_the_job_is_captured_into_its_job_directory(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    (root / "77").mkdir(parents=True, mode=0o700)
    script = _wrapped(tmp_path, 'echo "run $LOGCAPTURE_RUN_ID"\necho oops >&2\nexit 5\n')
    env = _job_env(tmp_path, SLURM_JOB_ID="77", SLURM_CLUSTER_NAME="c1",
                   SLURMD_NODENAME="n1", LOGCAPTURE_FLUSH_INTERVAL="0.1")
    (tmp_path / "home" / ".logoptin").write_text("mode: enabled\n")
    r = _run_wrapper([f"--spool-root={root}", str(script)], env)
    assert r.returncode == 5, r.stderr
    assert r.stdout == b"run 77\n" and r.stderr == b"oops\n"
    records = list(iter_run(root / "77" / "77"))
    assert isinstance(records[0], Start) and records[0].slurm["cluster"] == "c1"
    assert [x.text for x in records if isinstance(x, Line)] == ["run 77", "oops"]
    assert isinstance(records[-1], End) and records[-1].exit_status == 5


def test_with_logoptin_the_wrapper_captures_without_the_cli(tmp_path: Path) -> None:
    # Every captured job pays the wrapper's start-up: click and the CLI are not part of it.
    root = tmp_path / "spool"
    (root / "79").mkdir(parents=True, mode=0o700)
    script = _wrapped(tmp_path, "echo captured\n")
    env = _job_env(tmp_path, SLURM_JOB_ID="79", LOGCAPTURE_FLUSH_INTERVAL="0.1")
    (tmp_path / "home" / ".logoptin").write_text("mode: enabled\n")
    r = _run_wrapper([f"--spool-root={root}", str(script)], env, "-X", "importtime")
    assert r.returncode == 0 and r.stdout == b"captured\n", r.stderr
    imported = {line.split("|")[-1].strip() for line in r.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert "logcapture.pipeline" in imported
    assert "click" not in imported and "logcapture.cli" not in imported
    assert [x.text for x in iter_run(root / "79" / "79") if isinstance(x, Line)] == ["captured"]


def test_with_logoptin_but_no_job_directory_capture_falls_back_to_the_users_spool(
        tmp_path: Path) -> None:
    script = _wrapped(tmp_path, "echo hello\n")
    env = _job_env(tmp_path, SLURM_JOB_ID="78", LOGCAPTURE_FLUSH_INTERVAL="0.1")
    (tmp_path / "home" / ".logoptin").write_text("")
    r = _run_wrapper([f"--spool-root={tmp_path / 'nope'}", str(script)], env)
    assert r.returncode == 0 and r.stdout == b"hello\n"
    assert b"spool directory" in r.stderr and b"missing" in r.stderr
    fallback = tmp_path / "state" / "logcapture" / "spool" / "78"
    assert [x.text for x in iter_run(fallback) if isinstance(x, Line)] == ["hello"]


def test_wrapper_usage_without_a_script() -> None:
    assert wrapper.job_main([]) == 2


# ------------------------------------------------------------------------------ job_submit.lua


def _lua() -> str:
    for name in ("lua5.1", "lua5.3", "lua5.4", "lua"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no lua interpreter (apt-get install lua5.1)")


LUA_HARNESS = r"""
slurm = {SUCCESS = 0, ERROR = -1, log_error = function(...) end, log_info = function(...) end}
dofile(arg[1])
local function show(s) if s == nil then return "<nil>" end return s end
local job = {script = "#!/bin/bash\necho hi\n"}
slurm_job_submit(job, {}, 1000)
io.write("once=", show(job.script), "|")
slurm_job_submit(job, {}, 1000)
io.write("twice=", show(job.script), "|")
local alloc = {}
slurm_job_submit(alloc, {}, 1000)
io.write("alloc=", show(alloc.script), "|")
local noshebang = {script = "echo hi\n"}
slurm_job_submit(noshebang, {}, 1000)
io.write("plain=", show(noshebang.script), "|")
"""


def test_job_submit_lua_wraps_batch_scripts_once_and_leaves_allocations(tmp_path: Path) -> None:
    lua = _lua()
    harness = tmp_path / "harness.lua"
    harness.write_text(LUA_HARNESS)
    r = subprocess.run([lua, str(harness), str(LUA)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    parts = dict(p.split("=", 1) for p in r.stdout.split("|") if p)
    header = "#!/usr/bin/env -S /opt/logcapture/bin/python3 -I /opt/logcapture/bin/logcapture-job\n"
    assert parts["once"] == header + "#!/bin/bash\necho hi\n"
    assert parts["twice"] == parts["once"]
    assert parts["alloc"] == "<nil>"
    assert parts["plain"] == "echo hi\n"


def test_job_submit_lua_line_is_what_dev_cluster_rewrites() -> None:
    text = LUA.read_text()
    assert text.count("\nlocal LOGCAPTURE_JOB_LINE = ") == 1
    assert "s|^local LOGCAPTURE_JOB_LINE = .*|" in (REPO / "slurm" / "dev-cluster").read_text()


# ------------------------------------------------------------------------------ prolog / epilog


NOBODY = pwd.getpwnam("nobody")


def _hook_env(root: Path, job_id: str = "4242", store: bool = False,
              **extra: str) -> dict[str, str]:
    config = root.parent / "config.yaml"
    config.write_text(f"spool_root: {root}\ncluster: unit\n"
                      + (f"store: chdb://{root.parent / 'store'}\n" if store else ""))
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_USER": "nobody",
           "SLURM_JOB_UID": str(NOBODY.pw_uid), "SLURM_JOB_GID": str(NOBODY.pw_gid),
           "SLURM_JOB_PARTITION": "debug", "SLURM_NODELIST": "n[1-2]",
           "SLURMD_NODENAME": "n1", "SLURM_CLUSTER_NAME": "unit",
           "LOGCAPTURE_CONFIG": str(config)}
    env.update(extra)
    return env


def _captured_run(root: Path, job_id: str, exit_status: int | None = 0,
                  signal: int | None = None) -> Path:
    """What the wrapper leaves: <root>/<job>/<job>/seg-*.ndjson.gz owned by the job's user."""
    run_dir = root / job_id / job_id
    run_dir.mkdir(mode=0o700)
    w = SpoolWriter(run_dir, flush_interval=0.05, fsync=False)
    w.write([Start(run=job_id, stream="run", seq=0, ts=1.0),
             Line(run=job_id, stream="stdout", seq=0, ts=1.0, text="hello"),
             End(run=job_id, stream="run", seq=1, ts=2.0, exit_status=exit_status,
                 signal=signal, state="SIGNALED" if signal else "COMPLETED", duration=1.0)])
    w.close()
    for path in [run_dir, *run_dir.iterdir()]:
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    return run_dir


@pytest.fixture
def root(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    return tmp_path / "spool"


@root_only
def test_prolog_makes_the_users_job_directory_and_a_trusted_record(root: Path) -> None:
    env = _hook_env(root, store=True, SLURM_ARRAY_JOB_ID="4240", SLURM_ARRAY_TASK_ID="2")
    assert hooks.prolog(env, now=123.0) == []
    st = (root / "4242").stat()
    assert (st.st_uid, st.st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert stat.S_IMODE(st.st_mode) == 0o700
    rec_path = root / ".jobs" / "4242.json"
    assert rec_path.stat().st_uid == 0 and stat.S_IMODE(rec_path.stat().st_mode) == 0o600
    assert stat.S_IMODE((root / ".jobs").stat().st_mode) == 0o700
    rec = json.loads(rec_path.read_text())
    assert rec["user"] == "nobody" and rec["uid"] == NOBODY.pw_uid and rec["start"] == 123.0
    assert (rec["array_job_id"], rec["array_task_id"]) == ("4240", "2")
    assert rec["partition"] == "debug" and rec["nodes"] == "n[1-2]"
    assert jobrecords.read_job_record(str(root), "4242") == rec
    public = (root / PUBLIC).read_text()
    assert "spool_root" in public and "chdb" not in public and "store" not in public
    assert stat.S_IMODE((root / PUBLIC).stat().st_mode) == 0o644
    # Idempotent: a second prolog (requeue) keeps the directory.
    assert hooks.prolog(env) == [f"job directory {root}/4242 already existed (requeue?): kept"]
    # The public config left unreadable to jobs by hand, its bytes unchanged: written anew.
    (root / PUBLIC).chmod(0o600)
    hooks.prolog(env)
    assert stat.S_IMODE((root / PUBLIC).stat().st_mode) == 0o644
    assert (root / PUBLIC).read_text() == public
    os.chown(root / PUBLIC, NOBODY.pw_uid, NOBODY.pw_gid)  # another's, its bytes the same
    hooks.prolog(env)
    assert (root / PUBLIC).stat().st_uid == 0 and (root / PUBLIC).read_text() == public


PUBLIC = jobrecords.PUBLIC_CONFIG


@root_only
def test_prolog_refuses_a_spool_root_others_can_write(root: Path) -> None:
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    assert hooks._hook_main("prolog", _hook_env(root)) == 1
    assert not (root / "4242").exists()


def test_hooks_never_raise_outside_slurm(capsys: pytest.CaptureFixture[str]) -> None:
    assert hooks._hook_main("epilog", {}) == 1
    assert "SLURM_JOB_ID" in capsys.readouterr().err


@root_only
def test_epilog_records_the_wrappers_exit_status_and_slurms_state(root: Path) -> None:
    env = _hook_env(root, SLURM_JOB_EXIT_CODE2="0:0")
    hooks.prolog(env)
    _captured_run(root, "4242", exit_status=None, signal=15)
    messages = hooks.epilog(env, now=200.0, state_of=lambda j: {"JobState": "CANCELLED"})
    assert messages == [f"run(s) 4242 left in {root}/4242 for the agent (no store configured)"]
    rec = jobrecords.read_job_record(str(root), "4242")
    assert rec is not None
    assert (rec["exit_status"], rec["signal"], rec["wrapper_state"]) == (None, 15, "SIGNALED")
    assert rec["slurm_state"] == "CANCELLED" and rec["slurm_exit_code"] == "0:0"
    assert rec["end"] == 200.0 and rec["user"] == "nobody"
    assert (root / "4242" / "4242").is_dir()  # left for the agent


@root_only
def test_epilog_of_a_job_that_captured_nothing_leaves_nothing(root: Path) -> None:
    env = _hook_env(root)
    hooks.prolog(env)
    assert hooks.epilog(env, state_of=lambda j: {}) == []
    assert not (root / "4242").exists() and not (root / ".jobs" / "4242.json").exists()


@root_only
def test_epilog_takes_array_ids_from_slurm(root: Path) -> None:
    env = _hook_env(root)
    hooks.prolog(env)
    _captured_run(root, "4242")
    hooks.epilog(env, state_of=lambda j: {"JobState": "COMPLETED", "ArrayJobId": "4240",
                                          "ArrayTaskId": "3"})
    rec = jobrecords.read_job_record(str(root), "4242")
    assert rec is not None and (rec["array_job_id"], rec["array_task_id"]) == ("4240", "3")


@root_only
def test_planted_symlinks_fifos_and_huge_files_gain_nothing(root: Path, tmp_path: Path) -> None:
    env = _hook_env(root)
    hooks.prolog(env)
    run_dir = _captured_run(root, "4242", exit_status=7)
    secret = tmp_path / "secret"
    secret.write_text('{"kind":"end","run":"4242","stream":"run","seq":9,"ts":1,'
                      '"exit_status":99}\nTOP-SECRET\n')
    secret.chmod(0o600)
    os.symlink(secret, run_dir / "seg-999999.ndjson")
    os.symlink("/etc/shadow", run_dir / "seg-999998.ndjson.gz")
    os.mkfifo(run_dir / "seg-999997.ndjson")
    with open(run_dir / "seg-999996.ndjson", "wb") as f:
        f.truncate(rootsafe.MAX_SEGMENT_BYTES + 1)
    hard = run_dir / "seg-999995.ndjson"
    try:
        os.link(secret, hard)  # root-owned: refused by owner
    except OSError:
        pass
    other = tmp_path / "other-user-spool"
    other.mkdir()
    os.symlink(other, root / "4242" / "4242.1")
    for path in run_dir.iterdir():
        if not path.is_symlink():
            os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid) if path.name != hard.name else None
    messages = hooks.epilog(env, state_of=lambda j: {"JobState": "FAILED"})
    rec = jobrecords.read_job_record(str(root), "4242")
    assert rec is not None and rec["exit_status"] == 7 and rec["runs"] == ["4242"]
    assert not any("SECRET" in m or "99" in m for m in messages)
    assert secret.exists() and other.exists()
    # Removing the job (after shipping) does not follow the plants either.
    jobrecords._remove_job(os.open(root, os.O_RDONLY), "4242")
    assert not (root / "4242").exists() and secret.read_text().endswith("TOP-SECRET\n")
    assert other.is_dir()



def test_removing_a_job_retries_when_the_agent_adds_a_file_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The agent may create its cursor lock in a run directory while rmtree empties it: rmdir
    # then fails with ENOTEMPTY; the epilog goes again instead of leaking the job.
    import errno
    import shutil

    root = tmp_path / "root"
    (root / "4243" / "4243").mkdir(parents=True)
    (root / "4243" / "4243" / "seg-000000.ndjson").write_text("")
    real = shutil.rmtree
    calls: list[str] = []

    def racing(path: str, *args: object, **kw: object) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOTEMPTY, "Directory not empty")
        real(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(shutil, "rmtree", racing)
    jobrecords._remove_job(os.open(root, os.O_RDONLY), "4243")
    assert len(calls) == 2 and not (root / "4243").exists()

QUERY = """
import json, sys
from logcapture.store import open_store
with open_store(sys.argv[1], must_exist=True) as s:
    print(json.dumps({"runs": s.runs(), "lines": [r.get("text") for r in s.records("4242")
                                                 if r.get("kind") == "line"]}))
"""


@root_only
def test_epilog_ships_with_the_trusted_identity_and_removes_the_spool(root: Path) -> None:
    env = _hook_env(root, store=True)
    hooks.prolog(env)
    run_dir = _captured_run(root, "4242", exit_status=0)
    # The user's Start record claims to be someone else: the rows must not believe it.
    forged = run_dir / "seg-000001.ndjson"
    forged.write_text(json.dumps({"kind": "line", "run": "4242", "stream": "stdout", "seq": 1,
                                  "ts": 1.5, "text": "second"}) + "\n")
    os.chown(forged, NOBODY.pw_uid, NOBODY.pw_gid)
    r = subprocess.run([sys.executable, "-m", "logcapture.slurm", "epilog"], env={
        **os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "shipped run(s) 4242 and removed the job's spool" in r.stderr
    assert not (root / "4242").exists() and not (root / ".jobs" / "4242.json").exists()
    q = subprocess.run([sys.executable, "-c", QUERY, f"chdb://{root.parent / 'store'}"],
                       capture_output=True, text=True, timeout=120)
    assert q.returncode == 0, q.stderr
    found = json.loads(q.stdout.strip().splitlines()[-1])
    assert [(x["run"], x["owner"], x["uid"], x["job_id"]) for x in found["runs"]] == [
        ("4242", "nobody", NOBODY.pw_uid, "4242")]
    assert found["lines"] == ["hello", "second"]


@root_only
def test_epilog_of_a_later_component_keeps_and_ships_the_first_components_task_runs(
        root: Path) -> None:
    """A heterogeneous job's component 1 (job 4243 to Slurm) on a node of its own: its tasks'
    runs are named after the job (4242.0.R) in 4243's directory (slurm.task.job_spool)."""
    env = _hook_env(root, job_id="4243", SLURM_HET_JOB_ID="4242")
    hooks.prolog(env)
    assert jobrecords.read_job_record(str(root), "4243")["het_job_id"] == "4242"
    for run in ("4242.0.1", "4244.0.0"):  # the job's task, and one not of this job
        run_dir = root / "4243" / run
        run_dir.mkdir(mode=0o700)
        w = SpoolWriter(run_dir, flush_interval=0.05, fsync=False)
        w.write([Start(run=run, stream="run", seq=0, ts=1.0),
                 Line(run=run, stream="stdout", seq=0, ts=1.0, text="task line")])
        w.close()
        for path in [run_dir, *run_dir.iterdir()]:
            os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    messages = hooks.epilog(env, state_of=lambda j: {})
    assert messages == [f"samples left in {root}/.samples/4243 and task run(s) in "
                        f"{root}/4243 for the agent (no store configured)"]
    assert (root / "4243" / "4242.0.1").is_dir()  # not removed with the directory
    names = ["4242.0.1", "4244.0.0", "4241.0.0", "4243.0.0", "4243.1.0.2", "x.0.0"]
    assert jobrecords._task_run_dirs(names, "4243", "4242") == [
        "4242.0.1", "4243.0.0", "4243.1.0.2"]
    assert jobrecords._task_run_dirs(names, "4243") == ["4243.0.0", "4243.1.0.2"]
    # and the rows of what is in 4243's directory are job 4242's
    ident = trusted_identity(root / "4243" / "4242.0.1")
    assert (ident.job_id, ident.uid, ident.run) == ("4242", NOBODY.pw_uid, "4242.0.1")


@root_only
def test_epilog_reads_and_ships_nothing_of_a_hard_link_and_says_so(root: Path,
                                                                    tmp_path: Path) -> None:
    """Hard links in the job's run directory (made here by root for the user: a link is the
    same file whoever makes it; tests/test_ship.py has the user make them): one to a root
    file, one more name of a file of the user's own. Neither is read for the End record nor
    shipped; the epilog's log names each, and root's file is as it was."""
    env = _hook_env(root, store=True)
    hooks.prolog(env)
    run_dir = _captured_run(root, "4242", exit_status=0)

    def end_and_line(status: int, text: str) -> bytes:
        return (json.dumps({"kind": "line", "run": "4242", "stream": "stdout", "seq": 50,
                            "ts": 1.5, "text": text}) + "\n" + json.dumps({
            "kind": "end", "run": "4242", "stream": "run", "seq": 9, "ts": 3.0,
            "exit_status": status}) + "\n").encode()

    secret = tmp_path / "secret"
    secret.write_bytes(end_and_line(99, "TOP-SECRET"))
    secret.chmod(0o600)
    os.link(secret, run_dir / "seg-000001.ndjson")
    own = run_dir / "seg-000002.ndjson"
    own.write_bytes(end_and_line(98, "TWICE"))
    os.chown(own, NOBODY.pw_uid, NOBODY.pw_gid)
    os.link(own, root / "4242" / "elsewhere")
    r = subprocess.run([sys.executable, "-m", "logcapture.slurm", "epilog"], env={
        **os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rec = jobrecords.read_job_record(str(root), "4242")
    assert rec is not None and rec["exit_status"] == 0  # the wrapper's End, not a planted one
    assert (f"refused {run_dir / 'seg-000001.ndjson'}: owned by uid 0, not by the directory's "
            f"owner (uid {NOBODY.pw_uid}); 2 links (a hard link): not shipped") in r.stderr
    assert f"refused {own}: 2 links (a hard link): not shipped" in r.stderr
    assert "left in" in r.stderr and "TOP-SECRET" not in r.stderr  # for the agent, as is
    assert secret.read_bytes() == end_and_line(99, "TOP-SECRET")
    assert (secret.stat().st_uid, stat.S_IMODE(secret.stat().st_mode)) == (0, 0o600)
    q = subprocess.run([sys.executable, "-c", QUERY, f"chdb://{root.parent / 'store'}"],
                       capture_output=True, text=True, timeout=120)
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout.strip().splitlines()[-1])["lines"] == ["hello"]


def test_epilog_removes_the_spool_of_a_run_the_agent_shipped_first(root: Path) -> None:
    # The agent tails the spool root and may ship the job's run before the epilog gets to it
    # (the epilog first waits for the node sampler). The run is in the store: the epilog
    # removes the spool all the same (it used to see "already uploaded", exit 2, and leave
    # the spool behind for an agent that was done with it).
    from logcapture import ship

    env = _hook_env(root, store=True)
    hooks.prolog(env)
    run_dir = _captured_run(root, "4242", exit_status=0)
    first = ship.upload(run_dir.parent, run="4242", dsn=f"chdb://{root.parent / 'store'}",
                        retention_days=None)
    assert first.exit_code == 0 and first.runs == ["4242"], first
    r = subprocess.run([sys.executable, "-m", "logcapture.slurm", "epilog"], env={
        **os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "removed the job's spool" in r.stderr, r.stderr
    assert not (root / "4242").exists() and not (root / ".jobs" / "4242.json").exists()


# Runs Python with the system spool root (the documented /var/spool/logcapture) set to argv[1].
AT_SYSTEM_ROOT = "import sys, logcapture.spool.layout as s; s.SYSTEM_ROOT = sys.argv.pop(1); "


@root_only
def test_with_no_spool_root_configured_the_agent_ships_what_prolog_and_wrapper_spooled(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An admin config without ``spool_root``: the prolog, the job wrapper (no --spool-root)
    and root's agent (no --spool) all take the default system spool root, here ``root`` in
    each of their processes, and the agent ships the job; the agent's own per-user spool
    ($LOGCAPTURE_SPOOL unset, $XDG_STATE_HOME) stays unread."""
    from logcapture.spool import layout

    monkeypatch.setattr(layout, "SYSTEM_ROOT", str(root))
    env = _hook_env(root)
    config = tmp_path / "no-spool-root.yaml"
    config.write_text("cluster: unit\n")
    env = {**env, "LOGCAPTURE_CONFIG": str(config), "SLURM_JOB_USER": "root",
           "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0"}  # a job of the user the test runs as
    hooks.prolog(env, optin=lambda uid: False)
    assert (root / "4242").is_dir()

    script = _wrapped(tmp_path, "echo from the job\n")
    job_env = _job_env(tmp_path, SLURM_JOB_ID="4242", LOGCAPTURE_FLUSH_INTERVAL="0.1")
    (tmp_path / "home" / ".logoptin").write_text("")
    r = subprocess.run([sys.executable, "-c", AT_SYSTEM_ROOT + "from logcapture.slurm.wrapper "
                        "import job_main; sys.exit(job_main())", str(root), str(script)],
                       env=job_env, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and r.stdout == b"from the job\n", r.stderr
    run_dir = root / "4242" / "4242"
    assert [x.text for x in iter_run(run_dir) if isinstance(x, Line)] == ["from the job"]

    dsn = f"chdb://{tmp_path / 'store'}"
    agent_env = {k: v for k, v in os.environ.items() if not k.startswith("LOGCAPTURE_")}
    agent_env.update(LOGCAPTURE_STORE=dsn, LOGCAPTURE_CONFIG=str(config),
                     XDG_STATE_HOME=str(tmp_path / "state"))
    code, first, err = agent_until_shipped(
        [sys.executable, "-c", AT_SYSTEM_ROOT + "from logcapture.cli import main; main()",
         str(root), "agent", "--interval", "0.1", "--keep"], agent_env, run_dir)
    assert first == f"logcapture: agent shipping {root} to {dsn}\n"
    assert code == 0, err
    q = subprocess.run([sys.executable, "-c", QUERY, dsn], capture_output=True, text=True,
                       timeout=120)
    assert q.returncode == 0, q.stderr
    found = json.loads(q.stdout.strip().splitlines()[-1])
    assert [(x["run"], x["owner"], x["job_id"]) for x in found["runs"]] == [
        ("4242", "root", "4242")]
    assert found["lines"] == ["from the job"]
    assert not (tmp_path / "state" / "logcapture" / "spool").exists()


def test_read_end_bounds_and_validates(tmp_path: Path) -> None:
    uid = os.getuid()
    run = tmp_path / "9"
    run.mkdir()
    good = {"kind": "end", "run": "9", "stream": "run", "seq": 3, "ts": 1.0,
            "exit_status": 2, "signal": None, "state": "FAILED", "duration": 1.5}
    payload = b"x" * 100 + b"\n" + json.dumps(good).encode() + b"\n"
    (run / "seg-000000.ndjson.gz").write_bytes(gzip.compress(payload))
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        assert rootsafe.read_end(fd, "9", uid) == {"exit_status": 2, "signal": None,
                                                "state": "FAILED", "duration": 1.5}
        assert rootsafe.read_end(fd, "9", uid + 1) is None  # not the job user's
        bad = dict(good, exit_status=999)
        (run / "seg-000001.ndjson").write_bytes(json.dumps(bad).encode() + b"\n")
        assert rootsafe.read_end(fd, "9", uid)["exit_status"] == 2  # invalid End skipped
        (run / "seg-000002.ndjson").write_bytes(json.dumps(dict(good, run="8")).encode()
                                                + b"\n")
        assert rootsafe.read_end(fd, "9", uid)["exit_status"] == 2  # another run's End
    finally:
        os.close(fd)
    assert rootsafe._valid_end({"kind": "end", "run": "9", "state": "<script>"}, "9") == {
        "exit_status": None, "signal": None, "state": "", "duration": None}
    assert rootsafe._valid_end({"kind": "end", "run": "9", "signal": True}, "9") is None


def test_a_gzip_bomb_is_read_only_up_to_the_bound(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rootsafe, "MAX_DECOMPRESSED_BYTES", 4 << 20)
    path = tmp_path / "bomb.gz"
    with gzip.open(path, "wb") as f:
        for _ in range(64):
            f.write(b"\0" * (1 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        tail = rootsafe._tail(fd, path.stat().st_size, compressed=True)
    finally:
        os.close(fd)
    assert len(tail) <= rootsafe.MAX_END_LINE_BYTES


# ------------------------------------------------------------------------------ scripts


@pytest.mark.parametrize("script", ["prolog/logcapture-prolog", "epilog/logcapture-epilog"])
def test_thin_scripts_always_exit_0_and_log_the_job_id(tmp_path: Path, script: str) -> None:
    text = (REPO / script).read_text()
    log = tmp_path / "log"
    text = text.replace("\nLOGCAPTURE=/opt/logcapture/bin/logcapture\n",
                        f"\nLOGCAPTURE={tmp_path / 'fake'}\n")
    text = text.replace("\nLOG_FILE=\n", f"\nLOG_FILE={log}\n")
    fake = tmp_path / "fake"
    fake.write_text("#!/bin/sh\necho \"called with $*\"\nexit 1\n")
    fake.chmod(0o755)
    copy = tmp_path / "script"
    copy.write_text(text)
    copy.chmod(0o755)
    r = subprocess.run([str(copy)], env={"SLURM_JOB_ID": "31", "SLURM_ARRAY_JOB_ID": "30",
                                         "SLURM_ARRAY_TASK_ID": "1"},
                       capture_output=True, timeout=60)
    assert r.returncode == 0
    which = "prolog" if "prolog" in script else "epilog"
    assert f"job 31 (array 30_1): called with slurm {which}" in log.read_text()
    fake.unlink()
    r = subprocess.run([str(copy)], env={"SLURM_JOB_ID": "32"}, capture_output=True,
                       timeout=60)
    assert r.returncode == 0 and "job 32: " in log.read_text() and "missing" in log.read_text()


def test_dev_cluster_script_is_valid_bash_and_reports_when_down(tmp_path: Path) -> None:
    dev = REPO / "slurm" / "dev-cluster"
    assert subprocess.run(["bash", "-n", str(dev)], timeout=30).returncode == 0
    r = subprocess.run([str(dev), "status"], env={**os.environ,
                                                  "LOGCAPTURE_DEV_DIR": str(tmp_path / "x")},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 3 and "down" in r.stdout
    r = subprocess.run([str(dev), "bogus"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "usage" in r.stderr


@pytest.mark.parametrize("name", ["config.yaml.example", "config.yaml.in"])
def test_shipped_admin_configs_are_valid(tmp_path: Path, name: str) -> None:
    from logcapture.config.admin import load_admin

    text = (REPO / "slurm" / name).read_text().replace("@DIR@", "/tmp/x").replace(
        "@CLUSTER@", "dev").replace("@SAMPLE_INTERVAL@", "10")
    path = tmp_path / "config.yaml"
    path.write_text(text)
    admin = load_admin(path, env={})
    assert admin.spool_root and admin.store and admin.cluster


# ------------------------------------------------------------------------------ node sampler

def _cgroup(path: Path, procs: str = "", usage_ns: int | None = None,
            usage_usec: int | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "cgroup.procs").write_text(procs)
    if usage_ns is not None:
        (path / "cpuacct.usage").write_text(f"{usage_ns}\n")
    if usage_usec is not None:
        (path / "cpu.stat").write_text(f"usage_usec {usage_usec}\nuser_usec 0\n")
    return path


def test_the_job_cgroup_is_found_by_id_in_slurm_2205_layouts(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    freezer = _cgroup(v1 / "freezer" / "slurm_n1" / "uid_1001" / "job_7")
    assert find_job_cgroup_by_id("7", 1001, v1) == freezer
    # cpuacct (which counts CPU time) wins over hierarchies that only list processes
    cpuacct = _cgroup(v1 / "cpu,cpuacct" / "slurm" / "uid_1001" / "job_7", usage_ns=1)
    assert find_job_cgroup_by_id("7", 1001, v1) == cpuacct
    assert find_job_cgroup_by_id("7", None, v1) == cpuacct
    assert find_job_cgroup_by_id("7", 1002, v1) is None  # another user's uid_ directory
    assert find_job_cgroup_by_id("70", 1001, v1) is None
    assert find_job_cgroup_by_id("../7", 1001, v1) is None
    # cgroup v2: <slurmd's cgroup>/slurmstepd.scope/job_<id>, on a pure or hybrid host
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu memory pids\n")
    job = _cgroup(v2 / "system.slice" / "slurmstepd.scope" / "job_7", usage_usec=5)
    assert find_job_cgroup_by_id("7", 1001, v2) == job
    hybrid = tmp_path / "hybrid"
    (hybrid / "unified").mkdir(parents=True)
    (hybrid / "unified" / "cgroup.controllers").write_text("")
    job = _cgroup(hybrid / "unified" / "slurmstepd.scope" / "job_7")
    assert find_job_cgroup_by_id("7", 1001, hybrid) == job
    assert find_job_cgroup_by_id("7", 1001, tmp_path / "missing") is None


def test_without_a_cgroup_the_jobs_processes_are_found_by_their_environment(
        tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, environ in ((10, b"A=1\0SLURM_JOB_ID=7\0"), (11, b"SLURM_JOB_ID=7\0B=2\0"),
                         (12, b"SLURM_JOB_ID=70\0"), (13, b"X=SLURM_JOB_ID=7\0"),
                         (14, b"")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "environ").write_bytes(environ)
    (proc / "self").mkdir()
    assert job_pids_from_environ("7", os.getuid(), proc) == [10, 11]
    assert job_pids_from_environ("7", os.getuid() + 1, proc) == []  # other users' processes


def test_the_node_collector_keeps_the_cgroups_last_cpu_reading_when_it_vanishes(
        tmp_path: Path) -> None:
    cg = _cgroup(tmp_path / "cpuacct" / "slurm" / "uid_1001" / "job_7", usage_ns=1_500_000_000)
    t = [0.0]
    c = NodeJobCollector("7", 1001, cgroup_root=tmp_path, proc_root=tmp_path / "proc",
                         clock=lambda: t[0], cpus_allocated=2)
    first = c.collect()
    assert first["cpu_seconds_total"] == 1.5 and first["processes"] == 0
    (cg / "cpuacct.usage").write_text("2500000000\n")
    c.poll_cpu()  # between two samples
    shutil.rmtree(tmp_path / "cpuacct")  # slurmd removes the job's cgroup
    t[0] = 1.0
    last = c.collect()
    assert last["cpu_seconds_total"] == 2.5 and last["cpu_percent"] == pytest.approx(100.0)
    assert c.ended


def test_a_cgroup_that_appears_after_the_sampler_started_is_picked_up(tmp_path: Path) -> None:
    c = NodeJobCollector("7", 1001, cgroup_root=tmp_path, proc_root=tmp_path / "proc")
    assert c.collect()["processes"] == 0 and c.cgroup_path is None and not c.ended
    _cgroup(tmp_path / "freezer" / "slurm" / "uid_1001" / "job_7" / "step_batch",
            procs=f"{os.getpid()}\n")
    (tmp_path / "freezer" / "slurm" / "uid_1001" / "job_7" / "cgroup.procs").write_text("")
    out = c.collect()
    assert c.cgroup_path == tmp_path / "freezer" / "slurm" / "uid_1001" / "job_7"
    assert out["processes"] == 1 and c.pids() == [os.getpid()]


def _samples(run_dir: Path) -> list[Sample]:
    return [r for r in iter_run(run_dir) if isinstance(r, Sample)] if run_dir.exists() else []


def _wait_for_samples(run_dir: Path, enough: Callable[[list[Sample]], bool]) -> None:
    """Until the samples on disk are ``enough`` (a sampler thread on a loaded machine may take
    its time)."""
    deadline = time.monotonic() + 20
    while not enough(_samples(run_dir)):
        assert time.monotonic() < deadline, _samples(run_dir)
        time.sleep(0.05)


@root_only
def test_node_sampler_samples_the_jobs_cgroup_and_gpus_until_stopped(
        root: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from fakenvml import FakeGPU, FakeNVML

    env = _hook_env(root, SLURM_JOB_GPUS="1", LOGCAPTURE_SAMPLE_INTERVAL="0.05")
    hooks.prolog(env, optin=lambda uid: False)
    job = subprocess.Popen(["sleep", "30"])  # stands in for the job's process
    request.addfinalizer(lambda: (job.kill(), job.wait()))
    cgroups = tmp_path / "cgroup"
    cg = _cgroup(cgroups / "cpuacct" / "slurm" / f"uid_{NOBODY.pw_uid}" / "job_4242",
                 procs=f"{job.pid}\n", usage_ns=3_000_000_000)
    nvml = FakeNVML([FakeGPU("GPU-aaaa", minor=0), FakeGPU("GPU-bbbb", minor=1,
                                                           processes=[(job.pid, 1 << 30)])])
    stop = threading.Event()
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(nodesampler.node_sampler(
        env, "4242", stop=stop, cgroup_root=str(cgroups), nvml=nvml)))
    t.start()
    run_dir = root / jobrecords.SAMPLES_DIR / "4242" / "4242"
    _wait_for_samples(run_dir, lambda got: len(got) >= 2)
    (cg / "cpuacct.usage").write_text("4000000000\n")
    _wait_for_samples(run_dir, lambda got: got[-1].job["cpu_seconds_total"] == 4.0)
    stop.set()
    t.join(10)
    assert codes == [0]
    samples = _samples(run_dir)
    assert len(samples) >= 3
    assert {s.stream for s in samples} == {"sample:n1"} and {s.run for s in samples} == {"4242"}
    assert [s.seq for s in samples] == list(range(len(samples)))
    assert samples[0].job["cpu_seconds_total"] == 3.0
    assert samples[-1].job["cpu_seconds_total"] == 4.0
    assert samples[-1].job["processes"] == 1
    # only the job's GPU (SLURM_JOB_GPUS=1 -> minor 1), with the job's own GPU memory
    assert [g["uuid"] for g in samples[-1].gpus] == ["GPU-bbbb"]
    assert samples[-1].gpus[0]["job_memory_used_bytes"] == 1 << 30
    # root's spool, not the user's
    for path in (root / jobrecords.SAMPLES_DIR, run_dir.parent, run_dir):
        st = path.stat()
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
    assert not any((root / "4242").iterdir())


@root_only
def test_node_sampler_stops_by_itself_when_the_jobs_cgroup_is_gone(
        root: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    env = _hook_env(root, LOGCAPTURE_SAMPLE_INTERVAL="0.05")
    hooks.prolog(env, optin=lambda uid: False)
    job = subprocess.Popen(["sleep", "30"])  # stands in for the job's process
    request.addfinalizer(lambda: (job.kill(), job.wait()))
    cgroups = tmp_path / "cgroup"
    _cgroup(cgroups / "cpuacct" / "slurm" / f"uid_{NOBODY.pw_uid}" / "job_4242",
            procs=f"{job.pid}\n", usage_ns=2_000_000_000)
    t = threading.Thread(target=nodesampler.node_sampler, args=(env, "4242"),
                         kwargs={"cgroup_root": str(cgroups)})
    t.start()
    _wait_for_samples(root / jobrecords.SAMPLES_DIR / "4242" / "4242", bool)
    shutil.rmtree(cgroups / "cpuacct")
    t.join(10)
    assert not t.is_alive()
    samples = _samples(root / jobrecords.SAMPLES_DIR / "4242" / "4242")
    assert samples[-1].job["cpu_seconds_total"] == 2.0
    # the sample taken on the way out, after the job's cgroup went, is not a sample of it
    assert all(s.job["processes"] == 1 for s in samples)


def test_the_prologs_optin_rule_is_logoptin_in_the_passwd_home_in_any_form(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    uid = os.getuid()
    assert not hooks.optin_for_uid(uid, home=str(home))
    (home / ".logoptin").write_text("mode: enabled\n")
    assert hooks.optin_for_uid(uid, home=str(home))
    (home / ".logoptin").unlink()
    (home / ".logoptin").symlink_to("/etc/passwd")  # refused, but it opts in (as the wrapper)
    assert hooks.optin_for_uid(uid, home=str(home))
    assert not hooks.optin_for_uid(uid, home=str(tmp_path / "missing"))


@root_only
@pytest.mark.parametrize("job_id, het", [("4242", ""), ("4243", "4242")])
def test_prolog_starts_a_detached_node_sampler_and_epilog_stops_and_cleans_it(
        root: Path, request: pytest.FixtureRequest, job_id: str, het: str) -> None:
    """Also for a heterogeneous job's later component (job 4243 to Slurm): its samples are
    the first component's job's run's (4242), whose node figures they give."""
    env = _hook_env(root, job_id, LOGCAPTURE_SAMPLE_INTERVAL="0.1",
                    **({"SLURM_HET_JOB_ID": het} if het else {}))
    # the job's process: the sampler finds it by its user and SLURM_JOB_ID (no cgroup here)
    job = subprocess.Popen(["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}",
                            "--clear-groups", "sleep", "60"],
                           env={"SLURM_JOB_ID": job_id, "PATH": "/usr/bin:/bin"})
    request.addfinalizer(lambda: (job.kill(), job.wait()))
    messages = hooks.prolog(env, optin=lambda uid: True)
    assert len(messages) == 1 and messages[0].startswith("node sampler started (pid ")
    pidfile = root / jobrecords.SAMPLERS_DIR / f"{job_id}.pid"
    st = pidfile.stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o644  # the wrapper reads it
    assert stat.S_IMODE((root / jobrecords.SAMPLERS_DIR).stat().st_mode) == 0o755
    pid = int(pidfile.read_text().split()[0])
    try:
        assert os.getsid(pid) == pid  # its own session: the prolog script does not wait
        assert nodesampler.node_sampler_running(str(root), job_id)
        assert not nodesampler.node_sampler_running(str(root), "4244")
        # a copy of the trusted record, for an agent shipping .samples
        record = jobrecords.read_job_record(str(root / jobrecords.SAMPLES_DIR), job_id)
        assert record["user"] == "nobody"
        run_dir = root / jobrecords.SAMPLES_DIR / job_id / (het or job_id)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not _spooled(run_dir):
            time.sleep(0.1)
        # A second prolog (a retry) does not start a second sampler.
        assert hooks.prolog(env, optin=lambda uid: True)[-1] == (
            f"node sampler already running (pid {pid})")
        # No run of the wrapper on this node (not the batch node): the samples alone are
        # left for the agent, the user's empty directory goes.
        messages = hooks.epilog(env, state_of=lambda j: {})
        assert messages == [f"samples left in {root}/.samples/{job_id} for the agent "
                            "(no store configured)"]
        assert not nodesampler._sampler_alive(pid, nodesampler._proc_start_time(pid)[0] if
                                        nodesampler._proc_start_time(pid) else 0, job_id)
        assert not pidfile.exists() and not (root / job_id).exists()
        samples = _samples(run_dir)
        assert samples and samples[-1].node == "n1" and samples[-1].run == "4242"
        if het:  # stored as job 4242's
            assert trusted_identity(run_dir).job_id == "4242"
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def _spooled(run_dir: Path) -> bool:
    try:
        return bool(_samples(run_dir))
    except Exception:  # noqa: BLE001 - not there yet
        return False


@root_only
def test_epilog_never_signals_a_process_that_is_not_the_jobs_sampler(root: Path) -> None:
    env = _hook_env(root)
    hooks.prolog(env, optin=lambda uid: False)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (root / jobrecords.SAMPLERS_DIR).mkdir(mode=0o755)
        start = nodesampler._proc_start_time(other.pid)
        assert start is not None
        pidfile = root / jobrecords.SAMPLERS_DIR / "4242.pid"
        for content in (f"{other.pid} {start[0]}\n",  # not a sampler
                        f"{other.pid} {start[0] + 1}\n", "junk\n"):  # recycled pid; garbage
            pidfile.write_text(content)
            assert not nodesampler.node_sampler_running(str(root), "4242")
            hooks.prolog(env, optin=lambda uid: False)
            hooks.epilog(env, state_of=lambda j: {}, sampler_wait=0.2)
            assert other.poll() is None and not pidfile.exists()
    finally:
        other.kill()
        other.wait()


@root_only
def test_the_wrapper_does_not_sample_a_node_the_prologs_sampler_samples(
        root: Path, tmp_path: Path) -> None:
    (root / "77").mkdir(parents=True, mode=0o700)
    (root / jobrecords.SAMPLERS_DIR).mkdir(mode=0o755)
    root.chmod(0o755)
    script = _wrapped(tmp_path, "echo hi\n")
    env = _job_env(tmp_path, SLURM_JOB_ID="77", SLURMD_NODENAME="n1",
                   LOGCAPTURE_FLUSH_INTERVAL="0.1")
    (tmp_path / "home" / ".logoptin").write_text("")
    # Stands in for `logcapture slurm sampler --job 77` (root's, that command line).
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "slurm",
                             "sampler", "--job", "77"])
    try:
        info = nodesampler._proc_start_time(fake.pid)
        assert info is not None
        (root / jobrecords.SAMPLERS_DIR / "77.pid").write_text(f"{fake.pid} {info[0]}\n")
        r = _run_wrapper([f"--spool-root={root}", str(script)], env)
        assert r.returncode == 0, r.stderr
        records = list(iter_run(root / "77" / "77"))
        assert not [x for x in records if isinstance(x, Sample)]
        assert isinstance(records[0], Start) and records[0].inventory.get("cpus")
    finally:
        fake.kill()
        fake.wait()
    # Without a running node sampler the wrapper samples its node itself (while the job
    # runs: a moment with no process of the job gives no sample).
    shutil.rmtree(root / "77" / "77")
    script = _wrapped(tmp_path, "sleep 0.6\n")
    r = _run_wrapper([f"--spool-root={root}", str(script)],
                     {**env, "LOGCAPTURE_SAMPLE_INTERVAL": "0.1"})
    assert r.returncode == 0, r.stderr
    samples = [x for x in iter_run(root / "77" / "77") if isinstance(x, Sample)]
    assert samples and all(x.job["processes"] >= 1 for x in samples)


# --- a task of a job step (slurm.task, started by the SPANK plugin) --------------------------
def test_a_task_run_is_named_after_its_job_run_step_and_rank() -> None:
    from logcapture.slurm import task

    assert task.task_run_id("42", "0", "3") == "42.0.3"
    assert task.task_run_id("42.1", "2", "0") == "42.1.2.0"
    ident = task.task_identity({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n7",
                                "SLURM_STEP_ID": "9"}, "0", "3", "1")
    assert ident == {"job_id": "42", "node": "n7", "step": "0", "rank": "3", "local_rank": "1"}
    ident = task.task_identity({"SLURM_JOB_ID": "42", "SLURM_STEP_NUM_TASKS": "4"}, "0", "3",
                               "1")
    assert ident["step_tasks"] == "4"  # a step's section title names it (rankview.step_title)
    ident = task.task_identity({"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "2,3"}, "0", "3",
                               "1")
    assert ident["cuda_visible_devices"] == "2,3"  # the GPUs Slurm gave the task
    assert task.status_address("42", "0", "3") == b"\0logcapture/task/42.0.3"


def test_a_task_of_a_heterogeneous_step_is_named_after_its_rank_across_components() -> None:
    """``srun --het-group=0,1``: each component is a job of its own (ids 42 and 43) whose
    task ids count from 0; SLURM_PROCID, which Slurm sets for the task, counts across them."""
    from logcapture.slurm import task

    env = {"SLURM_JOB_ID": "42", "SLURM_HET_SIZE": "2", "SLURM_JOB_ID_HET_GROUP_0": "42",
           "SLURM_JOB_ID_HET_GROUP_1": "43", "SLURM_PROCID": "2", "SLURMD_NODENAME": "n2"}
    assert task.global_rank(env, "1") == "2"  # the second task of component 1
    assert task.global_rank({"SLURM_PROCID": "x"}, "1") == "1"
    assert task.global_rank({}, "3") == "3"
    assert task.task_identity(env, "0", "2", "1", "43") == {
        "job_id": "42", "node": "n2", "step": "0", "rank": "2", "local_rank": "1",
        "het_group": "1"}
    assert task.het_group(env, "42") == "0" and task.het_group(env, "44") is None
    assert task.het_group({"SLURM_JOB_ID": "42"}, "42") is None  # no heterogeneous job
    assert "het_group" not in task.task_identity({"SLURM_JOB_ID": "42"}, "0", "0", "0", "42")


def test_a_task_captures_only_into_a_job_spool_of_its_user(tmp_path: Path) -> None:
    from logcapture.slurm import task

    mine = tmp_path / "42"
    mine.mkdir()
    assert task.job_spool({"LOGCAPTURE_TASKS": str(mine)}) == mine
    assert task.job_spool({}) is None
    assert task.job_spool({"LOGCAPTURE_TASKS": "relative/42"}) is None
    assert task.job_spool({"LOGCAPTURE_TASKS": str(tmp_path / "missing")}) is None
    (tmp_path / "link").symlink_to(mine)
    assert task.job_spool({"LOGCAPTURE_TASKS": str(tmp_path / "link")}) is None


def test_a_later_components_task_captures_into_its_components_directory(
        tmp_path: Path) -> None:
    """Each component of a heterogeneous job is a job to Slurm: on a node of component 1 alone
    the prolog made <spool_root>/43, not the /42 the batch script's wrapper exported."""
    from logcapture.slurm import task

    env = {"LOGCAPTURE_TASKS": str(tmp_path / "42"), "SLURM_JOB_ID": "42"}
    assert task.job_spool(env, "43") is None  # neither directory
    (tmp_path / "43").mkdir()
    assert task.job_spool(env, "43") == tmp_path / "43"
    (tmp_path / "42").mkdir()  # a node of both components: each its own
    assert task.job_spool(env, "43") == tmp_path / "43"
    assert task.job_spool(env, "42") == task.job_spool(env) == tmp_path / "42"
    (tmp_path / "43").rmdir()
    (tmp_path / "43").symlink_to(tmp_path / "42")  # not the prolog's: the job's own then
    assert task.job_spool(env, "43") == tmp_path / "42"
    assert task.job_spool(env, "../x") == tmp_path / "42"


@pytest.mark.skipif(os.geteuid() != 0, reason="slurmstepd's status comes from root")
def test_the_status_listener_takes_the_wait_status_from_root_and_answers_when_done() -> None:
    import socket

    from logcapture.runner.spawn import Attached
    from logcapture.slurm import task

    attached = Attached(os.getpid())
    address = task.status_address("999999", "0", str(os.getpid()))
    listener = task.StatusListener(address, attached)
    previous = signal.signal(signal.SIGCHLD, lambda s, f: None)  # set_status wakes the reader
    try:
        listener.start()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as plugin:
            plugin.connect(address)
            plugin.sendall(b"768\n")  # exit status 3, as waitpid gives it
            listener.thread.join(5)
            assert attached.poll() == 3
            listener.done()
            assert plugin.recv(16) == b"done\n"
            # Then end of file only as the capture process exits (here: its fd closed).
            plugin.settimeout(0.2)
            with pytest.raises(TimeoutError):
                plugin.recv(16)
            os.close(listener.held)
            plugin.settimeout(5)
            assert plugin.recv(16) == b""
    finally:
        signal.signal(signal.SIGCHLD, previous)
