"""Benchmark: a fleet of nodes' agents shipping into one store (the store path at scale).

N simulated nodes, each a spool root with one job's run written at a training job's rates
(a log line every 0.5-2 s, a JSON metrics line every 10th line, a resource sample every
10 s), a few of them flooding (2,000 lines/s for 5 s every 30 s), and each with its own real
``ship.Agent`` (its own thread, cursor and cadence) shipping into ONE store. The agents
ship what a server store is sent (``--path server``, the default: every record through the
``ingest`` table and its views, no file reads; each agent its own client handle on the engine,
inserting concurrently) or what the embedded store reads (``--path embedded``: one store
taken in turns under a lock). Reported per N:

- lines/s written and accepted (rows in the store / seconds), rows lost and duplicated
  (``FINAL`` counts against what the nodes wrote: both must be 0; raw copies before merges
  are shown too);
- insert latency p50/p99 (the store calls of one flush) and flush latency p50/p99 (the
  agent's whole flush, waiting for the store included);
- new parts per second (parts written by inserts: one per insert, target table and day; the
  tables' block numbers count them) and active parts over time;
- CPU seconds of the whole process per 1M lines (agents, writers and engine together: an
  upper bound of the store's share) and bytes on disk per line.

The baseline, in the same run: the same nodes and rates shipped by ONE agent over all the
spool roots (one insert stream at the agents' cadence: the batching ClickHouse recommends,
about one insert per second); the figure printed is the ratio of new parts per second.

What this measures, and what it cannot (docs/storage.md, "Sizing"): the embedded engine
(chDB) is one process per store folder, so the N agents are threads of this process: with
``--path server`` each has its own handle on the one engine (concurrent inserts, as a server
takes them over HTTP, but one process's threads and one Python interpreter on this machine's
cores, the agents' own work included); with ``--path embedded`` they take turns (as separate
processes would through the store's lock). chDB accepts the asynchronous
insert settings but inserts synchronously (``--async on`` shows the same parts as ``off``):
how a server batches them (``async_insert_busy_timeout_ms``) cannot be shown here, only the
part rate that synchronous inserts give, which is what asynchronous inserts bound.

Usage: ``python bench/bench_fleet.py [--nodes 10,100,300] [--seconds 30] [--interval 2]
[--async off,on] [--path server|embedded]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from logcapture import ship  # noqa: E402
from logcapture import store as S  # noqa: E402
from logcapture.records import End, Line, Metadata, Sample, Start  # noqa: E402
from logcapture.ship import agent as ship_agent  # noqa: E402
from logcapture.spool.layout import create_run_dir  # noqa: E402
from logcapture.spool.writer import SpoolWriter  # noqa: E402

FLOOD_EVERY = 30.0  # s
FLOOD_FOR = 5.0  # s
FLOOD_RATE = 2000  # lines/s
SAMPLE_EVERY = 10.0  # s
TABLES = ("lines", "notes", "metadata", "samples", "runs")


@dataclass
class Node:
    """One node: a spool root holding one job's run, written at its rates."""

    name: str
    root: Path
    rate: float  # log lines per second outside floods
    flooding: bool
    writer: SpoolWriter | None = None
    run: str = ""
    seq: int = 0
    sample_seq: int = 0
    owed: float = 0.0
    next_sample: float = 0.0
    written: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))

    def start(self, t0: float) -> None:
        self.run = f"{self.name}-job"
        run_dir = create_run_dir(self.root, self.run)
        self.writer = SpoolWriter(run_dir, fsync=False)
        self.writer.write([Start(run=self.run, stream="run", seq=0, ts=time.time(),
                                 command=["python", "train.py"], user="bench", uid=0,
                                 host=self.name)])
        self.written["runs"] = 1
        self.next_sample = t0 + random.random() * SAMPLE_EVERY

    def step(self, now: float, dt: float, t0: float) -> None:
        """Write what is due after ``dt`` seconds more."""
        assert self.writer is not None
        rate = self.rate
        if self.flooding and (now - t0) % FLOOD_EVERY < FLOOD_FOR:
            rate = FLOOD_RATE
        self.owed += rate * dt
        recs: list[Any] = []
        ts = time.time()
        while self.owed >= 1:
            self.owed -= 1
            self.seq += 1
            if self.seq % 10 == 0:
                recs.append(Metadata(run=self.run, stream="stdout", seq=self.seq, ts=ts,
                                     fields={"epoch": self.seq // 1000, "step": self.seq,
                                             "loss": round(random.random(), 4)}))
                self.written["metadata"] += 1
            else:
                recs.append(Line(run=self.run, stream="stdout", seq=self.seq, ts=ts,
                                 text=f"epoch {self.seq // 1000} step {self.seq} loss="
                                      f"{random.random():.4f} lr=0.000{self.seq % 97:02d}"))
                self.written["lines"] += 1
        if now >= self.next_sample:
            self.next_sample += SAMPLE_EVERY
            recs.append(Sample(run=self.run, stream=f"sample:{self.name}", seq=self.sample_seq,
                               ts=ts, node=self.name,
                               gpus=[{"index": 0, "utilization_gpu_percent": 97,
                                      "memory_used_bytes": 30 << 30}],
                               job={"cpu_percent": 812.5, "memory_rss_bytes": 12 << 30}))
            self.sample_seq += 1
            self.written["samples"] += 1
        if recs:
            self.writer.write(recs)
            self.writer.flush()

    def end(self) -> None:
        assert self.writer is not None
        self.seq += 1
        self.writer.write([End(run=self.run, stream="run", seq=1, ts=time.time(), exit_status=0,
                               state="COMPLETED", duration=1.0)])
        self.writer.close()


