"""The ``logcapture`` console script's entry point: ``logcapture run`` and ``logcapture slurm
task`` without click.

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

``logcapture slurm task`` is what the task plugin (slurm/spank) starts in every task of a
captured step, and the task's program waits for it to be ready: importing click and the CLI
was a third of its CPU until then (90-99 ms without them 60-68 ms, measured from a regular
install; docs/performance.md). Its command line is parsed here the same way
(``parse_task``, compared with click's in ``tests/test_entry.py``) and the task's capture
(``slurm.interactive.task_capture``) called at once; it ends without the interpreter's teardown
(``runner.exits.leave``), which slurmstepd would wait for at the step's end, one task after
another (7 ms, 1 ms without).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

# run's options (cli.capture_commands.run): the ones that take a value, and the
# --sample/--no-sample flag.
_VALUE_OPTIONS = {"--spool": "spool", "--run-id": "run_id", "--mode": "mode"}
_FLAGS = {"--sample": True, "--no-sample": False}


def _walk(args: list[str], i: int, option: Callable[[str, int], int | None]) -> int | None:
    """Walk the options from ``args[i]``: ``option(name, i)`` takes the one at ``i`` (its name
    before any ``=``) and returns the index after it, or None when click must judge. Returns
    where the command starts (after ``--``, or at the first word that is not an option:
    click's allow_interspersed_args off), or None."""
    while i < len(args):
        if args[i] == "--":
            return i + 1
        if not args[i].startswith("-"):
            return i
        after = option(args[i].partition("=")[0], i)
        if after is None:
            return None
        i = after
    return i


def _value(args: list[str], i: int) -> tuple[str, int] | None:
    """The value of the option ``args[i]`` (``--name=value`` or ``--name value``) and the index
    of the word after it; None when it has none, or an empty one, or one that starts like an
    option (click's to judge)."""
    _, eq, value = args[i].partition("=")
    if not eq:
        if i + 1 >= len(args):
            return None
        i += 1
        value = args[i]
    if not value or value.startswith("-"):
        return None
    return value, i + 1


def parse_run(args: list[str]) -> dict | None:
    """``run``'s parameters from ``args`` (the words after ``logcapture``), as click would
    pass them to ``run`` (``cli.capture_commands``); None when click must look at them (not a
    plain ``run``)."""
    if not args or args[0] != "run":
        return None
    from .records import MODES

    params: dict = {"spool": None, "run_id": None, "mode": None, "sample": True}

    def option(name: str, i: int) -> int | None:
        if name in _VALUE_OPTIONS:
            got = _value(args, i)
            if got is None:
                return None
            params[_VALUE_OPTIONS[name]] = got[0]
            return got[1]
        if args[i] in _FLAGS:
            params["sample"] = _FLAGS[args[i]]
            return i + 1
        return None  # --help, -h, an unknown or misspelt option: click's to answer

    start = _walk(args, 1, option)
    if start is None:
        return None
    command = args[start:]
    if not command or (params["mode"] is not None and params["mode"] not in MODES):
        return None
    if params["spool"] is not None:
        params["spool"] = Path(params["spool"])
    params["command"] = tuple(command)
    return params


# slurm task's options (cli.slurm_commands.slurm_task): all required but --job (default
# ""); the two numbers are ints.
_TASK_OPTIONS = {"--socket": "sock_fd", "--step": "step", "--rank": "rank", "--job": "job",
                 "--local-rank": "local_rank", "--task-pid": "task_pid"}
_TASK_INTS = ("sock_fd", "task_pid")


def parse_task(args: list[str]) -> dict | None:
    """``slurm task``'s parameters from ``args`` (the words after ``logcapture``), as click
    would pass them to ``slurm_task`` (``cli.slurm_commands``); None when click must look at
    them."""
    if args[:2] != ["slurm", "task"]:
        return None
    params: dict = {"job": ""}

    def option(name: str, i: int) -> int | None:
        key = _TASK_OPTIONS.get(name)
        got = None if key is None else _value(args, i)
        if key is None or got is None:
            return None
        value, after = got
        if key not in _TASK_INTS:
            params[key] = value
        elif value.isascii() and value.isdigit():
            params[key] = int(value)
        else:
            return None
        return after

    start = _walk(args, 2, option)
    if start is None or len(params) != len(_TASK_OPTIONS):
        return None  # a required option missing: click's error to give
    params["command"] = tuple(args[start:])
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
    args = list(sys.argv[1:] if argv is None else argv)
    params = parse_run(args)
    if params is None:
        task = parse_task(args)
        if task is not None:
            from .runner.exits import leave
            from .slurm.interactive import task_capture

            # As cli.slurm_commands.slurm_task calls it; then without the interpreter's
            # teardown: the run is written and the worker reaped, and the exit closes the
            # status connection the plugin waits on.
            capture = task_capture(os.environ)
            leave(capture(task["sock_fd"], task["step"], task["rank"], task["local_rank"],
                          task["task_pid"], list(task["command"]), task["job"]))
            return
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
