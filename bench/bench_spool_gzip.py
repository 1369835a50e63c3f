"""Closing a spool segment: ``spool.gzip_compress`` (ISA-L when installed) against zlib's gzip at
the same level, measured in the same run.

    .venv/bin/python bench/bench_spool_gzip.py [--lines 100000] [--repeat 5]

Two segments' worth of the spool's own NDJSON, written by a real ``SpoolWriter``: the
``prints`` benchmark's lines (``line N xxx...``) and a training job's log lines with a JSON
metrics line every 10th. Prints CPU MB/s, the compressed size of each and the ratios; the
best of ``--repeat``. Both outputs are checked to decompress to the input.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from logcapture.records import Line, Metadata  # noqa: E402
from logcapture.spool import layout as spool  # noqa: E402
from logcapture.spool.writer import SpoolWriter  # noqa: E402


def ndjson(kind: str, n: int) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = spool.create_run_dir(Path(tmp), "bench")
        w = SpoolWriter(run_dir, segment_bytes=1 << 40, fsync=False)
        t0 = time.time()
        recs = []
        for i in range(n):
            ts = t0 + i * 1e-3
            if kind == "prints":
                recs.append(Line(run="bench", stream="stdout", seq=i, ts=ts,
                                 text=f"line {i} " + "x" * 60))
            elif i % 10 == 0:
                recs.append(Metadata(run="bench", stream="stdout", seq=i, ts=ts,
                                     fields={"step": i, "loss": 1 / (i + 1), "lr": 1e-4}))
            else:
                recs.append(Line(run="bench", stream="stdout", seq=i, ts=ts,
                                 text=f"12:00:{i % 60:02d} INFO train: epoch {i // 5000} step {i} "
                                      f"loss {round(1 / (i + 1), 6)} grad_norm "
                                      f"{round((i % 97) / 31, 4)}"))
        w.write(recs)
        w.flush()
        data = b"".join(p.read_bytes() for p in sorted(run_dir.glob("seg-*.ndjson")))
        w.close()
        return data


def best(fn, data: bytes, repeat: int) -> tuple[float, bytes]:
    times, out = [], b""
    for _ in range(repeat):
        t = time.process_time()
        out = fn(data)
        times.append(time.process_time() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    try:
        import isal  # noqa: F401
        engine = "ISA-L (isal)"
    except ImportError:
        engine = "zlib (isal not installed)"
    print(f"# spool.gzip_compress uses {engine}; level {spool.COMPRESS_LEVEL}")
    for kind in ("prints", "training"):
        data = ndjson(kind, args.lines)
        base_t, base = best(lambda d: gzip.compress(d, compresslevel=spool.COMPRESS_LEVEL,
                                                    mtime=0), data, args.repeat)
        ours_t, ours = best(spool.gzip_compress, data, args.repeat)
        assert gzip.decompress(base) == data and gzip.decompress(ours) == data
        mb = len(data) / 1e6
        print(f"\n## {kind}: {args.lines:,} records, {mb:.1f} MB of NDJSON")
        print(f"baseline gzip.compress (zlib): {mb / base_t:8.0f} MB/s  {len(base) / 1e6:.2f} MB")
        print(f"spool.gzip_compress:           {mb / ours_t:8.0f} MB/s  {len(ours) / 1e6:.2f} MB")
        print(f"ratio: {base_t / ours_t:.1f}x as fast; size {len(ours) / len(base):.3f}x "
              f"the baseline's; per 1M records {ours_t * 1e6 / args.lines:.2f} s instead of "
              f"{base_t * 1e6 / args.lines:.2f} s")


if __name__ == "__main__":
    main()
