"""The store: ClickHouse tables, schema migrations, inserts and queries (clickhouse-connect).

One client library, one schema, one code path for both targets (SPEC.md §1, §6):

- ``chdb:///PATH``: the embedded engine (chDB) stored in PATH. The default is
  ``$XDG_STATE_HOME/logcapture/store`` (``~/.local/state/logcapture/store``). chDB allows one
  process per store folder (CHDB.md), so the folder is guarded by an ``flock`` on
  ``PATH.lock`` beside it: a second process gets a clear ``StoreUnavailable`` instead of the
  engine's ``BAD_ARGUMENTS``. Callers open, work and close (``open_store`` is a context
  manager) so readers and writers take turns.
- ``http(s)://USER:PASS@HOST:8123/DB``: a ClickHouse server (or a cluster, docs/storage.md).

The DSN comes from ``--store``, else ``$LOGCAPTURE_STORE``, else the ``store:`` key of the
config file, else the embedded default (``resolve_dsn``).

Ingest (docs/storage.md): spool NDJSON bytes go to the engine as they are. The owner and run
identity of every row are *not* read from the records: the caller passes an ``Identity`` from a
trusted source. The hot path (embedded store; line and command records, >95 % of a spool, told
apart at the bytes level by their last key ``"kind":"line"}``) writes the bytes to a private
temporary file and runs one ``INSERT INTO lines SELECT {run}, {owner}, {uid}, ... FROM
file(...)`` per run, the identity passed as query parameters: no per-line Python, no view.
A record key the structure does not name (``owner``, ``_owner``, ...) is refused
(``input_format_skip_unknown_fields = 0``, code 117) and a line record without stream, seq or ts
trips ``throwIf`` (code 395). Whole closed (gzip) segments are not even read in Python: the
shipper opens them and the engine reads those descriptors through ``/proc/self/fd``
(``probe_segments``, ``insert_segments``), two inserts at once. Every other record (and
everything on a ClickHouse server, which cannot read the client's files) goes into the
``ingest`` table (engine Null) with the identity spliced into each line as
``_run``/``_owner``/... keys; materialized views route it by kind into ``runs``, ``lines``,
``notes``, ``metadata`` and ``samples``. A record that tries to carry
those keys itself is a duplicate key, which ClickHouse refuses (code 117). A refused batch goes
through the slow path, which parses every line in Python, skips and reports bad lines, and
inserts the rest re-encoded.

Idempotency: every table is a ReplacingMergeTree (AggregatingMergeTree for ``runs``) whose
ORDER BY holds the record identity ``(run, owner, stream, seq)``, and every query reads with
``FINAL``, so a re-inserted record never shows twice, before or after merges. The tail of a
job (``lines(run, limit=N)``) is a FINAL read in key order that stops after N rows, of ``lines``
alone unless the run has notes or metadata.

No SQL is built by pasting values or identifiers: values are clickhouse-connect server-side
parameters (``{name:Type}``) and table names come from the fixed allow-list ``TABLES``
(passed as ``{table:Identifier}``).
"""

from __future__ import annotations

import fcntl
import gc
import importlib.util
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlparse, urlunparse

from . import jobref
from .errors import (
    LogcaptureError,
    NoEngine,
    NotFound,
    StoreAuthError,
    StoreDataError,
    StoreError,
    StoreUnavailable,
    UsageError,
)
from .records import KINDS, Record, dumps, from_dict
from .search import Found, Hit, Pattern, Request

SCHEMA_VERSION = 4
DEFAULT_DATABASE = "logcapture"
# The tables a user-facing name may refer to (the identifier allow-list).
TABLES = ("runs", "lines", "notes", "metadata", "samples", "insights")
ALL_TABLES = ("ingest", *TABLES, "schema_version")
VIEWS = ("ingest_runs_seen", "ingest_runs", "ingest_lines", "ingest_notes", "ingest_metadata",
         "ingest_samples")
ADMIN_ROLE = "logcapture_admin"

# ClickHouse error codes (src/Common/ErrorCodes.cpp) that mean "the data is wrong": never
# retried (Vector's ClickHouse sink does the same for 117 and 53).
DATA_ERROR_CODES = frozenset({
    6,    # CANNOT_PARSE_TEXT
    26,   # CANNOT_PARSE_QUOTED_STRING
    27,   # CANNOT_PARSE_INPUT_ASSERTION_FAILED
    32,   # ATTEMPT_TO_READ_AFTER_EOF
    38,   # CANNOT_PARSE_DATE
    41,   # CANNOT_PARSE_DATETIME
    53,   # TYPE_MISMATCH
    69,   # ARGUMENT_OUT_OF_BOUND
    70,   # CANNOT_CONVERT_TYPE
    72,   # CANNOT_PARSE_NUMBER
    117,  # INCORRECT_DATA
    131,  # TOO_LARGE_STRING_SIZE
    321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
    349,  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
    395,  # FUNCTION_THROW_IF_VALUE_IS_NON_ZERO
    407,  # DECIMAL_OVERFLOW
    469,  # VIOLATED_CONSTRAINT (a record without kind/stream/seq/ts, or no identity)
    623,  # CANNOT_PARSE_BOOL
    })
# Authentication/authorisation: stop at once (gpufl: 401/403 stop immediately).
AUTH_ERROR_CODES = frozenset({
    192,  # UNKNOWN_USER
    193,  # WRONG_PASSWORD
    194,  # REQUIRED_PASSWORD
    195,  # IP_ADDRESS_NOT_ALLOWED
    497,  # ACCESS_DENIED
    516,  # AUTHENTICATION_FAILED
})
SCHEMA_ERROR_CODES = frozenset({60, 81})  # UNKNOWN_TABLE, UNKNOWN_DATABASE
# Not transient either: a bug or an engine that cannot run the statement.
FATAL_ERROR_CODES = frozenset({1, 36, 46, 47, 48, 62})  # UNSUPPORTED_METHOD, BAD_ARGUMENTS,
# UNKNOWN_FUNCTION (the lightest chDB build lacks some), UNKNOWN_IDENTIFIER, NOT_IMPLEMENTED,
# SYNTAX_ERROR

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_HTTP_STATUS_RE = re.compile(r"\b(?:HTTP|status)[^0-9]{0,20}(401|403)\b", re.IGNORECASE)


# --- the schema ------------------------------------------------------------------------------
# Columns shared by every per-record table: the trusted identity first, then the record's.
# Codecs (bench_store, 2M lines): DoubleDelta stores a steady ts or seq in ~0.1 bit per row
# (Delta: 4 bits); ZSTD(3) on run, constant over a job's key range, 0.5 MB -> 0.03 MB.
_ID_COLUMNS = """
    run String CODEC(ZSTD(3)),
    owner LowCardinality(String),
    uid UInt32,
    stream LowCardinality(String),
    seq UInt64 CODEC(DoubleDelta, ZSTD(1)),
    ts DateTime64(9, 'UTC') CODEC(DoubleDelta, ZSTD(1)),"""

# ORDER BY: one job first, then time, then the rest of the record identity (run, owner,
# stream, seq): the order a job's page reads. The tail of a job is a reverse read of one key
# range (optimize_read_in_order: no sort; FINAL merges only what it reads). ts is part of the
# record, identical in every copy, so copies still collapse. owner last: two users who chose
# the same run id stay apart.
_RECORD_TABLE = """ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (run, ts, stream, seq, owner)
SETTINGS index_granularity = 8192"""


def json_keys(column: str) -> str:
    """SQL: the top-level keys of the JSON object in ``column``, in their order. Written with
    functions every engine build has (the lightest chDB build lacks ``JSONExtractKeys`` and
    ``JSONExtractKeysAndValuesRaw``)."""
    return f"mapKeys(JSONExtract({column}, 'Map(String, String)'))"


def _numbers(column: str) -> str:
    """SQL: the JSON numbers among the top-level values of ``column`` as a
    ``Map(String, Float64)`` (strings, booleans, null, objects and arrays left out)."""
    return (f"CAST(arrayFilter(kv -> isNotNull(kv.2), arrayMap(k -> (k, "
            f"if(JSONType({column}, k) IN ('Int64', 'UInt64', 'Double'), "
            f"JSONExtractFloat({column}, k), NULL)), {json_keys(column)})), "
            f"'Map(String, Float64)')")


