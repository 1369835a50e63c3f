"""The store against the real embedded engine (chDB through clickhouse-connect): schema,
round trips, idempotent re-inserts before and after merges, trusted identity, bad lines,
error classes, TTL, row policies, export, the one-process lock. One store per module."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logcapture import store as S
from logcapture.errors import (
    NotFound,
    StoreAuthError,
    StoreDataError,
    StoreError,
    StoreUnavailable,
    UsageError,
)
from logcapture.records import Command, End, Line, Metadata, Note, Sample, Start

T0 = 1_790_000_000.123456


def sample_records(run: str, n: int = 5) -> list:
    recs = [Start(run=run, stream="run", seq=0, ts=T0, command=["python", "train.py"],
                  cwd="/home/alice", user="alice", uid=1000, host="n1", pid=42,
                  slurm={"cluster": "c1", "job_id": "77"}, inventory={"cpus": 4},
                  config={"mode": "enabled"})]
    recs += [Line(run=run, stream="stdout", seq=i, ts=T0 + i * 0.001 + 1e-7,
                  text=f"step {i} ✓ ünïcode \t \"quoted\" \\ back") for i in range(n)]
    recs += [Note(run=run, stream="stdout", seq=n, ts=T0 + 1, note="repeat", count=3,
                  text="3 repeated lines dropped"),
             Metadata(run=run, stream="stdout", seq=n + 1, ts=T0 + 2,
                      fields={"epoch": 1, "loss": 0.25, "name": "x", "ok": True,
                              "nested.a": [1, 2]}),
             Command(run=run, stream="stderr", seq=0, ts=T0 + 3,
                     text='/LOGCOMMAND {"mode": "metadata"}', options={"mode": "metadata"}),
             Line(run=run, stream="stderr", seq=1, ts=T0 + 3.5, text=""),
             Note(run=run, stream="run", seq=1, ts=T0 + 3.6, note="warning", text="w"),
             Sample(run=run, stream="sample:n1", seq=0, ts=T0 + 4, node="n1",
                    gpus=[{"index": 0, "uuid": "GPU-1", "utilization_gpu_percent": 50}],
                    job={"cpu_percent": 12.5, "memory_rss_bytes": 1 << 30}),
             End(run=run, stream="run", seq=2, ts=T0 + 5, exit_status=0, state="COMPLETED",
                 duration=5.0, counts={"stdout": {"lines": n}})]
    return recs


def ident(run: str, user: str = "alice", uid: int = 1000) -> S.Identity:
    return S.Identity(run=run, user=user, uid=uid, cluster="c1", job_id="77")


def key(d: dict) -> tuple:
    return (d["stream"], d["seq"], d["kind"])


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("store") / "store"
    with S.open_store(f"chdb://{path}") as s:
        yield s


def test_schema_is_versioned_and_idempotent(db: S.Store) -> None:
    assert db.schema_version() == S.SCHEMA_VERSION
    assert db.init_schema() == S.SCHEMA_VERSION
    assert db.init_schema() == S.SCHEMA_VERSION
    rows = db.client.query("SELECT name, engine FROM system.tables WHERE database = "
                           "currentDatabase()").result_rows
    engines = dict(rows)
    assert engines["ingest"] == "Null"
    assert engines["lines"] == "ReplacingMergeTree"
    assert engines["runs"] == "AggregatingMergeTree"
    assert int(db.client.command("SELECT count() FROM schema_version")) == len(S.MIGRATIONS)


def _index_granularity(store: S.Store) -> tuple[str, int]:
    return store.client.query(
        "SELECT type_full, granularity FROM system.data_skipping_indices WHERE database = "
        "currentDatabase() AND table = 'lines' AND name = 'text_tokens'").result_rows[0]


def _granules_read(store: S.Store, word: str) -> tuple[int, int]:
    """(granules left after the text_tokens index, granules before it) for a hasToken search."""
    plan = "\n".join(r[0] for r in store.client.query(
        "EXPLAIN indexes = 1 SELECT count() FROM lines WHERE hasToken(text, {w:String})",
        parameters={"w": word}).result_rows)
    assert "text_tokens" in plan, plan
    after = plan[plan.index("text_tokens"):]
    left, total = after.split("Granules: ", 1)[1].split()[0].split("/")
    return int(left), int(total)


def in_own_process(check: str, store: Path) -> None:
    """Run ``test_store.<check>(store)`` in a process of its own (chDB opens one store
    directory per process) and fail with its traceback."""
    p = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import test_store; "
         f"test_store.{check}(sys.argv[2])", str(Path(__file__).parent), str(store)],
        capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


def test_migration_2_rebuilds_the_token_index_over_8_granules(tmp_path: Path) -> None:
    """A store made by schema version 1 (a filter per granule) keeps its lines, gets the
    index of version 2 (one filter per 8 granules), and a word found in one block of 8
    granules only leaves the other blocks unread: the index is built for the old parts.
    In a process of its own: chDB opens one store directory per process."""
    in_own_process("check_migration_2", tmp_path / "store")


def migrate_to(st: S.Store, version: int) -> None:
    """Make ``st`` (opened with ``create=False``) the store an older release made: the
    migrations up to ``version`` and its ``schema_version`` rows, as ``init_schema`` does."""
    st.client.command(S.schema._SCHEMA_VERSION_DDL)
    for v, statements in S.MIGRATIONS:
        if v <= version:
            for sql in statements:
                st.client.command(sql)
            st.client.command(f"INSERT INTO schema_version (version) VALUES ({v})")


def check_migration_2(path: str) -> None:
    with S.open_store(f"chdb://{path}", create=False) as st:
        migrate_to(st, 1)
        assert st.schema_version() == 1
        assert _index_granularity(st) == ("tokenbf_v1(32768, 3, 0)", 1)
        # 4 blocks of 8 granules (8192 rows each); 'Traceback' only in the third block
        st.client.command(
            "INSERT INTO lines (run, owner, uid, stream, seq, ts, kind, text, options) "
            "SELECT 'r', 'alice', 1000, 'stdout', number, "
            "toDateTime64('2026-11-22 00:00:00', 9, 'UTC') + number / 1000, 'line', "
            "if(number = 150000, 'Traceback (most recent call last):', "
            "concat('step ', toString(number), ' loss ', toString(number % 97))), '' "
            "FROM numbers(262144)")
        st.client.command("OPTIMIZE TABLE lines FINAL")
        assert st.init_schema() == S.SCHEMA_VERSION
        assert _index_granularity(st) == ("tokenbf_v1(32768, 3, 0)", 8)
        deadline = time.monotonic() + 60
        while int(st.client.command("SELECT count() FROM system.mutations WHERE database = "
                                    "currentDatabase() AND NOT is_done")):
            assert time.monotonic() < deadline, "MATERIALIZE INDEX did not finish"
            time.sleep(0.1)
        assert int(st.client.command("SELECT count() FROM lines")) == 262144
        assert int(st.client.command(
            "SELECT count() FROM lines WHERE hasToken(text, 'Traceback')")) == 1
        left, total = _granules_read(st, "Traceback")
        assert total == 32 and left == 8, (left, total)
        assert _granules_read(st, "absentword")[0] == 0
        assert st.init_schema() == S.SCHEMA_VERSION  # idempotent
        assert _index_granularity(st) == ("tokenbf_v1(32768, 3, 0)", 8)


def test_migration_4_reads_ts_as_a_decimal_and_rewrites_the_number_views(tmp_path: Path
                                                                          ) -> None:
    """A store at schema version 2 whose views were written by the full engine (keys through
    JSONExtractKeysAndValuesRaw, which the lightest engine build lacks) and whose ``ingest``
    reads ts straight into DateTime64: after migration 4 the records of every kind go in with
    fractional timestamps kept to the nanosecond, and the number maps are filled."""
    in_own_process("check_migration_4", tmp_path / "store")


def check_migration_4(path: str) -> None:
    with S.open_store(f"chdb://{path}", create=False) as st:
        migrate_to(st, 2)
        assert "DateTime64(9" in st.client.command(
            "SELECT type FROM system.columns WHERE database = currentDatabase() AND "
            "table = 'ingest' AND name = 'ts'")
    # the view definitions as the full engine wrote them (the store is closed: plain files)
    views = [f for f in Path(path).rglob("ingest_*.sql") if f.stem in ("ingest_metadata",
                                                                    "ingest_samples")]
    assert len(views) == 2
    for f in views:
        text = f.read_text()
        for col in ("fields", "job"):
            text = text.replace(S.json_keys(col), f"JSONExtractKeys({col})")
        assert "JSONExtractKeys(" in text
        f.write_text(text)
    with S.open_store(f"chdb://{path}") as st:  # migrates to the current version
        assert st.schema_version() == S.SCHEMA_VERSION
        assert "Decimal(38, 9)" in st.client.command(
            "SELECT type FROM system.columns WHERE database = currentDatabase() AND "
            "table = 'ingest' AND name = 'ts'")
        st.insert_records(sample_records("m3"), ident("m3"))
        numbers = st.client.query("SELECT numbers FROM metadata FINAL WHERE run = 'm3'"
                                  ).result_rows[0][0]
        assert numbers and all(isinstance(v, float) for v in numbers.values()), numbers
        assert st.client.query("SELECT job_metrics FROM samples FINAL WHERE run = 'm3'"
                               ).result_rows[0][0]
        ns = st.client.command("SELECT toUnixTimestamp64Nano(start_ts) FROM runs FINAL "
                               "WHERE run = 'm3'")
        assert int(ns) == 1_790_000_000_123_456_000
        assert [r["ts"] for r in st.records("m3")] == [r.ts for r in sample_records("m3")]


def test_documented_columns_exist(db: S.Store) -> None:
    """docs/storage.md names these columns; Grafana panels depend on them."""
    want = {
        "lines": ["run", "owner", "uid", "stream", "seq", "ts", "kind", "text", "options"],
        "notes": ["run", "owner", "uid", "stream", "seq", "ts", "note", "count", "text"],
        "metadata": ["run", "owner", "uid", "stream", "seq", "ts", "fields", "numbers"],
        "samples": ["run", "owner", "uid", "stream", "seq", "ts", "node", "gpus", "job",
                    "job_metrics"],
        "runs": ["run", "owner", "uid", "cluster", "job_id", "start_ts", "end_ts", "last_ts",
                 "host", "command", "state", "exit_status", "signal", "duration"],
    }
    doc = (Path(__file__).parent.parent / "docs" / "storage.md").read_text()
    for table, cols in want.items():
        got = [r[0] for r in db.client.query(
            "SELECT name FROM system.columns WHERE database = currentDatabase() AND "
            "table = {t:String} ORDER BY position", parameters={"t": table}).result_rows]
        assert set(cols) <= set(got), table
        assert f"`{table}`" in doc
    sorting = db.client.command("SELECT sorting_key FROM system.tables WHERE database = "
                                "currentDatabase() AND name = 'lines'")
    assert sorting == "run, ts, stream, seq, owner"


def test_round_trip_every_kind(db: S.Store) -> None:
    recs = sample_records("rt1")
    res = db.insert_records(recs, ident("rt1"))
    assert res.rows == len(recs) and not res.bad and not res.slow_path
    got = db.records("rt1")
    assert sorted(got, key=key) == sorted((r.to_dict() for r in recs), key=key)
    assert got[0]["kind"] == "start" and got[-1]["kind"] == "end"
    # ts reads back as the very same float (DateTime64(9) from the JSON decimal text)
    assert {d["ts"] for d in got} == {r.ts for r in recs}
    info = db.run_info("rt1")
    assert info["state"] == "COMPLETED" and info["owner"] == "alice" and info["uid"] == 1000
    assert info["cluster"] == "c1" and info["job_id"] == "77"
    assert info["counts"] == {"lines": 7, "notes": 2, "metadata": 1, "samples": 1}
    nums = db.client.query("SELECT numbers FROM metadata FINAL WHERE run = 'rt1'").result_rows
    assert nums == [({"epoch": 1.0, "loss": 0.25},)]
    assert db.samples("rt1")[0]["job"]["cpu_percent"] == 12.5
    assert [d["fields"]["epoch"] for d in db.metadata("rt1")] == [1]


def test_lines_limit_and_stream(db: S.Store) -> None:
    recs = [Line(run="lim", stream="stdout" if i % 2 else "stderr", seq=i // 2, ts=T0 + i,
                 text=str(i)) for i in range(50)]
    db.insert_records(recs, ident("lim"))
    assert [d["text"] for d in db.lines("lim", limit=3)] == ["47", "48", "49"]
    assert [d["text"] for d in db.lines("lim", stream="stdout", limit=2)] == ["47", "49"]
    assert len(db.lines("lim")) == 50


def test_tail_equals_the_end_of_the_whole_with_and_without_notes(db: S.Store) -> None:
    """``lines(run, limit=N)`` is the last N of ``lines(run)``: for a run of lines and
    commands only (one query, built from columns) and for one with notes and metadata."""
    recs = [Line(run="tl", stream="stdout" if i % 3 else "stderr", seq=i, ts=T0 + i * 1e-3,
                 text=f"l{i}") for i in range(40)]
    recs.append(Command(run="tl", stream="stdout", seq=40, ts=T0 + 0.5, text="/LOGCOMMAND {}",
                        options={"mode": "metadata"}))
    db.insert_records(recs, ident("tl"))
    whole = db.lines("tl")
    for n in (1, 5, 41, 100):
        assert db.lines("tl", limit=n) == whole[-n:]
    assert db.lines("tl", stream="stderr", limit=3) == db.lines("tl", stream="stderr")[-3:]
    db.insert_records(sample_records("tl2", n=30), ident("tl2"))
    whole = db.lines("tl2")
    assert {d["kind"] for d in whole} == {"line", "note", "metadata", "command"}
    for n in (2, 10, 100):
        assert db.lines("tl2", limit=n) == whole[-n:]
    assert db.lines("nothing-here", limit=5) == []


def test_tail_with_unmerged_duplicates(db: S.Store) -> None:
    """The tail read (one query over three tables) shows each record once while copies are
    still apart on disk (the newest 10 and the note three times)."""
    run = "tail"
    recs = [Line(run=run, stream="stdout", seq=i, ts=T0 + i, text=str(i)) for i in range(30)]
    recs.append(Note(run=run, stream="stdout", seq=30, ts=T0 + 30, note="blank", count=1,
                     text="1 blank line dropped"))
    db.client.command("SYSTEM STOP MERGES")
    try:
        for part in (recs, recs[20:], recs[20:]):  # the newest 10 and the note three times
            db.insert_records(part, ident(run))
        assert int(db.client.command("SELECT count() FROM lines WHERE run = {r:String}",
                                     parameters={"r": run})) == 50
        texts = [d["text"] for d in db.lines(run, limit=15)]
        assert texts == [str(i) for i in range(16, 30)] + ["1 blank line dropped"]
        assert [d["text"] for d in db.lines(run, limit=100)][:-1] == [str(i) for i in range(30)]
        assert [d["seq"] for d in db.lines(run, stream="stdout", limit=3)] == [28, 29, 30]
    finally:
        db.client.command("SYSTEM START MERGES")


def test_hot_path_refuses_forged_keys_and_incomplete_lines(db: S.Store) -> None:
    """Line records that go straight into ``lines`` (their last key is kind): a record
    naming an owner or any other unknown key, or lacking seq, is reported, never stored."""
    good = Line(run="hot", stream="stdout", seq=0, ts=T0, text="ok").to_json().encode()
    forged = (b'{"run":"hot","stream":"stdout","seq":1,"ts":1.5,"owner":"root","uid":0,'
              b'"text":"x","kind":"line"}')
    no_seq = b'{"run":"hot","stream":"stdout","ts":1.5,"text":"y","kind":"line"}'
    assert S.split_by_kind(good + b"\n" + forged + b"\n")[1] == b""  # both on the hot path
    res = db.insert_ndjson(b"\n".join([good, forged, no_seq]) + b"\n", ident("hot", "mallory"))
    assert res.slow_path and res.rows == 1 and [n for n, _ in res.bad] == [2, 3]
    rows = db.client.query("SELECT owner, text FROM lines FINAL WHERE run = 'hot'").result_rows
    assert rows == [("mallory", "ok")]
    # a lines-only batch lists the run at once, as the views do for the other records
    db.insert_ndjson(good + b"\n", ident("hot-only", "mallory"))
    assert db.run_info("hot-only")["owner"] == "mallory"


def test_reinsert_never_duplicates_before_or_after_merges(db: S.Store) -> None:
    recs = sample_records("dup", n=200)
    db.client.command("SYSTEM STOP MERGES lines")  # the copies must stay apart for now
    try:
        for _ in range(3):
            db.insert_records(recs, ident("dup"))
        raw = int(db.client.command("SELECT count() FROM lines WHERE run = 'dup'"))
    finally:
        db.client.command("SYSTEM START MERGES lines")
    assert raw == 3 * 202  # three copies on disk before any merge ...
    assert len(db.lines("dup")) == 200 + 2 + 2 + 1  # ... but each record once in queries
    assert len(db.records("dup")) == len(recs)
    assert len(db.runs()) == len({d["run"] for d in db.runs()})
    for table in S.TABLES:
        db.client.command("OPTIMIZE TABLE {t:Identifier} FINAL", parameters={"t": table})
    assert int(db.client.command("SELECT count() FROM lines WHERE run = 'dup'")) == 202
    assert len(db.records("dup")) == len(recs)
    assert sorted(db.records("dup"), key=key) == sorted((r.to_dict() for r in recs), key=key)


def test_async_inserts_on_the_server_path_keep_every_record_once(db: S.Store) -> None:
    """A server's write path (every record through ``ingest``) with the asynchronous insert
    settings: the engine takes them, the rows are there when the insert returns
    (``wait_for_async_insert``), and a batch sent again collapses. The embedded engine has no
    server queue (it inserts at once): a server's batching cannot be shown here."""
    assert not db.async_insert  # the embedded store inserts synchronously by default
    assert S.ASYNC_INSERT_SETTINGS["async_insert"] == 1
    assert S.ASYNC_INSERT_SETTINGS["wait_for_async_insert"] == 1
    recs = sample_records("async1", n=50)
    db.embedded, db.async_insert = False, True
    try:
        for _ in range(2):
            db.insert_records(recs, ident("async1"))
            assert len(db.lines("async1")) == 50 + 2 + 2 + 1  # visible on return, once
        # the slow path (a refused batch, checked line by line) inserts synchronously
        res = db.insert_ndjson(b'{"kind":"line","run":"async1"}\n' + recs[1].to_json().encode()
                               + b"\n", ident("async1"))
        assert res.slow_path and res.rows == 1 and len(res.bad) == 1
    finally:
        db.embedded, db.async_insert = True, False
    assert len(db.records("async1")) == len(recs)
    assert sorted(db.records("async1"), key=key) == sorted((r.to_dict() for r in recs),
                                                           key=key)


