"""The Reader over the caller's own spool and store (``LocalReader``), as on a laptop or on
the node that runs the job: a run is read from the store once shipped, else from the spool;
on a login node, "the store" is the read service.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import jobref
from ..errors import LogcaptureError, NotFound, SpoolError, UsageError
from ..insights.efficiency import admin_thresholds
from ..logview import just_before
from ..ownership import trusted_identity
from ..records import OUTPUT_STREAMS, Command, Line, Metadata, Note
from ..runs import find_run, follow_records, job_candidates, summarize
from ..search import Request, answer, merge
from ..ship import is_shipped
from ..spool.layout import find_run_dirs
from ..spool.reading import iter_run
from ..store import EXPORTS, export_rows
from .held_store import HeldStore, Reopened
from .interface import LOG_PAGE, Reader, page_limit
from .show import describe, spool_facts
from .spool_pages import SpoolRun
from .spool_search import search_spool
from .store_reader import StoreReader
from .summaries import newest_first, summary_of_spool, summary_of_store


def current_user() -> tuple[str, int]:
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name, uid
    except KeyError:
        return str(uid), uid

class LocalReader:
    """The Reader over a spool root and a store, as the user running it: their own runs only
    (root reads every run it can open). ``source``: ``auto`` reads a run from the store once
    the spool has shipped all of it (or no longer has it), else from the spool; ``spool`` and
    ``store`` force one. ``remote``: where "the store" is asked instead (the read service's
    ``ServiceReader`` on a cluster's login node)."""

    def __init__(self, spool_root: Path, dsn: str | None = None, source: str = "auto",
                 warn: Callable[[str], None] | None = None, store_wait: float = 5.0,
                 remote: Reader | None = None):
        self.root = spool_root
        self.source = source
        self.user, self.uid = current_user()
        self.owner: str | None = None if self.uid == 0 else self.user
        self.held = HeldStore(dsn, wait=store_wait, warn=warn)
        self.remote = remote
        self.store: Reader = (remote if remote is not None
                              else StoreReader(self.held, self.owner))
        self._where: dict[str, Path | None] = {}  # run id -> its spool dir, None: the store
        self._cache: dict[Path, SpoolRun] = {}  # spool runs asked of, read on as they grow

    # where a run lives
    def _mine(self, run_dir: Path) -> tuple[str, int] | None:
        """The run's trusted owner (``ownership.trusted_identity``), or None when it is not the
        caller's."""
        try:
            ident = trusted_identity(run_dir)
        except (OSError, LogcaptureError):
            return None
        if self.owner is not None and ident.uid != self.uid:
            return None
        return ident.user, ident.uid

    def owns(self, run_dir: Path) -> bool:
        """Whether the spool run ``run_dir`` is the caller's (``runs`` lists only those)."""
        return self._mine(run_dir) is not None

    def spool_dir(self, run: str) -> Path | None:
        """The spool directory ``run`` is read from; None when it is read from the store."""
        return self._dir(run)

    def _spool_run(self, ref: str | None) -> Path | None:
        if self.source == "store":
            return None
        try:
            run_dir = find_run(self.root, ref)
        except NotFound:
            return None
        return run_dir if self._mine(run_dir) is not None else None

    def _in_store(self) -> bool:
        if self.source == "spool":
            return False
        return self.remote is not None or self.held.available

    def _resolve_job(self, ref: str) -> str:
        """A Slurm job reference (``jobref``) among the caller's runs in the spool and the
        store together: an array's tasks or a requeued job's runs may be in both. A run is
        read from the spool until it is shipped, as ``resolve`` does."""
        found: dict[str, Any] = {}
        live: dict[str, Path] = {}  # in the spool, not shipped (or --source spool)
        shipped: dict[str, Path] = {}
        if self.source != "store":
            run_dirs = {d.name: d for d in find_run_dirs(self.root)}
            for c in jobref.select(ref, job_candidates(list(run_dirs.values()), ref)):
                run_dir = run_dirs[str(c["run"])]
                if self._mine(run_dir) is None:
                    continue
                found[run_dir.name] = c
                if self.source == "spool" or not is_shipped(run_dir):
                    live[run_dir.name] = run_dir
                else:
                    shipped[run_dir.name] = run_dir
        stored: set[str] = set()
        if self._in_store():
            for d in self._store_candidates(ref):
                if d["run"] not in live:
                    found[d["run"]] = d
                    stored.add(d["run"])
        run = jobref.choose(ref, found.values())
        self._where[run] = live.get(run) or (None if run in stored else shipped.get(run))
        return run

    def _store_candidates(self, ref: str) -> list[dict[str, Any]]:
        """Summaries of the caller's runs in the store that job reference ``ref`` may name."""
        if isinstance(self.store, StoreReader):
            with self.held() as st:
                return [summary_of_store(r) for r in st.runs(self.owner, job=ref)]
        return [dict(d) for d in jobref.select(ref, self.store.runs())]

    def stored_runs(self, ref: str) -> list[dict[str, Any]] | None:
        """Summaries of the caller's runs in the store (or the read service) that the job
        reference ``ref`` may name; None when no store is read (``--source spool``, none)."""
        return self._store_candidates(ref) if self._in_store() else None

    def release_store(self) -> None:
        """Between a follower's reads: an embedded store is one process's at a time, so the
        shipper may write in the meantime."""
        self.held.take_turns()

    def resolve(self, ref: str | None) -> str:
        if ref is None or ref == "latest":  # the newest run, wherever it is
            # (a job's, not one of its tasks, which start after it: `ls JOB` lists those)
            everything = self._runs(insights=False)
            newest = [d for d in everything if not jobref.is_task(d)] or everything
            if newest:
                ref = newest[0]["run"]
        if ref is not None and jobref.parse(ref) is not None:
            return self._resolve_job(ref)
        run_dir = self._spool_run(ref)
        if run_dir is not None and (self.source == "spool" or not is_shipped(run_dir)):
            self._where[run_dir.name] = run_dir
            return run_dir.name
        if self._in_store():
            name = run_dir.name if run_dir is not None else ref
            try:
                run = self.store.resolve(name)
                self._where[run] = None
                return run
            except NotFound:
                pass
        if run_dir is not None:
            self._where[run_dir.name] = run_dir
            return run_dir.name
        where = f"{self.root}" + (" or in the store" if self.source != "spool" else "")
        if ref is None or ref == "latest":
            raise NotFound(f"no runs in {where}")
        raise NotFound(f"no run {ref!r}: not in {self.root}"
                       + (" and not in the store" if self.source != "spool" else "")
                       + " (see `logcapture ls`)")

    def _dir(self, run: str) -> Path | None:
        if run not in self._where:
            self.resolve(run)
        return self._where.get(run)

    # the questions
    def runs(self) -> list[dict[str, Any]]:
        return self._runs()

    def _runs(self, insights: bool = True) -> list[dict[str, Any]]:
        """The summaries; without ``insights``, a spool run's are only those its End record
        says (enough to find the newest run)."""
        out = []
        if self.source != "store":
            thresholds = admin_thresholds()
            for run_dir in find_run_dirs(self.root):
                who = self._mine(run_dir)
                if who is None:
                    continue
                try:
                    s = summarize(run_dir)
                except SpoolError:
                    continue
                if s.state != "EMPTY":
                    out.append(summary_of_spool(s, *who, run_dir if insights else None,
                                                thresholds))
        if self._in_store():
            known = {d["run"] for d in out}
            out += [d for d in self.store.runs() if d["run"] not in known]
        return newest_first(out)

    def lines(self, run: str, stream: str | None = None, tail: int | None = None
              ) -> list[dict[str, Any]]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.lines(run, stream, tail)
        out = []
        for rec in iter_run(run_dir):
            if isinstance(rec, (Line, Command, Note, Metadata)) and (
                    stream is None and rec.stream in (*OUTPUT_STREAMS, "run")
                    or rec.stream == stream):
                out.append(rec.to_dict())
        if stream is None:  # both streams and the run's notes, by read time (as the store)
            out.sort(key=lambda d: d["ts"])
        return out[-tail:] if tail else out

    def follow(self, run: str) -> Iterator[dict[str, Any]]:
        run_dir = self._dir(run)
        if run_dir is not None:
            for rec in follow_records(run_dir):
                yield rec.to_dict()
            return
        if self.remote is not None:
            yield from self.remote.follow(run)
            return
        self.held.take_turns()  # the store is opened for each read: others take turns
        session = Reopened(self.held)
        yield from StoreReader(session, self.owner).follow(run)

    def summary(self, run: str) -> dict[str, Any]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.summary(run)
        who = self._mine(run_dir) or (self.user, self.uid)
        return summary_of_spool(summarize(run_dir), *who, run_dir)

    def log(self, run: str, stderr: bool = False, before: str | None = None,
            after: str | None = None, limit: int = LOG_PAGE, line: int | None = None
            ) -> dict[str, Any]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.log(run, stderr, before, after, limit, line)
        spool_run = self._cached(run_dir)
        if line is not None:
            after = just_before(spool_run.line_key(line), run, line)
        return spool_run.page(stderr, before, after, page_limit(limit))

    def _cached(self, run_dir: Path) -> SpoolRun:
        cached = self._cache.get(run_dir)
        if cached is None:
            cached = self._cache[run_dir] = SpoolRun(run_dir)
        return cached

    def describe(self, run: str) -> dict[str, Any]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.describe(run)
        who = self._mine(run_dir) or (self.user, self.uid)
        return describe(spool_facts(run_dir, *who))

    def metadata(self, run: str) -> list[dict[str, Any]]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.metadata(run)
        return self._cached(run_dir).metadata()

    def samples(self, run: str) -> list[dict[str, Any]]:
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.samples(run)
        return self._cached(run_dir).samples()

    def export_rows(self, run: str, what: str) -> list[dict[str, Any]]:
        if what not in EXPORTS:
            raise UsageError(f"--what must be lines, metadata, samples or progress, not {what!r}")
        run_dir = self._dir(run)
        if run_dir is None:
            return self.store.export_rows(run, what)
        recs = (self.lines(run) if what == "lines" else
                self._cached(run_dir).progress() if what == "progress" else
                self.metadata(run) if what == "metadata" else self.samples(run))
        return export_rows(what, recs)

    def search(self, request: dict[str, Any]) -> dict[str, Any]:
        """Shipped runs are searched in the store, the others in the spool (all in one,
        with ``source``), and the newest matches of both kept."""
        req = Request.from_dict(request)
        for ref in req.jobs:
            self.resolve(ref)  # NotFound names a job that is none of the caller's
        if self.remote is not None and self.source != "spool":
            # The read service searches the store as the caller; this machine's spool is not
            # added (on a login node there is none: a running job's lines are found once its
            # node's agent has shipped them).
            return self.remote.search(request)
        found = []
        if self._in_store():
            assert isinstance(self.store, StoreReader)  # no remote: the caller's own store
            found.append(self.store.found(req))
        if self.source != "store":
            found.append(search_spool(self.root, req, self._mine, skip_shipped=self._in_store()))
        return answer(merge(found, req.limit))

    def store_wanted(self) -> bool:
        """Whether another process waits for the embedded store this reader holds."""
        return self.held.wanted()

    def close(self) -> None:
        self.held.close()
        if self.remote is not None:
            self.remote.close()

