"""`logcapture check [FILE]`: validates a .logoptin, explains every problem, exits 0 or 1."""

from __future__ import annotations

import os

import pytest
from helpers import Ran, lc


def check(*args: str, **env: str) -> Ran:
    """``logcapture check ARGS`` (``helpers.lc``), with ``env`` added to this process's."""
    return lc(["check", *args], {**os.environ, **env}, text=True)


@pytest.mark.parametrize("content, mode", [("", "enabled"), ("mode: metadata\n", "metadata"),
                                           ("mode: disabled\n", "disabled")])
def test_valid_file_exits_0(tmp_path, content, mode):
    path = tmp_path / ".logoptin"
    path.write_text(content)
    result = check(str(path))
    assert result.returncode == 0, result.stdout
    assert f"{path}: valid; mode: {mode}" in result.stdout


def test_every_problem_is_explained_and_exits_1(tmp_path):
    path = tmp_path / ".logoptin"
    path.write_text("mode: enable\nmdoe: metadata\n")
    result = check(str(path))
    assert result.returncode == 1
    assert f"{path}:1:7: key 'mode'" in result.stdout
    assert "did you mean enabled" in result.stdout
    assert f"{path}:2:1: unknown key 'mdoe'" in result.stdout
    assert "invalid (2 problems)" in result.stdout
    assert "mode disabled" in result.stdout


def test_invalid_yaml_exits_1_with_line_and_column(tmp_path):
    path = tmp_path / ".logoptin"
    path.write_text("mode: enabled: x\n")
    result = check(str(path))
    assert result.returncode == 1
    assert f"{path}:1:14: invalid YAML" in result.stdout


def test_missing_file_exits_1(tmp_path):
    result = check(str(tmp_path / ".logoptin"))
    assert result.returncode == 1
    # the file that was checked ($LOGCAPTURE_OPTIN, or the one named), not always ~/.logoptin
    assert "does not exist" in result.stdout
    assert f"touch {tmp_path / '.logoptin'}" in result.stdout


def test_symlink_is_not_followed(tmp_path):
    target = tmp_path / "real"
    target.write_text("mode: enabled\n")
    link = tmp_path / ".logoptin"
    link.symlink_to(target)
    result = check(str(link))
    assert result.returncode == 1
    assert "symbolic link" in result.stdout


def test_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / ".logoptin"
    os.mkfifo(fifo)
    result = check(str(fifo))
    assert result.returncode == 1
    assert "FIFO" in result.stdout


def test_default_path_from_environment(tmp_path):
    path = tmp_path / "my-optin"
    path.write_text("mode: metadata\n")
    result = check(LOGCAPTURE_OPTIN=str(path))
    assert result.returncode == 0
    assert f"{path}: valid; mode: metadata" in result.stdout


def test_default_path_is_home_logoptin(tmp_path):
    (tmp_path / ".logoptin").write_text("mode: disabled\n")
    result = check(HOME=str(tmp_path), LOGCAPTURE_OPTIN="")
    assert result.returncode == 0
    assert "mode: disabled" in result.stdout


def test_uid_option_checks_ownership(tmp_path):
    path = tmp_path / ".logoptin"
    path.write_text("")
    other = os.getuid() + 1
    result = check("--uid", str(other), str(path))
    assert result.returncode == 1
    assert f"uid {other}" in result.stdout
    assert check("--uid", str(os.getuid()), str(path)).returncode == 0


def test_secret_values_are_not_echoed(tmp_path):
    path = tmp_path / ".logoptin"
    path.write_text("mode: ghp_AbCdEf0123456789\npassword: ghp_AbCdEf0123456789\n")
    result = check(str(path))
    assert result.returncode == 1
    assert "ghp_" not in result.stdout


def test_has_help():
    result = check("--help")
    assert result.returncode == 0
    assert "Validate a .logoptin FILE" in result.stdout


def test_interactive_steps_asked_for_are_said_and_a_bad_value_is_a_problem(tmp_path):
    path = tmp_path / ".logoptin"
    path.write_text("interactive: true\n")
    result = check(str(path))
    assert result.returncode == 0, result.stdout
    assert "interactive: true (srun --pty and salloc shells are captured too)" in result.stdout
    path.write_text("interactive: false\n")
    assert "interactive: true" not in check(str(path)).stdout
    path.write_text("interactive: always\n")
    result = check(str(path))
    assert result.returncode == 1
    assert f"{path}:1:14: key 'interactive': must be true or false, not a string" \
        in result.stdout