def test_identity_comes_from_the_caller_not_the_records(db: S.Store) -> None:
    forged = [Line(run="victim", stream="stdout", seq=0, ts=T0, text="mine")]
    db.insert_records(forged, ident("own1", user="mallory", uid=2000))
    assert not db.has_run("victim")
    row = db.client.query("SELECT run, owner, uid FROM lines FINAL WHERE run = 'own1'"
                          ).result_rows
    assert row == [("own1", "mallory", 2000)]
    # a line carrying the identity keys itself is refused and reported, never stored
    bad = (b'{"run":"own1","stream":"stdout","seq":1,"ts":1.5,"text":"x","kind":"line",'
           b'"_owner":"root","_uid":0}\n')
    res = db.insert_ndjson(bad, ident("own1", user="mallory", uid=2000))
    assert res.rows == 0 and res.bad and "unknown field" in res.bad[0][1]
    assert db.client.query("SELECT DISTINCT owner FROM lines WHERE run = 'own1'"
                           ).result_rows == [("mallory",)]


def test_same_run_id_two_owners_stay_apart(db: S.Store) -> None:
    db.insert_records([Line(run="r", stream="stdout", seq=0, ts=T0, text="alice's")],
                      ident("shared", "alice", 1000))
    db.insert_records([Line(run="r", stream="stdout", seq=0, ts=T0, text="bob's")],
                      ident("shared", "bob", 1001))
    got = db.client.query("SELECT owner, text FROM lines FINAL WHERE run = 'shared' "
                          "ORDER BY owner").result_rows
    assert got == [("alice", "alice's"), ("bob", "bob's")]