# How a record's ``ts`` (seconds since the epoch, a JSON number such as 1700000000.25) is read:
# as a decimal, converted to DateTime64(9) on the way into a table (exact, at the column
# scale). Read straight into DateTime64, a JSON number with a fraction is refused by the
# engine before ClickHouse 26.7 (CANNOT_PARSE_INPUT, ClickHouse issue 59443; fixed by
# pull request 108091), and a bare integer is taken as nanosecond ticks: every server of an
# older release and the lightest chDB build (26.5) would refuse every batch.
_TS_INPUT = "Nullable(Decimal(38, 9))"

# The two views that extract numbers (created by migration 1, rewritten by migration 4).
_METADATA_VIEW = f"""
SELECT assumeNotNull(_run) AS run, assumeNotNull(_owner) AS owner, assumeNotNull(_uid) AS uid,
    assumeNotNull(stream) AS stream, assumeNotNull(seq) AS seq, assumeNotNull(ts) AS ts,
    fields, {_numbers("fields")} AS numbers
FROM ingest WHERE kind = 'metadata'"""
_SAMPLES_VIEW = f"""
SELECT assumeNotNull(_run) AS run, assumeNotNull(_owner) AS owner, assumeNotNull(_uid) AS uid,
    assumeNotNull(stream) AS stream, assumeNotNull(seq) AS seq, assumeNotNull(ts) AS ts,
    node, gpus, job, {_numbers("job")} AS job_metrics
FROM ingest WHERE kind = 'sample'"""

MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        # Everything a spool line may hold, plus the trusted identity spliced in by
        # Store.insert_ndjson. Engine Null: nothing is kept here, the views route rows.
        """CREATE TABLE IF NOT EXISTS ingest (
    _run Nullable(String), _owner Nullable(String), _uid Nullable(UInt32),
    _cluster String, _job_id String,
    kind Nullable(String), run String, stream Nullable(String), seq Nullable(UInt64),
    ts Nullable(DateTime64(9, 'UTC')),
    text String, note String, count Int64, options String, fields String,
    node String, gpus String, job String,
    command String, cwd String, user String, uid Int64, host String, pid Int64, mode String,
    slurm String, inventory String, config String,
    exit_status Nullable(Int32), signal Nullable(Int32), state String, duration Float64,
    counts String,
    CONSTRAINT identity CHECK _run IS NOT NULL AND _run != '' AND _owner IS NOT NULL
        AND _uid IS NOT NULL,
    CONSTRAINT record CHECK kind IN ('start', 'line', 'note', 'command', 'metadata', 'sample',
        'end') AND stream IS NOT NULL AND seq IS NOT NULL AND ts IS NOT NULL
) ENGINE = Null""",
        """CREATE TABLE IF NOT EXISTS runs (
    run String,
    owner LowCardinality(String),
    uid SimpleAggregateFunction(anyLast, UInt32),
    cluster SimpleAggregateFunction(anyLast, LowCardinality(String)),
    job_id SimpleAggregateFunction(anyLast, String),
    start_ts SimpleAggregateFunction(min, Nullable(DateTime64(9, 'UTC'))),
    end_ts SimpleAggregateFunction(max, Nullable(DateTime64(9, 'UTC'))),
    last_ts SimpleAggregateFunction(max, DateTime64(9, 'UTC')),
    start_seq SimpleAggregateFunction(anyLast, Nullable(UInt64)),
    end_seq SimpleAggregateFunction(anyLast, Nullable(UInt64)),
    host SimpleAggregateFunction(anyLast, Nullable(String)),
    command SimpleAggregateFunction(anyLast, Nullable(String)),
    cwd SimpleAggregateFunction(anyLast, Nullable(String)),
    record_user SimpleAggregateFunction(anyLast, Nullable(String)),
    record_uid SimpleAggregateFunction(anyLast, Nullable(Int64)),
    pid SimpleAggregateFunction(anyLast, Nullable(Int64)),
    mode SimpleAggregateFunction(anyLast, Nullable(String)),
    slurm SimpleAggregateFunction(anyLast, Nullable(String)),
    inventory SimpleAggregateFunction(anyLast, Nullable(String)),
    config SimpleAggregateFunction(anyLast, Nullable(String)),
    exit_status SimpleAggregateFunction(anyLast, Nullable(Int32)),
    signal SimpleAggregateFunction(anyLast, Nullable(Int32)),
    state SimpleAggregateFunction(anyLast, Nullable(String)),
    duration SimpleAggregateFunction(anyLast, Nullable(Float64)),
    counts SimpleAggregateFunction(anyLast, Nullable(String))
) ENGINE = AggregatingMergeTree
ORDER BY (run, owner)""",
        # text: ZSTD(8) is the lowest level below gzip -6 of the text (bench_store: ZSTD(1)
        # 1.05x gzip, ZSTD(3) 1.10x, ZSTD(7) 1.01x, ZSTD(8) 0.96x; ZSTD(9) no smaller, slower;
        # 4 MiB compression blocks no smaller). It is the dearest part of an insert: one
        # insert of 1M lines took ~2.4 CPU seconds with ZSTD(8), ~1.8 with ZSTD(1).
        f"""CREATE TABLE IF NOT EXISTS lines ({_ID_COLUMNS}
    kind LowCardinality(String),
    text String CODEC(ZSTD(8)),
    options String CODEC(ZSTD(1)),
    INDEX text_tokens text TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 1
) {_RECORD_TABLE}""",
        f"""CREATE TABLE IF NOT EXISTS notes ({_ID_COLUMNS}
    note LowCardinality(String),
    count Int64 CODEC(ZSTD(1)),
    text String CODEC(ZSTD(1))
) {_RECORD_TABLE}""",
        f"""CREATE TABLE IF NOT EXISTS metadata ({_ID_COLUMNS}
    fields String CODEC(ZSTD(1)),
    numbers Map(LowCardinality(String), Float64) CODEC(ZSTD(1))
) {_RECORD_TABLE}""",
        f"""CREATE TABLE IF NOT EXISTS samples ({_ID_COLUMNS}
    node LowCardinality(String),
    gpus String CODEC(ZSTD(1)),
    job String CODEC(ZSTD(1)),
    job_metrics Map(LowCardinality(String), Float64) CODEC(ZSTD(1))
) {_RECORD_TABLE}""",
        # Two views feed ``runs``: one row per run and insert block for any record (so a run
        # shows up as soon as anything of it is shipped; few, cheap aggregates), and one row
        # per Start/End record with their fields (the rest of the columns stay NULL there).
        """CREATE MATERIALIZED VIEW IF NOT EXISTS ingest_runs_seen TO runs AS
SELECT t_run AS run, t_owner AS owner, any(t_uid) AS uid, any(t_cluster) AS cluster,
    any(t_job_id) AS job_id, max(t_ts) AS last_ts
FROM (SELECT assumeNotNull(_run) AS t_run, assumeNotNull(_owner) AS t_owner,
    assumeNotNull(_uid) AS t_uid, _cluster AS t_cluster, _job_id AS t_job_id,
    assumeNotNull(ts) AS t_ts FROM ingest)
GROUP BY t_run, t_owner""",
        """CREATE MATERIALIZED VIEW IF NOT EXISTS ingest_runs TO runs AS
SELECT assumeNotNull(_run) AS run, assumeNotNull(_owner) AS owner, assumeNotNull(_uid) AS uid,
    _cluster AS cluster, _job_id AS job_id,
    if(kind = 'start', ts, NULL) AS start_ts,
    if(kind = 'end', ts, NULL) AS end_ts,
    assumeNotNull(ts) AS last_ts,
    if(kind = 'start', seq, NULL) AS start_seq,
    if(kind = 'end', seq, NULL) AS end_seq,
    if(kind = 'start', host, NULL) AS host,
    if(kind = 'start', command, NULL) AS command,
    if(kind = 'start', cwd, NULL) AS cwd,
    if(kind = 'start', user, NULL) AS record_user,
    if(kind = 'start', uid, NULL) AS record_uid,
    if(kind = 'start', pid, NULL) AS pid,
    if(kind = 'start', mode, NULL) AS mode,
    if(kind = 'start', slurm, NULL) AS slurm,
    if(kind = 'start', inventory, NULL) AS inventory,
    if(kind = 'start', config, NULL) AS config,
    if(kind = 'end', exit_status, NULL) AS exit_status,
    if(kind = 'end', signal, NULL) AS signal,
    if(kind = 'end', state, NULL) AS state,
    if(kind = 'end', duration, NULL) AS duration,
    if(kind = 'end', counts, NULL) AS counts
FROM ingest WHERE kind IN ('start', 'end')""",
        """CREATE MATERIALIZED VIEW IF NOT EXISTS ingest_lines TO lines AS
SELECT assumeNotNull(_run) AS run, assumeNotNull(_owner) AS owner, assumeNotNull(_uid) AS uid,
    assumeNotNull(stream) AS stream, assumeNotNull(seq) AS seq, assumeNotNull(ts) AS ts,
    assumeNotNull(kind) AS kind, text, options
FROM ingest WHERE kind IN ('line', 'command')""",
        """CREATE MATERIALIZED VIEW IF NOT EXISTS ingest_notes TO notes AS
SELECT assumeNotNull(_run) AS run, assumeNotNull(_owner) AS owner, assumeNotNull(_uid) AS uid,
    assumeNotNull(stream) AS stream, assumeNotNull(seq) AS seq, assumeNotNull(ts) AS ts,
    note, count, text
FROM ingest WHERE kind = 'note'""",
        # numbers: the numeric values of the flattened fields (booleans and strings left out).
        "CREATE MATERIALIZED VIEW IF NOT EXISTS ingest_metadata TO metadata AS "
        + _METADATA_VIEW,
        "CREATE MATERIALIZED VIEW IF NOT EXISTS ingest_samples TO samples AS "
        + _SAMPLES_VIEW,
    ]),
    # 2: the token index covers 8 granules (65,536 rows) per filter, as the OpenTelemetry
    # exporter's current log table and ClickStack: 0.5 bytes a line instead of 4 (a 32 KiB
    # filter per 8,192 rows was 0.38x the gzip size of the text and does not compress), and
    # a word absent from a block still skips it (docs/storage.md, "The token index").
    # MATERIALIZE rebuilds it for the parts already there as a background mutation (chDB
    # defaults to mutations_sync = 1, which would make the first command after an upgrade
    # rebuild a whole store while holding its lock; an unfinished mutation resumes when the
    # store is next opened). Re-run after an interruption, the three steps end the same way.
    (2, [
        "ALTER TABLE lines DROP INDEX IF EXISTS text_tokens",
        "ALTER TABLE lines ADD INDEX IF NOT EXISTS text_tokens text "
        "TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 8",
        "ALTER TABLE lines MATERIALIZE INDEX text_tokens SETTINGS mutations_sync = 0",
    ]),
    # 3: insights (logcapture.insights): why a run failed, efficiency notes, what the agent
    # found while it ran. One row per run, owner and kind (the newest ``ts`` wins, so a
    # diagnosis made again replaces the last one); ``numbers`` holds the numeric details
    # (gpu_hours_idle, cpu_efficiency...) for dashboards: "jobs that held GPUs without using
    # them last week" is a GROUP BY over it.
    (3, [
        """CREATE TABLE IF NOT EXISTS insights (
    run String CODEC(ZSTD(3)),
    owner LowCardinality(String),
    uid UInt32,
    cluster LowCardinality(String),
    job_id String,
    kind LowCardinality(String),
    category LowCardinality(String),
    ts DateTime64(3, 'UTC'),
    message String CODEC(ZSTD(1)),
    hint String CODEC(ZSTD(1)),
    evidence String CODEC(ZSTD(1)),
    details String CODEC(ZSTD(1)),
    numbers Map(LowCardinality(String), Float64)
) ENGINE = ReplacingMergeTree(ts)
ORDER BY (run, owner, kind)""",
    ]),
    # 4: ``ts`` read as a decimal (``_TS_INPUT``; the views convert it into their tables'
    # DateTime64 by themselves), and the views of migration 1 as they are written now, with
    # functions every engine build has: a store made by the full engine
    # (JSONExtractKeysAndValuesRaw) then takes inserts from the lightest one. MODIFY QUERY
    # swaps a query with no moment without a view (``ingest`` keeps nothing: rows inserted
    # meanwhile would be lost).
    (4, [
        f"ALTER TABLE ingest MODIFY COLUMN ts {_TS_INPUT}",
        "ALTER TABLE ingest_metadata MODIFY QUERY " + _METADATA_VIEW,
        "ALTER TABLE ingest_samples MODIFY QUERY " + _SAMPLES_VIEW,
    ]),
]

