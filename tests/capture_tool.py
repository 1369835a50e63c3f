"""Record real programs' output through a pty, for the golden tests of the render stage.

    .venv/bin/python tests/capture_tool.py NAME [NAME ...]     # run the recipes named
    .venv/bin/python tests/capture_tool.py --all
    .venv/bin/python tests/capture_tool.py --outputs            # re-derive every NAME.output
    .venv/bin/python tests/capture_tool.py --check              # compare with a real terminal

Each recipe runs under a fresh pty set up as logcapture's runner does it: a window size
(TIOCSWINSZ; 80x24 unless ``SIZES`` says otherwise; without one tqdm prints nothing), no output
post-processing (OPOST off, so the bytes are exactly what the program wrote), stdout and stderr
on the same pty, TERM=xterm-256color. The raw bytes go to ``tests/captured/NAME.input``; the
lines the current renderer makes of them go to ``NAME.output`` (a JSON list of strings).

The expectation is checked against a real terminal, not by eye alone: ``terminal_lines`` plays
the bytes in tmux at the same size and reads its screen and history back with the wrapped rows
joined (``capture-pane -J``); ``--check`` and tests/test_render.py compare. ``NOT_TERMINAL``
lists where the log deliberately differs, and why. Needs tqdm and rich only when capturing, and
tmux for the comparison; the tests read the committed files.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
from pathlib import Path
from typing import Any

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
    # Keras 3's own progress bar (keras.utils.Progbar, what model.fit prints at verbose=1),
    # two epochs of 30 steps with a loss, each step 0.05 s: the numpy backend needs no GPU.
    "keras_progbar": [PY, "-c", """
import os, time
os.environ.setdefault("KERAS_BACKEND", "numpy")
from keras.utils import Progbar
for epoch in (1, 2):
    print(f"Epoch {epoch}/2")
    bar = Progbar(30)
    for step in range(1, 31):
        time.sleep(0.05)
        bar.update(step, values=[("loss", 1.0 / (step + 30 * epoch))])
print("trained")
"""],
    # tqdm over 3 seconds: a series of several points (at most one a second).
    "tqdm_slow": [PY, "-c", """
import time
from tqdm import tqdm
for _ in tqdm(range(60), desc="train", mininterval=0.1):
    time.sleep(0.05)
print("done")
"""],
    # wget's own bar, downloading 3 MB over about 2 s from a local server (no network).
    "wget_download": [PY, "-c", """
import http.server, subprocess, tempfile, threading, time
class Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(30 * 100_000))
        self.end_headers()
        for _ in range(30):
            self.wfile.write(b"x" * 100_000)
            self.wfile.flush()
            time.sleep(0.07)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
threading.Thread(target=srv.serve_forever, daemon=True).start()
with tempfile.TemporaryDirectory() as d:
    subprocess.run(["wget", "--no-verbose", "--show-progress", "--progress=bar:force",
                    "-O", d + "/model.bin", f"http://127.0.0.1:{srv.server_port}/model.bin"])
print("downloaded")
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


# A rich progress display of two bars, live on stdout, while a C library writes a long warning
# (NCCL-like) straight to fd 2, the same terminal: rich's next refresh moves up over what it
# believes are its own two rows and erases them, one of which is the warning's second row.
RECIPES["rich_live_fd_write"] = [PY, "-c", r'''
import os, time
from rich.progress import Progress
with Progress(refresh_per_second=20) as progress:
    a = progress.add_task("epoch 1", total=30)
    b = progress.add_task("batches", total=30)
    for i in range(30):
        progress.update(a, advance=1)
        progress.update(b, advance=1)
        if i in (10, 20):
            os.write(2, b"W1124 09:12:44.912345 2231 ProcessGroupNCCL.cpp:1249] Warning: the NCCL "
                        b"communicator for rank 3 was created with blocking wait; collectives "
                        b"may hang if a peer fails (step %d)\n" % i)
        time.sleep(0.03)
print("done")
''']
# rich's console.log between the refreshes of a live progress display, with log lines longer
# than the width (rich wraps them itself) and a final print that wraps.
RECIPES["rich_console_log"] = [PY, "-c", r'''
import time
from rich.progress import Progress
with Progress(refresh_per_second=20) as progress:
    t = progress.add_task("[green]train", total=40)
    v = progress.add_task("[cyan]eval", total=40)
    for i in range(40):
        progress.update(t, advance=1)
        progress.update(v, advance=1)
        if i % 10 == 5:
            progress.console.log(f"step {i}: loss 0.{90 - i} " + "lr 3e-4 " * (i // 3))
        time.sleep(0.02)
progress.console.print("finished: " + "all checkpoints written to /scratch/run-42/ckpt; " * 2)
''']
# A bar wider than the terminal (a fixed ncols), redrawn with \r: each redraw wraps.
RECIPES["tqdm_too_wide"] = [PY, "-c", r'''
import time
from tqdm import tqdm
print("start")
for _ in tqdm(range(30), desc="a long description for a bar", ncols=100, mininterval=0):
    time.sleep(0.005)
print("done")
''']
# Nested bars moving up and down (tqdm moves down with newlines) around a message that wraps.
RECIPES["tqdm_write_long"] = [PY, "-c", r'''
import time
from tqdm import tqdm
for epoch in tqdm(range(2), desc="epoch", position=0):
    for i in tqdm(range(20), desc="batch", position=1, leave=False, mininterval=0):
        if i == 10:
            tqdm.write(f"epoch {epoch}: validation accuracy 0.9{epoch} on 10000 samples, "
                       "best so far; checkpoint saved to /scratch/run/ckpt.pt")
        time.sleep(0.005)
print("finished")
''']
# pip's download bar (rich, live) on a narrow terminal after lines that wrap.
RECIPES["pip_download_narrow"] = [*RECIPES["pip_download"]]