class Shared:
    """``ship.agent.open_store`` for the agents. ``--path server``: each agent thread has its own
    client handle on the one engine and inserts when it likes, as agents send a server their
    inserts at once (the engine runs a query without holding the GIL). ``--path embedded``:
    one store lent under a lock (chDB is one process per store folder: agents would take
    turns through its file lock)."""

    def __init__(self, store: S.Store, path: str, async_insert: bool):
        self.store = store
        self.path = path
        self.async_insert = async_insert
        self.lock = threading.Lock()
        self.mine: dict[int, S.Store] = {}
        self.insert_s: list[float] = []
        self.flush_s: list[float] = []
        self._setup(store)

    def _setup(self, store: S.Store) -> None:
        if self.path == "server":
            store.embedded = False  # everything through ``ingest``, as a server is sent it
        store.async_insert = self.async_insert
        for name in ("insert_many", "insert_segments", "insert_ndjson"):
            self._time(store, name)

    def _time(self, store: S.Store, name: str) -> None:
        inner = getattr(store, name)

        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.insert_s.append(time.perf_counter() - t)

        setattr(store, name, timed)

    def _own(self) -> S.Store:
        me = threading.get_ident()
        if me not in self.mine:
            import clickhouse_connect

            with self.lock:
                client = clickhouse_connect.get_client(dsn=f"chdb://{S.connection._chdb_path(self.store.dsn)}")
            client.database = S.DEFAULT_DATABASE
            st = S.Store(client, self.store.dsn)
            self._setup(st)
            self.mine[me] = st
        return self.mine[me]

    @contextlib.contextmanager
    def __call__(self, dsn: Any = None, **kw: Any) -> Iterator[S.Store]:
        if self.path == "server":
            yield self._own()
            return
        with self.lock:
            yield self.store

    def close(self) -> None:
        for st in self.mine.values():
            st.close()