def test_every_read_keeps_to_its_owner(db: S.Store) -> None:
    """Two users chose one run id: each read of one owner sees that owner's rows only, of
    None everyone's; the condition is spelled once (queries.owner_cond)."""
    from logcapture.search import Request
    from logcapture.store import queries

    run = "owned-twice"
    for user, uid in (("alice", 1000), ("bob", 1001)):
        who = ident(run, user, uid)
        db.insert_records([Start(run=run, stream="run", seq=0, ts=T0),
                           Line(run=run, stream="stdout", seq=0, ts=T0 + 1,
                                text=f"okapi of {user}")], who)
        db.insert_insights(who, [{"kind": f"{user}-kind", "category": "failure",
                                  "message": "m"}], T0)
    for owner in ("alice", "bob"):
        assert [(d["owner"], d["insights"]) for d in db.runs(owner) if d["run"] == run] == [
            (owner, [f"{owner}-kind"])]
        assert db.resolve_run(run, owner) == run and db.has_run(run, owner)
        assert [d["text"] for d in db.lines(run, owner=owner)] == [f"okapi of {owner}"]
        assert [i["kind"] for i in db.insights(run, owner)] == [f"{owner}-kind"]
        found = db.search(Request("okapi", jobs=(run,)), owner)
        assert [(h.owner, h.line["text"]) for h in found.hits] == [(owner, f"okapi of {owner}")]
        found = db.search(Request("okapi"), owner)
        assert [(h.owner, h.line["text"]) for h in found.hits] == [(owner, f"okapi of {owner}")]
    assert sorted(d["owner"] for d in db.runs() if d["run"] == run) == ["alice", "bob"]
    assert sorted(i["kind"] for i in db.insights(run)) == ["alice-kind", "bob-kind"]
    assert len(db.search(Request("okapi")).hits) == 2
    assert not db.has_run(run, "carol") and not [d for d in db.runs("carol") if d["run"] == run]
    with pytest.raises(NotFound):
        db.resolve_run(run, "carol")
    assert Path(queries.__file__).read_text().count("owner = {owner:String}") == 1