_SCHEMA_VERSION_DDL = """CREATE TABLE IF NOT EXISTS schema_version (
    version UInt32, applied DateTime DEFAULT now()
) ENGINE = ReplacingMergeTree ORDER BY version"""

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
                    f"ts {_TS_INPUT}, kind Nullable(String), text String, options String")
_LINES_FROM_FILE = """INSERT INTO lines (run, owner, uid, stream, seq, ts, kind, text, options)
SELECT {run:String}, {owner:String}, {uid:UInt32}, assumeNotNull(stream), assumeNotNull(seq),
    assumeNotNull(ts), assumeNotNull(kind), text, options
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
_LINE_KEYS = ("run", "stream", "seq", "ts", "kind", "text", "options")
_OTHER_KEYS = tuple(sorted({name for cls in KINDS.values() for name in cls._fields}
                           - set(_LINE_KEYS)))
_SEGMENT_STRUCTURE = _LINES_STRUCTURE + "".join(f", {k} Nullable(String)" for k in _OTHER_KEYS)
_HOT_KINDS = "kind IN ('line', 'command')"


def _lines_from_segments(other_keys: tuple[str, ...]) -> str:
    others = "".join(f" OR {k} IS NOT NULL" for k in other_keys)
    return f"""INSERT INTO lines (run, owner, uid, stream, seq, ts, kind, text, options)
SELECT {{run:String}}, {{owner:String}}, {{uid:UInt32}}, assumeNotNull(stream), assumeNotNull(seq),
    assumeNotNull(ts), assumeNotNull(kind), text, options
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
    if(countSubstrings(raw, '"kind":"line"}\\n') = n, [],
        arrayFilter(l -> l != '' AND NOT endsWith(l, '"kind":"line"}')
            AND NOT endsWith(l, '"kind":"command"}'), splitByChar('\\n', raw)))
FROM file({path:String}, 'RawBLOB', 'raw String', 'gzip')"""
# What ``ingest_runs_seen`` does for the other records: one ``runs`` row per run and insert,
# its newest ts read in key order (one granule per part).
_RUNS_SEEN = """INSERT INTO runs (run, owner, uid, cluster, job_id, last_ts)
SELECT {run:String}, {owner:String}, {uid:UInt32}, {cluster:String}, {job_id:String}, ts
FROM lines WHERE run = {run:String} AND owner = {owner:String} ORDER BY ts DESC LIMIT 1"""
# Store._tail: the newest rows of lines, notes and metadata in one query (one round trip),
# each a FINAL read in key order that stops after {limit} rows (bench_store, 50M rows: 32 ms
# for the last 10k lines of a 2M-line job, vs 34-100 ms for the newest rows without FINAL
# with the copies dropped by key; do_not_merge_across_partitions_select_final, correct here as
# ts is in the key, made it twice as slow). No outer ORDER BY (it cost more than the reads):
# Store._tail checks the order. ``{cond}`` is replaced by a constant condition of
# Store.lines (its values are parameters).
_TAIL_ORDER = "ORDER BY ts DESC, stream DESC, seq DESC, owner DESC LIMIT {limit:UInt64}"
# An in-order read that stops after {limit} rows gains nothing from more threads, and reads
# less in small blocks (the default, 65k rows a block from each part, reads several times the
# rows it keeps). bench_store, a 2M-line job among 20M rows: 40 ms with the defaults, 33 ms
# with one thread, 23 ms with blocks of 2048 rows too (1024-8192 within 3 ms of that).
_TAIL_SETTINGS = "SETTINGS max_threads = 1, max_block_size = 2048"
_TAIL_SQL = f"""SELECT stream, seq, toUnixTimestamp64Nano(ts), CAST(kind AS String), text, options,
    CAST(owner AS String), 0
