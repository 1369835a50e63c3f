"""The ``logcapture`` console script's entry point: ``logcapture run`` without click.

Every job captured with ``logcapture run`` pays for the wrapper's start-up, and importing
click is ~10-20 ms of it (a twentieth of the 2 % CPU budget of a 10 s job;
docs/performance.md). So a ``run`` command line made only of the options ``run`` declares,
each with a plain value, is parsed here and the command started at once; everything else
(help, a misspelt or unknown option, a missing or empty value, a bad mode, any other command)
goes to the click CLI (the ``cli`` package), which prints the help or the error. Parsing here never
decides anything click would decide differently: ``tests/test_entry.py`` compares
``parse_run`` with click's parse of the same arguments. Errors are reported as ``cli.main``
reports them (``errors.failure``, shared by both). The capture itself is
``capture.run_command``, which ``cli.capture_commands.run`` calls too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# run's options (cli.capture_commands.run): the ones that take a value, and the
# --sample/--no-sample flag.
_VALUE_OPTIONS = {"--spool": "spool", "--run-id": "run_id", "--mode": "mode"}
_FLAGS = {"--sample": True, "--no-sample": False}


def parse_run(args: list[str]) -> dict | None:
    """``run``'s parameters from ``args`` (the words after ``logcapture``), as click would
    pass them to ``run`` (``cli.capture_commands``); None when click must look at them (not a
    plain ``run``)."""
    if not args or args[0] != "run":
        return None
    from .records import MODES

    params: dict = {"spool": None, "run_id": None, "mode": None, "sample": True}
    i = 1
    while i < len(args):
        word = args[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-"):
            break  # the command: options stop here (click: allow_interspersed_args off)
        name, eq, value = word.partition("=")
        if name in _VALUE_OPTIONS:
            if not eq:
                if i + 1 >= len(args):
                    return None
                i += 1
                value = args[i]
            if not value or value.startswith("-"):
                return None
            params[_VALUE_OPTIONS[name]] = value
        elif word in _FLAGS:
            params["sample"] = _FLAGS[word]
        else:
            return None  # --help, -h, an unknown or misspelt option: click's to answer
        i += 1
    command = args[i:]
    if not command or (params["mode"] is not None and params["mode"] not in MODES):
        return None
    if params["spool"] is not None:
        params["spool"] = Path(params["spool"])
    params["command"] = tuple(command)
    return params


def _run_command(params: dict) -> int:
    """``capture.run_command(**params)``; a broken install (capture cannot be imported) must not
    break the job, so then the command runs without it."""
    from .errors import Warner, exec_failed_status

    try:
        from .capture import run_command
    except Exception as e:  # noqa: BLE001 - a broken install must not break the job
        warn = Warner()
        command = params["command"]
        warn(f"capture unavailable ({type(e).__name__}: {e}); running the command without it")
        try:
            os.execvp(command[0], command)
        except OSError as err:
            warn(f"{command[0]}: {err.strerror}")
            return exec_failed_status(err)
    return run_command(**params)


def main(argv: list[str] | None = None) -> None:
    params = parse_run(list(sys.argv[1:] if argv is None else argv))
    if params is None:
        from .cli import main as cli_main

        cli_main(argv)
        return
    try:
        code = _run_command(params)
    except (Exception, KeyboardInterrupt) as e:
        from .errors import failure

        said = failure(e)
        if said is None:
            raise
        try:
            os.write(2, (said[0] + "\n").encode("utf-8", "replace"))
        except OSError:
            pass
        code = said[1]
    from .runner.exits import leave

    leave(code)  # without the interpreter's teardown: the command has ended
