"""runner.relay with real ptys and a real interactive bash, no Slurm: a "terminal" (the outer
pty, whose master the test drives as srun/slurmstepd would) is relayed to the program through
an inner pty by a capture process that has the outer pty as its controlling terminal, as
``slurm.interactive`` sets it up. What the terminal shows, window size, job control, raw
mode, Ctrl-C, input that the program is slow to read, echo-off text never stored, the exit
status."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from logcapture.runner.terminal import set_winsize

from .helpers import wait_foreground

pexpect = pytest.importorskip("pexpect")
from pexpect import fdpexpect  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROMPT = "relay-prompt> "

# The capture process: session leader with the outer pty (fd argv[1]) as controlling terminal, the
# program on the inner pty as its session's controlling terminal; what the read loop would
# store goes to the file argv[2]; its exit status is the program's.
CAPTURE = r"""
import os, signal, sys, termios, threading, fcntl
from logcapture.runner.relay import Relay, open_inner, raw_attrs, set_controlling
from logcapture.runner.spawn import Attached, attach
from logcapture.runner.outcome import Options

outer = int(sys.argv[1])
stored = open(sys.argv[2], "ab", buffering=0)
class Sink:
    def feed(self, stream, data, now): stored.write(data)
    def tick(self, now): pass
saved = termios.tcgetattr(outer)
master, slave = open_inner(outer)
pid = os.fork()
if pid == 0:
    # A terminal's session starts with ^C and ^\ at their default action, as slurmstepd
    # starts a task; a test run started in the background by a shell without job control
    # has them ignored, and an ignored signal stays ignored across exec.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    os.closerange(3, 1024)
    os.execvp(sys.argv[3], sys.argv[3:])
os.close(slave)
termios.tcsetattr(outer, termios.TCSANOW, raw_attrs(saved))
relay = Relay(outer, master, pid)
if not set_controlling(outer):
    relay.watch_winsize()
task = Attached(pid)
def reap():
    _, status = os.waitpid(pid, 0)
    task.set_status(status)
threading.Thread(target=reap, daemon=True).start()
if os.environ.get("RELAY_PLAIN"):  # the fallback after a failed capture, on its own
    from logcapture.runner.relay import relay_plain
    relay.stop()
    relay_plain(outer, master, b"echo typed-before\r")
    while task.returncode is None:
        threading.Event().wait(0.05)
    sys.exit(task.returncode if task.returncode >= 0 else 128 - task.returncode)
try:
    outcome = attach({master: "stdout"}, task, Sink(), Options(merge=True, stdout_fd=outer,
                     stderr_fd=outer, beside=relay))
finally:
    relay.stop()
    try:
        termios.tcsetattr(outer, termios.TCSANOW, saved)
    except termios.error:  # the terminal hung up
        pass