FROM (SELECT stream, seq, ts, kind, text, options, owner FROM lines FINAL WHERE {{cond}}
    {_TAIL_ORDER})
UNION ALL
SELECT stream, seq, toUnixTimestamp64Nano(ts), CAST(note AS String), toString(count), text,
    CAST(owner AS String), 1
FROM (SELECT stream, seq, ts, note, count, text, owner FROM notes FINAL WHERE {{cond}}
    {_TAIL_ORDER})
UNION ALL
SELECT stream, seq, toUnixTimestamp64Nano(ts), fields, '', '', CAST(owner AS String), 2
FROM (SELECT stream, seq, ts, fields, owner FROM metadata FINAL WHERE {{cond}} {_TAIL_ORDER})
{_TAIL_SETTINGS}"""
# Store.lines' first query: the newest lines alone (most runs have no notes or metadata in
# their tail's range, and each of the other two FINAL reads cost 2-3 ms even when empty), and,
# in the last column, whether the run has any notes (1) or metadata (2): two primary-key
# look-ups without FINAL. Only then ``_TAIL_SQL`` follows.
_TAIL_LINES_SQL = f"""SELECT stream, seq, toUnixTimestamp64Nano(ts), CAST(kind AS String), text,
    options, (SELECT count() FROM (SELECT 1 FROM notes WHERE {{cond}} LIMIT 1))
    + 2 * (SELECT count() FROM (SELECT 1 FROM metadata WHERE {{cond}} LIMIT 1))
FROM lines FINAL WHERE {{cond}} {_TAIL_ORDER}
{_TAIL_SETTINGS}"""
# Store.search: one window of time, newest first (``{where}``: constant conditions whose
# values are parameters, from ``search.Pattern.sql`` and ``Store.search``).
_SEARCH_SQL = """SELECT run, CAST(owner AS String), CAST(stream AS String), seq,
    toUnixTimestamp64Nano(ts), text
FROM lines WHERE {where}
ORDER BY ts DESC, stream DESC, seq DESC LIMIT {n:UInt64}
SETTINGS use_top_k_dynamic_filtering = 0"""
# ClickHouse 26.5's top-K dynamic filter (the embedded engine of chdb-core-lite) compares the
# second ORDER BY key with the first's type ("Cannot parse DateTime: while converting 'stdout'");
# 26.9 does not. The filter only skips granules early; the LIMIT is the same without it.
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
# The last key of a line or command record (records.Line.to_json, Record.to_dict: ``kind`` is
# written last). A JSON string cannot hold an unescaped quote, so text never ends a line so.
_HOT_ENDS = (b'"kind":"line"}', b'"kind":"command"}')


def split_by_kind(data: bytes) -> tuple[bytes, bytes]:
    """NDJSON (complete lines) -> (line and command records, every other line). All lines
    (the common batch) cost one ``count``; a mixed batch one ``endswith`` per line."""
    n = data.count(b"\n")
    if data.count(b'"kind":"line"}\n') == n:
        return data, b""
    lines = data.split(b"\n")
    lines.pop()
    hot = [x for x in lines if x.endswith(_HOT_ENDS)]
    if len(hot) == n:
        return data, b""
    rest = [x for x in lines if not x.endswith(_HOT_ENDS)]
    return (b"\n".join(hot) + b"\n" if hot else b""), b"\n".join(rest) + b"\n"


def row_policy_statements() -> list[str]:
    """The row-policy DDL (``db init --row-policies``): each user sees the rows whose ``owner``
    is their ClickHouse user name; members of the role ``logcapture_admin`` see all.
    ClickHouse takes no query parameters in access-control DDL, so these statements are built
    from the fixed allow-lists ``TABLES`` and ``ADMIN_ROLE`` only (never from input)."""
    out = [f"CREATE ROLE IF NOT EXISTS {ADMIN_ROLE}"]
    for table in TABLES:
        assert table in TABLES and _IDENT_RE.match(table)
        out.append(f"CREATE ROW POLICY OR REPLACE logcapture_{table}_owner ON {table} "
                   f"AS PERMISSIVE FOR SELECT USING owner = currentUser() TO ALL EXCEPT "
                   f"{ADMIN_ROLE}")
        out.append(f"CREATE ROW POLICY OR REPLACE logcapture_{table}_admin ON {table} "
                   f"AS PERMISSIVE FOR SELECT USING 1 TO {ADMIN_ROLE}")
    return out


def check_sql_syntax(store: Store, statements: Iterable[str]) -> list[str]:
    """Parse each statement (constants of this module, never input) with the store's own
    parser without running it (``EXPLAIN AST``; the lightest chDB build has no
    ``formatQuery``); returns them. Used to check DDL chDB cannot execute (row policies)."""
    out = []
    for sql in statements:
        store._query("EXPLAIN AST " + sql, what="checking SQL")
        out.append(sql)
    return out


# --- identity ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Identity:
    """Who owns the rows of one run, from a trusted source (issue 4): for Slurm the root-owned
    prolog record, standalone the run's Start record checked against the spool directory's
    owner. ``run`` replaces the run id of every shipped record."""

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


# --- DSN and locking -----------------------------------------------------------------------------
def default_store_path(env: Mapping[str, str] = os.environ) -> Path:
    state = env.get("XDG_STATE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return Path(state) / "logcapture" / "store"


def resolve_dsn(dsn: str | None = None, env: Mapping[str, str] = os.environ) -> str:
    """``--store``, else ``$LOGCAPTURE_STORE``, else ``store:`` in the admin config file
    (``$LOGCAPTURE_CONFIG`` or ``/etc/logcapture/config.yaml``, ``config.load_admin``), else
    the embedded default ``chdb://$XDG_STATE_HOME/logcapture/store``."""
    if dsn:
        return dsn
    if env.get("LOGCAPTURE_STORE"):
        return env["LOGCAPTURE_STORE"]
    from .config import load_admin

    return load_admin(env=env).store or f"chdb://{default_store_path(env)}"


def redact(dsn: str) -> str:
    """The DSN without its password, for messages."""
    p = urlparse(dsn)
    if p.password:
        netloc = f"{p.username}:***@{p.hostname}" + (f":{p.port}" if p.port else "")
        return urlunparse(p._replace(netloc=netloc))
    return dsn


def flock_within(fd: int, wait: float, poll: float) -> bool:
    """Take an exclusive flock on ``fd``, trying again every ``poll`` seconds for at most
    ``wait`` seconds (at least once). False when another holder kept it all that time."""
    import time

    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)


# clickhouse-connect logs each failed HTTP attempt itself ("Unexpected Http Driver Exception")
# through Python's last-resort handler, onto the user's terminal; every failure already
# reaches the user once, classified, from here (StoreError), so its own log stays quiet.
logging.getLogger("clickhouse_connect").addHandler(logging.NullHandler())
logging.getLogger("clickhouse_connect").propagate = False


def _want_path(lock_path: Path) -> Path:
    return lock_path.with_name(lock_path.name + ".want")


