"""Benchmark: what insights cost (docs/insights.md), each figure with its ratio against a
baseline measured in the same run, and the machine's load average (the cores may be shared).

1. Diagnosis at ship time: a failed run of N lines (default 1M; a training log with a
   traceback and a CUDA out-of-memory error at its end) is shipped from its spool
   (``ship.ship_runs`` as ``Agent.flush`` calls it: the engine reads the closed segments
   itself) and diagnosed by the shipper (``ship.diagnose_run``: the engine finds the
   candidate lines, Python reads only those).
   Baseline: the shipping alone. Figure: the diagnosis's CPU over the shipping's (process CPU
   time, the embedded engine's threads included). Target: <= 5 %.
2. ``logcapture show`` of a 2M-line failed run in the store: ``LocalReader.describe`` (what
   ``show`` prints), with the insights the shipper stored, and with none stored (diagnosed on
   the spot). Baseline: the same describe without insights. Target: <= 300 ms.
3. ``logcapture ls`` of a spool holding the failed run of 1.: its summary with the kinds
   ``show`` lists (``query.spool_insights``: the candidates found by their needles in the
   segments' bytes, then metadata and samples by kind). Baselines: the summary from the End
   record alone (``runs.summarize``), and the candidates found by one regular expression of
   all the needles instead (``matchers.CANDIDATE`` over the bytes). Figure: its time over
   each.

Usage: ``python bench/bench_insights.py [--lines N] [--show-lines N] [--rounds R]``
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_store import make_training_text  # noqa: E402

from logcapture import store as S  # noqa: E402
from logcapture.insights import report  # noqa: E402
from logcapture.insights.live import LiveWatch  # noqa: E402
from logcapture.query import HeldStore, StoreReader  # noqa: E402
from logcapture.query import show as query_show  # noqa: E402
from logcapture.query.spool_insights import spool_insights  # noqa: E402
from logcapture.records import End, Line, Start  # noqa: E402
from logcapture.ship import UploadResult, diagnose_run  # noqa: E402
from logcapture.spool.layout import create_run_dir, segments  # noqa: E402
from logcapture.spool.reading import read_segment_bytes  # noqa: E402
from logcapture.spool.writer import SpoolWriter  # noqa: E402

TAIL = ["Traceback (most recent call last):",
        '  File "/home/u/train.py", line 88, in <module>', "    main()",
        '  File "/home/u/train.py", line 61, in main', "    loss = model(batch)",
        '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", '
        'line 1501, in _call_impl', "    return forward_call(*args, **kwargs)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
        "total capacity of 79.15 GiB of which 11.06 MiB is free."]


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write_run(root: Path, run: str, n: int) -> None:
    rng = random.Random(7)
    d = create_run_dir(root, run)
    w = SpoolWriter(d, fsync=False, flush_interval=3600, flush_records=50_000)
    t0 = time.time() - n / 1000
    w.write([Start(run, "run", 0, t0, command=["python", "train.py"], user="u", uid=1000)])
    batch = []
    for i in range(n):
        batch.append(Line(run, "stdout", i, t0 + i / 1000, make_training_text(rng, i)))
        if len(batch) == 10000:
            w.write(batch)
            batch = []
    batch += [Line(run, "stderr", j, t0 + n / 1000, t) for j, t in enumerate(TAIL)]
    w.write(batch)
    w.write([End(run, "run", 1, t0 + n / 1000 + 1, exit_status=1, state="FAILED",
                 duration=n / 1000 + 1)])
    w.close()


def bench_ship(tmp: Path, n: int, rounds: int) -> None:
    ship_cpu: list[float] = []
    diag_cpu: list[float] = []
    live_cpu: list[float] = []
    for r in range(rounds):
        spool = tmp / f"spool{r}"
        write_run(spool, "r1", n)
        dsn = f"chdb://{tmp}/store{r}"
        with S.open_store(dsn):
            pass
        c0 = cpu()
        with S.open_store(dsn) as st:  # the shipping the agent does, without the diagnosis
            from logcapture.ship import _RunJob, identity_from_spool, lock_cursor, ship_runs

            run_dir = spool / "r1"
            with lock_cursor(run_dir, wait=0) as rc:
                assert rc is not None
                ident = identity_from_spool(run_dir)
                job = _RunJob(run_dir, rc, ident)
                res = UploadResult()
                ship_runs(st, [job], res, job_info=None)
                c1 = cpu()
                stored = st.insights("r1", ident.user)
                assert [i["kind"] for i in stored][:2] == ["cuda-oom", "python-exception"]
                c2 = cpu()
                diagnose_run(st, ident, {}, UploadResult())  # once more, measured alone
                c3 = cpu()
        ship_cpu.append(c1 - c0 - (c3 - c2))  # ship_runs included one diagnosis
        diag_cpu.append(c3 - c2)
        data = b"".join(read_segment_bytes(seg)[0] for seg in segments(run_dir))
        watch = LiveWatch()
        c4 = cpu()
        for k in range(0, len(data), 8 << 20):  # as the agent reads: batches of whole lines
            watch.observe(("r1", 0), data[k:k + (8 << 20)], time.time())
        live_cpu.append(cpu() - c4)
        shutil.rmtree(spool)
        shutil.rmtree(tmp / f"store{r}", ignore_errors=True)
    s, d = statistics.median(ship_cpu), statistics.median(diag_cpu)
    print(f"1. ship {n} lines: shipping {s:.2f} s CPU ({s / n * 1e6:.2f} us/line), "
          f"diagnosis {d * 1000:.0f} ms CPU ({d / n * 1e6:.3f} us/line): "
          f"{d / s * 100:.1f} % of the shipping (target <= 5 %)")
    v = statistics.median(live_cpu)
    print(f"1b. the agent's live watch over the same bytes: {v * 1000:.0f} ms CPU: "
          f"{v / s * 100:.1f} % of the shipping")


def bench_show(tmp: Path, n: int, rounds: int) -> None:
    dsn = f"chdb://{tmp}/show-store"
    with S.open_store(dsn) as st:
        st._command(
            "INSERT INTO lines (run, owner, uid, stream, seq, ts, kind, text, options) "
            "SELECT 'big', 'u', 1000, 'stdout', number, toDateTime64(1.7e9, 9, 'UTC') + "
            "number / 1000, 'line', concat('epoch ', toString(intDiv(number, 5000)), ' step ',"
            " toString(number), ' loss=', toString(number % 97 / 100), ' lr=0.0003'), '' "
            f"FROM numbers({n})")
        ident = S.Identity("big", "u", 1000)
        t_end = 1.7e9 + n / 1000
        st.insert_records(
            [Start("big", "run", 0, 1.7e9 - 1, command=["python", "train.py"]),
             *[Line("big", "stderr", j, t_end, t) for j, t in enumerate(TAIL)],
             End("big", "run", 1, t_end + 1, exit_status=1, state="FAILED",
                 duration=n / 1000 + 2)], ident)
        st._command("OPTIMIZE TABLE lines FINAL")

    def describe(with_insights: str) -> float:
        saved = report.store_insights
        if with_insights == "none":
            query_show.store_insights = lambda *a, **k: []  # type: ignore[assignment]
        try:
            session = HeldStore(dsn)
            assert session.available  # opened (chDB: ~0.2 s, not counted: any read pays it)
            reader = StoreReader(session, "u")
            t0 = time.perf_counter()
            info = reader.describe("big")
            dt = time.perf_counter() - t0
            session.close()
        finally:
            query_show.store_insights = saved  # type: ignore[assignment]
        if with_insights != "none":
            assert info["insights"][0]["kind"] == "cuda-oom", info["insights"]
        return dt

    results: dict[str, list[float]] = {"none": [], "diagnosed": [], "none ": [],
                                       "stored": []}
    describe("none")  # warm-up: the first read of a store is slower
    for _ in range(rounds):  # before the shipper stored anything
        for mode in ("none", "diagnosed"):
            results[mode].append(describe(mode))
    with S.open_store(dsn) as st:
        diagnose_run(st, S.Identity("big", "u", 1000), {}, UploadResult())
    for _ in range(rounds):  # after
        results["none "].append(describe("none"))
        results["stored"].append(describe("stored"))
    for mode, base_mode in (("diagnosed", "none"), ("stored", "none ")):
        m = statistics.median(results[mode])
        base = statistics.median(results[base_mode])
        print(f"2. show of a {n}-line failed run ({mode} insights): {m * 1000:.0f} ms "
              f"(without insights {base * 1000:.0f} ms: {m / base:.2f}x; target <= 300 ms)")


def bench_ls(tmp: Path, n: int, rounds: int) -> None:
    import re

    from logcapture.insights.matchers import CANDIDATE
    from logcapture.runs import summarize
    from logcapture.spool.reading import segment_data

    root = tmp / "ls-spool"
    write_run(root, "train-1", n)
    run_dir = root / "train-1"
    s = summarize(run_dir)
    regex = re.compile(CANDIDATE.pattern.encode())

    def timed(fn: object) -> float:
        out = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    kinds = [i.kind for i in spool_insights(run_dir, s.start, s.end)]
    assert kinds[:1] == ["cuda-oom"], kinds
    base = timed(lambda: summarize(run_dir))
    ours = timed(lambda: spool_insights(run_dir, s.start, s.end))
    one_regex = timed(lambda: [sum(1 for _ in regex.finditer(segment_data(seg)[0]))
                               for seg in segments(run_dir)])
    print(f"3. ls of a spool with a {n}-line failed run: the kinds show lists in "
          f"{ours * 1000:.0f} ms (the End record alone {base * 1000:.0f} ms: "
          f"{ours / base:.1f}x; one regular expression of the needles "
          f"{one_regex * 1000:.0f} ms: {one_regex / ours:.1f}x ours)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--show-lines", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    tmp = Path(tempfile.mkdtemp(prefix="bench-insights-"))
    try:
        bench_ship(tmp, args.lines, args.rounds)
        bench_show(tmp, args.show_lines, args.rounds)
        bench_ls(tmp, args.lines, args.rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