sys.exit(outcome.exit_status if outcome.exit_status is not None else 128 + outcome.signal)
"""


class Terminal:
    """The outer pty's master as a person's terminal (pexpect over its fd) and the capture
    process relaying it to ``argv``."""

    def __init__(self, tmp: Path, argv: list[str], rows: int = 30, cols: int = 100,
                 plain: bool = False):
        self.master, slave = os.openpty()
        set_winsize(slave, rows, cols)
        self.stored = tmp / "stored"
        env = {**os.environ, "PYTHONPATH": str(REPO), "PS1": PROMPT, "TERM": "xterm",
               "HOME": str(tmp), **({"RELAY_PLAIN": "1"} if plain else {})}
        with (tmp / "capture.err").open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", CAPTURE, str(slave), str(self.stored), *argv],
                pass_fds=(slave,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=err, env=env, start_new_session=True)
        self.slave = os.dup(slave)  # the outer pty's termios, for the test to look at
        os.close(slave)
        self.term = fdpexpect.fdspawn(self.master, encoding="utf-8", timeout=15)

    def ask(self, command: str) -> str:
        """Run a shell command; what it printed between markers not in its echo."""
        self.term.send(f'echo "[[""["; {command}; echo "]]""]"\r')
        self.term.expect(r"\[\[\[\r\n(.*?)\]\]\]")
        got = self.term.match.group(1)
        self.term.expect_exact(PROMPT)
        return got.replace("\r", "").strip()

    def resize(self, rows: int, cols: int) -> None:
        set_winsize(self.master, rows, cols)  # the kernel signals the outer's foreground group

    def close(self) -> None:
        """Kill the capture process (and so the program) if it still runs, and reap it."""
        self.proc.kill()
        self.proc.wait()

    def finish(self) -> int:
        try:
            code = self.proc.wait(timeout=20)
        finally:
            for fd in (self.master, self.slave):
                try:
                    os.close(fd)
                except OSError:
                    pass
        return code


def _bash(tmp: Path) -> Terminal:
    t = Terminal(tmp, ["bash", "--norc", "--noprofile", "-i"])
    t.term.expect_exact(PROMPT)
    return t


def test_the_shell_behaves_as_on_its_own_terminal(tmp_path: Path) -> None:
    t = _bash(tmp_path)
    try:
        assert t.ask("stty size; [ -t 0 ] && [ -t 1 ] && echo terminal") == "30 100\nterminal"
        # The inner pty is the shell's controlling terminal: job control works.
        assert t.ask("ps -o tty= -p $$ | grep -q pts && echo has-tty") == "has-tty"
        t.resize(40, 120)
        assert t.ask('for i in $(seq 100); do [ "$(stty size)" = "40 120" ] && break; '
                     'sleep 0.05; done; stty size') == "40 120"
        # Ctrl-C: the foreground job only.
        t.term.send('echo "sleep ""starts"; sleep 30; echo slept\r')
        t.term.expect_exact("sleep starts")
        wait_foreground(["sleep", "30"])
        t.term.send("\x03")  # Ctrl-C
        t.term.expect_exact(PROMPT, timeout=5)
        assert "slept" not in t.term.before
        assert t.ask("echo alive") == "alive"
        # ^Z stops the foreground job, fg resumes it.
        t.term.send("bash -c 'sleep 1.5; echo \"woke \"\"up\"'\r")
        wait_foreground(["sleep", "1.5"])
        t.term.send("\x1a")  # Ctrl-Z
        t.term.expect("Stopped")
        t.term.expect_exact(PROMPT)
        assert t.ask("jobs | grep -c Stopped") == "1"
        t.term.send("fg\r")
        t.term.expect_exact("woke up", timeout=10)
        t.term.expect_exact(PROMPT)
        # Raw mode for a program, then the line discipline as it was.
        before = t.ask("stty -g")
        t.term.send("python3 -c 'import tty,termios,os; a=termios.tcgetattr(0); tty.setraw(0); "
                    "os.write(1, b\"raw-\" b\"ready \"); "
                    "os.write(1, b\"raw:\" + os.read(0, 1) + b\"\\r\\n\"); "
                    "termios.tcsetattr(0, termios.TCSADRAIN, a)'\r")
        t.term.expect_exact("raw-ready ")  # set: a key typed before would be flushed
        t.term.send("q")
        t.term.expect_exact("raw:q")
        t.term.expect_exact(PROMPT)
        assert t.ask("stty -g") == before
        t.term.send("exit 3\r")
        assert t.finish() == 3
    finally:
        t.close()
    stored = t.stored.read_bytes()
    assert b"alive" in stored and b"woke up" in stored


def test_what_is_typed_with_echo_off_is_never_stored(tmp_path: Path) -> None:
    t = _bash(tmp_path)
    try:
        t.term.send('read -s -p "pass""word: " P; echo; echo "length ${#P}"\r')
        t.term.expect_exact("password: ")
        t.term.send("hunter2-secret\r")
        t.term.expect_exact("length 14")
        t.term.expect_exact(PROMPT)
        assert "hunter2" not in t.term.before
        # What a program shows while it reads a line without echo reaches the terminal, and
        # is not stored either.
        t.term.send("python3 -c 'import termios,os,time; a=termios.tcgetattr(0); "
                    "b=termios.tcgetattr(0); b[3] &= ~termios.ECHO; "
                    "termios.tcsetattr(0, termios.TCSADRAIN, b); os.write(1, b\"shown-\" + "
                    "b\"while-hidden\\r\\n\"); time.sleep(0.5); "
                    "termios.tcsetattr(0, termios.TCSADRAIN, a); print(\"after-echo\")'\r")
        t.term.expect_exact("shown-while-hidden")
        t.term.expect_exact("after-echo")
        t.term.expect_exact(PROMPT)
        t.term.send("exit\r")
        assert t.finish() == 0
    finally:
        t.close()
    stored = t.stored.read_bytes()
    assert b"length 14" in stored and b"after-echo" in stored
    assert b"hunter2" not in stored
    assert b"shown-while-hidden" not in stored


def test_input_waits_until_the_program_reads_it_none_lost_or_reordered(tmp_path: Path) -> None:
    size = 200_000  # far more than a pty's input queue (4 KiB) holds
    data = bytes((i * 7 + i // 251) % 256 for i in range(size))
    # raw: every byte reaches the program unchanged, none echoed; it reads only after 1 s
    program = ("import tty,sys,os,time,hashlib; tty.setraw(0); time.sleep(1); b=b''\n"
               f"while len(b) < {size}: b += os.read(0, 65536)\n"
               "os.write(1, b'sha ' + hashlib.sha256(b).hexdigest().encode() + b' end')")
    t = Terminal(tmp_path, [sys.executable, "-c", program])
    try:
        time.sleep(0.3)  # the program has set raw mode by then (it waits 1 s to read)
        view = memoryview(data)
        while view:  # the outer pty's master, written as fast as it takes it
            view = view[os.write(t.master, view[:4096]):]
        t.term.expect(r"sha ([0-9a-f]+) end", timeout=30)
        assert t.term.match.group(1) == hashlib.sha256(data).hexdigest()
        assert t.finish() == 0
    finally:
        t.close()
    assert data[:64] not in t.stored.read_bytes()  # input is never stored


def test_output_reaches_the_terminal_byte_for_byte(tmp_path: Path) -> None:
    program = ("import os; os.write(1, b'a\\nb\\x1b[1mbold\\x1b[0m\\r\\n\\xe2\\x82\\xac \\t|'); "
               "os.write(2, b'err\\n')")
    # The same program on a terminal of its own, as without logcapture.
    master, slave = os.openpty()
    plain = subprocess.Popen([sys.executable, "-c", program], stdin=slave, stdout=slave,
                             stderr=slave, start_new_session=True)
    os.close(slave)
    expected = b""
    plain.wait(timeout=10)
    while True:
        try:
            got = os.read(master, 4096)
        except OSError:
            break
        if not got:
            break
        expected += got
    os.close(master)
    t = Terminal(tmp_path, [sys.executable, "-c", program])
    seen = b""
    deadline = time.monotonic() + 10
    while len(seen) < len(expected) and time.monotonic() < deadline:
        try:
            seen += os.read(t.master, 4096)
        except OSError:
            break
    assert t.finish() == 0
    assert seen == expected
    assert t.stored.read_bytes() == expected


def test_the_terminal_is_raw_while_relayed_and_left_as_it_was(tmp_path: Path) -> None:
    t = Terminal(tmp_path, ["sleep", "1"])
    try:
        before = termios.tcgetattr(t.slave)
        time.sleep(0.5)
        during = termios.tcgetattr(t.slave)
        deadline = time.monotonic() + 10
        while t.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        after = termios.tcgetattr(t.slave)
        assert t.finish() == 0
    finally:
        t.close()
    assert before[3] & termios.ICANON and before[3] & termios.ECHO
    assert not during[3] & (termios.ICANON | termios.ECHO | termios.ISIG)
    assert after == before


def test_a_hang_up_of_the_terminal_reaches_the_program(tmp_path: Path) -> None:
    t = _bash(tmp_path)
    try:
        os.close(t.master)  # srun and slurmstepd gone: the outer pty hangs up
        code = t.proc.wait(timeout=20)
    finally:
        t.close()
        os.close(t.slave)
    assert code == 128 + 1  # bash ended by SIGHUP, as on its own terminal


def test_the_fallback_after_a_failed_capture_keeps_the_terminal_working(tmp_path: Path) -> None:
    t = Terminal(tmp_path, ["bash", "--norc", "--noprofile", "-i"], plain=True)
    try:
        t.term.expect_exact("typed-before")  # what was typed before the fallback, first
        t.term.expect_exact(PROMPT)
        assert t.ask("stty size") == "30 100"
        t.resize(40, 120)
        assert t.ask('for i in $(seq 100); do [ "$(stty size)" = "40 120" ] && break; '
                     'sleep 0.05; done; stty size') == "40 120"
        t.term.send("exit 3\r")
        assert t.finish() == 3
    finally:
        t.close()
    assert t.stored.read_bytes() == b""  # nothing stored