def test_bad_lines_take_the_slow_path_and_are_reported(db: S.Store) -> None:
    good = [Line(run="bad", stream="stdout", seq=i, ts=T0, text=str(i)).to_json().encode()
            for i in range(3)]
    data = b"\n".join([good[0], b"garbage", good[1], b'{"kind":"bogus","run":"bad"}',
                       b'{"kind":"line","run":"bad","stream":"stdout","ts":1}', b"",
                       b"[1,2]", good[2]]) + b"\n"
    res = db.insert_ndjson(data, ident("bad"))
    assert res.slow_path and res.rows == 3
    assert [n for n, _ in res.bad] == [2, 4, 5, 7]
    assert [d["text"] for d in db.lines("bad")] == ["0", "1", "2"]


def test_data_error_when_valid_records_are_refused(db: S.Store) -> None:
    # from_dict accepts a negative seq; the store's UInt64 refuses it (code 72)
    data = Line(run="de", stream="stdout", seq=-1, ts=T0, text="x").to_json().encode() + b"\n"
    with pytest.raises(StoreDataError) as e:
        db.insert_ndjson(data, ident("de"))
    assert "refused the data" in e.value.message and "Code: 72" in e.value.message
    with pytest.raises(StoreDataError):
        db.insert_many([(data, ident("de"))])


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(st.characters(blacklist_categories=["Cs"]), max_size=40),
                      min_size=1, max_size=8))
