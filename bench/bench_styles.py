"""What keeping a line's colours costs in the store: the stored bytes of a colourful log with
its styles against the same log without them, both through the real store.

    .venv/bin/python bench/bench_styles.py [--lines 30000]

The log: the real programs' bytes of tests/captured (Lightning 2.6's rich and tqdm bars,
pytest --color=yes, rich's progress and console.log, pip's download bar, coloured logging,
git diff, grep and ls) and a
Lightning-like training log (rich's progress bar per epoch, coloured metrics, a model summary
table, warnings), each rendered by logcapture's Renderer, repeated with the numbers changed
until ``--lines``. The same lines go into the store twice, as two runs in two daily
partitions: once as captured (``style`` set where a line has colours) and once plain (no
``style``), through ``Store.insert_ndjson`` (the ingest's bytes path). After ``OPTIMIZE
FINAL`` the compressed bytes of each partition's ``lines`` parts are compared (all columns,
the token index included). Target: styled / plain <= 1.15.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from logcapture import store as S  # noqa: E402
from logcapture.records import Line  # noqa: E402
from logcapture.render import Renderer  # noqa: E402

CAPTURED = ROOT / "tests" / "captured"
REAL = ("pytest_color", "rich_progress", "rich_console_log", "pip_download", "colour_logging",
        "git_diff_color", "grep_color", "ls_color", "lightning_rich", "lightning_tqdm")


def lightning_like(rng: random.Random, epoch: int) -> bytes:
    """One epoch of a Lightning-style log as rich writes it to a terminal."""
    out = []
    if epoch == 0:
        out.append("\x1b[1m┏━━━┳━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━┳━━━━━━━━┓\x1b[0m\n"
                   "\x1b[1m┃\x1b[0m\x1b[1;35m   \x1b[0m\x1b[1m┃\x1b[0m\x1b[1;35m Name    \x1b[0m"
                   "\x1b[1m┃\x1b[0m\x1b[1;35m Type              \x1b[0m\x1b[1m┃\x1b[0m"
                   "\x1b[1;35m Params \x1b[0m\x1b[1m┃\x1b[0m\n")
        for i, (name, kind, n) in enumerate((("model", "ResNet", "11.2 M"),
                                             ("loss_fn", "CrossEntropyLoss", "0"),
                                             ("accuracy", "MulticlassAccuracy", "0"))):
            out.append(f"│\x1b[2m \x1b[0m\x1b[2m{i}\x1b[0m\x1b[2m \x1b[0m│ {name:<7} │ "
                       f"{kind:<17} │ {n:>6} │\n")
        out.append("\x1b[1mTrainable params\x1b[0m: 11.2 M\n")
    steps = 40
    for s in range(0, steps + 1, 4):
        bar = "\x1b[38;2;249;38;114m" + "━" * s + "\x1b[0m\x1b[38;5;237m" + "━" * (steps - s)
        out.append(f"\rEpoch {epoch}/99 {bar}\x1b[0m {s * 25}/1000 \x1b[2m0:00:{s:02d} • "
                   f"0:00:{40 - s:02d}\x1b[0m \x1b[2;4m{rng.uniform(20, 30):.2f}it/s\x1b[0m "
                   f"\x1b[2mv_num: 0 train_loss: {rng.uniform(0.1, 2):.3f}\x1b[0m\x1b[K")
    out.append("\n")
    out.append(f"\x1b[32mINFO\x1b[0m: Epoch {epoch}: val_loss {rng.uniform(0.1, 2):.4f} "
               f"val_acc \x1b[1m{rng.uniform(0.5, 1):.4f}\x1b[0m\n")
    if epoch % 7 == 3:
        out.append("\x1b[33mWARNING\x1b[0m: The dataloader does not have many workers which "
                   "may be a bottleneck.\n")
    return "".join(out).encode()


def rendered(raw: bytes) -> list[tuple[str, tuple]]:
    r = Renderer()
    return [(x.text, x.style) for x in r.feed(raw) + r.finish()]


def colourful_log(n: int, seed: int = 7) -> list[tuple[str, tuple]]:
    rng = random.Random(seed)
    real = [rendered((CAPTURED / f"{name}.input").read_bytes()) for name in REAL]
    out: list[tuple[str, tuple]] = []
    epoch = 0
    while len(out) < n:
        out += rendered(lightning_like(rng, epoch))
        if epoch % 5 == 0:
            out += real[(epoch // 5) % len(real)]
        epoch += 1
    return out[:n]


def ndjson(lines: list[tuple[str, tuple]], run: str, t0: float, styled: bool) -> bytes:
    return "".join(Line(run=run, stream="stdout", seq=i, ts=t0 + i * 0.01, text=text,
                        style=style if styled else ()).to_json() + "\n"
                   for i, (text, style) in enumerate(lines)).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=30000)
    args = ap.parse_args()
    lines = colourful_log(args.lines)
    share = sum(1 for _, s in lines if s) / len(lines)
    day = (time.time() // 86400 - 5) * 86400 + 43200
    days = {"styled": day, "plain": day + 86400}
    with tempfile.TemporaryDirectory(prefix="bench-styles-") as tmp, \
            S.open_store(f"chdb://{Path(tmp) / 'store'}") as st:
        sizes = {}
        for what, t0 in days.items():
            ident = S.Identity(run=what, user="bench", uid=os.getuid())
            res = st.insert_ndjson(ndjson(lines, what, t0, what == "styled"), ident)
            assert res.rows == len(lines) and not res.slow_path, res
        st.client.command("OPTIMIZE TABLE lines FINAL")
        for what, t0 in days.items():
            parts = st.client.query(
                "SELECT sum(data_compressed_bytes) + sum(secondary_indices_compressed_bytes), "
                "sum(rows) FROM system.parts WHERE active AND database = currentDatabase() "
                "AND table = 'lines' AND partition = {day:String}",
                parameters={"day": time.strftime("%Y-%m-%d", time.gmtime(t0))}).result_rows[0]
            assert parts[1] == len(lines), (what, parts)
            sizes[what] = parts[0]
        styles = st.client.query(
            "SELECT sum(length(style)), countIf(style != '') FROM lines WHERE run = 'styled'"
        ).result_rows[0]
    text_bytes = sum(len(t.encode()) for t, _ in lines)
    print(f"a colourful log: {len(lines):,} lines, {share:.0%} of them styled, "
          f"{text_bytes / 1e6:.2f} MB of text, {styles[0] / 1e6:.2f} MB of style JSON "
          f"({styles[1]:,} lines)")
    print(f"stored without styles: {sizes['plain'] / 1e6:.3f} MB "
          f"({sizes['plain'] / len(lines):.2f} bytes a line)")
    print(f"stored with styles:    {sizes['styled'] / 1e6:.3f} MB "
          f"({sizes['styled'] / len(lines):.2f} bytes a line)")
    ratio = sizes["styled"] / sizes["plain"]
    print(f"ratio styled/plain {ratio:.3f}  (target <= 1.15) "
          f"{'ok' if ratio <= 1.15 else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