# Coloured output of everyday programs, for the styles (docs/rendering.md, "Colours"): each
# makes its own files in a temporary folder and colours as it would in a terminal.
_COLOUR_SETUP = """set -e
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT; cd "$d"
"""
RECIPES["pytest_color"] = ["bash", "-c", _COLOUR_SETUP + f"""
cat > test_demo.py <<'END'
import pytest

def test_ok():
    assert 1 + 1 == 2

@pytest.mark.skip(reason="not today")
def test_skipped():
    pass

def test_fails():
    assert {{"loss": 0.5}} == {{"loss": 0.25}}
END
{PY} -m pytest --color=yes -p no:cacheprovider -o console_output_style=classic test_demo.py \
    || true
"""]
RECIPES["ls_color"] = ["bash", "-c", _COLOUR_SETUP + """
mkdir data logs; touch run.sh notes.txt model.tar.gz; chmod +x run.sh; ln -s data latest
LS_COLORS= ls --color=always -1
"""]
RECIPES["grep_color"] = ["bash", "-c", _COLOUR_SETUP + """
printf 'step 1 ok\nstep 2 ERROR: loss is nan\nstep 3 ok\nERROR again, ERROR twice\n' > train.log
GREP_COLORS= grep --color=always -n ERROR train.log
"""]
RECIPES["git_diff_color"] = ["bash", "-c", _COLOUR_SETUP + """
git init -q .; git config user.email a@b.c; git config user.name demo
printf 'lr = 0.1\nepochs = 10\nbatch = 32\n' > train.cfg; git add .; git commit -qm one
printf 'lr = 0.01\nepochs = 10\nbatch = 64\nwarmup = 100\n' > train.cfg
git -c color.ui=always --no-pager diff
"""]

#: Window size (columns, rows) of the recipes not run at 80x24.
# Lightning 2.6's two progress bars (rich's and tqdm's) over a real training run: two epochs
# with validation, captured on an NVIDIA H100 (PyTorch 2.11) at 120x30.
RECIPES["lightning_rich"] = [PY, "-c", r'''
import sys, warnings
import torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
warnings.filterwarnings("ignore")
class M(L.LightningModule):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(32, 1)
    def training_step(self, b, i):
        loss = torch.nn.functional.mse_loss(self.l(b[0]), b[1])
        self.log("train_loss", loss, prog_bar=True); return loss
    def validation_step(self, b, i):
        self.log("val_loss", torch.nn.functional.mse_loss(self.l(b[0]), b[1]), prog_bar=True)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
ds = TensorDataset(torch.randn(20000, 32), torch.randn(20000, 1))
bar = (L.pytorch.callbacks.RichProgressBar() if sys.argv[1] == "rich"
       else L.pytorch.callbacks.TQDMProgressBar())
t = L.Trainer(max_epochs=2, devices=1, callbacks=[bar], logger=False,
              enable_checkpointing=False)
t.fit(M(), DataLoader(ds, batch_size=64), DataLoader(ds, batch_size=256))
''', "rich"]
RECIPES["lightning_tqdm"] = [*RECIPES["lightning_rich"][:-1], "tqdm"]

SIZES: dict[str, tuple[int, int]] = {
    "lightning_rich": (120, 30),
    "lightning_tqdm": (120, 30),
    "rich_live_fd_write": (120, 24),
    "tqdm_write_long": (60, 24),
    "pip_download_narrow": (50, 24),
}

#: Where the log deliberately differs from what a terminal of the recipe's size shows.
NOT_TERMINAL = {
    "curses": "the full-screen program's last frame is kept; a terminal drops it on leaving",
}
#: Compared with a terminal of another width: a \r redraw of a line wider than the screen
#: keeps the line's last state, as a terminal wide enough for the line shows it (a terminal of
#: the program's width piles the redraws up; docs/rendering.md).
TERMINAL_COLUMNS = {"tqdm_too_wide": 120}


