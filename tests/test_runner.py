"""The runner with real ptys: the command's outcome never changes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pexpect
import psutil
import pytest
from helpers import LOGCAPTURE, lc

from logcapture.runner.outcome import Options, Outcome
from logcapture.runner.readloop import LINGER_BACKOFF
from logcapture.runner.spawn import Attached, attach, run
from logcapture.runner.terminal import open_terminals

PY = sys.executable


class Recorder:
    def __init__(self) -> None:
        self.data: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.ticks = 0

    def feed(self, stream: str, data: bytes, now: float) -> None:
        self.data[stream] += data

    def tick(self, now: float) -> None:
        self.ticks += 1


def _run_to_files(tmp_path: Path, argv: list[str], sink: object | None = None,
                  **opts: object) -> tuple[Outcome, bytes, bytes, list[str]]:
    out, err = tmp_path / "out", tmp_path / "err"
    warnings: list[str] = []
    with open(out, "wb") as fo, open(err, "wb") as fe:
        outcome = run(argv, sink, Options(  # type: ignore[arg-type]
            stdout_fd=fo.fileno(), stderr_fd=fe.fileno(), warn=warnings.append,
            **opts))  # type: ignore[arg-type]
    return outcome, out.read_bytes(), err.read_bytes(), warnings


# ------------------------------------------------------------------ exit status and signals


@pytest.mark.parametrize("code", [0, 1, 3, 42, 255])
def test_exit_status_is_the_commands(lc_env: dict[str, str], code: int) -> None:
    res = lc(["run", "--", "sh", "-c", f"echo out; exit {code}"], lc_env)
    assert res.returncode == code
    assert res.stdout == b"out\n"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL,
                                 signal.SIGUSR1, signal.SIGHUP, signal.SIGSEGV])
def test_killed_by_signal_n_looks_killed_by_signal_n(lc_env: dict[str, str], sig: int) -> None:
    res = lc(["run", "--", PY, "-c",
                  f"import os, signal; signal.signal({sig}, signal.SIG_DFL) if {sig} != 9 "
                  f"else None; os.kill(os.getpid(), {sig})"], lc_env)
    assert res.returncode == -sig


def test_command_not_found_is_127_with_a_message(lc_env: dict[str, str]) -> None:
    res = lc(["run", "--", "no-such-command-xyz"], lc_env)
    assert res.returncode == 127
    assert b"no-such-command-xyz: command not found" in res.stderr


CATCHER = textwrap.dedent("""
    import os, signal, sys, time
    want = set(sys.argv[1].split(","))
    got = []
    def handler(signum, frame):
        got.append(signal.Signals(signum).name)
    for name in want:
        signal.signal(getattr(signal, name), handler)
    print("ready", flush=True)
    deadline = time.time() + 30
    while not want <= set(got) and time.time() < deadline:
        time.sleep(0.01)
    print("got", ",".join(sorted(set(got))), flush=True)
    sys.exit(int(sys.argv[2]))
