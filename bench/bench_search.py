"""Benchmark: ``logcapture search`` over a store of 50M lines (10k runs, 30 days).

The store is generated once by the engine (``INSERT ... SELECT ... FROM numbers``; a few
minutes) into a cached folder (``--cache``, default ``$XDG_CACHE_HOME/logcapture/
bench_search``) and reused. Its lines are a training cluster's: runs of 5,000 lines by 40
users, one started every ~4 minutes over 30 days, each ~70 minutes long; log-module training
lines, Megatron-style iteration lines, tqdm bars, validation lines, DataLoader and other
Python warnings on stderr, NCCL start-up lines, and the tracebacks that end the failed runs
(CUDA out of memory, an NCCL watchdog timeout, a plain exception). Numbers everywhere, so
each block of lines has ~100k distinct tokens. ``Xid`` (a GPU error) is in 3 runs only.

Four searches, each timed as ``Store.search`` (the CLI's query, owner filter of one user and
of everyone; median of ``--rounds``), each against a baseline run in the same process: the
same lines found by a plain scan, ``text LIKE '%...%'`` (or ``match``) over the whole table,
newest first. Goals: rare word <= 300 ms, a common word's first page (100 lines) <= 1 s, a
phrase <= 1 s.

Also measured (``--index-cost``): what the token index costs, in bytes on disk (from
``system.data_skipping_indices``) and at insert (the same 2M lines inserted into a copy of
``lines`` with and without the index, three rounds each, interleaved).

Usage: ``python bench/bench_search.py [--cache DIR] [--rounds 5] [--index-cost]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from logcapture import store as S  # noqa: E402
from logcapture.search import Request  # noqa: E402

RUNS = 10_000
LINES_PER_RUN = 5_000
T0 = 1_790_000_000  # 2026-09-21: a fixed start, so the cached store is always the same
DAYS = 30
USERS = 40
CACHE_VERSION = "v1"

# One line of one run, from the row number n (run = n / 5000, i = n % 5000), by the engine.
# h: a per-line hash; r: the run; i: the line in the run. Failed runs (r % 7 = 3) end in a
# traceback of their kind (r % 3).
_LINE_SQL = """
WITH intDiv(number, {per:UInt64}) AS r, number % {per:UInt64} AS i,
     cityHash64(number) AS h, (h % 10000) / 10000 AS u,
     intDiv(i, 1000) AS epoch, i - {per:UInt64} + 14 AS tb,
     toDateTime64({t0:Float64} + r * {gap:Float64} + i * 0.85, 9, 'UTC') AS t
