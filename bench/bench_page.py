"""Figures of `logcapture serve`'s job page, each beside a baseline measured in the same run:

1. server time to the first screen of a 2M-line job (HTML, header, newest log page, metadata
   and resources: every request the page makes before it can draw), from the spool (a run not
   shipped yet) and from the store (shipped); baseline: `tail -n 1000` of the job's own output
   file. Goal <= 200 ms.
2. browser time until the log and graphs are drawn (headless Chromium, navigation start to
   the page's "ready" mark); baseline: the same 1000 lines as a static <pre> page. Goal <= 1 s.
3. print-to-visible latency of a live line (a job printing its clock every 0.25 s; the
   browser notes when each line reaches the screen): p50 and p99; baseline: the same lines
   read by `tail -f` on the job's output file. Goal p99 <= 2 s.
4. a graph of 100k points drawn (uPlot, as the page draws it); baseline: the same points as
   one canvas path by hand. Goal <= 300 ms.

    .venv/bin/python bench/bench_page.py [--lines 2000000] [--rounds 5]

Needs Debian's chromium and chromium-driver (as the browser tests).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import LOGCAPTURE, env_for, lc  # noqa: E402
from pages import Serve, chromium  # noqa: E402

BIG = """
import json, sys
n = int(sys.argv[1])
out = sys.stdout
for i in range(n):
    if i % 1000 == 0:
        out.write(json.dumps({"step": i, "loss": 1 / (1 + i / 1e5), "lr": 0.1}) + "\\n")
    else:
        out.write(f"step {i}: training batch {i % 977} of the epoch, all fine\\n")
"""

LIVE = """
import time
for i in range(int(__import__('sys').argv[1])):
    print(f"live {i} {time.time():.6f}", flush=True)
    time.sleep(0.25)
