"""errors.py: the exit status of a command that could not be run, decided in one place."""

from __future__ import annotations

import ast
import errno
from pathlib import Path

from logcapture.errors import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, exec_failed_status

PACKAGE = Path(__file__).resolve().parent.parent / "logcapture"


def test_a_command_not_found_is_127_one_found_but_not_runnable_126() -> None:
    assert (EXIT_NOT_FOUND, EXIT_CANNOT_EXECUTE) == (127, 126)
    assert exec_failed_status(FileNotFoundError(errno.ENOENT, "No such file")) == 127
    # /bin/sh/x, or a $PATH entry that is a file: the search found nothing
    assert exec_failed_status(NotADirectoryError(errno.ENOTDIR, "Not a directory")) == 127
    assert exec_failed_status(PermissionError(errno.EACCES, "Permission denied")) == 126
    assert exec_failed_status(OSError(errno.ENOEXEC, "Exec format error")) == 126


def test_only_errors_py_spells_the_shells_exit_statuses() -> None:
    # Every exec that can fail (logcapture run, its fallback without capture, the Slurm job
    # wrapper) asks exec_failed_status; a decimal 126 or 127 elsewhere is a second copy.
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "errors.py":
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if (isinstance(node, ast.Constant) and type(node.value) is int
                    and ast.get_source_segment(source, node) in ("126", "127")):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []
