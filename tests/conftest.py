"""Shared fixtures: per-test spool and state folders for the real CLI (``helpers.lc``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import env_for


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def lc_env(tmp_path: Path, spool: Path) -> dict[str, str]:
    """An environment for `logcapture` subprocesses (``helpers.env_for``) with its spool at the
    ``spool`` fixture's path."""
    env = env_for(tmp_path, sample_interval=None)
    assert env["LOGCAPTURE_SPOOL"] == str(spool)
    return env
