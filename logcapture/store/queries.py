"""Reading the store: runs and their summaries, a run's records, the tail and pages of its
log, metadata, samples, insights, a diagnosis's lines, and search.

Every read takes ``owner``: a user name, or None for all owners (the run's own store on a
laptop, an administrator). The tail of a job (``lines(run, limit=N)``) is a FINAL read in key
order that stops after N rows, of ``lines`` alone unless the run has notes or metadata.
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .. import jobref, ranklabel
from ..errors import NotFound, StoreAuthError, StoreError, StoreUnavailable, UsageError
from ..logview import ts_ns
from ..records import redactions_by_kind
from ..search import Found, Hit, Pattern, Request
from ..summary_row import name_sql, state_sql
from .connection import _Connection, classify
from .schema import TABLES, json_keys

# How a query takes a condition: the conditions of this module (``_run_cond``, ``Store.lines``,
# ``Store.search``) and of ``search.Pattern.sql`` are fixed text of the code, composed with
# f-strings; every value in them is a server-side parameter (``{name:Type}``), bound by
# clickhouse-connect, never text of the query.

# An in-order read that stops after {limit} rows gains nothing from more threads, and reads
# less in small blocks (the default, 65k rows a block from each part, reads several times the
# rows it keeps). bench_store, a 2M-line job among 20M rows: 40 ms with the defaults, 33 ms
# with one thread, 23 ms with blocks of 2048 rows too (1024-8192 within 3 ms of that).
_TAIL_ORDER = "ORDER BY ts DESC, stream DESC, seq DESC, owner DESC LIMIT {limit:UInt64}"
_TAIL_SETTINGS = "SETTINGS max_threads = 1, max_block_size = 2048"


def _tail_sql(cond: str) -> str:
    """``Store._tail``: the newest rows of lines, notes and metadata matching ``cond`` (a
    condition of ``Store.lines``) in one query (one round trip), each a FINAL read in key order
    that stops after {limit} rows (bench_store, 50M rows: 32 ms for the last 10k lines of a
    2M-line job, vs 34-100 ms for the newest rows without FINAL with the copies dropped by key;
    do_not_merge_across_partitions_select_final, correct here as ts is in the key, made it
    twice as slow). No outer ORDER BY (it cost more than the reads): ``Store._tail`` checks the
    order."""
    return f"""SELECT stream, seq, toUnixTimestamp64Nano(ts), CAST(kind AS String), text,
    if(kind = 'command', options, style), CAST(owner AS String), 0
FROM (SELECT stream, seq, ts, kind, text, options, style, owner FROM lines FINAL WHERE {cond}
    {_TAIL_ORDER})
UNION ALL
SELECT stream, seq, toUnixTimestamp64Nano(ts), CAST(note AS String), toString(count), text,
    CAST(owner AS String), 1
FROM (SELECT stream, seq, ts, note, count, text, owner FROM notes FINAL WHERE {cond}
    {_TAIL_ORDER})
UNION ALL
SELECT stream, seq, toUnixTimestamp64Nano(ts), fields, CAST(label AS String), '',
    CAST(owner AS String), 2
FROM (SELECT stream, seq, ts, fields, label, owner FROM metadata FINAL WHERE {cond}
    {_TAIL_ORDER})
{_TAIL_SETTINGS}"""


# A line row's columns: a command's options and a line's style share the last one.
_LINE_COLUMNS = "kind, text, if(kind = 'command', options, style)"


def _tail_lines_sql(cond: str) -> str:
    """``Store.lines``' first query for a tail: the newest lines matching ``cond`` alone (most
    runs have no notes or metadata in their tail's range, and each of the other two FINAL reads
    cost 2-3 ms even when empty), and, in the last column, whether the run has any notes (1) or
    metadata (2): two primary-key look-ups without FINAL. Only then ``_tail_sql`` follows."""
    return f"""SELECT stream, seq, toUnixTimestamp64Nano(ts), CAST(kind AS String), text,
    if(kind = 'command', options, style),
    (SELECT count() FROM (SELECT 1 FROM notes WHERE {cond} LIMIT 1))
    + 2 * (SELECT count() FROM (SELECT 1 FROM metadata WHERE {cond} LIMIT 1))
FROM lines FINAL WHERE {cond} {_TAIL_ORDER}
{_TAIL_SETTINGS}"""


def _search_sql(where: str) -> str:
    """``Store.search``: one window of time, newest first; ``where``: the conditions of
    ``search.Pattern.sql`` and ``Store.search``, joined.

    ClickHouse 26.5's top-K dynamic filter (the embedded engine of chdb-core-lite) compares the
    second ORDER BY key with the first's type ("Cannot parse DateTime: while converting
    'stdout'"); 26.9 does not. The filter only skips granules early; the LIMIT is the same
    without it, so it is off."""
    return f"""SELECT run, CAST(owner AS String), CAST(stream AS String), seq,
    toUnixTimestamp64Nano(ts), text
FROM lines WHERE {where}
ORDER BY ts DESC, stream DESC, seq DESC LIMIT {{n:UInt64}}
SETTINGS use_top_k_dynamic_filtering = 0"""


# The windows a search asks in turn, in seconds back from the newest line it may find (None:
# all the rest); each window's partitions (one a day) are read only by its own query.
SEARCH_WINDOWS: tuple[float | None, ...] = (86400.0, 8 * 86400.0, 64 * 86400.0, None)
SEARCH_MARGIN_NS = 3600 * 10**9  # a run's lines may be stamped before its first record
# The lines around matching lines: ranges of sequence numbers, per run, owner and stream.
_SEARCH_CONTEXT_SQL = """SELECT run, CAST(owner AS String), CAST(stream AS String), seq,
    toUnixTimestamp64Nano(ts), text
