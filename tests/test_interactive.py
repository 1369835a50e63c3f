"""slurm.interactive without Slurm: the plugin's protocol up to the point where the task's
terminal would be switched (a socketpair for the plugin's end): who is asked, what the
capture process answers when it does not capture, and that it leaves nothing behind."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from logcapture.slurm import interactive as I


def _env(tmp_path: Path, optin: str | None) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    if optin is not None:
        (home / ".logoptin").write_text(optin)
    return {"HOME": str(home), "SLURM_JOB_ID": "77", "SLURM_PTY_PORT": "40000",
            "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _run(env: dict[str, str], hello: bytes) -> tuple[bytes, list[str]]:
    """interactive_task with ``hello`` from the "plugin"; what it answered, its warnings."""
    plugin, capture = socket.socketpair()
    warnings: list[str] = []
    try:
        plugin.sendall(hello)
        I.interactive_task(capture, "0", "0", "0", os.getpid(), ["bash"], env,
                           warnings.append)
        capture.close()
        plugin.settimeout(5)
        answer = b""
        while got := plugin.recv(64):
            answer += got
    finally:
        plugin.close()
        capture.close()
    return answer, warnings


@pytest.mark.parametrize("optin", [None, "", "interactive: false\n", "mode: enabled\n",
                                   "interactive: maybe\n"])
def test_a_user_who_did_not_ask_is_answered_no_and_nothing_is_made(
        tmp_path: Path, optin: str | None) -> None:
    root = tmp_path / "spool"
    (root / "77").mkdir(parents=True)
    answer, warnings = _run(_env(tmp_path, optin), b"S" + bytes(root) + b"\n")
    assert answer == b"n" and warnings == []
    assert list((root / "77").iterdir()) == []


def test_no_spool_directory_of_the_job_is_one_warning_and_no(tmp_path: Path) -> None:
    answer, warnings = _run(_env(tmp_path, "interactive: true\n"),
                            b"S" + bytes(tmp_path / "nowhere") + b"\n")
    assert answer == b"n"
    assert len(warnings) == 1 and "no spool directory of the job" in warnings[0]


def test_anything_but_the_plugin_s_hello_is_left_alone(tmp_path: Path) -> None:
    answer, warnings = _run(_env(tmp_path, "interactive: true\n"), b"hello\n")
    assert answer == b"" and warnings == []


def test_an_interactive_task_is_a_terminal_and_the_pty_port(tmp_path: Path) -> None:
    master, slave = os.openpty()
    try:
        assert I.is_interactive({"SLURM_PTY_PORT": "4000"}, slave)
        assert not I.is_interactive({}, slave)  # srun -u: slurmstepd's terminal, no port
        r, w = os.pipe()
        assert not I.is_interactive({"SLURM_PTY_PORT": "4000"}, w)
        os.close(r)
        os.close(w)
    finally:
        os.close(master)
        os.close(slave)


def test_the_job_spool_must_be_the_user_s_directory(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    root.mkdir()
    env = {"SLURM_JOB_ID": "77"}
    assert I.job_spool(env, str(root)) is None
    (root / "77").symlink_to(tmp_path)
    assert I.job_spool(env, str(root)) is None  # a link is not the prolog's directory
    (root / "77").unlink()
    (root / "77").mkdir()
    assert I.job_spool(env, str(root)) == root / "77"


def test_both_starts_of_slurm_task_choose_the_capture_by_the_same_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's command line is read by entry.main's fast path and, when that leaves it
    to click, by cli.slurm_commands: both must start the interactive capture in an
    ``srun --pty`` task (the plugin speaks another protocol there)."""
    from logcapture import entry
    from logcapture.cli import main as cli_main
    from logcapture.runner import exits
    from logcapture.slurm import task

    master, slave = os.openpty()
    try:
        assert I.task_capture({"SLURM_PTY_PORT": "4000"}, slave) is I.interactive_main
        assert I.task_capture({}, slave) is task.task_main
    finally:
        os.close(master)
        os.close(slave)

    called: list[tuple] = []
    monkeypatch.setattr(I, "interactive_main", lambda *a: called.append(a) or 5)
    monkeypatch.setattr(I, "is_interactive", lambda env, fd=1: True)

    def leave(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(exits, "leave", leave)
    args = ["slurm", "task", "--socket", "3", "--step", "0", "--rank", "1", "--job", "9",
            "--local-rank", "0", "--task-pid", "42", "bash"]
    for start in (entry.main, cli_main):
        with pytest.raises(SystemExit) as ended:
            start(args if start is entry.main else args + ["-i"])
        assert ended.value.code == 5
    assert called == [(3, "0", "1", "0", 42, ["bash"], "9"),
                      (3, "0", "1", "0", 42, ["bash", "-i"], "9")]