def parts(store: S.Store) -> tuple[int, int]:
    """(parts written by inserts so far, active parts) of the logcapture tables. A
    MergeTree table numbers every part an insert writes from one counter (a merge takes none),
    so the highest block number listed counts them, even once merged parts are removed."""
    row = store.client.query(
        "SELECT sum(m), sum(a) FROM (SELECT max(max_block_number) AS m, countIf(active) AS a "
        "FROM system.parts WHERE database = currentDatabase() AND table IN {t:Array(String)} "
        "GROUP BY table)", parameters={"t": list(TABLES)}).result_rows[0]
    return int(row[0] or 0), int(row[1] or 0)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def one_run(n: int, seconds: float, interval: float, async_insert: bool, path: str,
            single_agent: bool, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    random.seed(seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    try:
        parent = tmp / "spool"
        nodes = [Node(f"n{i:04d}", parent / f"n{i:04d}", rate=rng.uniform(0.5, 2.0),
                      flooding=i < max(1, n // 50)) for i in range(n)]
        store = S.open_store(f"chdb://{tmp / 'store'}")
        shared = Shared(store, path, async_insert)
        real_open = ship_agent.open_store
        ship_agent.open_store = shared  # type: ignore[assignment]
        t0 = time.monotonic()
        for node in nodes:
            node.root.mkdir(parents=True)
            node.start(t0)
        roots = [parent] if single_agent else [node.root for node in nodes]
        agents = [ship.Agent(r, "bench", batch_interval=interval, poll=0.5,
                             retention_days=None) for r in roots]
        for a in agents:
            inner = a.flush

            def flush(inner: Any = inner) -> Any:
                t = time.perf_counter()
                try:
                    return inner()
                finally:
                    shared.flush_s.append(time.perf_counter() - t)

            a.flush = flush  # type: ignore[method-assign]
        threads = [threading.Thread(target=a.run, daemon=True) for a in agents]
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        load0 = os.getloadavg()[0]
        for t in threads:
            t.start()
        timeline: list[tuple[float, int, int]] = []
        probing = threading.Event()

        def probe() -> None:  # parts once a second, on a handle of its own
            with shared() as st:
                while not probing.wait(1.0):
                    timeline.append((time.monotonic() - t0, *parts(st)))

        timeline.append((0.0, *parts(store)))
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        last = t0
        while (now := time.monotonic()) < t0 + seconds:
            for node in nodes:
                node.step(now, now - last, t0)
            last = now
            time.sleep(0.2)
        for node in nodes:
            node.end()
        ended = time.monotonic() - t0
        for a in agents:
            a.stop()
        for t in threads:
            t.join(timeout=300)
        elapsed = time.monotonic() - t0
        probing.set()
        prober.join()
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        ship_agent.open_store = real_open
        shared.close()
        with shared.lock:
            timeline.append((elapsed, *parts(store)))
            got = {t: int(store.client.command(f"SELECT count() FROM {t} FINAL"))
                   for t in TABLES}
            raw = {t: int(store.client.command(f"SELECT count() FROM {t}")) for t in TABLES}
            disk = int(store.client.command(
                "SELECT sum(bytes_on_disk) FROM system.parts WHERE database = "
                "currentDatabase() AND active"))
        store.close()
        want = {t: sum(node.written[t] for node in nodes) for t in TABLES}
        want["runs"] = n
        lines = want["lines"] + want["metadata"]
        cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
        new_parts = timeline[-1][1] - timeline[0][1]
        return {
            "n": n, "agents": len(agents), "async": async_insert, "elapsed": elapsed,
            "drain": elapsed - ended,
            "written_per_s": lines / elapsed, "accepted_per_s": (got["lines"] + got["metadata"])
            / elapsed,
            "lost": {t: want[t] - got[t] for t in TABLES if want[t] > got[t]},
            "duplicated": {t: got[t] - want[t] for t in TABLES if got[t] > want[t]},
            "raw_copies": sum(raw[t] - got[t] for t in TABLES if t != "runs"),
            "inserts": len(shared.insert_s),
            "insert_p50": pct(shared.insert_s, 0.5), "insert_p99": pct(shared.insert_s, 0.99),
            "flush_p50": pct(shared.flush_s, 0.5), "flush_p99": pct(shared.flush_s, 0.99),
            "new_parts_per_s": new_parts / elapsed,
            "active_parts": [(round(t), a) for t, _, a in timeline],
            "max_active": max(a for _, _, a in timeline),
            "cpu_per_m_lines": cpu / max(lines, 1) * 1e6, "cpu_share": cpu / elapsed,
            "bytes_per_line": disk / max(lines, 1), "lines": lines, "samples": want["samples"],
            "load": (load0, os.getloadavg()[0]),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def show(r: dict[str, Any], label: str) -> None:
    print(f"  {label}: {r['agents']} agent(s), {r['elapsed']:.0f} s (the last "
          f"{r['drain']:.1f} s shipping what was left), load "
          f"{r['load'][0]:.1f} -> {r['load'][1]:.1f}")
    print(f"    lines/s written {r['written_per_s']:.0f}, accepted {r['accepted_per_s']:.0f} "
          f"({r['lines']} lines, {r['samples']} samples); lost {r['lost'] or 0}, "
          f"duplicated {r['duplicated'] or 0} (raw copies before merges: {r['raw_copies']})")
    print(f"    {r['inserts']} inserts: p50 {r['insert_p50'] * 1e3:.1f} ms, p99 "
          f"{r['insert_p99'] * 1e3:.1f} ms; flush (store wait included) p50 "
          f"{r['flush_p50'] * 1e3:.1f} ms, p99 {r['flush_p99'] * 1e3:.1f} ms")
    every = max(1, len(r["active_parts"]) // 8)
    print(f"    new parts/s {r['new_parts_per_s']:.1f}; active parts (s, n): "
          f"{r['active_parts'][::every]} max {r['max_active']}")
    print(f"    process CPU {r['cpu_share'] * 100:.0f} % of a core, "
          f"{r['cpu_per_m_lines']:.1f} CPU s per 1M lines; {r['bytes_per_line']:.1f} bytes "
          f"on disk per line")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="10,100,300")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=ship.BATCH_INTERVAL,
                    help="the agents' --interval (seconds)")
    ap.add_argument("--async", dest="modes", default="off,on",
                    help="asynchronous inserts: off, on or both (off,on)")
    ap.add_argument("--path", choices=("server", "embedded"), default="server")
    args = ap.parse_args()
    print(f"bench_fleet: path {args.path}, agents' interval {args.interval} s, "
          f"{args.seconds:.0f} s per run, {os.cpu_count()} cores")
    for n in (int(x) for x in args.nodes.split(",")):
        print(f"N = {n} nodes ({max(1, n // 50)} flooding)")
        base = one_run(n, args.seconds, args.interval, False, args.path, single_agent=True)
        show(base, "baseline, one agent for all nodes")
        for mode in args.modes.split(","):
            r = one_run(n, args.seconds, args.interval, mode == "on", args.path,
                        single_agent=False)
            show(r, f"{n} agents, async inserts {mode}")
            ratio = r["new_parts_per_s"] / max(base["new_parts_per_s"], 1e-9)
            print(f"    ratio of new parts/s, {n} agents / one agent: {ratio:.2f}x")
        print(flush=True)


if __name__ == "__main__":
    main()