def _lock_or_wait(fd: int, lock_path: Path, wait: float) -> bool:
    """Take the store's flock, waiting up to ``wait`` seconds. A process that has to wait says
    so by holding a shared flock on ``<store>.lock.want`` meanwhile: a holder that keeps the
    store between questions (the read service) sees it (``store_wanted``) and lets go."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        if wait <= 0:
            return False
    want = None
    try:
        want = os.open(_want_path(lock_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(want, fcntl.LOCK_SH)  # the holder's check holds it exclusively a moment
    except OSError:
        pass  # not ours to write (another user's store): wait all the same
    try:
        return flock_within(fd, wait, poll=0.05)
    finally:
        if want is not None:
            os.close(want)


def store_wanted(lock_path: Path) -> bool:
    """Whether another process waits for the embedded store whose lock is ``lock_path``."""
    try:
        fd = os.open(_want_path(lock_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the flock when it was taken
    return False


class _StoreLock:
    """Per-process reference-counted flock on ``<store>.lock``: chDB is one engine per process,
    so clients of one process share it; another process is refused."""

    _held: dict[str, tuple[int, int]] = {}  # path -> (fd, refcount)
    _mutex = threading.Lock()

    @classmethod
    def acquire(cls, lock_path: Path, wait: float = 0.0) -> None:
        key = str(lock_path)
        with cls._mutex:
            if key in cls._held:
                fd, n = cls._held[key]
                cls._held[key] = (fd, n + 1)
                return
            try:
                lock_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except PermissionError:
                # An embedded store belongs to whoever made it (on a cluster: root, so users
                # cannot read each other's rows); a clear message, not a traceback.
                raise StoreAuthError(
                    f"no permission to open the embedded store "
                    f"{lock_path.with_suffix('')}: it belongs to another user; ask an "
                    "administrator, or read your own spool with --source spool") from None
            except OSError as e:
                raise StoreUnavailable(f"cannot open the embedded store's lock {lock_path}: "
                                       f"{e.strerror}") from None
            if not _lock_or_wait(fd, lock_path, wait):
                holder = ""
                try:
                    holder = os.pread(fd, 32, 0).decode().strip()
                except OSError:
                    pass
                os.close(fd)
                who = f" (pid {holder})" if holder.isdigit() else ""
                raise StoreUnavailable(
                    f"the embedded store {lock_path.with_suffix('')} is in use by "
                    f"another process{who}; chDB allows one process per store folder, "
                    "try again when it has finished") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            cls._held[key] = (fd, 1)

    @classmethod
    def release(cls, lock_path: Path) -> None:
        key = str(lock_path)
        with cls._mutex:
            if key not in cls._held:
                return
            fd, n = cls._held[key]
            if n > 1:
                cls._held[key] = (fd, n - 1)
                return
            del cls._held[key]
            os.close(fd)  # closing the descriptor drops the flock


# --- errors -------------------------------------------------------------------------------
def classify(exc: BaseException, what: str = "") -> StoreError:
    """Map a clickhouse-connect/chDB exception to the store's error classes."""
    if isinstance(exc, StoreError):
        return exc
    msg = str(exc).strip()
    short = msg.splitlines()[0][:400] if msg else type(exc).__name__
    code = getattr(exc, "code", None)
    if not isinstance(code, int):
        m = re.search(r"Code: (\d+)", msg)
        code = int(m.group(1)) if m else None
    prefix = f"{what}: " if what else ""
    if code in AUTH_ERROR_CODES or _HTTP_STATUS_RE.search(msg):
        return StoreAuthError(f"{prefix}the store refused the credentials or the access "
                              f"(stopping at once): {short}")
    if code in DATA_ERROR_CODES:
        err = StoreDataError(f"{prefix}the store refused the data: {short}")
        err.code = code  # type: ignore[attr-defined]
        return err
    if code in FATAL_ERROR_CODES and "EmbeddedServer" not in msg:
        return StoreError(f"{prefix}{short}")
    if code in SCHEMA_ERROR_CODES:
        return StoreError(f"{prefix}the store has no logcapture schema (run `logcapture db "
                          f"init`): {short}")
    return StoreUnavailable(f"{prefix}{short}")


# --- the store -----------------------------------------------------------------------------------
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


