"""The schema: the tables, views and row policies, and the versioned migrations that make
them (``MIGRATIONS``, ``SCHEMA_VERSION``).

Idempotency: every table is a ReplacingMergeTree (AggregatingMergeTree for ``runs``) whose
ORDER BY holds the record identity ``(run, owner, stream, seq)``, and every query reads with
``FINAL``, so a re-inserted record never shows twice, before or after merges.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import StoreError, UsageError
from .connection import _IDENT_RE, _Connection, redact

SCHEMA_VERSION = 7
# The tables a user-facing name may refer to (the identifier allow-list).
TABLES = ("runs", "lines", "notes", "metadata", "samples", "insights", "progress")
ALL_TABLES = ("ingest", *TABLES, "schema_version")
VIEWS = ("ingest_runs_seen", "ingest_runs", "ingest_lines", "ingest_notes", "ingest_metadata",
         "ingest_samples", "ingest_progress")
ADMIN_ROLE = "logcapture_admin"

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
# Migration 7 rewrites it with the record's ``label`` (whose object it was, behind a launcher's
# label: records.Metadata), read from the ``ingest`` column migration 5 made for progress bars.
_METADATA_VIEW_LABELLED = _METADATA_VIEW.replace(" AS numbers\nFROM", " AS numbers, label\nFROM")
# The view that routes line and command records (created by migration 1, rewritten by 5).
_LINES_VIEW = """
SELECT assumeNotNull(_run) AS run, assumeNotNull(_owner) AS owner, assumeNotNull(_uid) AS uid,
    assumeNotNull(stream) AS stream, assumeNotNull(seq) AS seq, assumeNotNull(ts) AS ts,
    assumeNotNull(kind) AS kind, text, options, style
FROM ingest WHERE kind IN ('line', 'command')"""
_SAMPLES_VIEW = f"""
SELECT assumeNotNull(_run) AS run, assumeNotNull(_owner) AS owner, assumeNotNull(_uid) AS uid,
    assumeNotNull(stream) AS stream, assumeNotNull(seq) AS seq, assumeNotNull(ts) AS ts,
    node, gpus, job, {_numbers("job")} AS job_metrics
FROM ingest WHERE kind = 'sample'"""

# Everything a spool line may hold, plus the trusted identity spliced in by
# Store.insert_ndjson. Engine Null: nothing is kept here, the views route rows. (As migration 1
# made it; migration 5 makes it anew with the columns of later record kinds.)
_INGEST = """CREATE TABLE IF NOT EXISTS ingest (
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
) ENGINE = Null"""

MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        _INGEST,
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
    # 5: progress bars as data (records.Progress, docs/rendering.md): the ``ingest`` columns
    # of a progress record, the kind accepted by its constraint, and a table of points fed
    # by a view as the other records' are. A point is a few numbers (at most one a second
    # per bar), so the table keeps them as columns.
    (5, [
        # An engine Null table takes no ALTER of its constraints: it is made anew (it keeps
        # no rows; the views name it, and go on feeding from the new one).
        "DROP TABLE IF EXISTS ingest",
        _INGEST.replace("ts Nullable(DateTime64(9, 'UTC'))", f"ts {_TS_INPUT}")
        .replace("    counts String,\n",
                 "    counts String,\n    bar UInt32, label String, n Float64, "
                 "total Nullable(Float64), unit String,\n    rate Nullable(Float64), "
                 "elapsed Nullable(Float64), done UInt8,\n")
        .replace("'sample',\n        'end')", "'sample',\n        'end', 'progress')"),
        f"""CREATE TABLE IF NOT EXISTS progress ({_ID_COLUMNS}
    bar UInt32,
    label String CODEC(ZSTD(1)),
    n Float64,
    total Nullable(Float64),
    unit LowCardinality(String),
    rate Nullable(Float64),
    elapsed Nullable(Float64),
    done UInt8
) {_RECORD_TABLE}""",
        """CREATE MATERIALIZED VIEW IF NOT EXISTS ingest_progress TO progress AS
SELECT assumeNotNull(_run) AS run, assumeNotNull(_owner) AS owner, assumeNotNull(_uid) AS uid,
    assumeNotNull(stream) AS stream, assumeNotNull(seq) AS seq, assumeNotNull(ts) AS ts,
    bar, label, n, total, unit, rate, elapsed, done
FROM ingest WHERE kind = 'progress'""",
    ]),
    # 6: a line's style (logcapture.sgr: its colour spans as JSON text, '' when plain, so a
    # plain line costs a few bits of the column's compressed size). Rows stored before read
    # as plain. The ingest column first, then the table's, then the view that fills it.
    (6, [
        "ALTER TABLE ingest ADD COLUMN IF NOT EXISTS style String",
        "ALTER TABLE lines ADD COLUMN IF NOT EXISTS style String CODEC(ZSTD(8))",
        "ALTER TABLE ingest_lines MODIFY QUERY " + _LINES_VIEW,
    ]),
    # 7: whose a metadata row is when a launcher's label stood before its object (records.
    # Metadata ``label``: ``rank 1``; '' for an object printed alone, and for rows stored
    # before). Few distinct values: LowCardinality.
    (7, [
        "ALTER TABLE metadata ADD COLUMN IF NOT EXISTS label LowCardinality(String)",
        "ALTER TABLE ingest_metadata MODIFY QUERY " + _METADATA_VIEW_LABELLED,
    ]),
]

_SCHEMA_VERSION_DDL = """CREATE TABLE IF NOT EXISTS schema_version (
    version UInt32, applied DateTime DEFAULT now()
) ENGINE = ReplacingMergeTree ORDER BY version"""


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


def check_sql_syntax(store: _Connection, statements: Iterable[str]) -> list[str]:
    """Parse each statement (constants of this module, never input) with the store's own
    parser without running it (``EXPLAIN AST``; the lightest chDB build has no
    ``formatQuery``); returns them. Used to check DDL chDB cannot execute (row policies)."""
    out = []
    for sql in statements:
        store._query("EXPLAIN AST " + sql, what="checking SQL")
        out.append(sql)
    return out


class _Schema(_Connection):
    """Creating, migrating and checking the schema of ``Store``."""

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
