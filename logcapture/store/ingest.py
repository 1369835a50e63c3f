"""Inserting spool records as the rows of a trusted identity (docs/storage.md, "Ingest").

Spool NDJSON bytes go to the engine as they are. The owner and run identity of every row are
*not* read from the records: the caller passes an ``Identity`` from a trusted source. The hot
path (embedded store; line and command records, >95 % of a spool, told apart at the bytes level
by their last key ``"kind":"line"}``) writes the bytes to a private temporary file and runs one
``INSERT INTO lines SELECT {run}, {owner}, {uid}, ... FROM file(...)`` per run, the identity
passed as query parameters: no per-line Python, no view. A record key the structure does not
name (``owner``, ``_owner``, ...) is refused (``input_format_skip_unknown_fields = 0``, code
117) and a line record without stream, seq or ts trips ``throwIf`` (code 395). Whole closed
(gzip) segments are not even read in Python: the shipper opens them and the engine reads those
descriptors through ``/proc/self/fd`` (``probe_segments``, ``insert_segments``), two inserts at
once. Every other record (and everything on a ClickHouse server, which cannot read the client's
files) goes into the ``ingest`` table (engine Null) with the identity spliced into each line as
``_run``/``_owner``/... keys; materialized views route it by kind into ``runs``, ``lines``,
``notes``, ``metadata`` and ``samples``. A record that tries to carry those keys itself is a
duplicate key, which ClickHouse refuses (code 117). A refused batch goes through the slow path,
which parses every line in Python, skips and reports bad lines, and inserts the rest
re-encoded.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import LogcaptureError, StoreDataError
from ..records import KINDS, Record, dumps, from_dict, kind_suffix
from .connection import _Connection, classify
from .schema import _TS_INPUT

# A ClickHouse server takes the ``ingest`` inserts asynchronously (ClickHouse docs,
# "Asynchronous inserts"): it gathers the inserts of every node's agent in a buffer and writes
# them as one part per target table and flush, flushing at the latest after
# ``async_insert_busy_timeout_ms`` (the maximum of the adaptive timeout since 24.3; 1 s, about
# ClickHouse's one insert a second per table, however many agents), sooner when inserts are
# rare. ``wait_for_async_insert`` answers only once the rows are written, so a shipper moves
# its cursor past data the store holds (at least once), and the answer comes before the
# client's own timeout (``send_receive_timeout``, 60 s). Re-sent rows (a retry, or a batch
# sent again after a crash between the insert and the cursor) add copies that the tables'
# keys (ReplacingMergeTree, FINAL reads; idempotent aggregates in ``runs``) collapse, as for
# synchronous inserts: insert deduplication (``async_insert_deduplicate``) is not relied on.
# The embedded engine accepts these settings but inserts at once (no server queue).
ASYNC_INSERT_SETTINGS = {
    "async_insert": 1,
    "wait_for_async_insert": 1,
    "async_insert_busy_timeout_ms": 1000,
    "wait_for_async_insert_timeout": 50,
}

# Settings for every ingest: refuse unknown fields (a forged or corrupt line then takes the
# slow path, where it is reported), read nested objects/arrays as their JSON text.
INGEST_SETTINGS = {
    "input_format_skip_unknown_fields": 0,
    "input_format_json_read_objects_as_strings": 1,
    "input_format_json_read_arrays_as_strings": 1,
    "input_format_json_read_numbers_as_strings": 1,
    "date_time_input_format": "best_effort",
    "parallel_view_processing": 1,  # the five views in parallel (bench_store: +10-15 %)
}

# The hot path (``Store._insert_lines``): line and command records straight into ``lines``
# from a private temporary file, the trusted identity as query parameters. The structure names
# every key a line or command record has; any other key is refused (unknown field, code 117),
# so a record cannot bring its own owner. The record's ``run`` is read only to be checked (and
# so that it is not an unknown field: the reader drops columns a query does not use) and is
# replaced by the trusted one. A line without stream, seq or ts trips throwIf (code 395): the
# shipper then parses the batch line by line and reports it (the ``ingest`` table's
# constraints do the same for the other records).
_LINES_STRUCTURE = ("run String, stream Nullable(String), seq Nullable(UInt64), "
                    f"ts {_TS_INPUT}, kind Nullable(String), text String, options String, "
                    "style String")
_LINES_FROM_FILE = """INSERT INTO lines (run, owner, uid, stream, seq, ts, kind, text, options,
    style)