class Store:
    """A clickhouse-connect client on the logcapture schema. Use ``open_store``."""

    def __init__(self, client: Any, dsn: str, lock_path: Path | None = None):
        self.client = client
        self.dsn = dsn
        self._lock_path = lock_path
        self.embedded = lock_path is not None
        # asynchronous inserts into ``ingest`` (``ASYNC_INSERT_SETTINGS``): on a server
        self.async_insert = not self.embedded
        self._closed = False
        self._extra_clients: list[Any] = []  # more handles on the embedded engine

    # --- lifecycle
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for extra in self._extra_clients:
                extra.close()
            self.client.close()
        finally:
            if self._lock_path is not None:
                _StoreLock.release(self._lock_path)

    def wanted(self) -> bool:
        """Whether another process waits for this embedded store (``store_wanted``)."""
        return self._lock_path is not None and store_wanted(self._lock_path)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _command(self, sql: str, params: dict[str, Any] | None = None,
                 what: str = "") -> Any:
        try:
            return self.client.command(sql, parameters=params or None)
        except Exception as e:  # noqa: BLE001 - classified below
            raise classify(e, what) from None

    def _query(self, sql: str, params: dict[str, Any] | None = None,
               what: str = "reading", formats: dict[str, str] | None = None
               ) -> list[tuple[Any, ...]]:
        try:
            return list(self.client.query(sql, parameters=params or None,
                                          query_formats=formats).result_rows)
        except Exception as e:  # noqa: BLE001
            raise classify(e, what) from None

    # --- schema
    def schema_version(self) -> int:
        exists = self._query("SELECT count() FROM system.tables WHERE database = "
                             "currentDatabase() AND name = 'schema_version'")
        if not exists[0][0]:
            return 0
        return int(self._query("SELECT max(version) FROM schema_version")[0][0] or 0)

    def init_schema(self, ttl_days: int | None = None, row_policies: bool = False,
                    ) -> int:
        """Create or migrate the schema (versioned, idempotent); returns the version now in
        place. ``ttl_days``: rows older than that many days expire (0 removes the TTL; None
        leaves it as it is). ``row_policies``: create the row policies (a server only; chDB
        has no access control and answers ACCESS_DENIED, code 497)."""
        self._command(_SCHEMA_VERSION_DDL, what="creating the schema")
        current = self.schema_version()
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            for sql in statements:
                self._command(sql, what=f"schema migration {version}")
            self._command("INSERT INTO schema_version (version) VALUES ({v:UInt32})",
                          {"v": version}, what="schema migration")
        if ttl_days is not None:
            self.set_ttl(ttl_days)
        if row_policies:
            if self.embedded:
                n = len(check_sql_syntax(self, row_policy_statements()))
                raise StoreError(
                    "the embedded store (chDB) has no users or access control, so row "
                    f"policies need a ClickHouse server ({n} statements checked; see "
                    "docs/storage.md)")
            for sql in row_policy_statements():
                self._command(sql, what="creating row policies")
        return self.schema_version()

    def set_ttl(self, ttl_days: int) -> None:
        if not isinstance(ttl_days, int) or ttl_days < 0:
            raise UsageError(f"TTL must be a whole number of days >= 0, not {ttl_days!r}")
        for table in TABLES:
            column = "last_ts" if table == "runs" else "ts"
            if ttl_days == 0:
                if self._has_ttl(table):
                    self._command("ALTER TABLE {t:Identifier} REMOVE TTL", {"t": table},
                                  what="removing the TTL")
                continue
            self._command("ALTER TABLE {t:Identifier} MODIFY TTL toDateTime({c:Identifier}) + "
                          "toIntervalDay({d:UInt32})", {"t": table, "c": column, "d": ttl_days},
                          what="setting the TTL")

    def _has_ttl(self, table: str) -> bool:
        rows = self._query("SELECT create_table_query FROM system.tables WHERE database = "
                           "currentDatabase() AND name = {t:String}", {"t": table})
        return bool(rows) and " TTL " in rows[0][0]

    def check_schema(self) -> None:
        v = self.schema_version()
        if v < SCHEMA_VERSION:
            raise StoreError(f"the store {redact(self.dsn)} has schema version {v}, this "
                             f"logcapture needs {SCHEMA_VERSION}: run `logcapture db init`")

    # --- inserting
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

    def _more_clients(self, n: int) -> list[Any]:
        """``n`` more handles on the embedded engine this store opened (kept until close)."""
        import clickhouse_connect

        while len(self._extra_clients) < n:
            try:
                client = clickhouse_connect.get_client(dsn=f"chdb://{_chdb_path(self.dsn)}")
                client.database = DEFAULT_DATABASE
            except Exception as e:  # noqa: BLE001
                raise classify(e, "opening the embedded store") from None
            self._extra_clients.append(client)
        return self._extra_clients[:n]

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

    # --- reading
    # Every read takes ``owner``: a user name, or None for all owners (the run's own store on a
    # laptop, an administrator). The condition is built from constants only; the values are
    # parameters (``_run_cond``).
    def runs(self, owner: str | None = None, run: str | None = None,
             job: str | None = None) -> list[dict[str, Any]]:
        """One dict per run (``run``: that one only), newest first: run, owner, uid, cluster,
        job_id, host, command, start (epoch s), end, last (newest record), state (RUNNING
        while no end record), exit_status, signal, duration, slurm (the Start record's Slurm
        identity, a dict), lines (output lines: the End record's counts, counted in the
        store while it runs). ``job``: only the runs a job reference may name
        (``jobref.select`` picks among them): run id ``job``, or job id or array job id
        ``jobref.parse(job).job``."""
        p = {"owner": owner or "", "run": run or "", "ref": job or "", "job": ""}
        conds = (["owner = {owner:String}"] if owner is not None else []) + (
            ["run = {run:String}"] if run is not None else [])
        if job is not None:
            ref = jobref.parse(job)
            p["job"] = ref.job if ref is not None else ""
            conds.append("(run = {ref:String} OR ({job:String} != '' AND (job_id = {job:String}"
                         " OR JSONExtractString(ifNull(slurm, ''), 'array_job_id') = "
                         "{job:String})))")
        where = ("WHERE " + " AND ".join(conds)) if conds else ""
        rows = self._query(
            "SELECT run, owner, uid, cluster, job_id, host, command, "
            "toUnixTimestamp64Nano(start_ts), toUnixTimestamp64Nano(end_ts), "
            "toUnixTimestamp64Nano(last_ts), ifNull(state, 'RUNNING'), exit_status, signal, "
            "duration, slurm, counts FROM runs FINAL " + where +
            " ORDER BY ifNull(start_ts, last_ts) DESC, run", p if conds else None)
        out = [self._run_row(r) for r in rows]
        for d, r in zip(out, rows, strict=True):
            d["slurm"] = _loads(r[14], {})
            counts = _loads(r[15], None)
            d["lines"] = (sum(int(c.get("lines", 0)) for c in counts.values()
                              if isinstance(c, dict))
                          if isinstance(counts, dict) else None)
        live = [d["run"] for d in out if d["lines"] is None]
        if live:
            counted = dict(self._query(
                "SELECT run, count() FROM lines FINAL WHERE run IN {runs:Array(String)} AND "
                "kind = 'line'" + (" AND owner = {owner:String}" if owner is not None else "")
                + " GROUP BY run", {"runs": live, "owner": owner or ""}))
            for d in out:
                if d["lines"] is None:
                    d["lines"] = int(counted.get(d["run"], 0))
        kinds: dict[tuple[str, str], list[str]] = {}
        for run, who, kind in self._query(
                "SELECT run, owner, kind FROM insights FINAL" + (
                    " WHERE owner = {owner:String}" if owner is not None else "")
                + " ORDER BY run, category = 'live', category = 'efficiency', ts, kind",
                {"owner": owner} if owner is not None else None):
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
        return "run = {run:String} AND owner = {owner:String}", {"run": run, "owner": owner}

    def has_run(self, run: str, owner: str | None = None) -> bool:
        cond, p = self._run_cond(run, owner)
        return bool(self._query("SELECT count() FROM runs WHERE " + cond, p)[0][0])

    def resolve_run(self, ref: str | None, owner: str | None = None) -> str:
        """The run id RUN names, as the other commands take it (``runs.find_run`` on the spool
        side): None or ``latest`` (the newest run in the store), a run id, or a Slurm job
        reference (``J``, ``J_T``, ``J.N``: ``jobref``). NotFound when the store has none (of
        ``owner``'s); a UsageError when an array job of several tasks is named."""
        mine = " AND owner = {owner:String}" if owner is not None else ""
        p: dict[str, Any] = {"owner": owner or "", "ref": ref or ""}
        if ref is None or ref == "latest":
            rows = self._query("SELECT run FROM runs FINAL WHERE 1" + mine + " ORDER BY "
                               "ifNull(start_ts, last_ts) DESC, run DESC LIMIT 1", p)
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
        assert table in TABLES and re.fullmatch(r"[a-z_, ]+", columns)
        return self._query("SELECT stream, seq, toUnixTimestamp64Nano(ts), " + columns
                           + " FROM " + table + " FINAL WHERE " + cond, params)

    def _tail(self, cond: str, params: dict[str, Any], limit: int
              ) -> tuple[list[tuple[Any, ...]], ...]:
        """The newest ``limit`` records of lines, notes and metadata matching ``cond``, each
        once (FINAL), newest first, in one query (``_TAIL_SQL``). Rows: ``stream, seq, ts (ns),
        a, b, c, owner, table`` with (a, b, c) = lines (kind, text, options), notes (note,
        count as text, text), metadata (fields)."""
        rows = self._query(_TAIL_SQL.replace("{cond}", cond), {**params, "limit": limit})
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
        the newest N lines in one query (``_TAIL_LINES_SQL``), built into record dicts from
        its columns; None when the run has notes or metadata, or no lines."""
        try:
            res = self.client.query(_TAIL_LINES_SQL.replace("{cond}", cond),
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
        if "command" in kinds:
            for d, o in zip(out, options, strict=True):
                if d["kind"] == "command":
                    d["options"] = _loads(o, {})
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
            line_rows = self._rows("lines", "kind, text, options", cond, params)
            note_rows = self._rows("notes", "note, count, text", cond, params)
            meta_rows = self._rows("metadata", "fields", cond, params)
        # ts: DateTime64(9) parsed the spool's JSON decimal text exactly, so ns / 1e9 is the
        # very float the spool held (``_ns_to_float``), inlined: 10k rows per tail.
        lines = [{"kind": r[3], "run": run, "stream": r[0], "seq": r[1],
                  "ts": r[2] / 1_000_000_000, "text": r[4]} if r[3] != "command" else
                 {"kind": r[3], "run": run, "stream": r[0], "seq": r[1],
                  "ts": r[2] / 1_000_000_000, "text": r[4], "options": _loads(r[5], {})}
                 for r in line_rows]
        notes = [{"kind": "note", "run": run, "stream": r[0], "seq": r[1],
                  "ts": r[2] / 1_000_000_000, "note": r[3], "count": int(r[4]), "text": r[5]}
                 for r in note_rows]
        meta = [{"kind": "metadata", "run": run, "stream": r[0], "seq": r[1],
                 "ts": r[2] / 1_000_000_000, "fields": _loads(r[3], {})} for r in meta_rows]
        if limit and not notes and not meta:
            lines.reverse()  # the tail comes newest first, in key order
            return lines
        out = lines + notes + meta
        out.sort(key=lambda d: (d["ts"], d["stream"], d["seq"]))
        return out[-limit:] if limit else out[:head] if head else out

    def log_page(self, run: str, owner: str | None = None, stderr: bool = False,
                 before: tuple[int, str, int] | None = None,
                 after: tuple[int, str, int] | None = None, limit: int = 1000
                 ) -> tuple[list[tuple[float, str, int, str, str]], bool, bool]:
        """One page of the run's log as ``logview`` shows it: entries ``(ts, stream, seq,
        kind, text)`` in order, the newest ``limit`` before the cursor ``before`` (default:
        the newest), or the oldest ``limit`` after ``after``; whether more lie beyond; and
        whether the run has ended. A cursor is ``(ts in ns, stream, seq)``. The key begins
        with the run and the time, so a page costs one range of the run's rows, however long
        the log. NotFound when the run is not the owner's."""
        from .logview import METADATA, log_sql, metadata_text

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
                      ts="toUnixTimestamp64Nano(ts)", final=False)
        rows = self._query(sql, params)
        seen: set[tuple[str, int]] = set()
        unique = []
        for r in rows:
            if (r[1], r[2]) not in seen:
                seen.add((r[1], r[2]))
                unique.append(r)
        more = len(unique) > limit or len(rows) == params["limit"]
        out = [(r[0] / 1_000_000_000, r[1], int(r[2]), r[3],
                metadata_text(r[4]) if r[3] == METADATA else r[4]) for r in unique[:limit]]
        if after is None:
            out.reverse()
        return out, more, bool(state[0][0])

    def metadata(self, run: str, owner: str | None = None) -> list[dict[str, Any]]:
        """Metadata records of the run, newest first (dashboards show them that way)."""
        cond, p = self._run_cond(run, owner)
        rows = self._query("SELECT stream, seq, toUnixTimestamp64Nano(ts), fields FROM "
                           "metadata FINAL WHERE " + cond + " ORDER BY ts DESC, seq DESC", p)
        return [{"kind": "metadata", "run": run, "stream": r[0], "seq": r[1],
                 "ts": _ns_to_float(r[2]), "fields": _loads(r[3], {})} for r in rows]

    def samples(self, run: str, owner: str | None = None) -> list[dict[str, Any]]:
        """Sample records of the run, oldest first."""
        cond, p = self._run_cond(run, owner)
        rows = self._query("SELECT stream, seq, toUnixTimestamp64Nano(ts), node, gpus, job "
                           "FROM samples FINAL WHERE " + cond + " ORDER BY ts, stream, seq", p)
        return [{"kind": "sample", "run": run, "stream": r[0], "seq": r[1],
                 "ts": _ns_to_float(r[2]), "node": r[3], "gpus": _loads(r[4], []),
                 "job": _loads(r[5], {})} for r in rows]

    def records(self, run: str, owner: str | None = None) -> list[dict[str, Any]]:
        """Every record of the run, as spool record dicts (start first, end last)."""
        info = self.run_info(run, owner)
        body = self.lines(run, owner=owner) + self.samples(run, owner)
        body.sort(key=lambda d: (d["ts"], d["stream"], d["seq"]))
        head = [info["start_record"]] if info["start_record"] else []
        tail = [info["end_record"]] if info["end_record"] else []
        return head + body + tail

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

    def insights(self, run: str, owner: str | None = None) -> list[dict[str, Any]]:
        """The run's stored insights (``Insight.to_dict()`` plus ``ts``), failures first."""
        cond = "run = {run:String}" + (" AND owner = {owner:String}" if owner else "")
        rows = self._query(
            "SELECT kind, category, toUnixTimestamp64Milli(ts), message, hint, evidence, "
            "details FROM insights FINAL WHERE " + cond + " ORDER BY category = 'live', "
            "category = 'efficiency', ts", {"run": run, "owner": owner or ""})
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
        heads: dict[str, int] = {}
        for (stream, seq), text in found.items():
            if traceback_head in text and seq > heads.get(stream, -1):
                heads[stream] = seq
        for stream, head in heads.items():
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
            conds.append("owner = {owner:String}")
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
        return Found(found, self._search_summaries({(h.run, h.owner) for h in found}),
                     truncated)

    def _search_runs_cond(self, req: Request, owner: str | None, params: dict[str, Any]
                          ) -> str:
        """The condition on ``run`` for ``owner``, ``--job`` and ``--state`` (a subquery of
        ``runs``, which the primary key of ``lines`` serves), or '' for every run."""
        if not req.jobs and not req.states:
            # One user's runs are a small part of a shared store, and ``lines`` is sorted by
            # run first: naming them lets the primary key skip everyone else's.
            return ("" if owner is None else
                    "run IN (SELECT run FROM runs WHERE owner = {owner:String})")
        inner = []
        if owner is not None:
            inner.append("owner = {owner:String}")
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
            rows = self._query(_SEARCH_SQL.replace("{where}", " AND ".join(where)), p,
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
            "SELECT run, CAST(owner AS String), job_id, JSONExtractString(ifNull(slurm, "
            "'{}'), 'job_name'), ifNull(command, '[]'), ifNull(state, 'RUNNING'), "
            "toUnixTimestamp64Nano(ifNull(start_ts, last_ts)) FROM runs FINAL "
            "WHERE has({runs:Array(String)}, run)",
            {"runs": sorted({k[0] for k in keys})}, what="searching")
        out = {}
        for r in rows:
            if (r[0], r[1]) in keys:
                out[(r[0], r[1])] = {
                    "run": r[0], "owner": r[1], "job_id": r[2],
                    "name": r[3] or " ".join(_loads(r[4], [])), "state": r[5],
                    "start": _ns_to_float(r[6]), "source": "store"}
        for k in keys - set(out):  # lines shipped before any record that lists the run
            out[k] = {"run": k[0], "owner": k[1], "job_id": "", "name": "", "state": "RUNNING",
                      "start": None, "source": "store"}
        return out

    # --- export
    def export(self, run: str, what: str, fmt: str, out: BinaryIO,
               owner: str | None = None) -> int:
        """Write the run's ``lines``, ``metadata`` or ``samples`` as ``csv``, ``ndjson`` or
        ``parquet`` to ``out``; returns the number of rows. Metadata and sample fields become
        columns (dotted keys)."""
        check_export(what, fmt)
        self.run_info(run, owner)  # NotFound when absent
        if what == "lines":
            recs = self.lines(run, owner=owner)
        else:
            recs = self.metadata(run, owner) if what == "metadata" else self.samples(run, owner)
        rows = export_rows(what, recs)
        write_rows(rows, fmt, out, self)
        return len(rows)


