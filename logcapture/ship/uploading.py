"""Shipping after the fact: ``upload()`` ships the latest run, one run, or all runs of a
spool (the CLI's ``upload``, the Slurm epilog)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..config.defaults import SPOOL_RETENTION_DAYS
from ..errors import (
    LogcaptureError,
    SpoolError,
    StoreAuthError,
    StoreDataError,
    StoreError,
    StoreUnavailable,
)
from ..insights.notify import Notifier
from ..ownership import identity_from_spool
from ..runs import find_run
from ..spool.layout import find_run_dirs
from ..store import Identity, Store, open_store, redact
from .batches import BATCH_BYTES, _take_warnings, ship_run
from .cursor import lock_cursor
from .diagnosis import JobInfo
from .result import UploadResult
from .retention import retire_shipped
from .retry import STORE_WAIT, Warn, _with_retry

DEADLINE = 300.0  # gpufl's total timeout (5 min)


def upload(spool_root: Path, run: str | None = None, all: bool = False,  # noqa: A002
           force: bool = False, dsn: str | None = None, *, deadline: float = DEADLINE,
           retention_days: float | None = SPOOL_RETENTION_DAYS,
           identify: Callable[[Path], Identity] = identity_from_spool,
           max_bytes: int = BATCH_BYTES, warn: Warn | None = None,
           sleep: Callable[[float], None] = time.sleep,
           shipped_ok: bool = False, job_info: JobInfo | None = None,
           notifier: Notifier | None = None) -> UploadResult:
    """Ship runs from ``spool_root`` to the store ``dsn``: the latest run (default), ``run``,
    or ``all`` runs not yet shipped (oldest first). A run already shipped is refused in
    single-run mode (exit 2) and skipped with ``all``, unless ``force``; ``shipped_ok``
    skips it in single-run mode too (the epilog, which may find that the agent was first).
    Never raises for store or spool failures: they are in the result (gpufl's
    ``upload_logs``)."""
    t0 = time.monotonic()
    result = UploadResult()
    end = t0 + deadline
    try:
        selected = _select(Path(spool_root), run, all)
    except LogcaptureError as e:
        result.exit_code, result.error = 2, e.message
        return result
    if not selected:
        result.warnings.append(f"no runs in {spool_root}")
        result.elapsed = time.monotonic() - t0
        return result

    store: Store | None = None

    def get_store() -> Store:
        nonlocal store
        if store is None:
            store = _with_retry(
                lambda: open_store(dsn, wait=max(0.0, min(STORE_WAIT, end - time.monotonic()))),
                end, sleep, warn)
        return store

    try:
        for run_dir in selected:
            try:
                _upload_one(run_dir, get_store, result, force=force,
                            single=not all, shipped_ok=shipped_ok, end=end,
                            retention_days=retention_days, identify=identify,
                            max_bytes=max_bytes, sleep=sleep, warn=warn, job_info=job_info,
                            notifier=notifier)
            except StoreAuthError as e:
                result.failed.append(run_dir.name)
                result.error = e.message
                result.exit_code = 2
                break
            except StoreUnavailable as e:
                result.failed.append(run_dir.name)
                result.error = (f"{e.message} (gave up after {deadline:.0f}s; the spool is "
                                "kept, upload again later)")
                break
            except (StoreError, SpoolError) as e:
                result.failed.append(run_dir.name)
                result.error = e.message
                if isinstance(e, StoreError) and not isinstance(e, StoreDataError):
                    break
    finally:
        if store is not None:
            store.close()
    if result.exit_code == 0:
        if result.failed:
            result.exit_code = 1 if (result.runs or result.records) else 2
        elif result.bad_lines or result.set_aside or result.torn:
            result.exit_code = 1
    result.elapsed = time.monotonic() - t0
    return result


def _select(root: Path, run: str | None, all_runs: bool) -> list[Path]:
    if run and all_runs:
        raise LogcaptureError("--run and --all are mutually exclusive")
    if not root.is_dir():
        raise LogcaptureError(f"spool directory {root} does not exist")
    if run:
        # a run id, or a Slurm job reference (1234, 1234_5, 1234.1) as `ls` shows it, in a
        # user's spool or a cluster's spool root (one folder per job)
        return [find_run(root, run)]
    runs = find_run_dirs(root)
    if all_runs:
        return runs
    return runs[-1:]


def _upload_one(run_dir: Path, get_store: Callable[[], Store], result: UploadResult, *,
                force: bool, single: bool, end: float, retention_days: float | None,
                shipped_ok: bool = False,
                identify: Callable[[Path], Identity], max_bytes: int,
                sleep: Callable[[float], None], warn: Warn | None,
                job_info: JobInfo | None = None, notifier: Notifier | None = None) -> None:
    name = run_dir.name
    with lock_cursor(run_dir, wait=max(0.0, end - time.monotonic())) as rc:
        if rc is None:
            raise StoreUnavailable(f"run {name}: another shipper holds its cursor")
        if rc.cursor.shipped_at and not force:
            if single and not shipped_ok:
                raise StoreError(
                    f"run {name} was already uploaded on {rc.cursor.shipped_at} "
                    f"({rc.cursor.records} records). Pass --force to re-upload.")
            result.skipped.append(name)
            _take_warnings(rc, result)
            if retention_days is not None and retire_shipped(rc, retention_days, result):
                rc.save()
            return
        identity = identify(run_dir)

        def attempt() -> bool:
            return ship_run(get_store(), run_dir, identity, rc, result, max_bytes=max_bytes,
                            retention_days=retention_days, force=force, job_info=job_info,
                            notifier=notifier)

        first = True

        def once() -> bool:
            nonlocal first
            f, first = first, False
            if not f:
                # the failed attempt recorded nothing; re-read what is pending
                rc.cursor = rc._load()
            return attempt()

        done = _with_retry(once, end, sleep, warn)
        if done or not single or rc.cursor.records:
            result.runs.append(name)


def describe_dsn(dsn: str | None) -> str:
    from ..store import resolve_dsn

    return redact(resolve_dsn(dsn))
