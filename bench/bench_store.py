"""Benchmark: the embedded store (chDB through clickhouse-connect).

Three figures, each printed with its ratio against a baseline measured in the same run
and the machine's load average (the cores may be shared):

1. Ingest: spool -> store with one agent (``Agent.flush``: the engine reads the closed gzip
   segments itself through ``file()``, the identity as parameters, cursor saved).
   Baselines: ``raw_insert`` of the same NDJSON into a bare MergeTree table (the engine's own
   JSONEachRow rate: no identity, no index, no ReplacingMergeTree), and
   ``Store.insert_ndjson`` alone (the bytes path, without spool reading). Target: >= 500k
   lines/s.
2. Tail: the last 10k lines of one job (``Store.lines(run, limit=10000)`` and its SQL alone)
   from a ``lines`` table of N rows (default 2M; ``--full``: 50M). Baseline: reading the same
   job's lines from its spool (``iter_run``) and keeping the last 10k. Target: <= 50 ms.
3. Size: bytes the store keeps for a run's lines (compressed, all columns; and with the
   ``text_tokens`` index) vs ``gzip -6`` of the raw text alone, for two logs: the ingested
   run's text (``make_text``: short, near-template lines, ~10 bytes a line gzipped) and a
   training job's log (``make_training_text``: log-module lines, a JSON metrics line every
   10th, tqdm's final bars, DataLoader warnings, NCCL start-up lines, rare tracebacks), shipped
   by a second agent flush outside the timings. Target: <= 1.0x.

Usage: ``python bench/bench_store.py [--full] [--lines N] [--table-rows N]``
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from logcapture import store as S  # noqa: E402
from logcapture.records import End, Line, Start  # noqa: E402
from logcapture.ship import BATCH_BYTES, Agent  # noqa: E402
from logcapture.spool.layout import create_run_dir, segments  # noqa: E402,E501
from logcapture.spool.reading import iter_run, read_lines  # noqa: E402,E501
from logcapture.spool.writer import SpoolWriter  # noqa: E402,E501


def make_text(rng: random.Random, i: int) -> str:
    r = rng.random()
    if r < 0.6:
        return (f"epoch {i // 5000} step {i} loss={rng.random():.4f} "
                f"lr={1e-3 * rng.random():.6f} grad_norm={rng.random() * 3:.3f}")
    if r < 0.8:
        return f"[{time.strftime('%H:%M:%S')}] INFO worker-{i % 8}: processed batch {i}"
    if r < 0.95:
        return f"Validation: accuracy {rng.random():.4f} on {rng.randint(1000, 9999)} samples"
    return "WARNING: " + " ".join(rng.choice(["disk", "slow", "retry", "node", "gpu",
                                               "timeout", "memory"]) for _ in range(8))


def make_training_text(rng: random.Random, i: int) -> str:
    """A line of a training job's log, in the proportions such a job prints them."""
    if i % 10 == 9:
        return (f'{{"step": {i}, "loss": {rng.random():.5f}, "lr": {rng.random() * 1e-3:.3e}, '
                f'"grad_norm": {rng.random() * 3:.4f}, "epoch": {i // 5000}}}')
    if i % 5000 == 0:
        return (f"Epoch {i // 5000}: 100%|██████████| 5000/5000 [{rng.randint(0, 59):02d}:"
                f"{rng.randint(0, 59):02d}<00:00, {rng.random() * 20:.2f}it/s, "
                f"loss={rng.random():.3f}]")
    if i % 25000 == 17:
        return "Traceback (most recent call last):"
    if i < 400 or i % 50000 == 3:
        return (f"NCCL INFO comm 0x{rng.getrandbits(40):x} rank {i % 8} nranks 8 cudaDev "
                f"{i % 8} busId {rng.getrandbits(20):x} - Init COMPLETE")
    r = rng.random()
    if r < 0.02:
        return (f"/opt/conda/lib/python3.11/site-packages/torch/utils/data/dataloader.py:"
                f"{rng.randint(100, 999)}: UserWarning: This DataLoader will create "
                f"{rng.randint(2, 64)} worker processes in total.")
    if r < 0.5:
        return (f"{time.strftime('%Y-%m-%d %H:%M:%S')} | INFO | train | epoch={i // 5000} "
                f"step={i % 5000}/5000 loss={rng.random() * 2:.4f} acc={rng.random():.4f} "
                f"lr={rng.random() * 1e-3:.6f} throughput={1000 + rng.random() * 500:.1f} "
                "samples/s")
    return make_text(rng, i)


