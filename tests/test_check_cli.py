"""`logcapture check [FILE]`: validates a .logoptin, explains every problem, exits 0 or 1."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from logcapture.cli import cli


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, ["check", *args], env=env, catch_exceptions=False)


@pytest.mark.parametrize("content, mode", [("", "enabled"), ("mode: metadata\n", "metadata"),
                                           ("mode: disabled\n", "disabled")])
def test_valid_file_exits_0(tmp_path, content, mode):
    path = tmp_path / ".logoptin"
    path.write_text(content)
    result = invoke(str(path))
    assert result.exit_code == 0, result.output
    assert f"{path}: valid; mode: {mode}" in result.output


def test_every_problem_is_explained_and_exits_1(tmp_path):
    path = tmp_path / ".logoptin"
    path.write_text("mode: enable\nmdoe: metadata\n")
    result = invoke(str(path))
    assert result.exit_code == 1
    assert f"{path}:1:7: key 'mode'" in result.output
    assert "did you mean enabled" in result.output
    assert f"{path}:2:1: unknown key 'mdoe'" in result.output
    assert "invalid (2 problems)" in result.output
    assert "mode disabled" in result.output


def test_invalid_yaml_exits_1_with_line_and_column(tmp_path):
    path = tmp_path / ".logoptin"
    path.write_text("mode: enabled: x\n")
    result = invoke(str(path))
    assert result.exit_code == 1
    assert f"{path}:1:14: invalid YAML" in result.output


def test_missing_file_exits_1(tmp_path):
    result = invoke(str(tmp_path / ".logoptin"))
    assert result.exit_code == 1
    # the file that was checked ($LOGCAPTURE_OPTIN, or the one named), not always ~/.logoptin
    assert "does not exist" in result.output
    assert f"touch {tmp_path / '.logoptin'}" in result.output


def test_symlink_is_not_followed(tmp_path):
    target = tmp_path / "real"
    target.write_text("mode: enabled\n")
    link = tmp_path / ".logoptin"
    link.symlink_to(target)
    result = invoke(str(link))
    assert result.exit_code == 1
    assert "symbolic link" in result.output


def test_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / ".logoptin"
    os.mkfifo(fifo)
    result = invoke(str(fifo))
    assert result.exit_code == 1
    assert "FIFO" in result.output


def test_default_path_from_environment(tmp_path):
    path = tmp_path / "my-optin"
    path.write_text("mode: metadata\n")
    result = invoke(env={"LOGCAPTURE_OPTIN": str(path)})
    assert result.exit_code == 0
    assert f"{path}: valid; mode: metadata" in result.output


def test_default_path_is_home_logoptin(tmp_path):
    (tmp_path / ".logoptin").write_text("mode: disabled\n")
    result = invoke(env={"HOME": str(tmp_path), "LOGCAPTURE_OPTIN": ""})
    assert result.exit_code == 0
    assert "mode: disabled" in result.output


def test_uid_option_checks_ownership(tmp_path):
    path = tmp_path / ".logoptin"
    path.write_text("")
    other = os.getuid() + 1
    result = invoke("--uid", str(other), str(path))
    assert result.exit_code == 1
    assert f"uid {other}" in result.output
    assert invoke("--uid", str(os.getuid()), str(path)).exit_code == 0


def test_secret_values_are_not_echoed(tmp_path):
    path = tmp_path / ".logoptin"
    path.write_text("mode: ghp_AbCdEf0123456789\npassword: ghp_AbCdEf0123456789\n")
    result = invoke(str(path))
    assert result.exit_code == 1
    assert "ghp_" not in result.output


def test_has_help():
    result = CliRunner().invoke(cli, ["check", "--help"])
    assert result.exit_code == 0
    assert "Validate a .logoptin FILE" in result.output


def test_exit_code_through_main(tmp_path, capsys):
    """`main()` (the console script) passes the exit status through."""
    from logcapture.cli import main

    path = tmp_path / ".logoptin"
    path.write_text("mode: nope\n")
    with pytest.raises(SystemExit) as info:
        main(["check", str(path)])
    assert info.value.code == 1
    path.write_text("mode: enabled\n")
    try:
        main(["check", str(path)])
    except SystemExit as e:  # click may exit 0 explicitly
        assert e.code in (0, None)
    assert "valid; mode: enabled" in capsys.readouterr().out