SELECT {run:String}, {owner:String}, {uid:UInt32}, assumeNotNull(stream), assumeNotNull(seq),
    assumeNotNull(ts), assumeNotNull(kind), text, options, style
FROM file({path:String}, 'JSONEachRow', {structure:String})
WHERE throwIf(stream IS NULL OR seq IS NULL OR ts IS NULL OR kind NOT IN ('line', 'command')
    OR empty(run), 'a line record without run, stream, seq or ts') = 0"""
# Closed spool segments read by the engine itself (``Store.insert_segments``, the shipper's
# bulk path: no decompressing, copying or temporary file in Python). A segment of line and
# command records only (the probe below tells) is read with their keys alone; any other key
# is refused (code 117), and a record lacking run, stream, seq or ts trips throwIf (code 395),
# as on the bytes path. A segment that also holds other records (its Start or End, notes,
# metadata) is read with every key any record has (``records.KINDS``), those of the other kinds
# as nullable text, and a line or command record holding any of them is refused too. Every
# key is used by the query: the reader drops the columns a query does not use, and would then
# refuse their keys as unknown. The wider structure costs twice the parsing (bench_store:
# 1.0 vs 0.5 CPU seconds per 1M lines, 10-15 % of the whole insert), hence two statements.
_LINE_KEYS = ("run", "stream", "seq", "ts", "kind", "text", "options", "style")
_OTHER_KEYS = tuple(sorted({name for cls in KINDS.values() for name in cls._fields}
                           - set(_LINE_KEYS)))
_SEGMENT_STRUCTURE = _LINES_STRUCTURE + "".join(f", {k} Nullable(String)" for k in _OTHER_KEYS)
_HOT_KINDS = "kind IN ('line', 'command')"


def _lines_from_segments(other_keys: tuple[str, ...]) -> str:
    others = "".join(f" OR {k} IS NOT NULL" for k in other_keys)
    return f"""INSERT INTO lines (run, owner, uid, stream, seq, ts, kind, text, options, style)
SELECT {{run:String}}, {{owner:String}}, {{uid:UInt32}}, assumeNotNull(stream), assumeNotNull(seq),
    assumeNotNull(ts), assumeNotNull(kind), text, options, style
FROM file({{path:String}}, 'JSONEachRow', {{structure:String}}, 'gzip')
WHERE {_HOT_KINDS} AND throwIf({_HOT_KINDS} AND (stream IS NULL OR seq IS NULL OR ts IS NULL
    OR empty(run){others}),
    'a line record without run, stream, seq or ts, or with a key of another record') = 0
SETTINGS input_format_skip_unknown_fields = 0, input_format_json_read_objects_as_strings = 1,
    input_format_json_read_arrays_as_strings = 1, input_format_json_read_numbers_as_strings = 1,
    date_time_input_format = 'best_effort', optimize_on_insert = 0"""


_LINES_FROM_SEGMENTS = _lines_from_segments(_OTHER_KEYS)  # segments with other records
_LINES_FROM_LINE_SEGMENTS = _lines_from_segments(())  # segments of line records only
# One look at each segment before it is inserted (cheap next to the insert: decompressing and
# splitting in the engine): its size, its complete lines (the cursor counts them), whether
# its last line is complete, and the lines that are not line or command records (by the same
# last-key rule as ``split_by_kind``; a segment of lines only is told by one count), which go
# through ``ingest``.
_PROBE_SEGMENTS = """SELECT _file, length(raw), countSubstrings(raw, '\\n') AS n,
    raw = '' OR endsWith(raw, '\\n'),
    if(countSubstrings(raw, '{line}\\n') = n, [],
        arrayFilter(l -> l != '' AND NOT endsWith(l, '{line}')
            AND NOT endsWith(l, '{command}'), splitByChar('\\n', raw)))
