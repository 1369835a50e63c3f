"""What the batch capture spends on srun's copy of its tasks' output: through the batch pty
(rendered, classified and spooled again as batch lines: how it was before srun's output was
forwarded) against through the pipes of logcapture.slurm.forward (copied, not stored).

The batch script runs a writer that plays srun: it connects to the batch capture as the SPANK
plugin does (or does not: the baseline) and writes N lines in 4 KiB writes, as srun forwards
its tasks' output; the script prints a line before and after. Each variant runs under
``capture.capture_command`` (reader and worker processes, as the job wrapper runs it) in its
own process, interleaved, ``--rounds`` times; the capture CPU comes from the run's end record
(reader + worker), the wall time is the command's. The output files are checked equal.

  .venv/bin/python bench/bench_forward.py [--lines 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent

WRITER = r"""
import os, socket, sys
address = sys.argv[1].encode().replace(b"@", b"\0", 1)
n, forward = int(sys.argv[2]), sys.argv[3] == "1"
saved, sock = {}, None
if forward:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    socket.send_fds(sock, [b"F"], [1, 2])
    reply, fds, _, _ = socket.recv_fds(sock, 3, 2)
    for fd, index in zip((1, 2), reply[1:], strict=True):
        if index != ord("-"):
            saved[fd] = os.dup(fd)
            os.dup2(fds[index - ord("0")], fd)
line = b"rank 0 step %d loss 0.125 lr 3e-4 tokens/s 41234.5 some more text to fill it\n"
buf = b""
for i in range(n):
    buf += line % i
    if len(buf) >= 4096:
        os.write(1, buf)
        buf = b""
os.write(1, buf + b"srun: error: n3: task 1: Exited with exit code 3\n")
if sock is not None:
    for fd, original in saved.items():
        os.dup2(original, fd)
    sock.send(b"E")
    sock.recv(1)
"""

CAPTURE = r"""
import sys
from pathlib import Path
from logcapture.capture import capture_command
from logcapture.errors import Warner
from logcapture.slurm.forward import Forwarder
address, forward, spool = sys.argv[1], sys.argv[2] == "1", Path(sys.argv[3])
beside = Forwarder(address.encode().replace(b"@", b"\0", 1)) if forward else None
sys.exit(capture_command(sys.argv[4:], spool_root=spool, run_id="bench", warn=Warner(),
                         sample=False, beside=beside))
"""


def one(forward: bool, lines: int, tmp: Path, n: int) -> tuple[float, int, bytes]:
    address = f"@logcapture-bench/{os.getpid()}/{n}"
    spool = tmp / f"spool{n}"
    spool.mkdir()
    out = tmp / f"out{n}"
    script = (f"echo before; {PY} -c '{WRITER}' {address} {lines} {int(forward)}; "
              "echo after")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LOGCAPTURE_OPTIN": str(tmp / "optin")}
    started = time.monotonic()
    with open(out, "wb") as f:
        subprocess.run([PY, "-c", CAPTURE, address, str(int(forward)), str(spool), "bash",
                        "-c", script], stdout=f, stderr=subprocess.STDOUT, env=env,
                       check=True)
    wall = time.monotonic() - started
    from logcapture.spool.reading import iter_run

    ends = [r for r in iter_run(spool / "bench") if r.kind == "end"]
    cpu = int(ends[0].counts["capture"]["cpu_ms"])  # type: ignore[attr-defined]
    return wall, cpu, out.read_bytes()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results: dict[bool, list[tuple[float, int]]] = {False: [], True: []}
    outputs: set[bytes] = set()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "optin").write_text("")
        n = 0
        for _ in range(args.rounds):
            for forward in (False, True):
                n += 1
                wall, cpu, out = one(forward, args.lines, tmp, n)
                results[forward].append((wall, cpu))
                outputs.add(out)
    assert len(outputs) == 1, "the output files differ"
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
           for k, v in results.items()}
    for forward, name in ((False, "through the batch pty"), (True, "forwarded (pipes)")):
        wall, cpu = med[forward]
        print(f"{name:24} wall {wall:6.2f} s   capture CPU {cpu / 1000:6.2f} s")
    print(f"ratio forwarded / pty:   wall {med[True][0] / med[False][0]:.2f}   "
          f"capture CPU {med[True][1] / max(1, med[False][1]):.2f}")


if __name__ == "__main__":
    main()
