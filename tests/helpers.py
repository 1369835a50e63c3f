"""What the tests share: the one way they run the ``logcapture`` command (``lc``: the real
console command in a subprocess, as a user types it) and the environment it runs in
(``env_for``: a private spool, state folder and no configuration). Fixtures built on them are
in ``conftest.py``; the page's server and browser in ``pages.py``."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

LOGCAPTURE = [sys.executable, "-m", "logcapture"]
REPO = Path(__file__).resolve().parent.parent  # the tree under test


class Ran(NamedTuple):
    """What a run of the command gave: its exit status and outputs (bytes, or text with
    ``text=True``); also a tuple, ``code, out, err = lc(...)``."""

    returncode: int
    stdout: Any
    stderr: Any


def lc(args: Sequence[str], env: Mapping[str, str] | None = None, *, user: str | None = None,
       check: bool = False, timeout: float = 120, **kw: Any) -> Ran:
    """``logcapture ARGS`` run as a person runs it, with ``env`` (default: this process's) and
    as ``user`` (default: the caller; another user gets a clean environment of theirs, this
    tree's logcapture on PYTHONPATH, plus ``env``). ``check``: raise CalledProcessError on a
    non-zero exit. Other keywords go to ``subprocess.run`` (``text``, ``input``, ``cwd``)."""
    if user is not None:
        pw = pwd.getpwnam(user)
        env = {"HOME": pw.pw_dir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
               "LOGCAPTURE_CONFIG": "/nonexistent", "PYTHONPATH": str(REPO), **(env or {})}
        kw.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        kw.setdefault("cwd", "/")
    kw.setdefault("capture_output", True)
    res = subprocess.run([*LOGCAPTURE, *args], env=None if env is None else dict(env),
                         check=check, timeout=timeout, **kw)
    return Ran(res.returncode, res.stdout, res.stderr)


def env_for(tmp: Path, sample_interval: str | None = "0.2") -> dict[str, str]:
    """An environment for ``logcapture`` subprocesses: a private spool and state folder under
    ``tmp``, no .logoptin, no admin config, fast flushing (and sampling, unless
    ``sample_interval`` is None), no Slurm job."""
    env = dict(os.environ)
    env.update(LOGCAPTURE_SPOOL=str(tmp / "spool"), XDG_STATE_HOME=str(tmp / "state"),
               LOGCAPTURE_OPTIN=str(tmp / "no-logoptin"),
               LOGCAPTURE_CONFIG=str(tmp / "no-config.yaml"), LOGCAPTURE_FLUSH_INTERVAL="0.2")
    if sample_interval is not None:
        env["LOGCAPTURE_SAMPLE_INTERVAL"] = sample_interval
    env.pop("SLURM_JOB_ID", None)
    return env


def agent_until_shipped(argv: Sequence[str], env: Mapping[str, str], run_dir: Path,
                        timeout: float = 60) -> tuple[int, str, str]:
    """Start ``argv`` (``logcapture agent ...``), wait until its cursor says all of
    ``run_dir`` is in the store (or ``timeout``), and stop it with TERM, as an init system
    does: its exit status, the first line it printed on stderr, and the rest."""
    import json
    import signal
    import time

    p = subprocess.Popen(list(argv), env=dict(env), stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        first = p.stderr.readline()
        cursor = run_dir / ".logcapture-cursor.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (
                cursor.exists() and json.loads(cursor.read_text()).get("shipped_at")):
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        _, rest = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return p.returncode, first, rest


def wait_foreground(argv: Sequence[str], timeout: float = 30.0) -> int:
    """The pid of a process running exactly ``argv`` once it is the foreground job of its
    terminal (its process group is the terminal's foreground group), for a test that is
    about to type ^C or ^Z at it: a shell under load may not have handed it the terminal
    yet when its first output shows. AssertionError after ``timeout`` seconds."""
    import time

    want = ("\0".join(argv) + "\0").encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read() != want:
                        continue
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            # after the command's name: state, ppid, pgrp, session, tty_nr, tpgid
            if fields[2] == fields[5]:
                return int(entry)
        time.sleep(0.02)
    raise AssertionError(f"no {' '.join(argv)!r} became the foreground job in {timeout} s")