FROM lines WHERE run IN {runs:Array(String)} AND arrayExists(r -> r.1 = run AND r.2 = owner
    AND r.3 = stream AND seq >= r.4 AND seq <= r.5,
    {ranges:Array(Tuple(String, String, String, UInt64, UInt64))})"""


def _ns_to_float(ns: int) -> float:
    # DateTime64(9) parsed the spool's JSON decimal text exactly (a float of a 10-digit epoch
    # has at most 7 decimals); int / int is correctly rounded, as is float(text), so this is
    # the very float the spool held.
    return ns / 1_000_000_000


def _loads(text: str | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def owner_cond(owner: str | None) -> str:
    """The one spelling of the owner rule in a read: the condition selecting ``owner``'s rows
    (a user name, bound as the parameter ``owner``), or every owner's (None: ``1``)."""
    return "1" if owner is None else "owner = {owner:String}"


class _Queries(_Connection):
    """The reads of ``Store``. Every read takes ``owner``: a user name, or None for all owners.
    The condition is built from constants only (``owner_cond``, ``_run_cond``); the values are
    parameters."""

    def runs(self, owner: str | None = None, run: str | None = None,
             job: str | None = None) -> list[dict[str, Any]]:
        """One dict per run (``run``: that one only), newest first: run, owner, uid, cluster,
        job_id, host, command, start (epoch s), end, last (newest record), state (RUNNING
        while no end record), exit_status, signal, duration, slurm (the Start record's Slurm
        identity, a dict), lines (output lines: the End record's counts, counted in the
        store while it runs), redactions (secrets replaced: the End record's counts, None
        while it runs). ``job``: only the runs a job reference may name
        (``jobref.select`` picks among them): run id ``job``, or job id or array job id
        ``jobref.parse(job).job``."""
        p = {"owner": owner or "", "run": run or "", "ref": job or "", "job": ""}
        conds = [owner_cond(owner)] + (["run = {run:String}"] if run is not None else [])
        if job is not None:
            ref = jobref.parse(job)
            p["job"] = ref.job if ref is not None else ""
            conds.append("(run = {ref:String} OR ({job:String} != '' AND (job_id = {job:String}"
                         " OR JSONExtractString(ifNull(slurm, ''), 'array_job_id') = "
                         "{job:String})))")
        rows = self._query(
            "SELECT run, owner, uid, cluster, job_id, host, command, "
            "toUnixTimestamp64Nano(start_ts), toUnixTimestamp64Nano(end_ts), "
            "toUnixTimestamp64Nano(last_ts), ifNull(state, 'RUNNING'), exit_status, signal, "
            "duration, slurm, counts FROM runs FINAL WHERE " + " AND ".join(conds) +
            " ORDER BY ifNull(start_ts, last_ts) DESC, run", p)
        out = [self._run_row(r) for r in rows]
        for d, r in zip(out, rows, strict=True):
            d["slurm"] = _loads(r[14], {})
            counts = _loads(r[15], None)
            d["lines"] = (sum(int(c.get("lines", 0)) for c in counts.values()
                              if isinstance(c, dict))
                          if isinstance(counts, dict) else None)
            d["redactions"] = (sum(redactions_by_kind(counts).values())
                               if isinstance(counts, dict) else None)
        live = [d["run"] for d in out if d["lines"] is None]
        if live:
            counted = dict(self._query(
                "SELECT run, count() FROM lines FINAL WHERE run IN {runs:Array(String)} AND "
                "kind = 'line' AND " + owner_cond(owner) + " GROUP BY run",
                {"runs": live, "owner": owner or ""}))
            for d in out:
                if d["lines"] is None:
                    d["lines"] = int(counted.get(d["run"], 0))
        kinds: dict[tuple[str, str], list[str]] = {}
        for run, who, kind in self._query(
                "SELECT run, owner, kind FROM insights FINAL WHERE " + owner_cond(owner)
                + " ORDER BY run, category = 'live', category = 'efficiency', ts, kind",
                {"owner": owner or ""}):
            kinds.setdefault((run, who), []).append(kind)
        for d in out:
            d["insights"] = kinds.get((d["run"], d["owner"]), [])
        return out

    @staticmethod
    def _run_row(r: tuple[Any, ...]) -> dict[str, Any]:
        return {"run": r[0], "owner": r[1], "uid": r[2], "cluster": r[3], "job_id": r[4],
                "host": r[5] or "", "command": _loads(r[6], []),
                "start": _ns_to_float(r[7]) if r[7] is not None else None,
                "end": _ns_to_float(r[8]) if r[8] is not None else None,
                "last": _ns_to_float(r[9]), "state": r[10], "exit_status": r[11],
                "signal": r[12], "duration": r[13]}

    @staticmethod
    def _run_cond(run: str, owner: str | None) -> tuple[str, dict[str, Any]]:
        """The condition and parameters selecting one run's rows, of one owner or of all."""
        if owner is None:
            return "run = {run:String}", {"run": run}
        return "run = {run:String} AND " + owner_cond(owner), {"run": run, "owner": owner}

    def last_output(self, run: str, owner: str | None = None) -> float | None:
        """When the run printed its newest line or metadata line (epoch seconds); None when
        it printed none."""
        cond, p = self._run_cond(run, owner)
        rows = self._query(
            "SELECT max(t) FROM (SELECT toUnixTimestamp64Milli(max(ts)) AS t, count() AS n "
            "FROM lines WHERE " + cond + " UNION ALL SELECT toUnixTimestamp64Milli(max(ts)), "
            "count() FROM metadata WHERE " + cond + ") WHERE n > 0", p)
        newest = rows[0][0] if rows else None
        return newest / 1000 if newest else None

    def user_text_bytes_since(self, owner: str, since: float) -> int:
        """Bytes of output text ``owner``'s runs stored from ``since`` (epoch seconds) on, by
        the lines' times (the shipper's per-user daily bound, ``ship.UserQuota``)."""
        rows = self._query(
            "SELECT sum(length(text)) FROM lines WHERE " + owner_cond(owner)
            + " AND ts >= fromUnixTimestamp64Milli({since:Int64})",
            {"owner": owner, "since": int(since * 1000)})
        return int(rows[0][0] or 0) if rows else 0

    def has_run(self, run: str, owner: str | None = None) -> bool:
        cond, p = self._run_cond(run, owner)
        return bool(self._query("SELECT count() FROM runs WHERE " + cond, p)[0][0])

    def resolve_run(self, ref: str | None, owner: str | None = None) -> str:
        """The run id RUN names, as the other commands take it (``runs.find_run`` on the spool
        side): None or ``latest`` (the newest run in the store), a run id, or a Slurm job
        reference (``J``, ``J_T``, ``J.N``: ``jobref``). NotFound when the store has none (of
        ``owner``'s); a UsageError when an array job of several tasks is named."""
        p: dict[str, Any] = {"owner": owner or "", "ref": ref or ""}
        if ref is None or ref == "latest":
            rows = self._query("SELECT run FROM runs FINAL WHERE " + owner_cond(owner) +
                               " ORDER BY ifNull(start_ts, last_ts) DESC, run DESC LIMIT 1", p)
            if not rows:
                raise NotFound("the store has no runs yet (ship one with `logcapture upload`)")
            return str(rows[0][0])
        try:  # a Slurm job reference or a run id (jobref: the rule)
            return jobref.choose(ref, self.runs(owner, job=ref))
        except NotFound:
            raise NotFound(f"run {ref!r} is not in the store (ship it with `logcapture "
                           "upload`)") from None

    def record_count(self, run: str, owner: str | None = None) -> int:
        """About how many output records the run has (lines, notes, metadata; rows not yet
        merged counted each time): primary-key counts, without FINAL."""
        cond, p = self._run_cond(run, owner)
        return int(self._query(
            "SELECT (SELECT count() FROM lines WHERE " + cond + ") + (SELECT count() FROM "
            "notes WHERE " + cond + ") + (SELECT count() FROM metadata WHERE " + cond + ")",
            p)[0][0])

    def run_info(self, run: str, owner: str | None = None, *, counts: bool = True
                 ) -> dict[str, Any]:
        """The run's summary (as ``runs()``) plus ``start_record`` and ``end_record`` (record
        dicts as in the spool, or None) and per-table row counts (``counts=False``: not
        counted, four reads less: the shipper's diagnosis needs only the records)."""
        cond, p = self._run_cond(run, owner)
        rows = self._query(
            "SELECT run, owner, uid, cluster, job_id, host, command, "
            "toUnixTimestamp64Nano(start_ts), toUnixTimestamp64Nano(end_ts), "
            "toUnixTimestamp64Nano(last_ts), ifNull(state, 'RUNNING'), exit_status, signal, "
            "duration, start_seq, end_seq, cwd, record_user, record_uid, pid, mode, slurm, "
            "inventory, config, counts FROM runs FINAL WHERE " + cond, p)
        if not rows:
            raise NotFound(f"run {run!r} is not in the store")
        r = rows[0]
        info = self._run_row(r)
        start = end = None
        if r[14] is not None:
            start = {"kind": "start", "run": r[0], "stream": "run", "seq": r[14],
                     "ts": info["start"], "command": info["command"], "cwd": r[16] or "",
                     "user": r[17] or "", "uid": r[18] if r[18] is not None else -1,
                     "host": info["host"], "pid": r[19] or 0, "mode": r[20] or "",
                     "slurm": _loads(r[21], {}), "inventory": _loads(r[22], {}),
                     "config": _loads(r[23], {})}
        if r[15] is not None:
            end = {"kind": "end", "run": r[0], "stream": "run", "seq": r[15],
                   "ts": info["end"], "exit_status": r[11], "signal": r[12],
                   "state": r[10], "duration": r[13] or 0.0, "counts": _loads(r[24], {})}
        info["start_record"] = start
        info["end_record"] = end
        if counts:
            info["counts"] = {t: self._count(t, run, owner)
                              for t in ("lines", "notes", "metadata", "samples")}
        return info

    def tallies(self, run: str, owner: str | None = None) -> dict[str, Any]:
        """What the store counts for ``query.describe`` without reading every line: output
        lines per stream, ``notes`` as (stream, note, sum of count, records) rows, commands,
        the mode changes in order (stdout's notes: the classifier notes a change in both
        streams) and the metadata keys."""
        cond, p = self._run_cond(run, owner)
        lines = dict(self._query("SELECT stream, count() FROM lines FINAL WHERE " + cond
                                 + " AND kind = 'line' GROUP BY stream", p))
        notes = [(r[0], r[1], int(r[2]), int(r[3])) for r in self._query(
            "SELECT stream, note, sum(count), count() FROM notes FINAL WHERE " + cond
            + " GROUP BY stream, note", p)]
        commands = int(self._query("SELECT count() FROM lines FINAL WHERE " + cond
                                   + " AND kind = 'command'", p)[0][0])
        modes = [{"ts": _ns_to_float(r[0]), "text": r[1]} for r in self._query(
            "SELECT toUnixTimestamp64Nano(ts), text FROM notes FINAL WHERE " + cond
            + " AND note = 'mode' AND stream = 'stdout' ORDER BY ts, seq", p)]
        keys = [r[0] for r in self._query(
            f"SELECT DISTINCT arrayJoin({json_keys('fields')}) AS k FROM metadata FINAL "
            "WHERE " + cond + " ORDER BY k", p)]
        return {"lines": lines, "notes": notes, "commands": commands, "modes": modes,
                "metadata_keys": keys}

    def _count(self, table: str, run: str, owner: str | None = None) -> int:
        if table not in TABLES:
            raise UsageError(f"unknown table {table!r}")
        cond, p = self._run_cond(run, owner)
        return int(self._query("SELECT count() FROM {t:Identifier} FINAL WHERE " + cond,
                               {"t": table, **p})[0][0])

    def _rows(self, table: str, columns: str, cond: str, params: dict[str, Any]
              ) -> list[tuple[Any, ...]]:
        """``stream, seq, ts (ns), *columns`` of ``table``'s rows matching ``cond``, each record
        once (FINAL). ``table`` and ``columns`` are constants of this module, never input."""
        assert table in TABLES and (columns == _LINE_COLUMNS
                                    or re.fullmatch(r"[a-z_, ]+", columns))
        return self._query("SELECT stream, seq, toUnixTimestamp64Nano(ts), " + columns
                           + " FROM " + table + " FINAL WHERE " + cond, params)

    def _tail(self, cond: str, params: dict[str, Any], limit: int
              ) -> tuple[list[tuple[Any, ...]], ...]:
        """The newest ``limit`` records of lines, notes and metadata matching ``cond``, each
        once (FINAL), newest first, in one query (``_tail_sql``). Rows: ``stream, seq, ts (ns),
        a, b, c, owner, table`` with (a, b, c) = lines (kind, text, the options of a command
        or the style of a line), notes (note,
        count as text, text), metadata (fields, label)."""
        rows = self._query(_tail_sql(cond), {**params, "limit": limit})
        out = []
        for t in range(3):
            mine = [r for r in rows if r[7] == t]
            keys = [(r[2], r[0], r[1], r[6]) for r in mine]  # the key, ts first
            if any(a < b for a, b in zip(keys, keys[1:], strict=False)):  # UNION ALL keeps
                pairs = sorted(zip(keys, mine, strict=True), key=lambda kr: kr[0],  # no order
                               reverse=True)
                mine = [r for _, r in pairs]
            out.append(mine)
        return tuple(out)

    def _tail_of_lines(self, run: str, cond: str, params: dict[str, Any], limit: int
                       ) -> list[dict[str, Any]] | None:
        """``lines(run, limit=N)`` when the run has neither notes nor metadata (most runs):
        the newest N lines in one query (``_tail_lines_sql``), built into record dicts from
        its columns; None when the run has notes or metadata, or no lines."""
        try:
            res = self.client.query(_tail_lines_sql(cond),
                                    parameters={**params, "limit": limit})
            columns = res.result_columns
        except Exception as e:  # noqa: BLE001
            raise classify(e, "reading") from None
        if not columns or not len(columns[0]) or columns[6][0]:
            return None
        # newest first in key order: reversed, the tail reads oldest first. ts: DateTime64(9)
        # parsed the spool's JSON decimal text exactly, so ns / 1e9 is the very float the
        # spool held (``_ns_to_float``, inlined).
        streams, seqs, tss, kinds, texts, options = (c[::-1] for c in columns[:6])
        collect = gc.isenabled()
        gc.disable()  # 10k new dicts, no cycles: the collector's passes cost ~10 % here
        try:
            out = [{"kind": k, "run": run, "stream": s, "seq": q, "ts": t / 1_000_000_000,
                    "text": x} for s, q, t, k, x in zip(streams, seqs, tss, kinds, texts,
                                                        strict=True)]
        finally:
            if collect:
                gc.enable()
        if "command" in kinds or any(options):
            for d, o in zip(out, options, strict=True):
                if d["kind"] == "command":
                    d["options"] = _loads(o, {})
                elif o:
                    d["style"] = _loads(o, [])
        return out

    def lines(self, run: str, stream: str | None = None, limit: int | None = None, *,
              owner: str | None = None, after: Mapping[str, int] | None = None,
              since: float | None = None, head: int | None = None) -> list[dict[str, Any]]:
        """What ``logcapture logs`` shows: the run's output-stream records (line, command,
        note, metadata) as spool record dicts, in order (ts, stream, seq); ``stream`` picks
        one stream; ``limit`` keeps the last N. Run-level notes (stream ``run``) included
        when ``stream`` is None. ``after`` (stream -> the next seq not yet seen) and ``since``
        (epoch seconds; no record older) read only what is new to a follower: seq counts each
        stream from 0 and is shipped in order, so nothing is missed or read twice. ``head``
        keeps the first N (a page: the next page is ``after`` the streams' last seqs)."""
        cond, params = self._run_cond(run, owner)
        params["stream"] = stream or ""
        cond += " AND ({stream:String} = '' OR stream = {stream:String})"
        if after is not None:
            cond += (" AND seq >= transform(CAST(stream AS String), {streams:Array(String)}, "
                     "{nexts:Array(UInt64)}, toUInt64(0))")
            params["streams"] = list(after)
            params["nexts"] = [int(v) for v in after.values()]
        if since is not None:
            cond += " AND ts >= fromUnixTimestamp64Nano({since:Int64})"
            params["since"] = int(since * 1_000_000_000)
        if limit:
            tail = self._tail_of_lines(run, cond, params, int(limit))
            if tail is not None:
                return tail
            line_rows, note_rows, meta_rows = self._tail(cond, params, int(limit))
        else:
            if head:
                cond += " ORDER BY ts, stream, seq LIMIT {head:UInt64}"
                params["head"] = int(head)
            line_rows = self._rows("lines", _LINE_COLUMNS, cond, params)
            note_rows = self._rows("notes", "note, count, text", cond, params)
            meta_rows = self._rows("metadata", "fields, label", cond, params)
        # ts: DateTime64(9) parsed the spool's JSON decimal text exactly, so ns / 1e9 is the
        # very float the spool held (``_ns_to_float``), inlined: 10k rows per tail.
        lines = [{"kind": r[3], "run": run, "stream": r[0], "seq": r[1],
                  "ts": r[2] / 1_000_000_000, "text": r[4]} if r[3] != "command" else
                 {"kind": r[3], "run": run, "stream": r[0], "seq": r[1],
                  "ts": r[2] / 1_000_000_000, "text": r[4], "options": _loads(r[5], {})}
                 for r in line_rows]
        for d, r in zip(lines, line_rows, strict=True):
            if r[5] and r[3] != "command":  # a line's style (the options column of a command)
                d["style"] = _loads(r[5], [])
        notes = [{"kind": "note", "run": run, "stream": r[0], "seq": r[1],
                  "ts": r[2] / 1_000_000_000, "note": r[3], "count": int(r[4]), "text": r[5]}
                 for r in note_rows]
        meta = [{"kind": "metadata", "run": run, "stream": r[0], "seq": r[1],
                 "ts": r[2] / 1_000_000_000, "fields": _loads(r[3], {}),
                 **({"label": r[4]} if r[4] else {})} for r in meta_rows]
        if limit and not notes and not meta:
            lines.reverse()  # the tail comes newest first, in key order
            return lines
        out = lines + notes + meta
        out.sort(key=lambda d: (d["ts"], d["stream"], d["seq"]))
        return out[-limit:] if limit else out[:head] if head else out

    def log_page(self, run: str, owner: str | None = None, stderr: bool = False,
                 before: tuple[int, str, int] | None = None,
                 after: tuple[int, str, int] | None = None, limit: int = 1000
                 ) -> tuple[list[tuple[Any, ...]], bool, bool]:
        """One page of the run's log as ``logview`` shows it: entries ``(ts, stream, seq,
        kind, text, style, line number)`` in order, the newest ``limit`` before the cursor
        ``before`` (default: the newest), or the oldest ``limit`` after ``after``; whether
        more lie beyond; and whether the run has ended. A cursor is ``(ts in ns, stream,
        seq)``. The key begins with the run and the time, so a page costs one range of the
        run's rows, however long the log, and its line numbers a count of the keys before
        it (``line_numbers``). NotFound when the run is not the owner's."""
        from ..logview import METADATA, NUMBERED, log_sql, stored_metadata_text
        from ..sgr import spans

        cond, params = self._run_cond(run, owner)
        state = self._query("SELECT max(end_ts IS NOT NULL) FROM runs FINAL WHERE " + cond
                            + " GROUP BY run", params)
        if not state:
            raise NotFound(f"run {run!r} is not in the store")
        # Without FINAL (see log_sql): twice the page, and a record shipped twice and not
        # yet merged dropped here; a short page that hit the limit still says ``more``.
        params.update(stderr=int(stderr), limit=2 * int(limit) + 1)
        where, order = "1", "DESC"
        cursor = after or before
        if cursor is not None:
            params.update(c_ns=cursor[0], c_stream=cursor[1], c_seq=cursor[2])
            where = (f"(ts, stream, seq) {'>' if after else '<'} "
                     "(fromUnixTimestamp64Nano({c_ns:Int64}, 'UTC'), {c_stream:String}, "
                     "{c_seq:UInt64})")
            order = "ASC" if after else "DESC"
        sql = log_sql("", cond, "{stderr:UInt8}", where, order, "{limit:UInt32}",
                      ts="toUnixTimestamp64Nano(ts)", final=False, style=True)
        rows = self._query(sql, params)
        seen: set[tuple[str, int]] = set()
        unique = []
        for r in rows:
            if (r[1], r[2]) not in seen:
                seen.add((r[1], r[2]))
                unique.append(r)
        more = len(unique) > limit or len(rows) == params["limit"]
        page = unique[:limit]
        numbers = self.line_numbers(run, owner, [(r[1], int(r[2]), r[0]) for r in page
                                                 if r[3] in NUMBERED])
        out = [(r[0] / 1_000_000_000, r[1], int(r[2]), r[3],
                stored_metadata_text(r[4]) if r[3] == METADATA else r[4], spans(r[5]),
                numbers.get((r[1], int(r[2])), 0)) for r in page]
        if after is None:
            out.reverse()
        return out, more, bool(state[0][0])

    def line_numbers(self, run: str, owner: str | None,
                     keys: Iterable[tuple[str, int] | tuple[str, int, int]]
                     ) -> dict[tuple[str, int], int]:
        """The line numbers (``logview.py``) of the run's rows named by ``keys`` (``(stream,
        seq)``, with their time in ns when known: then only the rows up to the latest are
        read), keyed by ``(stream, seq)``; a key that is no line has none."""
        from ..logview import line_numbers_sql

        keys = list(keys)
        if not keys:
            return {}
        times = [int(k[2]) for k in keys if len(k) > 2]
        # A µs either side: any bounds number alike (a count before, rows after).
        lo, upto = ((min(times) - 1000, max(times) + 1000) if len(times) == len(keys)
                    else (0, 2**62))
        cond, params = self._run_cond(run, owner)
        rows = self._query(line_numbers_sql("", cond), {
            **params, "keys": [(k[0], int(k[1])) for k in keys], "lo": lo, "upto": upto})
        return {(r[0], int(r[1])): int(r[2]) for r in rows}

    def line_key(self, run: str, owner: str | None, n: int) -> tuple[int, str, int] | None:
        """The key ``(ts in ns, stream, seq)`` of the run's line numbered ``n`` (logview.py),
        or None."""
        if n < 1:
            return None
        cond, params = self._run_cond(run, owner)
        rows = self._query(
            "SELECT toUnixTimestamp64Nano(ts), CAST(stream AS String), seq FROM lines FINAL "
            "WHERE " + cond + " AND stream IN ('stdout', 'stderr') ORDER BY ts, stream, seq "
            "LIMIT 1 OFFSET {skip:UInt64}", {**params, "skip": int(n) - 1})
        return (int(rows[0][0]), rows[0][1], int(rows[0][2])) if rows else None

    def metadata(self, run: str, owner: str | None = None) -> list[dict[str, Any]]:
        """Metadata records of the run, newest first (dashboards show them that way)."""
        cond, p = self._run_cond(run, owner)
        rows = self._query("SELECT stream, seq, toUnixTimestamp64Nano(ts), fields, label FROM "
                           "metadata FINAL WHERE " + cond + " ORDER BY ts DESC, seq DESC", p)
        return [{"kind": "metadata", "run": run, "stream": r[0], "seq": r[1],
                 "ts": _ns_to_float(r[2]), "fields": _loads(r[3], {}),
                 **({"label": r[4]} if r[4] else {})} for r in rows]

    def samples(self, run: str, owner: str | None = None) -> list[dict[str, Any]]:
        """Sample records of the run, oldest first."""
        cond, p = self._run_cond(run, owner)
        rows = self._query("SELECT stream, seq, toUnixTimestamp64Nano(ts), node, gpus, job "
                           "FROM samples FINAL WHERE " + cond + " ORDER BY ts, stream, seq", p)
        return [{"kind": "sample", "run": run, "stream": r[0], "seq": r[1],
                 "ts": _ns_to_float(r[2]), "node": r[3], "gpus": _loads(r[4], []),
                 "job": _loads(r[5], {})} for r in rows]

    def progress(self, run: str, owner: str | None = None) -> list[dict[str, Any]]:
        """Progress records of the run (points of its bars), oldest first."""
        cond, p = self._run_cond(run, owner)
        rows = self._query("SELECT stream, seq, toUnixTimestamp64Nano(ts), bar, label, n, total, "
                           "unit, rate, elapsed, done FROM progress FINAL WHERE " + cond
                           + " ORDER BY ts, stream, seq", p)
        return [{"kind": "progress", "run": run, "stream": r[0], "seq": r[1],
                 "ts": _ns_to_float(r[2]), "bar": r[3], "label": r[4], "n": r[5],
                 "total": r[6], "unit": r[7], "rate": r[8], "elapsed": r[9], "done": r[10]}
                for r in rows]

    def records(self, run: str, owner: str | None = None) -> list[dict[str, Any]]:
        """Every record of the run, as spool record dicts (start first, end last)."""
        info = self.run_info(run, owner)
        body = self.lines(run, owner=owner) + self.samples(run, owner)
        body.sort(key=lambda d: (d["ts"], d["stream"], d["seq"]))
        head = [info["start_record"]] if info["start_record"] else []
        tail = [info["end_record"]] if info["end_record"] else []
        return head + body + tail

    # --- insights
    def insights(self, run: str, owner: str | None = None) -> list[dict[str, Any]]:
        """The run's stored insights (``Insight.to_dict()`` plus ``ts``), failures first."""
        cond, p = self._run_cond(run, owner)
        rows = self._query(
            "SELECT kind, category, toUnixTimestamp64Milli(ts), message, hint, evidence, "
            "details FROM insights FINAL WHERE " + cond + " ORDER BY category = 'live', "
            "category = 'efficiency', ts", p)
        return [{"kind": r[0], "category": r[1], "ts": r[2] / 1000, "message": r[3],
                 "hint": r[4], "evidence": _loads(r[5], []), "details": _loads(r[6], {})}
                for r in rows]

    def diagnosis_lines(self, run: str, needles: Iterable[str], words: Iterable[str],
                        traceback_head: str, traceback_lines: int, trailing: int = 0,
                        owner: str | None = None
                        ) -> tuple[list[tuple[str, int, str]], dict[str, int]]:
        """What a diagnosis reads of a stored run, found by the engine in one scan of its
        text: the lines holding one of ``needles`` or, in any case, one of ``words``; then the
        ``traceback_lines`` lines after the last ``traceback_head`` of each stream when it is
        close enough to the stream's end to be the fatal one (at most ``traceback_lines +
        trailing`` before it). In stream order, each once; and the last sequence number of
        each stream. The scan is hyperscan's (``multiMatchAny``: 54 ms for 300k lines in
        bench_insights, ``multiSearchAny`` 119 ms), or ``multiSearchAny`` on an engine built
        without it; no FINAL: a copy not merged yet is dropped here."""
        cond, p = self._run_cond(run, owner)
        needles, words = list(needles), list(words)
        p["patterns"] = [re.escape(n) for n in needles] + [f"(?i){w}" for w in words]
        p.update(needles=needles, words=words)
        scan = ("SELECT stream, seq, text FROM lines WHERE " + cond + " AND kind = 'line' AND ")
        try:
            rows = self._query(scan + "multiMatchAny(text, {patterns:Array(String)})", p,
                               what="diagnosing")
        except StoreError as e:
            if isinstance(e, (StoreUnavailable, StoreAuthError)):
                raise
            rows = self._query(scan + "(multiSearchAny(text, {needles:Array(String)}) OR "
                               "multiSearchAnyCaseInsensitive(text, {words:Array(String)}))", p,
                               what="diagnosing")
        found = {(stream, int(seq)): text for stream, seq, text in rows}
        last = {k: int(v) for k, v in self._query(
            "SELECT stream, max(seq) FROM lines WHERE " + cond + " GROUP BY stream", p)}
        # the last head of each stream and rank label: ranks sharing a terminal print their
        # tracebacks interleaved, each rank's own
        heads: dict[tuple[str, str | None], int] = {}
        for (stream, seq), text in found.items():
            where = (stream, ranklabel.split(text).key)
            if traceback_head in text and seq > heads.get(where, -1):
                heads[where] = seq
        for (stream, _), head in heads.items():
            if last.get(stream, head) - head > traceback_lines + trailing:
                continue  # printed long before the end: not the fatal one
            q = {**p, "stream": stream, "lo": head, "hi": head + traceback_lines}
            for s, seq, text in self._query(
                    "SELECT stream, seq, text FROM lines WHERE " + cond + " AND kind = 'line' "
                    "AND stream = {stream:String} AND seq BETWEEN {lo:UInt64} AND {hi:UInt64}",
                    q, what="diagnosing"):
                found[(s, int(seq))] = text
        return [(s, q, found[(s, q)]) for s, q in sorted(found)], last

    # --- search (``search.Pattern``, docs/user.md "Searching")
    def search(self, req: Request, owner: str | None = None) -> Found:
        """The newest ``req.limit`` lines of ``owner``'s runs (None: everyone's) that match
        ``req`` (``search.Request``), each with ``req.context`` lines around it, newest first.

        A time-ordered search cannot stop early in a table sorted by run first, so it asks
        the newest stretch of time first and older ones after (``SEARCH_WINDOWS``), until
        enough lines matched: a common word is answered from the newest day's partitions, a
        rare one asks every window, whose token index skips the blocks without it."""
        pattern = Pattern.parse(req.pattern, req.regex)
        match_sql, params = pattern.sql()
        conds = [match_sql]
        if owner is not None:
            conds.append(owner_cond(owner))
            params["owner"] = owner
        if req.stream:
            conds.append("stream = {stream:String}")
            params["stream"] = req.stream
        runs_cond = self._search_runs_cond(req, owner, params)
        if runs_cond:
            conds.append(runs_cond)
        run_conds = [c for c in (conds[1:]) if not c.startswith("stream")]  # owner, runs
        bounds = self._query("SELECT count(), toUnixTimestamp64Nano(max(last_ts)), "
                             "toUnixTimestamp64Nano(min(ifNull(start_ts, last_ts))) FROM runs"
                             + "".join((" AND " if i else " WHERE ") + c
                                       for i, c in enumerate(run_conds)),
                             params, what="searching")
        if not bounds or not bounds[0][0]:
            return Found([], {}, False)
        newest, oldest = int(bounds[0][1]), int(bounds[0][2])
        since = None if req.since is None else int(req.since * 1e9)
        until = None if req.until is None else int(req.until * 1e9)
        anchor = newest if until is None else min(until, newest)
        hits: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        want = req.limit + 1  # one more tells that there are more
        hi: int | None = until
        for span in SEARCH_WINDOWS:
            lo = anchor - int(span * 1e9) if span is not None else None
            if lo is not None and lo <= oldest - SEARCH_MARGIN_NS:
                lo = None  # the last window: everything older
            if since is not None and (lo is None or lo < since):
                lo = since
            self._search_window(conds, params, lo, hi, want - len(hits), hits)
            if len(hits) >= want or lo is None or lo == since:
                break
            hi = lo
        rows = sorted(hits.values(), key=lambda r: (r[4], r[2], r[3], r[0], r[1]),
                      reverse=True)
        truncated = len(rows) > req.limit
        rows = rows[:req.limit]
        lines = [{"stream": r[2], "seq": int(r[3]), "ts": _ns_to_float(r[4]), "text": r[5]}
                 for r in rows]
        around = self._search_context(rows, req.context) if req.context else {}
        found = [Hit(r[0], r[1], d, *around.get((r[0], r[1], r[2], int(r[3])), ([], [])))
                 for r, d in zip(rows, lines, strict=True)]
        self._number_hits(found)
        return Found(found, self._search_summaries({(h.run, h.owner) for h in found}),
                     truncated)

    def _number_hits(self, hits: list[Hit]) -> None:
        """Each line of ``hits`` (matches and context) given its line number, one query per
        run."""
        per_run: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for h in hits:
            per_run.setdefault((h.run, h.owner), []).extend((*h.before, h.line, *h.after))
        for (run, owner), lines in per_run.items():
            numbers = self.line_numbers(run, owner, [
                (d["stream"], d["seq"], ts_ns(d["ts"])) for d in lines])
            for d in lines:
                d["line"] = numbers.get((d["stream"], d["seq"]))

    def _search_runs_cond(self, req: Request, owner: str | None, params: dict[str, Any]
                          ) -> str:
        """The condition on ``run`` for ``owner``, ``--job`` and ``--state`` (a subquery of
        ``runs``, which the primary key of ``lines`` serves), or '' for every run."""
        if not req.jobs and not req.states:
            # One user's runs are a small part of a shared store, and ``lines`` is sorted by
            # run first: naming them lets the primary key skip everyone else's.
            return ("" if owner is None else
                    "run IN (SELECT run FROM runs WHERE " + owner_cond(owner) + ")")
        inner = [owner_cond(owner)]
        if req.jobs:
            inner.append("(has({jobs:Array(String)}, run) OR has({jobs:Array(String)}, "
                         "job_id) OR has({jobs:Array(String)}, concat(JSONExtractString("
                         "ifNull(slurm, '{}'), 'array_job_id'), '_', JSONExtractString("
                         "ifNull(slurm, '{}'), 'array_task_id'))))")
            params["jobs"] = list(req.jobs)
        if req.states:
            inner.append("has({states:Array(String)}, ifNull(state, 'RUNNING'))")
            params["states"] = list(req.states)
        return "run IN (SELECT run FROM runs FINAL WHERE " + " AND ".join(inner) + ")"

    def _search_window(self, conds: list[str], params: dict[str, Any], lo: int | None,
                       hi: int | None, need: int, hits: dict[tuple[Any, ...], tuple[Any, ...]]
                       ) -> None:
        """Add the newest ``need`` matching lines with lo < ts <= hi (ns; None: unbounded)
        to ``hits`` (by record identity: the copies a repeated upload left before the
        merges collapse them count once)."""
        where = list(conds)
        p = dict(params)
        if lo is not None:
            where.append("ts > fromUnixTimestamp64Nano({lo:Int64}, 'UTC')")
            p["lo"] = lo
        if hi is not None:
            where.append("ts <= fromUnixTimestamp64Nano({hi:Int64}, 'UTC')")
            p["hi"] = hi
        fetch = need + 16
        while True:
            p["n"] = fetch
            rows = self._query(_search_sql(" AND ".join(where)), p,
                               what="searching")
            before = len(hits)
            for r in rows:
                hits.setdefault((r[0], r[1], r[2], r[3]), r)
            if len(rows) < fetch or len(hits) - before >= need:
                return
            fetch *= 4  # copies took the places: ask again for more

    def _search_context(self, rows: list[tuple[Any, ...]], n: int
                        ) -> dict[tuple[str, str, str, int], tuple[list[dict[str, Any]],
                                                                  list[dict[str, Any]]]]:
        """The ``n`` lines before and after each matching line in its run's stream. Sequence
        numbers count a stream's notes and metadata too, so the lines are read from a range
        of numbers around each line, and a wider one where that held too few."""
        out = {}
        todo = [(r[0], r[1], r[2], int(r[3])) for r in rows]
        width = 2 * n + 8
        for last in (False, True):
            ranges = [(run, owner, stream, max(0, seq - width), seq + width)
                      for run, owner, stream, seq in todo]
            got = self._query(_SEARCH_CONTEXT_SQL, {
                "runs": sorted({r[0] for r in ranges}), "ranges": ranges}, what="searching")
            per: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
            for r in got:
                per.setdefault((r[0], r[1], r[2]), {})[int(r[3])] = {
                    "stream": r[2], "seq": int(r[3]), "ts": _ns_to_float(r[4]), "text": r[5]}
            short = []
            for run, owner, stream, seq in todo:
                mine = per.get((run, owner, stream), {})
                before = [mine[k] for k in sorted(k for k in mine if k < seq)][-n:]
                after = [mine[k] for k in sorted(k for k in mine if k > seq)][:n]
                out[(run, owner, stream, seq)] = (before, after)
                if not last and (len(before) < n and seq > width or len(after) < n):
                    short.append((run, owner, stream, seq))
            if not short:
                break
            todo, width = short, width * 16
        return out

    def _search_summaries(self, keys: set[tuple[str, str]]) -> dict[tuple[str, str],
                                                                      dict[str, Any]]:
        """The summaries of the runs a search found (run, owner, job_id, name, state, start,
        source)."""
        if not keys:
            return {}
        rows = self._query(
            "SELECT run, CAST(owner AS String), job_id, " + name_sql() + ", "
            + state_sql() + ", toUnixTimestamp64Nano(ifNull(start_ts, last_ts)) FROM runs FINAL "
            "WHERE has({runs:Array(String)}, run)",
            {"runs": sorted({k[0] for k in keys})}, what="searching")
        out = {}
        for r in rows:
            if (r[0], r[1]) in keys:
                out[(r[0], r[1])] = {
                    "run": r[0], "owner": r[1], "job_id": r[2],
                    "name": r[3], "state": r[4], "start": _ns_to_float(r[5]),
                    "source": "store"}
        for k in keys - set(out):  # lines shipped before any record that lists the run
            out[k] = {"run": k[0], "owner": k[1], "job_id": "", "name": "", "state": "RUNNING",
                      "start": None, "source": "store"}
        return out
