"""Shared fixtures: the real CLI as a subprocess, and per-test spool and state folders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LOGCAPTURE = [sys.executable, "-m", "logcapture"]


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def lc_env(tmp_path: Path, spool: Path) -> dict[str, str]:
    """An environment for `logcapture` subprocesses: a private spool, no .logoptin, no admin
    config, fast flushing."""
    env = dict(os.environ)
    env["LOGCAPTURE_SPOOL"] = str(spool)
    env["LOGCAPTURE_OPTIN"] = str(tmp_path / "no-logoptin")
    env["LOGCAPTURE_CONFIG"] = str(tmp_path / "no-config.yaml")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["LOGCAPTURE_FLUSH_INTERVAL"] = "0.2"
    env.pop("SLURM_JOB_ID", None)
    return env


def run_lc(args: list[str], env: dict[str, str], **kw: object) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("timeout", 60)
    return subprocess.run([*LOGCAPTURE, *args], env=env, **kw)  # type: ignore[call-overload]