SELECT concat('run-', toString(r)), concat('user', toString(r % {users:UInt64})),
    2000 + r % {users:UInt64},
    if(tb >= 0 AND r % 7 = 3 OR (u >= 0.90 AND u < 0.95 AND i >= 20), 'stderr', 'stdout'),
    i, t, 'line',
    multiIf(
    tb >= 0 AND r % 7 = 3, [
        'Traceback (most recent call last):',
        '  File "/home/user/project/train.py", line 412, in <module>',
        '    main(args)',
        '  File "/home/user/project/train.py", line 377, in main',
        '    loss = train_one_epoch(model, loader, optimizer, scaler)',
        '  File "/home/user/project/engine.py", line 88, in train_one_epoch',
        '    scaler.scale(loss).backward()',
        '  File "/opt/conda/lib/python3.11/site-packages/torch/_tensor.py", line 522, in backward',
        '    torch.autograd.backward(',
        concat('  File "/opt/conda/lib/python3.11/site-packages/torch/autograd/__init__.py", ',
               'line 266, in backward'),
        '    Variable._execution_engine.run_backward(',
        multiIf(r % 3 = 0, concat('torch.cuda.OutOfMemoryError: CUDA out of memory. ',
                    'Tried to allocate ', toString(1 + h % 8), '.00 GiB (GPU ', toString(h % 8),
                    '; 79.15 GiB total capacity; ',
                    toString(60 + h % 19), '.20 GiB already allocated)'),
                r % 3 = 1, concat('RuntimeError: NCCL communicator was aborted on rank ',
                    toString(h % 8), '. Original reason for failure was: [Rank ',
                    toString(h % 8), '] Watchdog caught ',
                    'collective operation timeout: WorkNCCL(SeqNum=', toString(h % 90000),
                    ', OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600', toString(100 + h % 900),
                    ' milliseconds before timing out.'),
                concat('ValueError: Expected input batch_size (', toString(h % 512),
                       ') to match target batch_size (', toString(h % 256), ').')),
        'srun: error: node tasks failed',
        concat('slurmstepd: error: *** JOB ', toString(100000 + r), ' ON gpu', toString(r % 64),
               ' CANCELLED ***')][tb + 1],
    i < 8, concat('NCCL INFO comm 0x', hex(h % 1099511627776), ' rank ', toString(i),
                  ' nranks 8 cudaDev ',
                  toString(i), ' busId ', hex(h % 1048576), ' - Init COMPLETE'),
    i = 8, concat('Using ', toString(8), ' GPUs: NVIDIA H100 80GB HBM3, ',
                  'driver 550.54.15, CUDA 12.4'),
    i = 9, 'Loading checkpoint from /scratch/ckpt/last.pt',
    i = 1234 AND r IN (1234, 5678, 9012), concat('NVRM: Xid (PCI:0000:', hex(h % 256),
        ':00): 79, pid=', toString(h % 65536), ', GPU has fallen off the bus.'),
    i % 1000 = 999, concat('Epoch ', toString(epoch), ': 100%|##########| 1000/1000 [',
        toString(10 + h % 50), ':', toString(10 + h % 49), '<00:00, ', toString(round(u * 20, 2)),
        'it/s, loss=', toString(round(u, 3)), ']'),
    i % 250 = 100, concat('Validation: accuracy ', toString(round(u, 4)), ' on ',
        toString(1000 + h % 9000), ' samples'),
    u < 0.45, concat(formatDateTime(t, '%Y-%m-%d %H:%i:%S'), ' | INFO | train | epoch=',
        toString(epoch), ' step=', toString(i % 1000), '/1000 loss=', toString(round(u * 4.4, 4)),
        ' acc=', toString(round(1 - u, 4)), ' lr=', toString(round(u / 1000, 6)), ' throughput=',
        toString(round(1000 + u * 500, 1)), ' samples/s'),
    u < 0.65, concat('epoch ', toString(epoch), ' step ', toString(i), ' loss=',
        toString(round(u * 3, 4)), ' lr=', toString(round(u / 3000, 6)), ' grad_norm=',
        toString(round(u * 3, 3))),
    u < 0.85, concat('[rank', toString(h % 8), '] iteration ', toString(i), '/',
        toString({per:UInt64}),
        ' | consumed samples ', toString(i * 32), ' | elapsed time per iteration (ms): ',
        toString(round(400 + u * 200, 1)), ' | learning rate ', toString(round(u / 10000, 8)),
        ' | lm loss ', toString(round(2 + u, 4)), ' | grad norm ', toString(round(u, 3)), ' |'),
    u < 0.90, concat('[', formatDateTime(t, '%H:%i:%S'), '] INFO worker-', toString(h % 8),
        ': processed batch ', toString(i)),
    u < 0.93, concat('/opt/conda/lib/python3.11/site-packages/torch/utils/data/dataloader.py:',
        toString(100 + h % 900), ': UserWarning: This DataLoader will create ',
        toString(2 + h % 62),
        ' worker processes in total.'),
    u < 0.95, concat('WARNING: CUDA out of memory on a probe batch of ', toString(h % 64),
        ', retrying with half'),
    u < 0.97, concat('/home/user/project/data.py:', toString(h % 300),
        ': FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated.'),
    concat('saving checkpoint step_', toString(i), '.pt to /scratch/', toString(h % 100000)))
    , ''
FROM numbers({start:UInt64}, {count:UInt64})"""

_RUNS_SQL = """
INSERT INTO runs (run, owner, uid, cluster, job_id, start_ts, end_ts, last_ts, start_seq,
    end_seq, host, command, state, exit_status, duration, slurm)
