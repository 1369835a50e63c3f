"""An interactive step (``srun --pty bash``) driven by a real terminal (pexpect) on a real
Slurm 22.05 cluster. Without ``interactive: true`` in ``.logoptin`` it is not captured; with
it, it is a run of its job (``J.STEP.RANK``) that only its user can read, with nothing typed
at a password prompt in it. Either way the terminal behaves as for a user who did not opt
in: window size at start and after a change, Ctrl-C reaching the foreground job and not the
shell, ^Z and fg, raw mode set and restored (vim, and a program of its own), the exit
status."""

from __future__ import annotations

import os
import pwd
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ..helpers import wait_foreground
from .conftest import Cluster, Job

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.slurm

U1, U2 = "lcuser1", "lcuser2"
PROMPT = "lc-prompt> "
PASSWORD = "pw-9f3c1e77ab2d"


SRUN_PTY = ["srun", "-n", "1", "--pty"]
BASH = ["bash", "--norc", "--noprofile", "-i"]


def _spawn(lc: Cluster, user: str, launcher: list[str], command: list[str] = BASH,
           shell: str = "/bin/bash") -> pexpect.spawn:
    """``LAUNCHER COMMAND`` as ``user`` on a terminal of 30 x 100 (pexpect's pty), with
    ``SHELL`` set to ``shell``."""
    pw = pwd.getpwnam(user)
    env = {"HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "SHELL": shell,
           "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "xterm",
           "SLURM_CONF": lc.env["SLURM_CONF"], "PS1": PROMPT}
    argv = [f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--reset-env",
            "env", *[f"{k}={v}" for k, v in env.items()], *launcher, *command]
    return pexpect.spawn("setpriv", argv, cwd=pw.pw_dir, encoding="utf-8", timeout=30,
                         dimensions=(30, 100), use_poll=True)