def test_text_round_trip_property(db: S.Store, texts: list[str]) -> None:
    run = f"prop{abs(hash(tuple(texts))) % 10**12}"
    recs = [Line(run=run, stream="stdout", seq=i, ts=T0 + i / 7, text=t)
            for i, t in enumerate(texts)]
    db.insert_records(recs, ident(run))
    assert [(d["text"], d["ts"]) for d in db.lines(run)] == [(r.text, r.ts) for r in recs]


def test_ttl_set_and_removed(db: S.Store) -> None:
    db.init_schema(ttl_days=3650)
    ddl = db.client.command("SELECT create_table_query FROM system.tables WHERE database = "
                            "currentDatabase() AND name = 'lines'")
    assert "TTL toDateTime(ts) + toIntervalDay(" in ddl and "3650" in ddl
    db.init_schema(ttl_days=0)
    assert " TTL " not in db.client.command(
        "SELECT create_table_query FROM system.tables WHERE database = currentDatabase() "
        "AND name = 'lines'")
    with pytest.raises(UsageError):
        db.set_ttl(-1)


def test_row_policies_render_parse_and_chdb_refuses(db: S.Store) -> None:
    stmts = S.row_policy_statements()
    parsed = S.check_sql_syntax(db, stmts)
    assert len(parsed) == 1 + 2 * len(S.TABLES)
    assert any("USING owner = currentUser()" in p and "ON lines" in p for p in parsed)
    with pytest.raises(StoreError, match="SYNTAX_ERROR|Syntax error"):  # the parser ran
        S.check_sql_syntax(db, [stmts[1].replace(" ON ", " ONN ")])
    # chDB has no access control: the engine answers ACCESS_DENIED (code 497) -> auth class
    with pytest.raises(StoreAuthError):
        db._command(stmts[1])
    with pytest.raises(StoreError, match="row policies need a ClickHouse server"):
        db.init_schema(row_policies=True)