EXPORTS = ("lines", "metadata", "samples")
EXPORT_FORMATS = ("csv", "ndjson", "parquet")


def check_export(what: str, fmt: str) -> None:
    if what not in EXPORTS:
        raise UsageError(f"--what must be lines, metadata or samples, not {what!r}")
    if fmt not in EXPORT_FORMATS:
        raise UsageError(f"--format must be csv, ndjson or parquet, not {fmt!r}")


def export_rows(what: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows ``export`` writes from one run's record dicts of that kind: its output records
    (``lines``), metadata records (one column per key) or sample records (``job.KEY`` and
    ``gpuN.KEY`` columns)."""
    if what == "lines":
        return [{"ts": d["ts"], "stream": d["stream"], "seq": d["seq"], "kind": d["kind"],
                 "text": _line_text(d)} for d in records]
    if what == "metadata":
        recs = sorted(records, key=lambda d: (d["ts"], d["seq"]))
        return [{"ts": d["ts"], "seq": d["seq"], **d["fields"]} for d in recs]
    rows = []
    for d in records:
        row: dict[str, Any] = {"ts": d["ts"], "node": d["node"]}
        row.update({f"job.{k}": v for k, v in d["job"].items()})
        for i, gpu in enumerate(d["gpus"]):
            if isinstance(gpu, dict):
                row.update({f"gpu{gpu.get('index', i)}.{k}": v for k, v in gpu.items()})
        rows.append(row)
    return rows


def _line_text(d: dict[str, Any]) -> str:
    if d["kind"] == "metadata":
        return dumps(d["fields"])
    return str(d.get("text", ""))


# The engine's output format for each export format.
ENGINE_FORMATS = {"csv": "CSVWithNames", "ndjson": "JSONEachRow", "parquet": "Parquet"}
# 64-bit integers as JSON numbers, "/" unescaped, NULL as an empty CSV field, Parquet text as
# strings (not binary) on servers of any age.
_EXPORT_SETTINGS = {
    "output_format_json_quote_64bit_integers": 0,
    "output_format_json_escape_forward_slashes": 0,
    "format_csv_null_representation": "",
    "output_format_parquet_string_as_string": 1,
}
_INT64 = range(-(1 << 63), 1 << 63)


def _export_column(values: list[Any]) -> tuple[str, bool]:
    """The engine type of an export column from its Python values (None: absent), and whether
    its values go in as text: whole numbers Int64, numbers Float64, booleans Bool, strings
    String; anything else (objects, lists, mixed) its JSON text."""
    kinds = {type(v) for v in values if v is not None}
    if kinds == {int} and all(v in _INT64 for v in values if v is not None):
        return "Int64", False
    if kinds and kinds <= {int, float}:
        return "Float64", False
    if kinds == {bool}:
        return "Bool", False
    return "String", bool(kinds - {str})


def _as_text(v: Any) -> str | None:
    """A value of a text column: objects and lists as their JSON text (``dumps`` takes a list
    as well), anything else as ``str``."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list):
        return dumps(v)  # type: ignore[arg-type]
    return dumps(v) if isinstance(v, dict) else str(v)


def write_rows(rows: list[dict[str, Any]], fmt: str, out: BinaryIO,
               store: Store | None = None) -> None:
    """Write export rows (``export_rows``) to ``out`` as ``csv``, ``ndjson`` or ``parquet``:
    the engine writes the file (``ENGINE_FORMATS``), one column per key in the order first
    seen, typed by ``_export_column``, NULL (an empty CSV field) where a row lacks it. The
    engine is ``store``'s (an embedded store reads the rows from a private temporary file, a
    server gets them as external data), else an in-memory embedded one. Values of a text
    column that are not strings are turned into their JSON text in ``rows`` itself."""
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    if not columns:
        columns = {"ts": None}
    types: dict[str, str] = {}
    for c in columns:
        values = [row.get(c) for row in rows]
        types[c], text = _export_column(values)
        if text:
            for row in rows:
                if c in row:
                    row[c] = _as_text(row[c])
    structure = ", ".join(f"`{_escape_ident(c)}` Nullable({t})" for c, t in types.items())
    body = "".join(dumps(row) + "\n" for row in rows).encode("utf-8", "surrogatepass")
    try:
        if store is None:
            with _memory_engine() as client:
                _write_through(client, True, body, structure, fmt, out)
        else:
            _write_through(store.client, store.embedded, body, structure, fmt, out)
    except LogcaptureError:
        raise
    except Exception as e:  # noqa: BLE001
        raise classify(e, "exporting") from None


def _escape_ident(name: str) -> str:
    return name.replace("\\", "\\\\").replace("`", "\\`")


def _write_through(client: Any, embedded: bool, body: bytes, structure: str, fmt: str,
                   out: BinaryIO) -> None:
    if not embedded:
        from clickhouse_connect.driver.external import ExternalData

        data = ExternalData(file_name="export_rows", data=body, fmt="JSONEachRow",
                            structure=structure)
        chunks = client.raw_stream("SELECT * FROM export_rows", fmt=ENGINE_FORMATS[fmt],
                                   settings=_EXPORT_SETTINGS, external_data=data)
        for chunk in chunks:
            out.write(chunk)
        return
    with tempfile.NamedTemporaryFile(prefix="logcapture-export-", suffix=".ndjson") as f:
        f.write(body)
        f.flush()
        chunks = client.raw_stream(
            "SELECT * FROM file({path:String}, 'JSONEachRow', {structure:String})",
            parameters={"path": f.name, "structure": structure}, fmt=ENGINE_FORMATS[fmt],
            settings=_EXPORT_SETTINGS)
        for chunk in chunks:
            out.write(chunk)


@contextmanager
def _memory_engine() -> Iterator[Any]:
    """An embedded engine for writing an export when no store is given: a new handle on the
    embedded store this process has open (chDB runs one engine per process, on one path),
    else an in-memory one (``chdb://memory``)."""
    if importlib.util.find_spec("chdb") is None:
        raise NoEngine("writing an export needs the ClickHouse engine: a store (LOGCAPTURE_STORE"
                       "=http(s)://USER:PASS@HOST:8123/DB or --store), or the embedded one: "
                       "pip install 'logcapture[embedded]'")
    import clickhouse_connect

    with _StoreLock._mutex:
        held = next(iter(_StoreLock._held), None)  # ``<store>.lock``
    client = clickhouse_connect.get_client(
        dsn=f"chdb://{held.removesuffix('.lock')}" if held else "chdb://memory")
    try:
        yield client
    finally:
        client.close()


# --- opening ---------------------------------------------------------------------------------
# One line: what a plain install (no ``embedded`` extra) says when a command needs a store and
# none is named, so the embedded default would be used.
NO_ENGINE = ("the embedded store ({path}) needs the chDB engine, which is not installed: "
             "pip install 'logcapture[embedded]', or name a ClickHouse server with "
             "LOGCAPTURE_STORE=http(s)://USER:PASS@HOST:8123/DB (or --store, or store: in the "
             "config file)")


def check_engine(dsn: str | None, env: Mapping[str, str] = os.environ) -> None:
    """Raise NoEngine (one line: how to get a store) when ``dsn`` (``resolve_dsn`` when
    None) is the embedded store and its engine is not installed."""
    dsn = resolve_dsn(dsn, env)
    if urlparse(dsn).scheme == "chdb" and importlib.util.find_spec("chdb") is None:
        raise NoEngine(NO_ENGINE.format(path=_chdb_path(dsn)))


def _chdb_path(dsn: str) -> Path:
    p = urlparse(dsn)
    if p.netloc and p.netloc not in ("",):
        raise UsageError(f"embedded store DSN must be chdb:///ABSOLUTE/PATH, not {dsn!r}")
    if not p.path or not p.path.startswith("/"):
        raise UsageError(f"embedded store DSN must be chdb:///ABSOLUTE/PATH, not {dsn!r}")
    return Path(os.path.realpath(p.path))


def open_store(dsn: str | None = None, *, wait: float = 0.0, create: bool = True,
               must_exist: bool = False,
               connect_timeout: float = 5.0, env: Mapping[str, str] = os.environ) -> Store:
    """Open the store named by ``dsn`` (``resolve_dsn`` when None). A context manager: leaving
    it closes the client and releases the chDB lock. ``wait``: seconds to wait for an embedded
    store held by another process. ``create``: for the embedded store, create or migrate the
    schema when it is missing or old (a server needs ``logcapture db init``). ``must_exist``:
    raise NotFound instead of creating an embedded store that is not there (readers)."""
    import clickhouse_connect

    dsn = resolve_dsn(dsn, env)
    scheme = urlparse(dsn).scheme
    if scheme == "chdb":
        path = _chdb_path(dsn)
        if must_exist and not path.is_dir():
            raise NotFound(f"no store at {path}")
        check_engine(dsn, env)
        lock = path.with_name(path.name + ".lock")
        _StoreLock.acquire(lock, wait)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
            except Exception as e:  # noqa: BLE001
                raise classify(e, f"opening the embedded store {path}") from None
            try:
                client.command("CREATE DATABASE IF NOT EXISTS {db:Identifier}",
                               parameters={"db": DEFAULT_DATABASE})
                client.database = DEFAULT_DATABASE
            except Exception as e:  # noqa: BLE001
                client.close()
                raise classify(e, f"opening the embedded store {path}") from None
        except BaseException:
            _StoreLock.release(lock)
            raise
        store = Store(client, dsn, lock)
        if create:
            try:
                if store.schema_version() < SCHEMA_VERSION:
                    store.init_schema()
            except BaseException:
                store.close()
                raise
        return store
    if scheme in ("http", "https"):
        p = urlparse(dsn)
        database = p.path.strip("/") or DEFAULT_DATABASE
        if not _IDENT_RE.match(database):
            raise UsageError(f"invalid database name {database!r} in the store DSN")
        try:
            client = clickhouse_connect.get_client(
                dsn=urlunparse(p._replace(path="")), database=database,
                connect_timeout=connect_timeout, send_receive_timeout=60,
                query_retries=0)
        except Exception as e:  # noqa: BLE001
            err = classify(e, f"connecting to {redact(dsn)}")
            if "UNKNOWN_DATABASE" in str(e) or getattr(e, "code", None) == 81:
                client = _create_database(p, database, connect_timeout)
            else:
                raise err from None
        return Store(client, dsn)
    raise UsageError(f"unsupported store DSN {redact(dsn)!r}: use chdb:///PATH or "
                     "http(s)://USER:PASS@HOST:8123/DB")


def _create_database(p: Any, database: str, connect_timeout: float) -> Any:
    import clickhouse_connect

    try:
        client = clickhouse_connect.get_client(dsn=urlunparse(p._replace(path="")),
                                               connect_timeout=connect_timeout, query_retries=0)
        client.command("CREATE DATABASE IF NOT EXISTS {db:Identifier}",
                       parameters={"db": database})
        client.database = database
        return client
    except Exception as e:  # noqa: BLE001
        raise classify(e, "creating the database") from None


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
