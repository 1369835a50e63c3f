"""The job wrapper: runs as the job's user at job start, on the batch node.

``slurm/job_submit.lua`` prepends ``#!<wrapper line>`` to every batch script, so the kernel
runs ``logcapture-job [--spool-root=DIR] SCRIPT ARGS...``. The script's own ``#!`` line is
now line 2. Without ``~/.logoptin`` the wrapper execs that interpreter at once, exactly as
the kernel would have (same argv, same environment, no pty, no file) and before importing
anything but ``os`` and ``sys``: that is the cost a user who did not opt in pays. With
``~/.logoptin`` it runs the script under ``capture_command`` (``logcapture run``) into the
job's spool directory that the prolog made. The decision is taken once, here: creating or
deleting ``~/.logoptin`` later changes nothing for this job.
"""

from __future__ import annotations

import os
import sys

# Nothing heavier than os and sys at module level, this package's other modules included:
# the wrapper execs the job's interpreter before it imports anything else, so a job without
# ~/.logoptin pays no measurable cost.


SHEBANG_MAX = 256  # Linux reads at most this many bytes of a "#!" line (BINPRM_BUF_SIZE)
WRAPPER_OPTIONS = ("--spool-root",)


def parse_shebang(line: bytes) -> list[str] | None:
    """The interpreter argv of a ``#!`` line, split as Linux does: the interpreter, then
    everything after the following blanks (trailing blanks stripped) as one argument."""
    if not line.startswith(b"#!"):
        return None
    body = line[2:SHEBANG_MAX].split(b"\n", 1)[0].rstrip(b"\r")
    body = body.strip(b" \t")
    if not body:
        return None
    parts = body.replace(b"\t", b" ").split(b" ", 1)
    argv = [os.fsdecode(parts[0])]
    if len(parts) > 1 and parts[1].strip(b" \t"):
        argv.append(os.fsdecode(parts[1].strip(b" \t")))
    return argv


def script_interpreter(script: str) -> list[str]:
    """The interpreter of a wrapped batch script: its second line is its own ``#!`` line.
    A script without one (not a wrapped script, or unreadable) runs under /bin/sh, as
    execvp would run it."""
    try:
        with open(script, "rb") as f:
            head = f.read(2 * SHEBANG_MAX + 2)
    except OSError:
        return ["/bin/sh"]
    lines = head.split(b"\n")
    if len(lines) >= 2:
        argv = parse_shebang(lines[1])
        if argv:
            return argv
    return ["/bin/sh"]


def _wrapper_args(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split the wrapper's own ``--name=value`` options (from the lua's wrapper line) from
    ``SCRIPT ARGS...``."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("--"):
        name, sep, value = args[i].partition("=")
        if name not in WRAPPER_OPTIONS or not sep:
            break
        opts[name[2:]] = value
        i += 1
    return opts, args[i:]


def optin_exists(env: dict[str, str] | os._Environ[str]) -> bool:
    """Whether the user opted in: ``$LOGCAPTURE_OPTIN``, else ``$HOME/.logoptin`` (the passwd
    home without HOME), exists in any form; what it contains is ``load_optin``'s business
    (a symlink or a FIFO opts in, then falls back to the most private mode). A home that
    cannot be searched counts as not opted in."""
    path = env.get("LOGCAPTURE_OPTIN")
    if not path:
        home = env.get("HOME")
        if not home:
            import pwd
            try:
                home = pwd.getpwuid(os.getuid()).pw_dir
            except KeyError:
                return False
        path = os.path.join(home, ".logoptin")
    try:
        os.lstat(path)
    except OSError:
        return False
    return True


def _exec_job(argv: list[str]) -> int:
    """Replace this process with the job's interpreter; only returns after a failed exec,
    with the status a shell gives for it."""
    try:
        os.execv(argv[0], argv)
    except OSError as e:
        msg = f"logcapture-job: {argv[0]}: cannot run the script's interpreter: {e.strerror}\n"
        try:
            os.write(2, msg.encode("utf-8", "replace"))
        except OSError:
            pass
        from ..errors import exec_failed_status

        return exec_failed_status(e)


def job_main(argv: list[str] | None = None) -> int:
    """The job wrapper (console script ``logcapture-job``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    opts, rest = _wrapper_args(args)
    if not rest:
        sys.stderr.write("usage: logcapture-job [--spool-root=DIR] SCRIPT [ARGS...]\n"
                         "(the Slurm job wrapper: job_submit.lua puts it on line 1 of batch "
                         "scripts)\n")
        return 2
    script, script_args = rest[0], rest[1:]
    job = [*script_interpreter(script), script, *script_args]
    if not optin_exists(os.environ):
        return _exec_job(job)
    try:
        return _captured(job, opts)
    except Exception as e:  # noqa: BLE001 - logcapture must never change the job's outcome
        try:
            os.write(2, f"logcapture: capture disabled for this job ({type(e).__name__}); "
                        "the job runs normally\n".encode())
        except OSError:
            pass
        return _exec_job(job)


def job_script() -> None:
    """The console script ``logcapture-job``: ``job_main``, then the end without the
    interpreter's teardown (``runner.exits.leave``): the job has ended by then."""
    code = job_main()
    from ..runner.exits import leave

    leave(code)


def _captured(job: list[str], opts: dict[str, str]) -> int:
    from pathlib import Path

    from ..capture import capture_command
    from ..errors import Warner
    from ..spool.layout import default_root
    from .jobrecords import PUBLIC_CONFIG
    from .jobs import run_id_for
    from .nodesampler import node_sampler_running

    env = dict(os.environ)
    warn = Warner()
    root = default_root(env, process="slurm", configured=opts.get("spool-root"))
    run_id = run_id_for(env)
    # The admin config is root-only (it holds the store's credentials); the prolog leaves its
    # public part beside the spool. A missing file means the defaults.
    env["LOGCAPTURE_CONFIG"] = str(root / PUBLIC_CONFIG)
    spool: Path | None = None
    beside = None
    if run_id is not None:
        job_dir = root / env["SLURM_JOB_ID"]
        try:
            st = os.lstat(job_dir)
            import stat
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                spool = job_dir
        except OSError:
            pass
    if spool is not None:
        # The SPANK plugin (slurm/spank/logcapture_task.c) captures each task of the job's
        # srun steps into this directory: the job's environment is how it learns that the
        # user opted in, on every node of the job (srun passes it on, --export=ALL).
        from .task import TASKS_VAR

        env[TASKS_VAR] = str(spool)
        # And srun's copy of what the tasks print is not stored again with the batch script
        # (slurm.forward: the plugin hands srun's output to this reader through pipes).
        from .forward import Forwarder, batch_address

        beside = Forwarder(batch_address(env["SLURM_JOB_ID"]))
    else:
        spool = default_root(env)
        warn(f"the job's spool directory under {root} is missing (did the logcapture prolog "
             f"run?); capturing to {spool} instead, which the agent does not ship")
    # The prolog's node sampler samples this node (and every other node of the job): the
    # wrapper samples only when there is none, so no node is sampled twice. The hardware
    # inventory still goes into the Start record.
    sample = not node_sampler_running(str(root), env.get("SLURM_JOB_ID", ""))
    return capture_command(job, spool_root=spool, run_id=run_id, warn=warn, env=env,
                           sample=sample, beside=beside)
