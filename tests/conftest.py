"""Shared fixtures: per-test spool and state folders for the real CLI (``helpers.lc``)."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from helpers import env_for

# The test process starts the embedded engine hundreds of times (a store per test), and each
# start leaves descriptors behind (docs/admin.md, "start afresh in place"): the soft limit is
# raised to the hard one, as a program that does not use select(2) may (getrlimit(2)).
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if _hard != resource.RLIM_INFINITY and _soft < _hard:
    resource.setrlimit(resource.RLIMIT_NOFILE, (_hard, _hard))


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