"""


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def first_screen(serve: Serve, run: str, rounds: int) -> list[float]:
    """Wall time of the requests the job page makes before it draws, in one client."""
    paths = [f"/job/{run}", f"/api/runs/{run}", f"/api/runs/{run}/log?limit=300",
             f"/api/runs/{run}/metadata", f"/api/runs/{run}/resources"]
    times = []
    each: dict[str, list[float]] = {p: [] for p in paths}
    with httpx.Client(base_url=serve.base, timeout=600) as c:
        c.get(serve.url)  # the cookie
        for _ in range(rounds):
            t = time.perf_counter()
            for p in paths:
                t1 = time.perf_counter()
                r = c.get(p)
                r.raise_for_status()
                each[p].append(time.perf_counter() - t1)
            times.append(time.perf_counter() - t)
    print("   " + ", ".join(f"{p.rsplit('/', 1)[-1]} {ms(statistics.median(v))}"
                            for p, v in each.items()))
    return times


def tail_baseline(path: Path, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        subprocess.run(["tail", "-n", "1000", str(path)], check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return times


def browser_ready(d, url: str, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        d.get(url)
        for _ in range(600):
            if d.execute_script("return document.body.dataset.ready") == "1":
                break
            time.sleep(0.02)
        times.append(d.execute_script(
            "return performance.getEntriesByName('lc-graphs')[0].startTime") / 1000)
        times[-1] = max(times[-1], d.execute_script(
            "return performance.getEntriesByName('lc-log')[0].startTime") / 1000)
    return times


def static_ready(d, base: str, path: Path, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        d.get(base)
        times.append(d.execute_script(
            "const t = performance.getEntriesByType('navigation')[0];"
            "return t.loadEventEnd || t.domComplete") / 1000)
    return times


def graph_points(d, serve: Serve, n: int, rounds: int) -> tuple[list[float], list[float]]:
    d.get(serve.base + "/compare")
    script = """
    const n = arguments[0], done = arguments[arguments.length - 1];
    const x = new Float64Array(n), y = new Float64Array(n);
    for (let i = 0; i < n; i++) { x[i] = i; y[i] = Math.sin(i / 500) + Math.random() * 0.1; }
    const box = document.createElement('div'); box.style.width = '1000px';
    document.body.append(box);
    const t0 = performance.now();
    LC.chart(box, {title: 'bench', xLabel: 'step', x: Array.from(x),
                   series: [{label: 'y', values: Array.from(y)}]});
    const uplot = performance.now() - t0;
    const c = document.createElement('canvas'); c.width = 1000; c.height = 240;
    document.body.append(c);
    const t1 = performance.now();
    const g = c.getContext('2d'); g.beginPath();
    for (let i = 0; i < n; i++) g.lineTo(i / n * 1000, 120 - y[i] * 100);
    g.stroke();
    const plain = performance.now() - t1;
    box.remove(); c.remove();
    requestAnimationFrame(() => done([uplot, plain]));
    """
    ours, base = [], []
    for _ in range(rounds):
        a, b = d.execute_async_script(script, n)
        ours.append(a / 1000)
        base.append(b / 1000)
    return ours, base


def live_latency(serve: Serve, env: dict[str, str], d, lines: int
                 ) -> tuple[list[float], list[float]]:
    out = Path(env["LOGCAPTURE_SPOOL"]).parent / "live.out"
    f = out.open("w")
    job = subprocess.Popen([*LOGCAPTURE, "run", "--run-id", "live", "--", sys.executable, "-c",
                            LIVE, str(lines)], env=env, stdout=f, stderr=subprocess.DEVNULL)
    tail_lat: list[float] = []

    def tail() -> None:
        p = subprocess.Popen(["tail", "-F", "-n", "+1", str(out)], stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout is not None
        for line in p.stdout:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "live":
                tail_lat.append(time.time() - float(parts[2]))
                if int(parts[1]) == lines - 1:
                    break
        p.kill()
        p.wait()

    t = threading.Thread(target=tail)
    t.start()
    while not (Path(env["LOGCAPTURE_SPOOL"]) / "live").exists():
        time.sleep(0.05)
    d.get(serve.base + "/job/live")
    d.execute_script("""
      window.seen = {}; window.lat = [];
      new MutationObserver(() => {
        for (const e of document.querySelectorAll('#log .row .t')) {
          const p = e.textContent.split(' ');
          if (p[0] === 'live' && !(p[1] in window.seen)) {
            window.seen[p[1]] = 1; window.lat.push(Date.now() / 1000 - parseFloat(p[2]));
          }
        }
      }).observe(document.getElementById('log-rows'), {childList: true, subtree: true});
    """)
    job.wait()
    f.close()
    t.join(30)
    time.sleep(2)
    page_lat = d.execute_script("return window.lat")
    return page_lat, tail_lat


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--live-lines", type=int, default=60)
    ap.add_argument("--points", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = env_for(tmp)
        output = tmp / "big.out"
        t = time.perf_counter()
        with output.open("w") as f:
            lc(["run", "--run-id", "big", "--no-sample", "--", sys.executable, "-c", BIG,
                str(args.lines)], env, stdout=f, capture_output=False, check=True, timeout=3600)
        print(f"captured {args.lines} lines in {time.perf_counter() - t:.1f} s")
        with Serve(env) as serve:
            ours = first_screen(serve, "big", args.rounds + 1)
            print(f"first open from the spool (reads the run once): {ms(ours[0])}")
            spool = ours[1:]
        t = time.perf_counter()
        lc(["upload", "big"], env, check=True, timeout=3600)
        print(f"shipped to the embedded store in {time.perf_counter() - t:.1f} s")
        base = tail_baseline(output, args.rounds)
        with Serve(env) as serve:
            # shipped: the page reads the run from the store now, as `logs` does
            store = first_screen(serve, "big", args.rounds + 1)[1:]
            d = chromium(tmp / "profile")
            try:
                d.get(serve.url)
                page = browser_ready(d, serve.base + "/job/big", args.rounds)
                static = tmp / "static.html"
                static.write_text("<pre>" + "".join(output.read_text().splitlines(True)[-1000:])
                                  + "</pre>")
                plain = static_ready(d, static.as_uri(), static, args.rounds)
                g_ours, g_base = graph_points(d, serve, args.points, args.rounds)
                live_page, live_tail = live_latency(serve, env, d, args.live_lines)
            finally:
                d.quit()
    b = statistics.median(base)
    print(f"\n1. server time to the first screen of a {args.lines:,}-line job "
          "(5 requests, median):")
    print(f"   from the store: {ms(statistics.median(store))}  (goal 200 ms); "
          f"from the spool, once read: {ms(statistics.median(spool))}")
    print(f"   baseline tail -n 1000 of the output file: {ms(b)}; ratio store/tail "
          f"{statistics.median(store) / b:.1f}x")
    print(f"2. browser, navigation to log and graphs drawn: {ms(statistics.median(page))} "
          f"(goal 1 s); baseline static <pre> of 1000 lines {ms(statistics.median(plain))}; "
          f"ratio {statistics.median(page) / max(statistics.median(plain), 1e-3):.1f}x")
    print(f"3. print to visible, live: p50 {ms(pct(live_page, .5))}, p99 "
          f"{ms(pct(live_page, .99))} over {len(live_page)} lines (goal p99 2 s); baseline "
          f"tail -F p50 {ms(pct(live_tail, .5))}, p99 {ms(pct(live_tail, .99))}")
    print(f"4. {args.points:,} points drawn: uPlot {ms(statistics.median(g_ours))} "
          f"(goal 300 ms); baseline one canvas path {ms(statistics.median(g_base))}; ratio "
          f"{statistics.median(g_ours) / max(statistics.median(g_base), 1e-4):.1f}x")
    print(json.dumps({"store_first_screen_s": statistics.median(store),
                      "spool_first_screen_s": statistics.median(spool),
                      "spool_first_open_s": ours[0], "tail_s": b,
                      "browser_ready_s": statistics.median(page),
                      "static_ready_s": statistics.median(plain),
                      "live_p50_s": pct(live_page, .5), "live_p99_s": pct(live_page, .99),
                      "tail_f_p99_s": pct(live_tail, .99),
                      "graph_s": statistics.median(g_ours),
                      "canvas_s": statistics.median(g_base)}))


if __name__ == "__main__":
    main()
