"""An interactive step (``srun --pty bash``) driven by a real terminal (pexpect) on a real
Slurm 22.05 cluster, as a user who opted in and one who did not: interactive steps are not
captured, and the terminal behaves the same for both (window size at start and after a
change, Ctrl-C reaching the foreground job and not the shell, raw mode set and restored)."""

from __future__ import annotations

import pwd
import re
import time

import pytest

from .conftest import Cluster

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.slurm

U1, U2 = "lcuser1", "lcuser2"
PROMPT = "lc-prompt> "


def _session(lc: Cluster, user: str) -> tuple[list[str], str]:
    """Drive ``srun --pty bash`` as ``user``; the answers the shell gave, and the job id."""
    pw = pwd.getpwnam(user)
    env = {"HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "SHELL": "/bin/bash",
           "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "xterm",
           "SLURM_CONF": lc.env["SLURM_CONF"], "PS1": PROMPT}
    argv = [f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--reset-env",
            "env", *[f"{k}={v}" for k, v in env.items()],
            "srun", "-n", "1", "--pty", "bash", "--norc", "--noprofile", "-i"]
    child = pexpect.spawn("setpriv", argv, cwd=pw.pw_dir, encoding="utf-8", timeout=30,
                          dimensions=(30, 100))
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
        time.sleep(1)  # sleep(1) is the foreground job by then
        child.sendintr()
        child.expect_exact(PROMPT, timeout=10)
        answers.append("interrupted" if "slept" not in child.before else "not interrupted")
        answers.append(ask("echo alive"))
        # Raw mode for a read of one key, then the line discipline as it was.
        answers.append(ask("stty -g > /tmp/lc-stty-$$; stty raw -echo; stty -a | "
                           "grep -o -- '-icanon'; stty $(cat /tmp/lc-stty-$$); "
                           "stty -a | grep -o -- ' icanon'; rm /tmp/lc-stty-$$"))
        child.sendline("exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    return answers, job.strip()


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
