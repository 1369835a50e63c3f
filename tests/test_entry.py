"""``logcapture run`` parsed without click (logcapture/entry.py) decides exactly what click's
``run`` would, and leaves to click everything else."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logcapture.cli import cli
from logcapture.entry import parse_run, parse_task
from logcapture.spool.reading import iter_run

WORDS = ["run", "--spool", "--spool=/tmp/s", "/tmp/x", "--run-id", "r1", "--run-id=r2",
         "--run-id=", "--mode", "enabled", "metadata", "disabled", "bogus", "--mode=disabled",
         "--mode=Enabled", "--sample", "--no-sample", "--sample=1", "--", "-", "-h", "--help",
         "--spoo", "--foo", "-x", "--version", "echo", "hi", "-n", "", "--mode=", "=", "ls"]


def click_parse(args: list[str]) -> dict | None:
    """What click passes to ``cli.run`` for ``logcapture ARGS``, or None if click answers
    with help, an error or another command."""
    if not args or args[0] != "run":
        return None
    run = cli.commands["run"]
    try:
        ctx = run.make_context("run", list(args[1:]), parent=click.Context(cli))
    except (click.exceptions.Exit, click.ClickException):
        return None
    return dict(ctx.params)


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=7).map(lambda w: ["run", *w]))
def test_parse_run_accepts_only_what_click_parses_the_same(args: list[str]) -> None:
    ours = parse_run(args)
    if ours is not None:
        assert ours == click_parse(args), args


@pytest.mark.parametrize("args, want", [
    (["run", "--", "echo", "hi"], dict(command=("echo", "hi"))),
    (["run", "echo", "--spool", "x"], dict(command=("echo", "--spool", "x"))),
    (["run", "--spool", "/s", "--run-id=a.b", "--mode", "metadata", "--no-sample", "--",
      "-x"], dict(spool=Path("/s"), run_id="a.b", mode="metadata", sample=False,
                  command=("-x",))),
    (["run", "--sample", "--no-sample", "--sample", "true"], dict(command=("true",))),
    (["run", "--run-id", "a", "--run-id", "b", "true"], dict(run_id="b", command=("true",))),
])
def test_parse_run_plain_command_lines(args: list[str], want: dict) -> None:
    full = dict(spool=None, run_id=None, mode=None, sample=True) | want
    assert parse_run(args) == full == click_parse(args)


@pytest.mark.parametrize("args", [
    [], ["ls"], ["run"], ["run", "--"], ["run", "--help"], ["run", "-h", "true"],
    ["run", "--mode", "bogus", "true"], ["run", "--spool"], ["run", "--spool=", "true"],
    ["run", "--spoo", "x", "true"], ["run", "--foo", "true"], ["--version"],
    ["run", "--run-id", "--mode", "true"],
])
def test_parse_run_leaves_the_rest_to_click(args: list[str]) -> None:
    assert parse_run(args) is None


def test_logcapture_run_starts_without_click(tmp_path: Path) -> None:
    """The console script's plain ``run`` never imports click or the CLI module, nor typing or
    dataclasses; help and errors still come from click."""
    env = dict(os.environ, HOME=str(tmp_path), XDG_STATE_HOME=str(tmp_path / "state"))
    spool = tmp_path / "spool"
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "logcapture", "run",
                        "--spool", str(spool), "--run-id", "e1", "--", "sh", "-c",
                        "echo out; exit 3"], capture_output=True, env=env, timeout=60)
    assert r.returncode == 3 and r.stdout == b"out\n", r
    imported = {line.split("|")[-1].strip() for line in r.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert "logcapture.pipeline" in imported
    assert "click" not in imported and "logcapture.cli" not in imported
    # Neither process (the wrapper, the forked capture worker: both log here) imports typing
    # or dataclasses (inspect): ~25-35 ms of CPU at every start (records.py).
    assert not imported & {"typing", "dataclasses", "inspect"}, imported
    # The closed segment is compressed with ISA-L: the standard library's gzip (~0.7 ms) is
    # only its fallback (spool.layout.gzip_compress).
    assert "gzip" not in imported or importlib.util.find_spec("isal") is None
    assert [x.text for x in iter_run(spool / "e1") if x.kind == "line"] == ["out"]

    r = subprocess.run([sys.executable, "-m", "logcapture", "run", "--mode", "loud", "true"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "Invalid value for '--mode'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "logcapture", "run", "--help"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "Run COMMAND under a pseudo-terminal" in r.stdout


def test_out_of_file_descriptors_the_command_still_runs(tmp_path: Path) -> None:
    """With too few file descriptors for the ptys, the wake-up pipe or the spawn, capture
    gives way: the command runs without it, with its own exit status."""
    import resource

    env = dict(os.environ, HOME=str(tmp_path), XDG_STATE_HOME=str(tmp_path / "state"),
               LOGCAPTURE_CONFIG="/nonexistent")
    warned = 0
    for limit in range(6, 20):
        r = subprocess.run(
            [sys.executable, "-m", "logcapture", "run", "--spool", str(tmp_path / "spool"),
             "--", "sh", "-c", "echo hi; exit 3"], capture_output=True, env=env, timeout=60,
            preexec_fn=lambda n=limit: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)))
        assert r.returncode == 3 and r.stdout == b"hi\n", (limit, r)
        warned += b"capture disabled for this run, the command runs normally" in r.stderr
    assert warned, "no limit was low enough to make capture give way"
    # a run whose capture gave way leaves no empty run directory behind; the others are whole
    for run_dir in (tmp_path / "spool").iterdir():
        records = list(iter_run(run_dir))
        assert records and records[0].kind == "start" and records[-1].kind == "end", run_dir


def test_an_error_in_the_fast_path_is_one_line_and_an_exit_code(tmp_path: Path) -> None:
    """``logcapture run`` without click reports errors as the click CLI does."""
    code = ("import sys\n"
            "from logcapture import capture, entry\n"
            "from logcapture.errors import LogcaptureError\n"
            "def boom(**kw):\n"
            "    raise {exc}\n"
            "capture.run_command = boom\n"
            "entry.main(['run', '--', 'true'])\n")
    for exc, rc, said in [
            ("LogcaptureError('the spool is on fire')", 2,
             "logcapture: error: the spool is on fire\n"),
            ("OSError(24, 'Too many open files', '/x')", 2,
             "logcapture: error: Too many open files: /x\n"),
            ("KeyboardInterrupt()", 130, "logcapture: aborted\n")]:
        r = subprocess.run([sys.executable, "-c", code.format(exc=exc)], capture_output=True,
                           text=True, timeout=60)
        assert (r.returncode, r.stderr) == (rc, said), (exc, r)


# ``logcapture slurm task``, as the task plugin (slurm/spank/logcapture_task.c) starts it.
TASK_WORDS = ["--socket", "3", "--socket=4", "x", "--step", "0", "--step=", "--rank", "1",
              "--job", "--job=12",
              "--rank=-1", "--local-rank", "--local-rank=0", "--task-pid", "123", "--task-pid=7",
              "٣", "--", "-", "-h", "--help", "--sock", "python3", "-c", "", "=", "+5", "07"]


def click_task(args: list[str]) -> dict | None:
    """What click passes to ``slurm_task`` for ``logcapture ARGS``, or None if click answers
    with help or an error."""
    task = cli.commands["slurm"].commands["task"]  # type: ignore[attr-defined]
    try:
        ctx = task.make_context("task", list(args[2:]), parent=click.Context(cli))
    except (click.exceptions.Exit, click.ClickException):
        return None
    return dict(ctx.params)


PLUGIN_ARGV = ["slurm", "task", "--socket", "3", "--job", "77", "--step", "0", "--rank", "5",
               "--local-rank", "1", "--task-pid", "4242", "--", "python3", "-c", "print(1)"]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(TASK_WORDS), max_size=12).map(lambda w: ["slurm", "task", *w]))
def test_parse_task_accepts_only_what_click_parses_the_same(args: list[str]) -> None:
    ours = parse_task(args)
    if ours is not None:
        assert ours == click_task(args), args


@settings(max_examples=500, deadline=None)
@given(st.permutations([["--socket", "3"], ["--step=2"], ["--rank", "17"], ["--local-rank=1"],
                        ["--task-pid", "99"]]),
       st.lists(st.sampled_from(["python3", "-c", "--", "x", "--rank"]), max_size=4))
def test_parse_task_takes_the_options_in_any_order(options: list[list[str]],
                                                   command: list[str]) -> None:
    args = ["slurm", "task", *(w for o in options for w in o), "--", *command]
    assert parse_task(args) == click_task(args) == dict(
        sock_fd=3, step="2", rank="17", local_rank="1", task_pid=99, job="",
        command=tuple(command))


def test_parse_task_reads_the_plugins_command_line_and_leaves_the_rest_to_click() -> None:
    assert parse_task(PLUGIN_ARGV) == click_task(PLUGIN_ARGV) == dict(
        sock_fd=3, job="77", step="0", rank="5", local_rank="1", task_pid=4242,
        command=("python3", "-c", "print(1)"))
    assert parse_task(PLUGIN_ARGV[:12] + PLUGIN_ARGV[14:]) is None  # no --task-pid
    assert parse_task(["slurm", "task", "--help"]) is None
    assert parse_task(["slurm", "prolog"]) is None
    assert parse_task(["run", *PLUGIN_ARGV[2:]]) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="the task's status comes from root (slurmstepd)")
@pytest.mark.parametrize("wait_status", [9, 3 << 8])  # killed by SIGKILL; exited with 3
def test_logcapture_slurm_task_starts_without_click(tmp_path: Path, wait_status: int) -> None:
    """The plugin's ``logcapture slurm task`` never imports click, the CLI or psutil (it does
    not sample; its worker included, as its imports go to the same stderr), nor subprocess
    unless a signal ended the task (only then is slurmctld asked for the job's state): it
    opens the task's pty, hands the slave over, captures what the task writes, takes the
    status from root, answers, and exits (end of file on the status connection)."""
    import socket

    from logcapture.slurm.task import status_address

    spool = tmp_path / "999998"
    spool.mkdir()
    env = dict(os.environ, HOME=str(tmp_path), LOGCAPTURE_TASKS=str(spool),
               SLURM_JOB_ID="999998", SLURMD_NODENAME="n1")
    task = subprocess.Popen(["sleep", "30"])
    plugin, theirs = socket.socketpair()
    try:
        capture = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "logcapture", "slurm", "task",
             "--socket", str(theirs.fileno()), "--job", "999998", "--step", "0", "--rank", "5",
             "--local-rank", "1", "--task-pid", str(task.pid), "--", "echo", "hi"],
            pass_fds=(theirs.fileno(),), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=env)
        theirs.close()
        plugin.settimeout(30)
        _, fds, _, _ = socket.recv_fds(plugin, 1, 2)
        os.write(fds[0], b"hello from rank 5\n")
        for fd in fds:
            os.close(fd)
        task.kill()
        task.wait()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as status:
            status.settimeout(30)
            for _ in range(300):
                try:
                    status.connect(status_address("999998", "0", "5"))
                    break
                except OSError:
                    import time
                    time.sleep(0.1)
            status.sendall(b"%d\n" % wait_status)  # as waitpid gives it
            assert status.recv(16) == b"done\n"
            assert status.recv(16) == b""  # the process has exited
        _, err = capture.communicate(timeout=30)
    finally:
        task.kill()
        plugin.close()
    assert capture.returncode == 0, err
    imported = {line.split("|")[-1].strip() for line in err.decode().splitlines()
                if line.startswith("import time:")}
    assert "logcapture.slurm.task" in imported
    assert "click" not in imported and "logcapture.cli" not in imported
    assert "psutil" not in imported  # a task's capture does not sample (slurm.task)
    assert "gzip" not in imported or importlib.util.find_spec("isal") is None
    # The reader spawns nothing (the task is slurmstepd's child); the worker asks slurmctld
    # (scontrol) only for a task a signal ended.
    assert ("subprocess" in imported) == (wait_status == 9)
    run = spool / "999998.0.5"
    assert [x.text for x in iter_run(run) if x.kind == "line"] == ["hello from rank 5"]
    # the node's CPUs and memory, not its GPUs: NVML is not started in a task's capture
    (start,) = [x.to_dict() for x in iter_run(run) if x.kind == "start"]
    assert start["inventory"]["cpus"] and "gpus" not in start["inventory"]
    end = [x.to_dict() for x in iter_run(run) if x.kind == "end"]
    assert end and (end[0]["signal"], end[0]["exit_status"]) == (
        (9, None) if wait_status == 9 else (None, 3)), end