def read_parquet(db: S.Store, path: Path) -> tuple[list[tuple[str, str]], list[tuple]]:
    """(column, type) pairs and rows of a Parquet file, read by the engine."""
    p = {"path": str(path)}
    described = db.client.query("DESCRIBE file({path:String}, 'Parquet')", parameters=p)
    rows = db.client.query("SELECT * FROM file({path:String}, 'Parquet')", parameters=p)
    return [(r[0], r[1]) for r in described.result_rows], list(rows.result_rows)


@pytest.mark.parametrize("fmt", ["csv", "ndjson", "parquet"])
def test_export_metadata(db: S.Store, fmt: str, tmp_path: Path) -> None:
    run = f"exp-{fmt}"
    recs = [Metadata(run=run, stream="stdout", seq=i, ts=T0 + i,
                     fields={"epoch": i, "loss": 1 / (i + 1), "tag": "a", "on": i % 2 == 0,
                             "path": "/x/y"} | ({"late": [i]} if i == 3 else {}))
            for i in range(4)]
    db.insert_records(recs, ident(run))
    out = io.BytesIO()
    assert db.export(run, "metadata", fmt, out) == 4
    data = out.getvalue()
    if fmt == "ndjson":
        rows = [json.loads(x) for x in data.splitlines()]
        assert [r["epoch"] for r in rows] == [0, 1, 2, 3] and rows[0]["tag"] == "a"
        assert [r["ts"] for r in rows] == [T0 + i for i in range(4)]
        assert rows[0]["on"] is True and rows[0]["path"] == "/x/y"
        assert rows[0]["late"] is None and rows[3]["late"] == "[3]"
    elif fmt == "csv":
        rows = list(csv.reader(io.StringIO(data.decode())))
        assert rows[0] == ["ts", "seq", "epoch", "loss", "tag", "on", "path", "late"]
        assert len(rows) == 5 and rows[2][2:5] == ["1", "0.5", "a"] and rows[1][7] == ""
    else:
        (tmp_path / "m.parquet").write_bytes(data)
        columns, rows = read_parquet(db, tmp_path / "m.parquet")
        assert [c for c, _ in columns] == ["ts", "seq", "epoch", "loss", "tag", "on", "path",
                                           "late"]
        types = dict(columns)
        assert "Int64" in types["epoch"] and "Float64" in types["loss"]
        assert "Float64" in types["ts"] and "String" in types["tag"]
        assert [r[2] for r in rows] == [0, 1, 2, 3] and [r[3] for r in rows][:2] == [1, 0.5]
        assert [r[0] for r in rows] == [T0 + i for i in range(4)]
        assert rows[0][4] == "a" and rows[3][7] == "[3]" and rows[0][7] is None
    with pytest.raises(NotFound):
        db.export("nope", "metadata", fmt, io.BytesIO())


def test_export_metadata_keys_named_like_its_own_columns_or_empty(db: S.Store) -> None:
    """A line's own "ts" and "seq" keys do not overwrite when and where it was printed, and an
    empty key (valid JSON) gets a column: each as metadata.KEY."""
    run = "exp-clash"
    recs = [Metadata(run=run, stream="stdout", seq=7 + i, ts=T0 + i,
                     fields={"step": i, "ts": 5, "seq": 9, "": 1, "metadata.ts": "x"})
            for i in range(2)]
    db.insert_records(recs, ident(run))
    out = io.BytesIO()
    assert db.export(run, "metadata", "csv", out) == 2
    rows = list(csv.reader(io.StringIO(out.getvalue().decode())))
    header = rows[0]
    assert header[:2] == ["ts", "seq"]
    assert sorted(header[2:]) == sorted(["step", "metadata.metadata.ts", "metadata.seq",
                                         "metadata.", "metadata.ts"])
    got = [dict(zip(header, r, strict=True)) for r in rows[1:]]
    assert [(float(r["ts"]), r["seq"]) for r in got] == [(T0, "7"), (T0 + 1, "8")]
    assert got[1]["metadata.metadata.ts"] == "5" and got[1]["metadata.seq"] == "9"
    assert got[1]["metadata."] == "1" and got[1]["metadata.ts"] == "x"