FROM file({{path:String}}, 'RawBLOB', 'raw String', 'gzip')""".format(
    line=kind_suffix("line").decode(), command=kind_suffix("command").decode())
# What ``ingest_runs_seen`` does for the other records: one ``runs`` row per run and insert,
# its newest ts read in key order (one granule per part).
_RUNS_SEEN = """INSERT INTO runs (run, owner, uid, cluster, job_id, last_ts)
SELECT {run:String}, {owner:String}, {uid:UInt32}, {cluster:String}, {job_id:String}, ts
FROM lines WHERE run = {run:String} AND owner = {owner:String} ORDER BY ts DESC LIMIT 1"""
FILE_INGEST_SETTINGS = {
    "input_format_skip_unknown_fields": 0,
    "input_format_json_read_objects_as_strings": 1,
    "input_format_json_read_arrays_as_strings": 1,
    "input_format_json_read_numbers_as_strings": 1,
    "date_time_input_format": "best_effort",
    # Replacing on insert sorts and collapses copies within the block: the reads drop copies
    # anyway (FINAL), and a block of one shipment holds none (bench_store: +25 %).
    "optimize_on_insert": 0,
}
# The end of a line or command record (``records.kind_suffix``: a record's kind is its last
# key). A JSON string cannot hold an unescaped quote, so text never ends a line so.
_HOT_ENDS = (kind_suffix("line"), kind_suffix("command"))


def split_by_kind(data: bytes) -> tuple[bytes, bytes]:
    """NDJSON (complete lines) -> (line and command records, every other line). All lines
    (the common batch) cost one ``count``; a mixed batch one ``endswith`` per line."""
    n = data.count(b"\n")
    if data.count(_HOT_ENDS[0] + b"\n") == n:
        return data, b""
    lines = data.split(b"\n")
    lines.pop()
    hot = [x for x in lines if x.endswith(_HOT_ENDS)]
    if len(hot) == n:
        return data, b""
    rest = [x for x in lines if not x.endswith(_HOT_ENDS)]
    return (b"\n".join(hot) + b"\n" if hot else b""), b"\n".join(rest) + b"\n"


@dataclass(frozen=True)
class Identity:
    """Who owns the rows of one run, from a trusted source (``ownership.trusted_identity``): for
    Slurm the root-owned prolog record, standalone the spool directory's owner. ``run``
    replaces the run id of every shipped record."""

    run: str
    user: str
    uid: int
    cluster: str = ""
    job_id: str = ""

    def splice_prefix(self) -> bytes:
        """The bytes that replace each line's opening ``{``."""
        head = {"_run": self.run, "_owner": self.user, "_uid": int(self.uid),
                "_cluster": self.cluster, "_job_id": self.job_id}
        return dumps(head)[:-1].encode() + b","


@dataclass
class InsertResult:
    rows: int = 0  # records sent and accepted
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line no in the batch, why)
    slow_path: bool = False


@dataclass
class SegmentProbe:
    """What ``Store.probe_segments`` found in one closed segment."""

    size: int  # bytes, uncompressed
    lines: int  # complete lines
    complete: bool  # the last line is complete (ends in a newline)
    others: list[bytes]  # the lines that are not line or command records


# Inserts of closed segments at once (``Store.insert_segments``; bench_store on 2 cores: one
# insert ~550k lines/s, two at once ~700k).
PARALLEL_INSERTS = 2


def _fd_glob(fds: list[int]) -> str:
    """The path under which the engine (in this process) reads the open descriptors ``fds``:
    the shipper opened each segment itself (no symlink followed, a regular file), so the engine
    reads that very file even if the name is replaced meanwhile."""
    if len(fds) == 1:
        return f"/proc/self/fd/{int(fds[0])}"
    return "/proc/self/fd/{" + ",".join(str(int(fd)) for fd in fds) + "}"


