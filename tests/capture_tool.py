"""Record real programs' output through a pty, for the golden tests of the render stage.

    .venv/bin/python tests/capture_tool.py NAME [NAME ...]     # run the recipes named
    .venv/bin/python tests/capture_tool.py --all
    .venv/bin/python tests/capture_tool.py --outputs            # re-derive every NAME.output

Each recipe runs under a fresh pty set up as logcapture's runner does it: 80x24 window size
(TIOCSWINSZ, PTY-RENDER.md: without it tqdm prints nothing), no output post-processing
(OPOST off, so the bytes are exactly what the program wrote), TERM=xterm-256color. The raw
bytes go to ``tests/captured/NAME.input``; the lines the current renderer makes of them go to
``NAME.output`` (a JSON list of strings) -- review that file by eye before committing it: it
is the expectation the tests hold the renderer to. Needs tqdm and rich only when capturing;
the tests read the committed files.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

HERE = Path(__file__).parent
CAPTURED = HERE / "captured"
PY = sys.executable

RECIPES: dict[str, list[str]] = {
    "tqdm": [PY, "-c", """
import time
from tqdm import tqdm
print("start")
for _ in tqdm(range(200), desc="train", mininterval=0.01):
    time.sleep(0.002)
print("done")
"""],
    "tqdm_nested": [PY, "-c", """
import time
from tqdm import tqdm
for epoch in tqdm(range(3), desc="epoch", position=0):
    for _ in tqdm(range(40), desc="batch", position=1, leave=False, mininterval=0.01):
        time.sleep(0.002)
    tqdm.write(f"epoch {epoch} loss 0.{9 - epoch}")
print("finished")
"""],
    "rich_progress": [PY, "-c", """
import time
from rich.progress import Progress
from rich.console import Console
Console().print("[bold green]downloading[/] two files")
with Progress() as progress:
    a = progress.add_task("[red]model.bin", total=60)
    b = progress.add_task("[cyan]vocab.txt", total=30)
    while not progress.finished:
        progress.update(a, advance=2)
        progress.update(b, advance=1)
        time.sleep(0.02)
print("all done")
"""],
    "pip_download": [PY, "-c", """
import time
from pip._internal.cli.progress_bars import get_download_progress_renderer
print("Collecting torch")
print("  Downloading torch-2.3.0-cp311-cp311-manylinux1_x86_64.whl (779.1 MB)")
chunks = [b"x" * 1_000_000] * 60
def slow():
    for c in chunks:
        time.sleep(0.01)
        yield c
renderer = get_download_progress_renderer(bar_type="on", size=60_000_000)
for _ in renderer(slow()):
    pass
print("Installing collected packages: torch")
print("Successfully installed torch-2.3.0")
"""],
    "colour_logging": [PY, "-c", """
import logging, sys
COLOURS = {"DEBUG": "36", "INFO": "32", "WARNING": "33", "ERROR": "1;31"}
class Colour(logging.Formatter):
    def format(self, record):
        c = COLOURS[record.levelname]
        name = f"\\x1b[2m{record.name}\\x1b[0m"
        return f"\\x1b[{c}m{record.levelname:<8}\\x1b[0m {name} {record.getMessage()}"
h = logging.StreamHandler(sys.stdout)
h.setFormatter(Colour())
log = logging.getLogger("train")
log.addHandler(h)
log.setLevel(logging.DEBUG)
log.debug("config loaded")
log.info("epoch 1 started")
log.info("epoch 1 started")
log.info("epoch 1 started")
log.warning("learning rate %s is high", 0.1)
print()
print()
log.error("nan loss at step %d", 42)
print("\\x1b[38;5;208m256-colour\\x1b[0m and \\x1b[38;2;10;20;30mtruecolour\\x1b[0m text")
"""],
    "dd_progress": ["sh", "-c", PY + " -c 'import sys, time\n"
                    "for _ in range(25): sys.stdout.buffer.write(bytes(100_000)); "
                    "sys.stdout.flush(); time.sleep(0.1)' "
                    "| dd of=/dev/null bs=4k status=progress; echo end"],
    "curses": [PY, "-c", """
import curses, time
print("before curses")
def main(scr):
    curses.curs_set(0)
    scr.clear()
    scr.border()
    scr.addstr(1, 2, "Dashboard", curses.A_BOLD)
    for i in range(5):
        scr.addstr(3, 2, f"step {i}/4  loss {1.0 / (i + 1):.3f}")
        scr.addstr(4, 2, "#" * (i * 10))
        scr.refresh()
        time.sleep(0.05)
curses.wrapper(main)
print("after curses")
"""],
}


def capture(argv: list[str], columns: int = 80, rows: int = 24) -> bytes:
    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # oflag: bytes exactly as written
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(columns), LINES=str(rows))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                            start_new_session=True, close_fds=True)
    os.close(slave)
    data = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the slave side is closed
            break
        if not chunk:
            break
        data += chunk
    os.close(master)
    proc.wait()
    return bytes(data)


def derive_output(name: str) -> None:
    sys.path.insert(0, str(HERE.parent))
    from logcapture.render import Renderer

    raw = (CAPTURED / f"{name}.input").read_bytes()
    r = Renderer()
    lines = [x.text for x in r.feed(raw) + r.finish()]
    (CAPTURED / f"{name}.output").write_text(
        json.dumps(lines, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def main(args: list[str]) -> None:
    CAPTURED.mkdir(exist_ok=True)
    if args == ["--outputs"]:
        for p in sorted(CAPTURED.glob("*.input")):
            derive_output(p.stem)
        return
    names = list(RECIPES) if args == ["--all"] else args
    for name in names:
        raw = capture(RECIPES[name])
        (CAPTURED / f"{name}.input").write_bytes(raw)
        derive_output(name)
        print(f"{name}: {len(raw)} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