""")


def _wait_for(proc: subprocess.Popen, text: bytes) -> bytes:
    assert proc.stdout is not None
    seen = b""
    while text not in seen:
        chunk = os.read(proc.stdout.fileno(), 4096)
        assert chunk, f"EOF before {text!r}; got {seen!r}"
        seen += chunk
    return seen


def test_signals_to_the_wrapper_alone_reach_the_command(lc_env: dict[str, str]) -> None:
    names = ["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGCONT", "SIGTSTP"]
    proc = subprocess.Popen([*LOGCAPTURE, "run", "--", PY, "-c", CATCHER, ",".join(names), "7"],
                            env=lc_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(proc, b"ready")
    for name in names:  # to the wrapper's pid only, as proctrack/cgroup does
        os.kill(proc.pid, getattr(signal, name))
        time.sleep(0.05)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7, err
    assert f"got {','.join(sorted(names))}".encode() in out


def test_second_term_does_not_kill_the_wrapper_before_the_command(
        lc_env: dict[str, str]) -> None:
    # The command takes two TERMs to end, then exits 9: the wrapper must outlive both.
    script = textwrap.dedent("""
        import signal, sys, time
        n = 0
        def h(s, f):
            global n
            n += 1
        signal.signal(signal.SIGTERM, h)
        print("ready", flush=True)
        seen = 0
        while n < 2:
            if n != seen:
                seen = n
                print("term", n, flush=True)
            time.sleep(0.01)
        print("two TERMs", flush=True)
        sys.exit(9)
    """)
    proc = subprocess.Popen([*LOGCAPTURE, "run", "--", PY, "-c", script], env=lc_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(proc, b"ready")
    os.kill(proc.pid, signal.SIGTERM)
    # Two pending TERMs would merge into one (a signal is a flag): the second goes once the
    # command has seen the first.
    _wait_for(proc, b"term 1")
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 9
    assert b"two TERMs" in out


def test_term_to_the_wrapper_kills_a_default_command_by_term(lc_env: dict[str, str]) -> None:
    proc = subprocess.Popen([*LOGCAPTURE, "run", "--", "sh", "-c", "echo ready; sleep 60"],
                            env=lc_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(proc, b"ready")
    os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM


# ------------------------------------------------------------------ terminals and bytes


def test_both_streams_are_ttys_and_separate(tmp_path: Path) -> None:
    rec = Recorder()
    outcome, out, err, _ = _run_to_files(tmp_path, [PY, "-c", (
        "import sys, os; print(sys.stdout.isatty(), sys.stderr.isatty(), "
        "os.get_terminal_size().columns); print('to err', file=sys.stderr)")],
        rec, winsize=(30, 123))
    assert outcome.exit_status == 0
    assert out == b"True True 123\n"
    assert err == b"to err\n"
    assert bytes(rec.data["stdout"]) == out and bytes(rec.data["stderr"]) == err


def test_default_window_size_is_set_without_a_terminal(tmp_path: Path) -> None:
    # A batch job has no terminal to copy a size from: a 0x0 pty makes tqdm print nothing.
    _, out, _, _ = _run_to_files(tmp_path, [PY, "-c",
                                            "import os; print(os.get_terminal_size())"])
    assert b"columns=80, lines=24" in out


def test_output_is_byte_identical(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 40 + b"\xff\xfe invalid utf-8 \x00 NUL \r\n\n no newline"
    (tmp_path / "payload").write_bytes(payload)
    writer = (f"import sys; d = open({str(tmp_path / 'payload')!r}, 'rb').read(); "
              "sys.stdout.buffer.write(d); sys.stdout.flush(); "
              "sys.stderr.buffer.write(d[::-1]); sys.stderr.flush()")
    rec = Recorder()
    outcome, out, err, warnings = _run_to_files(tmp_path, [PY, "-c", writer], rec)
    assert outcome.exit_status == 0 and not warnings
    assert out == payload
    assert err == payload[::-1]
    assert outcome.bytes == {"stdout": len(payload), "stderr": len(payload)}


def test_a_burst_of_short_lines_is_read_in_a_few_reads(tmp_path: Path) -> None:
    # A training step prints its lines one write() each; when output starts after a quiet
    # spell the reader lingers before reading instead of waking for every line
    # (docs/performance.md). 400 lines of ~40 bytes fit the pty (~17 KB) many times over
    # within one linger, so even a slow machine needs far fewer reads than lines; without the
    # linger the reader wakes for (nearly) every line.
    job = ("import time\nfor k in range(5):\n    time.sleep(0.05)\n"
           "    for i in range(80): print('step', k, i, 'loss', 1 / (i + 1))")
    rec = Recorder()
    outcome, out, _, _ = _run_to_files(tmp_path, [PY, "-c", job], rec)
    assert outcome.exit_status == 0
    assert out.count(b"\n") == 400 and bytes(rec.data["stdout"]) == out
    assert outcome.lingers >= 1
    # ~5 here (a burst a read), 10 when the reader read once before lingering, more when the
    # job was descheduled within a burst; ~90 without
    assert outcome.reads <= 60, outcome.reads


def test_a_flood_stops_the_linger(tmp_path: Path) -> None:
    # A job that fills the pty during a linger may have blocked on it: the reader then reads
    # without waiting for LINGER_BACKOFF seconds, so a flood is never slowed by sleeps.
    job = ("import sys\nb = b'x' * 79 + b'\\n'\n"
           "for _ in range(40000): sys.stdout.buffer.write(b * 4); sys.stdout.flush()")
    t0 = time.monotonic()
    outcome, out, _, _ = _run_to_files(tmp_path, [PY, "-c", job])
    took = time.monotonic() - t0
    assert len(out) == 40000 * 320
    # At most one linger per back-off period (plus the first), whatever the machine's speed;
    # without the back-off there is one after nearly every round (~270 here, 3.7 x slower).
    assert LINGER_BACKOFF >= 0.5
    # (A starved writer may not refill the pty after the first few lingers: some slack.)
    assert outcome.lingers <= 6 + took / 0.5, (outcome.lingers, took)


def test_the_commands_exit_is_seen_without_sigchld(lc_env: dict[str, str]) -> None:
    # A wrapper started with SIGCHLD blocked never hears of the command's exit: its quiet poll
    # still times out (QUIET_MS) to look, so a background process holding the pty open does
    # not keep the wrapper (and the job) waiting for it (here 30 s).
    code = ("import os, signal, sys\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])\n"
            "os.execv(sys.executable, [sys.executable, '-m', 'logcapture', 'run', '--', "
            "'sh', '-c', 'sleep 30 & echo hi; sleep 1; exit 3'])\n")  # exits once quiet
    t0 = time.monotonic()
    res = subprocess.run([PY, "-c", code], env=lc_env, capture_output=True, timeout=60)
    assert res.returncode == 3 and res.stdout == b"hi\n", res
    assert time.monotonic() - t0 < 25  # QUIET_MS + drain_timeout, not the 30 s sleep


def test_stdin_passes_through(lc_env: dict[str, str]) -> None:
    res = lc(["run", "--", "cat"], lc_env, input=b"hi\nthere")
    assert res.returncode == 0
    assert res.stdout == b"hi\nthere"


def _sigpipe_as_a_shell_gives_it() -> None:
    """SIGPIPE's default action, not blocked: what a shell starts a pipeline with (whatever
    this test process has done to it, which a child would inherit)."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGPIPE])