def size(name: str) -> tuple[int, int]:
    return SIZES.get(name, (80, 24))


def terminal_lines(raw: bytes, columns: int, rows: int) -> list[str]:
    """What a real terminal shows of ``raw``: the bytes played in a tmux pane of that size
    (its pty turns ``\\n`` into CR LF, as the renderer's LNM does), then the pane's history and
    screen read back with wrapped rows joined and trailing blanks dropped."""
    shown = _tmux_capture(raw, columns, rows)
    lines = [line.rstrip(" ") for line in shown.decode().split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _tmux_capture(raw: bytes, columns: int, rows: int, *flags: str) -> bytes:
    """``raw`` played in a tmux pane of that size; the pane's history and screen, wrapped
    rows joined (``capture-pane -J`` and ``flags``)."""
    tmux = shutil.which("tmux")
    if tmux is None:
        raise FileNotFoundError("tmux")
    with tempfile.TemporaryDirectory() as d:
        data = Path(d, "raw")
        data.write_bytes(raw)
        conf = Path(d, "tmux.conf")
        conf.write_text("set -g history-limit 200000\nset -g status off\n")
        sock = Path(d, "socket")
        cmd = [tmux, "-S", str(sock), "-f", str(conf)]
        subprocess.run([*cmd, "new-session", "-d", "-x", str(columns), "-y", str(rows),
                        f"cat {data}; {tmux} -S {sock} wait-for -S played; sleep 600"],
                       check=True)
        try:
            subprocess.run([*cmd, "wait-for", "played"], check=True, timeout=60)
            return subprocess.run([*cmd, "capture-pane", "-p", "-J", *flags, "-S", "-",
                                   "-E", "-"], check=True, capture_output=True).stdout
        finally:
            subprocess.run([*cmd, "kill-server"], capture_output=True)


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


def terminal_styles(raw: bytes, columns: int, rows: int) -> list[list[list[Any]]]:
    """The style spans of each line a real terminal shows of ``raw``: tmux's screen and
    history read back with their colours and attributes (``capture-pane -e``), as SGR
    sequences of its own making, whose spans the renderer's line mode reads (plain text and
    SGR only: what it does with them is ``logcapture.sgr.apply``, checked on its own)."""
    sys.path.insert(0, str(HERE.parent))
    from logcapture.render import Renderer

    # One stream: tmux writes only what changes from the cell before, across lines too.
    r = Renderer(columns=65536, rows=2)
    lines = r.feed(_tmux_capture(raw, columns, rows, "-e")) + r.finish()
    while lines and not lines[-1].text:
        lines.pop()
    return [[list(s) for s in line.style] for line in lines]


def derive_output(name: str) -> None:
    sys.path.insert(0, str(HERE.parent))
    from logcapture.render import Renderer

    raw = (CAPTURED / f"{name}.input").read_bytes()
    columns, rows = size(name)
    r = Renderer(columns=columns, rows=rows)
    rendered = r.feed(raw) + r.finish()
    lines = [x.text for x in rendered]
    (CAPTURED / f"{name}.output").write_text(
        json.dumps(lines, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    # The style of each line, [start, end, "sgr"] spans (logcapture.sgr), only where some
    # line has one.
    styles = [[list(s) for s in x.style] for x in rendered]
    path = CAPTURED / f"{name}.styles"
    if any(styles):
        path.write_text("[\n" + ",\n".join(json.dumps(x) for x in styles) + "\n]\n",
                        encoding="utf-8")
    elif path.exists():
        path.unlink()


def main(args: list[str]) -> None:
    CAPTURED.mkdir(exist_ok=True)
    if args == ["--outputs"]:
        for p in sorted(CAPTURED.glob("*.input")):
            derive_output(p.stem)
        return
    if args == ["--check"]:
        for p in sorted(CAPTURED.glob("*.input")):
            if p.stem in NOT_TERMINAL:
                print(f"{p.stem}: not compared ({NOT_TERMINAL[p.stem]})")
                continue
            columns, rows = size(p.stem)
            shown = terminal_lines(p.read_bytes(), TERMINAL_COLUMNS.get(p.stem, columns), rows)
            logged = json.loads((CAPTURED / f"{p.stem}.output").read_text(encoding="utf-8"))
            print(f"{p.stem}: {'same as' if shown == logged else 'DIFFERS from'} a terminal")
        return
    names = list(RECIPES) if args == ["--all"] else args
    for name in names:
        raw = capture(RECIPES[name], *size(name))
        (CAPTURED / f"{name}.input").write_bytes(raw)
        derive_output(name)
        print(f"{name}: {len(raw)} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