def write_spool(root: Path, run: str, n: int, gen=make_text, t0: float | None = None,
                ) -> tuple[Path, list[str]]:
    rng = random.Random(42)
    rd = create_run_dir(root, run)
    w = SpoolWriter(rd, fsync=False, flush_interval=3600, flush_records=50_000)
    t0 = time.time() if t0 is None else t0
    w.write([Start(run=run, stream="run", seq=0, ts=t0, command=["python", "train.py"])])
    texts = []
    batch = []
    for i in range(n):
        text = gen(rng, i)
        texts.append(text)
        batch.append(Line(run=run, stream="stdout", seq=i, ts=t0 + i * 1e-4, text=text))
        if len(batch) == 50_000:
            w.write(batch)
            batch = []
    w.write(batch)
    w.write([End(run=run, stream="run", seq=1, ts=t0 + n * 1e-4, state="COMPLETED")])
    w.close()
    return rd, texts


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true",
                    help="large sizes: 2M lines ingested, a 50M-row table for the tail query")
    ap.add_argument("--lines", type=int, default=None, help="lines to ingest")
    ap.add_argument("--table-rows", type=int, default=None, help="rows in the tail table")
    args = ap.parse_args()
    n = args.lines or (2_000_000 if args.full else 300_000)
    table_rows = args.table_rows or (50_000_000 if args.full else 2_000_000)
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    try:
        run_bench(tmp, n, table_rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_bench(tmp: Path, n: int, table_rows: int) -> None:
    root = tmp / "spool"
    dsn = f"chdb://{tmp / 'store'}"
    print(f"# bench_store: {n:,} lines ingested, tail query on {table_rows:,} rows, "
          f"{os.cpu_count()} CPUs, load average {load()}")
    t = time.perf_counter()
    rd, texts = write_spool(root, "bench-run", n)
    print(f"spool written: {len(segments(rd))} segments in {time.perf_counter() - t:.1f}s")
    spool_bytes = b"".join(b"\n".join(read_lines(s)[0]) + b"\n" for s in segments(rd))

    with S.open_store(dsn) as st:  # create the schema outside the timings
        st.client.command(
            "CREATE TABLE IF NOT EXISTS bare (run String, stream LowCardinality(String), "
            "seq UInt64, ts Decimal(38, 9), kind LowCardinality(String), text String "
            "CODEC(ZSTD(1))) ENGINE = MergeTree ORDER BY (run, stream, seq)")
        # baseline 1: the engine's own JSONEachRow rate into a bare table (ts read as a
        # decimal, as the store's ingest table reads it: engines before 26.7 refuse a
        # fractional JSON number read into DateTime64)
        t = time.perf_counter()
        st.client.raw_insert("bare", None, insert_block=spool_bytes, fmt="JSONEachRow",
                             settings={"input_format_skip_unknown_fields": 1})
        bare = time.perf_counter() - t
        # the store path alone (a different run id, same bytes)
        ident = S.Identity(run="store-only", user="bench", uid=os.getuid())
        chunks = []
        start = 0
        while start < len(spool_bytes):  # the agent's batch size, cut at line ends
            end = spool_bytes.find(b"\n", min(start + BATCH_BYTES, len(spool_bytes)) - 1)
            end = len(spool_bytes) if end < 0 else end + 1
            chunks.append(spool_bytes[start:end])
            start = end
        settle(st)
        t = time.perf_counter()
        for chunk in chunks:
            res = st.insert_ndjson(chunk, ident)
            assert not res.slow_path
        store_only = time.perf_counter() - t
        settle(st)
    # the full path: one agent flush (reads gzip segments, cursor, retention off)
    agent = Agent(root, dsn, batch_bytes=BATCH_BYTES, retention_days=None)
    t = time.perf_counter()
    agent.flush()
    full = time.perf_counter() - t
    rows = n + 2
    assert agent.stats.records == rows, agent.stats

    print("\n## 1. ingest (lines/s; target >= 500,000)")
    print(f"baseline raw_insert into a bare MergeTree: {rows / bare:12,.0f} lines/s")
    print(f"Store.insert_ndjson (file() into lines):   {rows / store_only:12,.0f} lines/s  "
          f"ratio {bare / store_only:.2f}x the baseline rate")
    print(f"one agent, spool -> store (end to end):    {rows / full:12,.0f} lines/s  "
          f"ratio {bare / full:.2f}x the baseline rate")

    # a training job's log, noon UTC 3 days back (its own daily partition: its parts are its
    # alone, and its few minutes of timestamps never cross midnight)
    day = (time.time() // 86400 - 3) * 86400 + 43200
    train_root = tmp / "spool-training"
    _, train_texts = write_spool(train_root, "training-run", n, make_training_text, day)
    Agent(train_root, dsn, batch_bytes=BATCH_BYTES, retention_days=None).flush()

    with S.open_store(dsn) as st:
        # 3. size
        st.client.command("OPTIMIZE TABLE lines FINAL")
        print("\n## 3. size of one run's lines (target: store/gzip <= 1.0)")
        train_day = time.strftime("%Y-%m-%d", time.gmtime(day))
        for what, texts_, runs, where in (
                ("near-template lines (make_text)", texts, 2, "partition != {day:String}"),
                ("a training job's log (make_training_text)", train_texts, 1,
                 "partition = {day:String}")):
            parts = st.client.query(
                "SELECT sum(data_compressed_bytes), sum(secondary_indices_compressed_bytes), "
                "sum(rows) FROM system.parts WHERE active AND database = currentDatabase() "
                "AND table = 'lines' AND " + where, parameters={"day": train_day},
            ).result_rows[0]
            assert parts[2] == runs * n, (what, parts)
            stored, index = parts[0] / runs, parts[1] / runs
            raw_text = ("\n".join(texts_) + "\n").encode()
            gz = len(gzip.compress(raw_text, compresslevel=6))
            print(f"{what}: raw text {len(raw_text) / 1e6:.1f} MB; gzip -6 (baseline) "
                  f"{gz / 1e6:.2f} MB ({gz / n:.1f} bytes a line)")
            print(f"  store, all columns: {stored / 1e6:.2f} MB  ratio store/gzip "
                  f"{stored / gz:.3f}")
            print(f"  store, all columns + text_tokens index: {(stored + index) / 1e6:.2f} MB "
                  f"({index / n:.2f} bytes a line)  ratio store/gzip {(stored + index) / gz:.3f}")
        st.client.command("ALTER TABLE lines DROP PARTITION {day:String}",
                          parameters={"day": train_day})

        # 2. tail of one job in a big table
        t = time.perf_counter()
        fill_table(st, table_rows)
        print(f"\n## 2. last 10k lines of one job among {table_rows:,} rows "
              f"(table filled in {time.perf_counter() - t:.1f}s; target <= 50 ms)")
        total = int(st.client.command("SELECT count() FROM lines"))
        sql_times, key_times, three_times, api_times = [], [], [], []
        cond = "run = {run:String} AND ({stream:String} = '' OR stream = {stream:String})"
        tail_params = {"run": "bench-run", "stream": "", "limit": 10_000}
        for _ in range(7):
            t = time.perf_counter()
            st.client.query(
                "SELECT stream, seq, ts, kind, text FROM lines FINAL WHERE run = {run:String} "
                "ORDER BY ts DESC, stream DESC, seq DESC LIMIT 10000",
                parameters={"run": "bench-run"})
            sql_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            st.client.query(  # Store.lines' query for a run without notes and metadata
                S.queries._tail_lines_sql(cond), parameters=tail_params)
            key_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            st.client.query(  # ... and its second one when the run has some: 3 tables
                S.queries._tail_sql(cond), parameters=tail_params)
            three_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            got = st.lines("bench-run", limit=10_000)
            api_times.append(time.perf_counter() - t)
        assert len(got) == 10_000 and got[-1]["seq"] == n - 1
    t = time.perf_counter()
    tail = [r for r in iter_run(rd) if r.kind == "line"][-10_000:]
    spool_time = time.perf_counter() - t
    assert len(tail) == 10_000
    sql_med, api_med = statistics.median(sql_times), statistics.median(api_times)
    key_med, three_med = statistics.median(key_times), statistics.median(three_times)
    print(f"table rows {total:,}; job {n:,} lines")
    print(f"baseline: the job's spool, last 10k (iter_run): {ms(spool_time)}")
    print(f"SQL, FINAL ORDER BY ts DESC LIMIT 10000: {ms(sql_med)}  "
          f"ratio {spool_time / sql_med:.1f}x faster than baseline")
    print(f"SQL of Store.lines: lines, has notes/metadata: {ms(key_med)}  "
          f"ratio {spool_time / key_med:.1f}x faster than baseline")
    print(f"(with notes or metadata, 2nd query: 3 tables, FINAL: {ms(three_med)}  "
          f"ratio {spool_time / three_med:.1f}x faster than baseline)")
    print(f"Store.lines(run, limit=10000) (that SQL, dicts): {ms(api_med)}  "
          f"ratio {spool_time / api_med:.1f}x faster than baseline")
    print(f"load average at the end: {load()}")


def settle(st: S.Store) -> None:
    """Merge what the previous step inserted, outside the timings, so that no timed step pays
    for the background merges of the one before (the bare baseline runs on an empty store)."""
    t = time.perf_counter()
    for table in ("bare", "lines", "runs"):
        st.client.command("OPTIMIZE TABLE {t:Identifier} FINAL", parameters={"t": table})
    print(f"(merged the previous step's parts in {time.perf_counter() - t:.1f}s)")


def fill_table(st: S.Store, table_rows: int) -> None:
    """Other jobs' lines straight into ``lines`` (generated by the engine), 10k jobs."""
    have = int(st.client.command("SELECT count() FROM lines"))
    need = max(0, table_rows - have)
    step = 5_000_000
    for start in range(0, need, step):
        st.client.command(
            "INSERT INTO lines (run, owner, uid, stream, seq, ts, kind, text, options) "
            "SELECT concat('job-', toString(number % 10000)), 'user' || toString(number % 97),"
            " 1000 + number % 97, if(number % 7 = 0, 'stderr', 'stdout'), "
            "intDiv(number, 10000), toDateTime64(1.79e9 + number / 1000, 9, 'UTC'), 'line', "
            "concat('epoch ', toString(intDiv(number, 100000)), ' step ', toString(number), "
            "' loss=', toString(round(cityHash64(number) % 10000 / 10000, 4))), '' "
            "FROM numbers({start:UInt64}, {count:UInt64})",
            parameters={"start": start, "count": min(step, need - start)})


if __name__ == "__main__":
    main()