def _status_into_a_closed_pipe(argv: list[str], env: dict[str, str], merged: bool) -> int:
    """``argv | head -c 10``: the exit status of ``argv`` (negative: killed by that signal)
    once the pipe's reader has read 10 bytes and gone."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, stdin=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT if merged else subprocess.DEVNULL,
                            preexec_fn=_sigpipe_as_a_shell_gives_it)
    assert proc.stdout is not None
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()
    return proc.wait(timeout=60)


@pytest.mark.parametrize("merged", [True, False])
@pytest.mark.parametrize("name, argv, bare", [
    # A program with SIGPIPE's default action dies of it; Python ignores SIGPIPE and ends
    # with an error (status 1) at its next write; a command that never stops printing too.
    ("yes", ["yes"], -signal.SIGPIPE),
    ("python", [PY, "-c", "for i in range(10**6): print(i)"], 1),
    ("python forever", [PY, "-c", "while True: print('x' * 100)"], 1),
])
def test_output_whose_reader_went_away_ends_the_command_as_without(
        lc_env: dict[str, str], name: str, argv: list[str], bare: int, merged: bool) -> None:
    assert _status_into_a_closed_pipe(argv, lc_env, merged) == bare
    got = _status_into_a_closed_pipe([*LOGCAPTURE, "run", "--", *argv], lc_env, merged)
    assert got == bare


def test_closed_standard_descriptors_stay_closed_for_the_command(lc_env: dict[str, str]) -> None:
    """Closed stdin (or stdout) is closed in the command too: no pty of logcapture's takes
    its number, so the command cannot read its own output from its stdin."""
    job = ("echo hello; if read -r line; then echo read:$line; else echo no stdin; fi; "
           "ls -l /proc/self/fd/0 2>&1 | grep -c ptmx")
    outputs = []
    for prefix in ([], [*LOGCAPTURE, "run", "--"]):
        script = 'exec 0<&- ; exec "$@"'
        res = subprocess.run(["sh", "-c", script, "sh", *prefix, "sh", "-c", job],
                             env=lc_env, capture_output=True, timeout=60)
        outputs.append((res.returncode, res.stdout))
    assert outputs[0] == outputs[1]
    assert b"hello\nno stdin\n0\n" == outputs[0][1]
    closed_out = 'exec 1>&- ; exec "$@"'
    res = subprocess.run(["sh", "-c", closed_out, "sh", *LOGCAPTURE, "run", "--", "sh", "-c",
                          "echo out || echo write failed >&2"],
                         env=lc_env, capture_output=True, timeout=60)
    bare = subprocess.run(["sh", "-c", closed_out, "sh", "sh", "-c",
                           "echo out || echo write failed >&2"],
                          env=lc_env, capture_output=True, timeout=60)
    assert (res.returncode, res.stdout) == (bare.returncode, bare.stdout) == (0, b"")
    assert b"write failed" in res.stderr and b"write failed" in bare.stderr


def test_a_command_started_with_a_thousand_descriptors_left_open_to_it(
        lc_env: dict[str, str]) -> None:
    """A program that leaves 1,100 descriptors open to ``logcapture run`` (close_fds=False)
    pushes its ptys and pipes past 1023, where select(2) cannot watch: the command's output,
    exit status and the record are as with a few."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the descriptor limit ({hard}) is too low")
    job = "echo out; echo err >&2; exit 3"
    # a fresh process opens them from 3 up, then becomes ``logcapture run``
    leave_open = ("import os, sys\n"
                  "for _ in range(1100):\n"
                  "    os.set_inheritable(os.open(os.devnull, os.O_RDONLY), True)\n"
                  "os.execv(sys.argv[1], sys.argv[1:])\n")
    res = subprocess.run([PY, "-c", leave_open, *LOGCAPTURE, "run", "--run-id", "many-fds",
                          "--", "sh", "-c", job], env=lc_env, capture_output=True, timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (3, b"out\n", b"err\n")
    shown = lc(["logs", "many-fds"], lc_env)
    assert shown.stdout.splitlines() == [b"out", b"err"], shown


def test_an_interactive_program_driven_by_pexpect(lc_env: dict[str, str]) -> None:
    child = pexpect.spawn(LOGCAPTURE[0], [*LOGCAPTURE[1:], "run", "--", PY, "-c",
                                          "n = input('name? '); print('hello', n)"],
                          env=lc_env, timeout=30, use_poll=True)
    child.expect("name\\? ")
    child.sendline("bob")
    child.expect("hello bob")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_grandchild_holding_the_pty_does_not_hang_the_wrapper(tmp_path: Path) -> None:
    outcome, out, _, _ = _run_to_files(tmp_path, ["sh", "-c", "sleep 30 & echo done"],
                                       drain_timeout=2.0)
    assert outcome.exit_status == 0
    assert out == b"done\n"


def test_a_failing_sink_never_breaks_the_command(tmp_path: Path) -> None:
    class Exploding(Recorder):
        def feed(self, stream: str, data: bytes, now: float) -> None:
            raise RuntimeError("secret text that must not be echoed")

    outcome, out, _, warnings = _run_to_files(
        tmp_path, [PY, "-c", "for i in range(1000): print(i)"], Exploding())
    assert outcome.exit_status == 0
    assert out == b"".join(f"{i}\n".encode() for i in range(1000))
    assert len(warnings) == 1 and "RuntimeError" in warnings[0]
    assert "secret" not in warnings[0]


def test_a_huge_line_without_newline_keeps_memory_bounded(lc_env: dict[str, str]) -> None:
    # 100 MB on one line, no newline: the wrapper's memory must not grow with it.
    writer = ("import sys\nb = b'x' * 65536\nfor _ in range(1600): sys.stdout.buffer.write(b)\n"
              "sys.stdout.flush()")
    proc = subprocess.Popen([*LOGCAPTURE, "run", "--", PY, "-c", writer], env=lc_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Poll the wrapper's RSS: ru_maxrss would count the test process's own memory, shared
    # into the child between fork and exec.
    wrapper = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, wrapper.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    assert proc.wait() == 0
    assert peak < 150 * 1024 * 1024, peak  # well under the 100 MB the line is long
    logs = lc(["logs"], lc_env)
    text = logs.stdout.decode()
    assert "line cut" in text


def test_a_resized_terminal_resizes_the_commands_ptys(lc_env: dict[str, str]) -> None:
    script = ("import os, signal, sys, time\n"
              "def h(s, f): print('size', os.get_terminal_size().columns,"
              " os.get_terminal_size(2).lines, flush=True)\n"
              "signal.signal(signal.SIGWINCH, h)\n"
              "h(0, 0)\n"
              "time.sleep(30)\n")
    child = pexpect.spawn(LOGCAPTURE[0], [*LOGCAPTURE[1:], "run", "--", PY, "-c", script],
                          env=lc_env, timeout=30, dimensions=(24, 80), use_poll=True)
    child.expect("size 80 24")
    child.setwinsize(33, 101)  # the kernel sends SIGWINCH to the wrapper
    child.expect("size 101 33")
    child.kill(signal.SIGTERM)
    child.expect(pexpect.EOF)
    child.close()
    assert child.signalstatus == signal.SIGTERM


# --- attach: a command another process started on our ptys (a Slurm task) ------------------
def _spawn_on(argv: list[str], out_s: int, err_s: int) -> int:
    """Start argv with the given slaves as its stdout and stderr, not through subprocess (its
    Popen would reap the child itself)."""
    actions = [(os.POSIX_SPAWN_DUP2, out_s, 1), (os.POSIX_SPAWN_DUP2, err_s, 2)]
    return os.posix_spawn(argv[0], argv, dict(os.environ), file_actions=actions)


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            got = os.read(fd, 65536)
        except BlockingIOError:
            return data
        if not got:
            return data
        data += got


def test_attach_copies_a_command_started_elsewhere_and_ends_with_its_status() -> None:
    import threading

    out_m, out_s, err_m, err_s = open_terminals(24, 80, merge=False)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = _spawn_on(["/bin/sh", "-c", "printf 'a\\r\\nb\\n'; [ -t 1 ] && echo tty >&2; exit 3"],
                    out_s, err_s)
    os.close(out_s)
    os.close(err_s)
    task = Attached(pid)
    # As the plugin's task_exit does: the status once the task has been reaped.
    threading.Thread(target=lambda: task.set_status(os.waitpid(pid, 0)[1])).start()
    outcome = attach({out_m: "stdout", err_m: "stderr"}, task, None,
                     Options(stdout_fd=out_w, stderr_fd=err_w))
    assert outcome is not None
    assert (outcome.exit_status, outcome.signal, outcome.pid) == (3, None, pid)
    assert dict(outcome.bytes) == {"stdout": 5, "stderr": 4}
    assert _read_all(out_r) == b"a\r\nb\n"  # output post-processing is off: bytes as written
    assert _read_all(err_r) == b"tty\n"
    for fd in (out_r, out_w, err_r, err_w):
        os.close(fd)


def test_attach_without_a_status_gives_none_once_the_pty_has_closed() -> None:
    out_m, out_s, _, _ = open_terminals(24, 80, merge=True)
    out_r, out_w = os.pipe()
    pid = _spawn_on(["/bin/sh", "-c", "echo one; kill -TERM $$"], out_s, out_s)
    os.close(out_s)
    task = Attached(pid)
    began = time.monotonic()
    outcome = attach({out_m: "stdout"}, task, None,
                     Options(stdout_fd=out_w), status_timeout=0.3)
    assert outcome is None and time.monotonic() - began < 5
    assert _read_all(out_r) == b"one\n"
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == -signal.SIGTERM
    os.close(out_r)
    os.close(out_w)