def _session(lc: Cluster, user: str, more: bool = False) -> tuple[list[str], str]:
    """Drive ``srun --pty bash`` as ``user``; the answers the shell gave, and the job id.
    ``more``: job control, vim, a password read, and ``exit 3`` (srun's status is the last
    answer)."""
    child = _spawn(lc, user, SRUN_PTY)
    answers = []

    def ask(command: str) -> str:
        # The markers as printed ([[[, ]]]) are not in the echo of the command line.
        child.sendline(f'echo "[[""["; {command}; echo "]]""]"')
        child.expect(r"\[\[\[\r?\n(.*?)\]\]\]")
        got = child.match.group(1)
        child.expect_exact(PROMPT)
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", got).strip()

    try:
        child.expect_exact(PROMPT)
        job = ask("echo $SLURM_JOB_ID")
        answers.append(ask("stty size; [ -t 0 ] && [ -t 1 ] && echo terminal"))
        child.setwinsize(40, 120)  # srun passes the change on to the step's terminal
        answers.append(ask('for i in $(seq 100); do [ "$(stty size)" = "40 120" ] && break; '
                           'sleep 0.1; done; stty size'))
        # Ctrl-C stops the foreground job only: the shell goes on.
        child.sendline('echo "sleep ""starts"; sleep 30; echo slept')
        child.expect_exact("sleep starts")
        wait_foreground(["sleep", "30"])
        child.sendintr()
        child.expect_exact(PROMPT, timeout=10)
        answers.append("interrupted" if "slept" not in child.before else "not interrupted")
        answers.append(ask("echo alive"))
        # Raw mode for a read of one key, then the line discipline as it was.
        answers.append(ask("stty -g > /tmp/lc-stty-$$; stty raw -echo; stty -a | "
                           "grep -o -- '-icanon'; stty $(cat /tmp/lc-stty-$$); "
                           "stty -a | grep -o -- ' icanon'; rm /tmp/lc-stty-$$"))
        if more:
            answers += _more(child, ask)
            child.sendline("exit 3")
        else:
            child.sendline("exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    if more:
        answers.append(f"srun exit {child.exitstatus}")
    return answers, job.strip()


def _more(child: pexpect.spawn, ask: Callable[[str], str]) -> list[str]:
    """Job control, vim and a raw-mode program (the terminal's settings before and after), a
    password read without echo."""
    answers = []
    # ^Z stops the foreground job (one process group), fg resumes it.
    child.sendline("bash -c 'sleep 2; echo \"woke \"\"up\"'")
    wait_foreground(["sleep", "2"])
    child.sendcontrol("z")
    child.expect("Stopped")
    child.expect_exact(PROMPT)
    answers.append(ask("jobs | grep -c Stopped"))
    child.sendline("fg")
    child.expect_exact("woke up", timeout=15)
    child.expect_exact(PROMPT)
    answers.append(ask("echo resumed"))
    before = ask("stty -a")
    child.sendline("vim -u NONE -N -n")
    time.sleep(2)  # vim has the terminal in raw mode and its screen drawn
    child.send("\x1b:q!\r")
    child.expect_exact(PROMPT, timeout=15)
    child.sendline("python3 -c 'import tty,termios,os; a=termios.tcgetattr(0); "
                   "tty.setraw(0); os.write(1, b\"raw-\" b\"ready \"); "
                   "os.write(1, b\"raw:\" + os.read(0, 1) + b\"\\r\\n\"); "
                   "termios.tcsetattr(0, termios.TCSADRAIN, a)'")
    child.expect_exact("raw-ready ")  # set: a key typed before would be flushed
    child.send("k")
    child.expect_exact("raw:k")
    child.expect_exact(PROMPT)
    answers.append("stty same" if ask("stty -a") == before else "stty changed")
    child.sendline('read -s -p "pass""word: " P; echo; echo "typed ${#P}"')
    child.expect_exact("password: ")
    child.sendline(PASSWORD)
    child.expect_exact("typed 15")
    child.expect_exact(PROMPT)
    answers.append("password hidden" if PASSWORD not in child.before else "password shown")
    answers.append(ask('echo "kept ""line"'))
    return answers


def test_an_interactive_step_is_not_captured_and_its_terminal_behaves_as_without(
        lc: Cluster) -> None:
    lc.optin(U1, "")
    captured_answers, captured_job = _session(lc, U1)
    plain_answers, _ = _session(lc, U2)
    assert plain_answers[0] == "30 100\nterminal", plain_answers
    assert plain_answers[1] == "40 120", plain_answers
    assert plain_answers[2:4] == ["interrupted", "alive"], plain_answers
    assert plain_answers[4].split() == ["-icanon", "icanon"], plain_answers
    assert captured_answers == plain_answers
    assert captured_job.isdigit()
    assert not (lc.spool_root / captured_job).exists()  # nothing captured, not even a task


def test_an_interactive_step_is_captured_when_asked_and_behaves_as_without(
        lc: Cluster) -> None:
    lc.optin(U1, "interactive: true\n")
    captured, job = _session(lc, U1, more=True)
    plain, _ = _session(lc, U2, more=True)
    assert plain[0] == "30 100\nterminal", plain
    assert plain[1] == "40 120", plain
    assert plain[2:4] == ["interrupted", "alive"], plain
    assert plain[4].split() == ["-icanon", "icanon"], plain
    assert plain[5:] == ["1", "resumed", "stty same", "password hidden", "kept line",
                         "srun exit 3"], plain
    assert captured == plain
    # The run of the job's step, once the step is over (the job ends with srun).
    lc.wait(Job(job, U1, Path("/dev/null")), timeout=60)
    runs = lc.task_run_dirs(job)
    assert list(runs) == [f"{job}.0.0"], runs
    records = lc.records(job, f"{job}.0.0")
    assert any(r.get("exit_status") == 3 for r in records), records[-1]
    assert PASSWORD.encode() not in lc.spool_bytes(job)
    bin_ = lc.env["LOGCAPTURE_BIN"] + "/logcapture"
    own = ["--spool", str(lc.spool_root / job), "--source", "spool"]
    r = lc.as_user(U1, [bin_, "logs", *own, job])
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("kept line") == 1 and "woke up" in r.stdout, r.stdout
    assert PASSWORD not in r.stdout
    r = lc.as_user(U2, [bin_, "logs", *own, job])
    assert r.returncode != 0 and "kept line" not in r.stdout


def test_salloc_s_interactive_step_is_captured_and_read_by_its_owner_only(
        lc: Cluster) -> None:
    lc.set_store(True)  # the epilog ships the job's run: read through the read service
    lc.optin(U1, "interactive: true\n")
    # salloc alone: the dev cluster's LaunchParameters=use_interactive_step makes its shell
    # ($SHELL, here bash without the user's start-up files) the job's interactive step
    pw = pwd.getpwnam(U1)
    shell = Path(pw.pw_dir) / "lc-shell"
    shell.write_text("#!/bin/sh\nexec bash --norc --noprofile -i\n")
    shell.chmod(0o755)
    os.chown(shell, pw.pw_uid, pw.pw_gid)
    child = _spawn(lc, U1, ["salloc", "-n", "1"], command=[], shell=str(shell))
    try:
        child.expect_exact(PROMPT)
        child.sendline('echo "job=$SLURM_JOB_ID step=$SLURM_STEP_ID size=$(stty size)"')
        child.expect(r"job=(\d+) step=(\d+) size=30 100")
        job, step = child.match.group(1), child.match.group(2)
        child.expect_exact(PROMPT)
        child.sendline('echo "salloc ""shell line"; exit 5')
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 5
    assert step == "4294967290"  # Slurm's SLURM_INTERACTIVE_STEP
    lc.wait(Job(job, U1, Path("/dev/null")), timeout=60)
    run = f"{job}.{step}.0"
    reader = ["env", f"LOGCAPTURE_READER_SOCKET={lc.env['LOGCAPTURE_READER_SOCKET']}",
              lc.env["LOGCAPTURE_BIN"] + "/logcapture"]
    deadline = time.monotonic() + 90
    while True:  # until the epilog has shipped it
        r = lc.as_user(U1, [*reader, "logs", run], timeout=120)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert r.returncode == 0, (r.stderr, lc.slurm_log()[-2000:])
    assert "salloc shell line" in r.stdout, r.stdout
    r = lc.as_user(U1, [*reader, "logs", job], timeout=120)
    assert r.returncode == 0 and r.stdout.count("salloc shell line") == 1, (r.stdout, r.stderr)
    r = lc.as_user(U2, [*reader, "logs", job], timeout=120)
    assert r.returncode != 0 and "salloc shell line" not in r.stdout


def test_an_interactive_step_whose_capture_fails_runs_on_its_own_terminal(
        lc: Cluster) -> None:
    lc.optin(U1, "interactive: true\n")
    plain, _ = _session(lc, U2)
    # No logcapture where the plugin looks for it: not even Python runs.
    lc.set_task_python("/nonexistent/python3")
    try:
        missing, missing_job = _session(lc, U1)
    finally:
        lc.set_task_python(None)
    assert missing == plain
    assert "not captured" in lc.slurmd_log()
    # logcapture runs but finds no spool directory: one warning on the terminal, no run.
    conf = lc.dir / "etc" / "plugstack.conf"
    line = conf.read_text()
    conf.write_text(re.sub(r"spool_root=\S+", "spool_root=/nonexistent", line))
    try:
        child = _spawn(lc, U1, SRUN_PTY)
        try:
            child.expect_exact("logcapture: interactive step 0 not captured: no spool "
                               "directory of the job")
            child.expect_exact(PROMPT)
            child.sendline("echo $SLURM_JOB_ID; exit 4")
            child.expect(r"(\d+)\r\n")
            job = child.match.group(1)
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
    finally:
        conf.write_text(line)
    assert child.exitstatus == 4
    for j in (missing_job, job):
        lc.wait(Job(j, U1, Path("/dev/null")), timeout=60)
        assert lc.task_run_dirs(j) == {}
