"""The capture process wiring (logcapture/capture.py): what the wrapper hands the worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from logcapture.capture import WorkerSettings
from logcapture.config import AdminConfig

FIELDS = dict(run_id="r", run_dir=Path("/tmp/r"), admin=AdminConfig(), mode="enabled", rows=24,
              columns=80, env={}, problems=[], sample=False, start_fields={}, wrapper_pid=1,
              warn=print, merged=False)


def test_the_worker_settings_hold_what_they_were_given() -> None:
    s = WorkerSettings(**FIELDS)
    assert {k: getattr(s, k) for k in FIELDS} == FIELDS


def test_a_misspelt_setting_is_an_error_not_a_new_field() -> None:
    with pytest.raises(TypeError, match="colums"):
        WorkerSettings(**{**{k: v for k, v in FIELDS.items() if k != "columns"}, "colums": 80})
    with pytest.raises(TypeError, match="smaple"):
        WorkerSettings(**FIELDS, smaple=True)  # type: ignore[call-arg] # mypy sees it too


def test_a_missing_setting_is_an_error() -> None:
    with pytest.raises(TypeError, match="wrapper_pid"):
        WorkerSettings(**{k: v for k, v in FIELDS.items() if k != "wrapper_pid"})