def test_write_rows_without_a_store_uses_the_engine_this_process_has(db: S.Store,
                                                                     tmp_path: Path) -> None:
    """chDB runs one engine per process: with a store open here (``db``), rows written
    without a store go through a new handle on it, not an in-memory engine it would refuse."""
    rows = [{"ts": T0, "k": 1, "s": "a", "o": {"x": [1]}}, {"ts": T0 + 1, "k": 2, "b": True}]
    out = io.BytesIO()
    S.write_rows(rows, "parquet", out)
    (tmp_path / "w.parquet").write_bytes(out.getvalue())
    columns, got = read_parquet(db, tmp_path / "w.parquet")
    assert columns == [("ts", "Nullable(Float64)"), ("k", "Nullable(Int64)"),
                       ("s", "Nullable(String)"), ("o", "Nullable(String)"),
                       ("b", "Nullable(Bool)")]
    assert got == [(T0, 1, "a", '{"x":[1]}', None), (T0 + 1, 2, None, None, True)]


def test_export_lines_and_samples(db: S.Store) -> None:
    db.insert_records(sample_records("exl"), ident("exl"))
    out = io.BytesIO()
    assert db.export("exl", "lines", "ndjson", out) == 10  # 7 lines/commands, 2 notes, 1 JSON
    assert json.loads(out.getvalue().splitlines()[0])["text"].startswith("step 0")
    out = io.BytesIO()
    assert db.export("exl", "samples", "csv", out) == 1
    header, row = list(csv.reader(io.StringIO(out.getvalue().decode())))
    assert header[:2] == ["ts", "node"] and row[1] == "n1"
    got = dict(zip(header, row, strict=True))
    assert got["job.cpu_percent"] == "12.5" and got["gpu0.utilization_gpu_percent"] == "50"
    assert got["gpu0.uuid"] == "GPU-1" and got["job.memory_rss_bytes"] == str(1 << 30)
    with pytest.raises(UsageError):
        db.export("exl", "everything", "csv", io.BytesIO())


def test_classify_error_codes() -> None:
    class E(Exception):
        def __init__(self, msg: str, code: int | None = None):
            super().__init__(msg)
            self.code = code

    assert isinstance(S.classify(E("x", 117)), StoreDataError)
    assert isinstance(S.classify(E("x", 53)), StoreDataError)
    for code in (516, 192, 497):
        assert isinstance(S.classify(E("x", code)), StoreAuthError)
    assert isinstance(S.classify(E("HTTP driver received HTTP status 401")), StoreAuthError)
    assert isinstance(S.classify(E("Code: 403. HTTP status 403 Forbidden")), StoreAuthError)
    assert isinstance(S.classify(ConnectionRefusedError("refused")), StoreUnavailable)
    assert isinstance(S.classify(E("x", 60)), StoreError)
    assert not isinstance(S.classify(E("x", 60)), StoreUnavailable)
    # a function this engine build lacks: no retry helps (the caller may try another query)
    assert not isinstance(S.classify(E("Code: 46. DB::Exception: Function with name "
                                       "`multiMatchAny` does not exist")), StoreUnavailable)


def test_a_server_that_cannot_be_reached_is_named_with_the_sockets_error() -> None:
    # Not the HTTP client's retry report (pool, query id, attempt number): what the operating
    # system said, after the store's address.
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreUnavailable) as got:
        S.open_store(f"http://127.0.0.1:{port}", create=False)
    assert str(got.value) == f"connecting to http://127.0.0.1:{port}: Connection refused"


def test_resolve_dsn(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "LOGCAPTURE_CONFIG": str(tmp_path / "missing.yaml")}
    assert S.resolve_dsn(None, env) == f"chdb://{tmp_path}/.local/state/logcapture/store"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    assert S.resolve_dsn(None, env) == f"chdb://{tmp_path}/state/logcapture/store"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("store: http://u:p@h:8123/db\n")
    env["LOGCAPTURE_CONFIG"] = str(cfg)
    assert S.resolve_dsn(None, env) == "http://u:p@h:8123/db"
    env["LOGCAPTURE_STORE"] = "chdb:///x"
    assert S.resolve_dsn(None, env) == "chdb:///x"
    assert S.resolve_dsn("chdb:///y", env) == "chdb:///y"
    assert S.redact("http://u:secret@h:8123/db") == "http://u:***@h:8123/db"
    with pytest.raises(UsageError):
        S.open_store("ftp://x", env=env)


