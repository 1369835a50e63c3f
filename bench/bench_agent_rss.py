"""The agent's peak memory shipping a backlog (the spool a node holds after an outage).

    .venv/bin/python bench/bench_agent_rss.py [--backlog-mib 1024] [--runs 8] [--batch-mib 64]

Builds a spool of ``--runs`` runs holding ``--backlog-mib`` MiB of NDJSON in all, written by
a real ``SpoolWriter`` (8 MiB segments, gzip-closed), then measures, each in a fresh process,
the peak resident set (``ru_maxrss``, getrusage(2)) of:

- floor: importing logcapture and opening the store;
- baseline: the same, then reading every pending segment into memory, as a shipper that does
  not stream does before its first insert (``read_segment_bytes`` of each, kept);
- logcapture: ``Agent.flush`` of the whole backlog, batches of ``--batch-mib``.

The store is the embedded engine (chDB) along a server's write path: ``embedded`` set False,
so every segment is read by the shipper and sent as bytes through ``ingest``, as to a
ClickHouse server. The engine works in the same process, so its own memory is in the figures
too; ``--null`` ships to a store that takes and drops every insert instead (the shipper
alone). Prints each peak and the growth over the floor against the backlog's size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from logcapture.records import Line  # noqa: E402
from logcapture.spool.layout import create_run_dir  # noqa: E402
from logcapture.spool.writer import SpoolWriter  # noqa: E402

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from logcapture import ship
from logcapture.spool.layout import find_run_dirs, segments
from logcapture.spool.reading import read_segment_bytes
from logcapture.errors import StoreError
from logcapture.ship import agent as ship_agent  # where the agent opens the store
what, root, dsn, batch, null = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), \
    sys.argv[5] == "1"
real_open = ship_agent.open_store


class NullStore:
    embedded = False
    reads_files = False
    def __enter__(self): return self
    def __exit__(self, *a): pass
    def insert_many(self, batches): return sum(b.count(b"\n") for b, _ in batches)
    def insert_insights(self, *a, **kw): return 0
    def run_info(self, *a, **kw): raise StoreError("null store")


def server_like(*args, **kw):
    if null:
        return NullStore()
    st = real_open(*args, **kw)
    st.embedded = False  # every segment read here and sent as bytes, as to a server
    return st


ship_agent.open_store = server_like
t = time.monotonic()
records = 0
if what == "floor":
    with ship_agent.open_store(dsn):
        pass
elif what == "baseline":
    with ship_agent.open_store(dsn):
        kept = []
        for run_dir in find_run_dirs(root):
            for seg in segments(run_dir):
                kept.append(read_segment_bytes(seg)[0])
        records = sum(k.count(b"\n") for k in kept)
else:
    agent = ship.Agent(root, dsn, batch_bytes=batch, retention_days=None)
    agent.scan()
    records = agent.flush().records
print(json.dumps({"peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "records": records, "seconds": time.monotonic() - t}))
"""


def build(root: Path, runs: int, total: int) -> tuple[int, int]:
    """``runs`` runs of ``total`` bytes of NDJSON in all; (records, bytes) written."""
    t0 = time.time()
    per_run = total // runs
    records = size = 0
    for r in range(runs):
        run = f"backlog{r:02d}"
        w = SpoolWriter(create_run_dir(root, run), fsync=False, flush_interval=60)
        seq = written = 0
        while written < per_run:
            recs = [Line(run=run, stream="stdout", seq=seq + i, ts=t0 + (seq + i) * 1e-4,
                         text=f"12:00:{i % 60:02d} INFO train: step {seq + i} loss "
                              f"{1 / (seq + i + 1):.6f} " + "x" * (i % 40))
                    for i in range(20_000)]
            seq += len(recs)
            written += sum(len(x.to_json()) + 1 for x in recs)
            w.write(recs)
        w.close()
        records += seq
        size += written
    return records, size


def measure(what: str, root: Path, dsn: str, batch: int, null: bool) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, what, str(root), dsn, str(batch),
                          "1" if null else "0"], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backlog-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--batch-mib", type=int, default=64)
    ap.add_argument("--null", action="store_true", help="a store that drops every insert")
    args = ap.parse_args()
    batch = args.batch_mib << 20
    with tempfile.TemporaryDirectory() as tmp:
        root, dsn = Path(tmp) / "spool", f"chdb://{tmp}/store"
        t = time.monotonic()
        records, size = build(root, args.runs, args.backlog_mib << 20)
        disk = sum(p.stat().st_size for p in root.rglob("seg-*"))
        print(f"# backlog: {records:,} records, {size / 2**20:.0f} MiB of NDJSON in "
              f"{args.runs} runs ({disk / 2**20:.0f} MiB gzipped on disk), built in "
              f"{time.monotonic() - t:.0f}s; batches of {args.batch_mib} MiB; store: "
              f"{'null' if args.null else 'chDB, server write path'}; load "
              f"{os.getloadavg()[0]:.1f}")
        floor = measure("floor", root, dsn, batch, args.null)
        base = measure("baseline", root, dsn, batch, args.null)
        ours = measure("agent", root, dsn, batch, args.null)
        assert ours["records"] == base["records"] == records, (ours, base, records)
        for name, m in (("floor (store opened)", floor), ("baseline (backlog read whole)", base),
                        ("logcapture agent (streaming)", ours)):
            grow = (m["peak_kib"] - floor["peak_kib"]) / 1024
            print(f"{name:31s} peak RSS {m['peak_kib'] / 1024:7.0f} MiB  over the floor "
                  f"{grow:7.0f} MiB ({grow / (size / 2**20):.2f}x the backlog)  "
                  f"{m['seconds']:.1f}s")


if __name__ == "__main__":
    main()