SELECT concat('run-', toString(number)), concat('user', toString(number % {users:UInt64})),
    2000 + number % {users:UInt64}, 'bench', toString(100000 + number),
    toDateTime64({t0:Float64} + number * {gap:Float64}, 9, 'UTC'),
    toDateTime64({t0:Float64} + number * {gap:Float64} + {per:UInt64} * 0.85, 9, 'UTC'),
    toDateTime64({t0:Float64} + number * {gap:Float64} + {per:UInt64} * 0.85, 9, 'UTC'),
    0, 1, concat('gpu', toString(number % 64)), '["python", "train.py"]',
    multiIf(number % 7 = 3, 'FAILED', number % 23 = 5, 'TIMEOUT', 'COMPLETED'),
    if(number % 7 = 3, 1, 0), {per:UInt64} * 0.85,
    concat('{"job_id": "', toString(100000 + number), '", "job_name": "train-',
           arrayElement(['resnet', 'llama', 'vit', 'bert', 'gpt'], number % 5 + 1), '"}')
FROM numbers({runs:UInt64})"""


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "logcapture" / "bench_search"


def _params(**kw: object) -> dict[str, object]:
    return {"per": LINES_PER_RUN, "t0": float(T0), "gap": DAYS * 86400 / RUNS, "users": USERS,
            "runs": RUNS, **kw}


def build(path: Path) -> S.Store:
    """The cached store, built when absent (its marker file says it is complete)."""
    marker = path / f"complete-{CACHE_VERSION}"
    dsn = f"chdb://{path / 'store'}"
    if marker.exists():
        return S.open_store(dsn)
    path.mkdir(parents=True, exist_ok=True)
    st = S.open_store(dsn)
    total = RUNS * LINES_PER_RUN
    have = int(st.client.command("SELECT count() FROM lines"))
    step = 2_500_000
    start = have - have % step  # resume after the last whole chunk
    if start != have:
        st.client.command("TRUNCATE TABLE lines")
        start = 0
    t = time.perf_counter()
    for s in range(start, total, step):
        st.client.command("INSERT INTO lines (run, owner, uid, stream, seq, ts, kind, text, "
                          "options) " + _LINE_SQL, parameters=_params(start=s, count=step))
        print(f"  {s + step:,} / {total:,} lines ({time.perf_counter() - t:.0f} s, "
              f"load {load()})", flush=True)
    st.client.command("TRUNCATE TABLE runs")
    st.client.command(_RUNS_SQL, parameters=_params())
    marker.write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
    return st


def timed(st: S.Store, fn, rounds: int) -> tuple[float, object]:
    """Median seconds of ``fn()``. Each call starts with the engine's query condition cache
    emptied: it remembers which blocks a condition ruled out, so a repeated query would be
    timed against its own earlier answer, not what a user's new search costs. The first call
    is not timed (it reads the files into the page cache: a disk's figure, not the query's)."""
    fn()
    times, out = [], None
    for _ in range(rounds):
        st.client.command("SYSTEM DROP QUERY CONDITION CACHE")
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def scan_sql(cond: str) -> str:
    return ("SELECT run, stream, seq, ts, text FROM lines WHERE " + cond +
            " ORDER BY ts DESC LIMIT 101")


def run_searches(st: S.Store, rounds: int) -> None:
    n = int(st.client.command("SELECT count() FROM lines"))
    days = st.client.query("SELECT dateDiff('day', min(ts), max(ts)) FROM lines").result_rows
    nruns = int(st.client.command("SELECT uniqExact(run) FROM lines"))
    print(f"store: {n:,} lines, {nruns:,} runs over {days[0][0]} days; load {load()}")
    without = int(st.client.command(
        "SELECT count() FROM system.parts WHERE database = currentDatabase() AND table = 'lines' "
        "AND active AND secondary_indices_compressed_bytes = 0"))
    if without:
        # such parts are scanned whole: the figures would be the baseline's, not the index's
        print(f"warning: {without} active part(s) of lines hold no token index data; rebuild "
              "the cached store (delete it) or MATERIALIZE INDEX text_tokens")
    cases = [
        ("rare word", Request("Xid"), "text LIKE '%Xid%'", 0.3),
        ("common word, first page", Request("loss"), "text LIKE '%loss%'", 1.0),
        ("phrase", Request('"CUDA out of memory"'), "text LIKE '%CUDA out of memory%'", 1.0),
        ("regex", Request(r"Watchdog.*Timeout\(ms\)=6", regex=True),
         r"match(text, 'Watchdog.*Timeout\\(ms\\)=6')", None),
        ("two words", Request("NCCL timeout"),
         "hasToken(text, 'NCCL') AND hasToken(text, 'timeout')", None),
        ("rare word, -C 3", Request("Xid", context=3), "text LIKE '%Xid%'", None),
    ]
    print(f"{'search':28s} {'logcapture':>11s} {'baseline':>10s} {'ratio':>7s} "
          f"{'found':>6s}  goal")
    for who in (None, "user34"):  # user34 has one of the 3 runs with Xid
        print(f"as {'an administrator (every run)' if who is None else who + ' (own runs)'}:")
        for name, req, base_cond, goal in cases:
            if who is not None:
                base_cond += f" AND owner = '{who}'"
            t_lc, found = timed(st, lambda req=req, owner=who: st.search(req, owner), rounds)
            t_base, rows = timed(st, lambda c=base_cond: st.client.query(
                scan_sql(c)).result_rows, max(1, rounds // 2))
            hits = len(found.hits)  # type: ignore[attr-defined]
            verdict = "" if goal is None else (f"<= {goal * 1000:.0f} ms: "
                                               + ("met" if t_lc <= goal else "MISSED"))
            print(f"  {name:26s} {t_lc * 1000:9.1f}ms {t_base * 1000:8.1f}ms "
                  f"{t_base / t_lc:6.1f}x {hits:6d}  {verdict}", flush=True)
            assert hits == min(len(rows), req.limit), (name, hits, len(rows))
    print(f"load average at the end: {load()}")


def index_cost(st: S.Store, rounds: int = 3) -> None:
    """Bytes of the token index against the text's, and the time of one insert of 2M lines
    with and without it."""
    rows = st.client.query(
        "SELECT sum(data_compressed_bytes), sum(data_uncompressed_bytes) FROM "
        "system.data_skipping_indices WHERE database = currentDatabase() AND table = 'lines' "
        "AND name = 'text_tokens'").result_rows
    col = st.client.query(
        "SELECT name, sum(data_compressed_bytes) FROM system.columns WHERE database = "
        "currentDatabase() AND table = 'lines' GROUP BY name").result_rows
    n = int(st.client.command("SELECT count() FROM lines"))
    total = sum(int(c[1]) for c in col)
    text = dict((c[0], int(c[1])) for c in col).get("text", 0)
    idx = int(rows[0][0] or 0)
    print(f"token index: {idx / 1e6:.1f} MB for {n:,} lines ({idx / n:.2f} bytes a line); "
          f"text column {text / 1e6:.1f} MB ({text / n:.2f} bytes a line), all columns "
          f"{total / 1e6:.1f} MB: the index is {idx / (total + idx) * 100:.1f} % of the table")
    src = "SELECT * FROM lines WHERE run >= 'run-5000' AND run < 'run-5400'"  # 2M lines
    st.client.command("CREATE TEMPORARY TABLE IF NOT EXISTS bench_src AS " + src)
    times: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(rounds):
        for name in ("with", "without"):
            table = f"bench_{name}_index"
            st.client.command(f"DROP TABLE IF EXISTS {table}")
            st.client.command(f"CREATE TABLE {table} AS lines")  # same engine, codecs, index
            if name == "without":
                st.client.command(f"ALTER TABLE {table} DROP INDEX text_tokens")
            t = time.perf_counter()
            st.client.command(f"INSERT INTO {table} SELECT * FROM bench_src")
            times[name].append(time.perf_counter() - t)
            st.client.command(f"DROP TABLE {table}")
    w, wo = statistics.median(times["with"]), statistics.median(times["without"])
    m = int(st.client.command("SELECT count() FROM bench_src"))
    print(f"insert of {m:,} lines: {w:.2f} s with the index, {wo:.2f} s without "
          f"({(w / wo - 1) * 100:+.0f} %; {m / w / 1000:.0f}k vs {m / wo / 1000:.0f}k lines/s); "
          f"load {load()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=default_cache())
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--index-cost", action="store_true")
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    t = time.perf_counter()
    st = build(args.cache)
    print(f"store ready in {time.perf_counter() - t:.1f} s ({args.cache})")
    try:
        if not args.build_only:
            run_searches(st, args.rounds)
            if args.index_cost:
                index_cost(st)
    finally:
        st.close()


if __name__ == "__main__":
    main()