def _splice(data: bytes, prefix: bytes) -> bytes:
    """Replace the opening ``{`` of every line with ``prefix`` (JSON strings cannot hold a
    raw newline, so ``\\n{`` only occurs at line starts). A line not starting with ``{`` keeps
    no identity and is refused by the ``identity`` constraint: the slow path reports it."""
    if data[:1] != b"{":
        return data.replace(b"\n{", b"\n" + prefix)
    return prefix + data[1:].replace(b"\n{", b"\n" + prefix)


class _Ingest(_Connection):
    """The inserts of ``Store``: spool NDJSON, closed segments, records and insights."""

    def insert_ndjson(self, data: bytes, identity: Identity) -> InsertResult:
        """Insert spool NDJSON lines (complete lines, each ending in ``\\n``) as rows of
        ``identity``'s run. Fast path: the bytes go as they are (``insert_many``). When the
        store refuses them as data, every line is parsed here: bad lines are skipped and
        reported in the result, the rest inserted. ``StoreDataError`` only when even the
        validated records are refused."""
        if not data:
            return InsertResult()
        if not data.endswith(b"\n"):
            data += b"\n"
        try:
            return InsertResult(rows=self.insert_many([(data, identity)]))
        except StoreDataError:
            pass
        return self._insert_checked(data.split(b"\n")[:-1], identity)

    def insert_many(self, batches: Iterable[tuple[bytes, Identity]]) -> int:
        """Insert several runs' NDJSON (complete lines), each as its own identity's rows;
        returns the number of lines sent. No slow path: ``StoreDataError`` when the store
        refuses any of it (then insert each with ``insert_ndjson``; what was already taken is
        taken again, and the store drops the copies).

        Embedded store: line and command records of each run go straight into ``lines``
        (``_insert_lines``), the other records through ``ingest`` and its views. Server: all
        through ``ingest``."""
        hot: dict[Identity, list[bytes]] = {}
        rest: list[bytes] = []
        n = 0
        for data, identity in batches:
            if not data:
                continue
            if not data.endswith(b"\n"):
                data += b"\n"
            n += data.count(b"\n")
            if self.embedded:
                lines, others = split_by_kind(data)
            else:
                lines, others = b"", data
            if lines:
                hot.setdefault(identity, []).append(lines)
            if others:
                rest.append(_splice(others, identity.splice_prefix()))
        # The few other records first: a corrupt line is most likely among them, and then
        # nothing of the batch is in yet when the caller falls back to the slow path.
        if rest:
            self._raw_insert(b"".join(rest))
        for identity, parts in hot.items():
            self._insert_lines(parts, identity)
        return n

    def _insert_lines(self, parts: list[bytes], identity: Identity) -> None:
        """Line and command records of one run into ``lines``, the identity as parameters;
        then one ``runs`` row (identity, newest ts) so the run is listed at once."""
        fd, path = tempfile.mkstemp(prefix="logcapture-ingest-", suffix=".ndjson")
        try:
            with os.fdopen(fd, "wb") as f:
                f.writelines(parts)
            params = {"run": identity.run, "owner": identity.user, "uid": int(identity.uid),
                      "path": path, "structure": _LINES_STRUCTURE}
            try:
                self.client.command(_LINES_FROM_FILE, parameters=params,
                                    settings=FILE_INGEST_SETTINGS)
            except Exception as e:  # noqa: BLE001
                raise classify(e, "inserting") from None
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._runs_seen(identity)

    @property
    def reads_files(self) -> bool:
        """Whether the engine can read the shipper's files (the embedded store, in this
        process: ``/proc/self/fd/N`` names a descriptor the shipper opened)."""
        return self.embedded and os.path.isdir("/proc/self/fd")

    def probe_segments(self, fds: list[int]) -> dict[int, SegmentProbe]:
        """Read closed (gzip) spool segments, open as ``fds``, in the engine: per descriptor
        its size, complete lines, whether its last line is complete, and its lines that are
        not line or command records (``_PROBE_SEGMENTS``)."""
        if not fds:
            return {}
        rows = self._query(_PROBE_SEGMENTS, {"path": _fd_glob(fds)}, what="reading segments",
                           formats={"String": "bytes"})
        return {int(r[0]): SegmentProbe(int(r[1]), int(r[2]), bool(r[3]), list(r[4]))
                for r in rows}

    def insert_segments(self, runs: list[tuple[dict[int, SegmentProbe], Identity]]) -> None:
        """Insert whole closed spool segments read by the engine itself (``reads_files``):
        per run its segments' descriptors with what ``probe_segments`` found in them, and its
        identity. Their lines that are not line or command records go through ``ingest``
        first (one insert for all runs), then each run's line and command records straight
        from the files into ``lines`` (``_LINES_FROM_LINE_SEGMENTS`` for segments of lines
        only, ``_LINES_FROM_SEGMENTS`` for the others), ``PARALLEL_INSERTS`` inserts at once.
        ``StoreDataError`` when the store refuses any of it (then ship the segments' bytes
        with ``insert_many``)."""
        rest = b"".join(_splice(b"\n".join(o) + b"\n", identity.splice_prefix())
                        for probes, identity in runs
                        if (o := [line for p in probes.values() for line in p.others]))
        if rest:
            self._raw_insert(rest)
        tasks = []
        for probes, identity in runs:
            for sql, structure, mixed in ((_LINES_FROM_LINE_SEGMENTS, _LINES_STRUCTURE, False),
                                          (_LINES_FROM_SEGMENTS, _SEGMENT_STRUCTURE, True)):
                fds = [fd for fd, p in probes.items() if bool(p.others) == mixed]
                # in parts, so the inserts run at once: one insert writes its parts (sort,
                # ZSTD(8), token index) in one thread (bench_store: 1.2-1.4x)
                per = max(1, -(-len(fds) // PARALLEL_INSERTS))
                tasks += [(sql, {"run": identity.run, "owner": identity.user,
                                 "uid": int(identity.uid), "path": _fd_glob(fds[i:i + per]),
                                 "structure": structure}) for i in range(0, len(fds), per)]
        self._commands_in_parallel(tasks, what="inserting")
        for probes, identity in runs:
            if probes:
                self._runs_seen(identity)

    def _commands_in_parallel(self, tasks: list[tuple[str, dict[str, Any]]], what: str
                              ) -> None:
        """Run each statement of ``tasks`` (SQL, parameters), up to ``PARALLEL_INSERTS`` at
        a time on as many handles of the embedded engine (chDB runs a query without holding
        the GIL). Raises the first failure, classified, once all have finished."""
        if len(tasks) <= 1 or PARALLEL_INSERTS <= 1:
            for sql, params in tasks:
                self._command(sql, params, what=what)
            return
        clients = [self.client, *self._more_clients(min(len(tasks), PARALLEL_INSERTS) - 1)]
        todo = list(reversed(tasks))
        errors: list[BaseException] = []
        mutex = threading.Lock()

        def work(client: Any) -> None:
            while True:
                with mutex:
                    if errors or not todo:
                        return
                    sql, params = todo.pop()
                try:
                    client.command(sql, parameters=params)
                except BaseException as e:  # noqa: BLE001 - reported below
                    with mutex:
                        errors.append(e)
                    return

        threads = [threading.Thread(target=work, args=(c,), daemon=True) for c in clients[1:]]
        for t in threads:
            t.start()
        work(clients[0])
        for t in threads:
            t.join()
        if errors:
            raise classify(errors[0], what) from None


    def _runs_seen(self, identity: Identity) -> None:
        self._command(_RUNS_SEEN, {"run": identity.run, "owner": identity.user,
                                   "uid": int(identity.uid), "cluster": identity.cluster,
                                   "job_id": identity.job_id}, what="inserting")

    def _raw_insert(self, body: bytes, sync: bool = False) -> None:
        """``body`` (NDJSON, identity spliced in) into ``ingest``: asynchronously when the
        store says so, unless ``sync`` (the slow path's checked lines: a server checks the
        constraints on a whole flush, so they must not share one with another node's refused
        batch)."""
        settings = (INGEST_SETTINGS if sync or not self.async_insert
                    else {**INGEST_SETTINGS, **ASYNC_INSERT_SETTINGS})
        try:
            self.client.raw_insert("ingest", None, insert_block=body, fmt="JSONEachRow",
                                   settings=settings)
        except Exception as e:  # noqa: BLE001
            raise classify(e, "inserting") from None

    def _insert_checked(self, lines: list[bytes], identity: Identity) -> InsertResult:
        result = InsertResult(slow_path=True)
        good: list[bytes] = []
        for i, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                rec = from_dict(json.loads(raw))
            except (ValueError, LogcaptureError) as e:
                result.bad.append((i, str(e)[:200]))
                continue
            good.append(rec.to_json().encode("utf-8", "surrogatepass"))
        if good:
            prefix = identity.splice_prefix()
            body = b"".join(prefix + g[1:] + b"\n" for g in good)
            self._raw_insert(body, sync=True)
        result.rows = len(good)
        return result

    def insert_records(self, records: Iterable[Record | Mapping[str, Any]] | bytes,
                       identity: Identity) -> InsertResult:
        """Insert records (Record objects, record dicts, or NDJSON bytes) as ``identity``'s."""
        if isinstance(records, (bytes, bytearray)):
            return self.insert_ndjson(bytes(records), identity)
        lines = []
        for r in records:
            d = r.to_dict() if isinstance(r, Record) else dict(r)
            lines.append(dumps(d).encode("utf-8", "surrogatepass") + b"\n")
        return self.insert_ndjson(b"".join(lines), identity)

    # --- insights
    def insert_insights(self, identity: Identity, insights: Iterable[Mapping[str, Any]],
                        ts: float, *, replace: tuple[str, ...] = ()) -> int:
        """Store a run's insights (``Insight.to_dict()``) as ``identity``'s, found at ``ts``
        (epoch seconds); one row per kind replaces an older one. ``replace``: categories
        whose older rows of the run go first (a diagnosis made again with Slurm's final
        state is the whole answer: a kind it no longer gives must not stay)."""
        import datetime as _dt

        if replace:
            self._command("DELETE FROM insights WHERE run = {run:String} AND owner = "
                          "{owner:String} AND category IN {cats:Array(String)}",
                          {"run": identity.run, "owner": identity.user, "cats": list(replace)},
                          what="replacing insights")

        rows = []
        for n, i in enumerate(insights):
            # a millisecond apart, in the order given (the diagnosis lists the cause first):
            # ``insights()`` reads them back by ts
            when = _dt.datetime.fromtimestamp(ts + n / 1000, _dt.UTC)
            details = dict(i.get("details") or {})
            numbers = {k: float(v) for k, v in details.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            rows.append([identity.run, identity.user, identity.uid, identity.cluster,
                         identity.job_id, str(i["kind"]), str(i.get("category") or ""), when,
                         str(i.get("message") or ""), str(i.get("hint") or ""),
                         json.dumps(i.get("evidence") or [], ensure_ascii=False),
                         json.dumps(details, ensure_ascii=False, default=str), numbers])
        if not rows:
            return 0
        try:
            self.client.insert("insights", rows, column_names=[
                "run", "owner", "uid", "cluster", "job_id", "kind", "category", "ts",
                "message", "hint", "evidence", "details", "numbers"])
        except Exception as e:  # noqa: BLE001
            raise classify(e, "storing insights") from None
        return len(rows)


def iter_ndjson_chunks(lines: list[bytes], max_bytes: int) -> Iterator[bytes]:
    """Join complete lines (without newlines) into NDJSON chunks of about ``max_bytes``."""
    chunk: list[bytes] = []
    size = 0
    for line in lines:
        chunk.append(line)
        size += len(line) + 1
        if size >= max_bytes:
            yield b"\n".join(chunk) + b"\n"
            chunk, size = [], 0
    if chunk:
        yield b"\n".join(chunk) + b"\n"