def test_second_process_gets_a_clear_error(db: S.Store) -> None:
    path = S.connection._chdb_path(db.dsn)
    code = ("import sys\nfrom logcapture import store\n"
            "try:\n    store.open_store(sys.argv[1])\n"
            "except store.StoreUnavailable as e:\n    print(e); sys.exit(3)\n")
    p = subprocess.run([sys.executable, "-c", code, db.dsn], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 3, p.stderr
    assert "in use by another process" in p.stdout and f"pid {os.getpid()}" in p.stdout
    assert str(path) in p.stdout


def test_same_process_shares_the_store(db: S.Store) -> None:
    db.insert_records(sample_records("share"), ident("share"))
    with S.open_store(db.dsn) as again:
        assert again.has_run("share")
    assert db.has_run("share")  # closing the second handle left the first working
    t = time.monotonic()
    assert db.runs()
    assert time.monotonic() - t < 60


def test_an_embedded_store_of_another_user_is_one_clear_error() -> None:
    # As root, a child process switched to nobody opens root's 0700 store.
    import pwd
    import shutil
    import subprocess
    import sys
    import tempfile
    if os.getuid() != 0:
        pytest.skip("needs root to switch to another user")
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="lc-store-perm-", dir="/tmp"))
    try:
        base.chmod(0o755)  # nobody can reach the store's folder, not into it
        store = base / "store"
        store.mkdir(mode=0o700)
        (base / "store.lock").write_text("")
        (base / "store.lock").chmod(0o600)
        env = dict(os.environ, HOME="/tmp", XDG_STATE_HOME=str(base / "nobody-state"))
        for args in (["ls", "--spool", "/nonexistent"], ["logs", "1", "--source", "store"]):
            res = subprocess.run(
                [sys.executable, "-m", "logcapture", *args, "--store", f"chdb://{store}"],
                env=env, capture_output=True, text=True, timeout=60, user=nobody.pw_uid,
                group=nobody.pw_gid)
            assert "Traceback" not in res.stderr, res.stderr
            assert "no permission to open the embedded store" in res.stderr, res.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_migration_7_keeps_the_label_of_a_metadata_row(tmp_path: Path) -> None:
    """A store at schema version 6 with a metadata row gets the ``label`` column: the old row
    reads as unlabelled, and a labelled row (``[default1]:{...}``: records.Metadata) keeps
    its label through the view, in ``metadata`` and in ``lines``, and not one without."""
    in_own_process("check_migration_7", tmp_path / "store")


def check_migration_7(path: str) -> None:
    with S.open_store(f"chdb://{path}", create=False) as st:
        migrate_to(st, 6)
        st.insert_records(sample_records("m6"), ident("m6"))
    with S.open_store(f"chdb://{path}") as st:
        assert st.schema_version() == S.SCHEMA_VERSION
        [old] = st.metadata("m6", "alice")
        assert "label" not in old and old["fields"]["epoch"] == 1
        labelled = [Metadata(run="m7", stream="stdout", seq=i, ts=T0 + i,
                             fields={"step": i // 2}, label=f"local rank {i % 2}" if i else "")
                    for i in range(4)]
        assert not st.insert_records(labelled, ident("m7")).bad
        want = [r.to_dict() for r in labelled]
        assert st.metadata("m7", "alice")[::-1] == want
        assert st.lines("m7", owner="alice") == want
        assert st.lines("m7", owner="alice", limit=3) == want[1:]


def test_migration_5_stores_progress_points(tmp_path: Path) -> None:
    """A store at schema version 4 gets the progress table; its ``ingest`` is made anew (an
    engine Null table takes no ALTER of its constraints) and every view still feeds from it:
    progress points, metadata and samples all land, and a forged kind is still refused."""
    in_own_process("check_migration_5", tmp_path / "store")


def check_migration_5(path: str) -> None:
    from logcapture.records import Progress

    with S.open_store(f"chdb://{path}", create=False) as st:
        migrate_to(st, 4)
    with S.open_store(f"chdb://{path}") as st:
        assert st.schema_version() == S.SCHEMA_VERSION
        points = [Progress(run="p5", stream="progress:stderr", seq=i, ts=1_790_000_000.5 + i,
                           bar=0, label="train", n=float(10 * i), total=30.0, unit="it",
                           rate=10.0 if i else None, elapsed=float(i), done=int(i == 3))
                  for i in range(4)]
        st.insert_records([*sample_records("p5"), *points], ident("p5"))
        got = st.progress("p5", "alice")
        assert [(d["seq"], d["n"], d["rate"], d["done"]) for d in got] == [
            (0, 0.0, None, 0), (1, 10.0, 10.0, 0), (2, 20.0, 10.0, 0), (3, 30.0, 10.0, 1)]
        assert got[0]["ts"] == 1_790_000_000.5 and got[0]["total"] == 30.0
        assert st.progress("p5", "bob") == []  # another owner's rows are not read
        assert st.metadata("p5", "alice") and st.samples("p5", "alice")
        bad = points[0].to_dict() | {"kind": "forged"}
        result = st.insert_records([bad], ident("p5"))
        assert result.rows == 0 and result.bad
