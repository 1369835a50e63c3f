"""srun's output in a captured batch job (logcapture.slurm.forward): copied to the job's
outputs byte for byte and in order, stored only where srun itself speaks. The batch script
runs under ``runner.spawn.run`` with real ptys; srun is played by tests/forward_client.py, which
speaks the SPANK plugin's side of the protocol (the plugin itself runs in tests/e2e)."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import socket
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logcapture.runner.outcome import Options, Outcome
from logcapture.runner.spawn import run
from logcapture.slurm.forward import Forwarder, SrunMessages, _Pipe

from .test_runner import Recorder

CLIENT = [sys.executable, str(Path(__file__).with_name("forward_client.py"))]
_numbers = itertools.count()
NL = "\\n"  # the client expands it


@pytest.fixture
def address() -> bytes:
    return f"\0logcapture-test/forward/{os.getpid()}/{next(_numbers)}".encode()


def srun(address: bytes, *steps: str) -> str:
    """A shell command that runs the client (srun) with ``steps``."""
    return shlex.join([*CLIENT, "@" + address[1:].decode(), *steps])


def _batch(tmp_path: Path, script: str, address: bytes | None, merge: bool = True
           ) -> tuple[Outcome, bytes, bytes, Recorder]:
    """Run ``script`` (bash) as the batch script; stdout and stderr to one file (``merge``)
    or two. Returns the outcome, the files' bytes and what was captured."""
    out, err = tmp_path / "out", tmp_path / "err"
    sink = Recorder()
    beside = Forwarder(address) if address is not None else None
    with open(out, "wb") as fo, open(err, "wb") as fe:
        outcome = run(["bash", "-c", script], sink, Options(  # type: ignore[arg-type]
            stdout_fd=fo.fileno(), stderr_fd=fo.fileno() if merge else fe.fileno(),
            merge=merge, beside=beside))
    return outcome, out.read_bytes(), err.read_bytes(), sink


def test_srun_bytes_reach_the_output_in_order_and_only_its_own_messages_are_captured(
        tmp_path: Path, address: bytes) -> None:
    steps = srun(address, f"out:task 1{NL}", f"err:srun: error: boom{NL}", f"out:task 2{NL}",
                 f"err:logcapture: task 1 of step 0 not captured{NL}")
    script = f"echo before; {steps}; echo after"
    outcome, out, _, sink = _batch(tmp_path, script, address)
    assert outcome.exit_status == 0
    assert out == (b"before\ntask 1\nsrun: error: boom\ntask 2\n"
                   b"logcapture: task 1 of step 0 not captured\nafter\n")
    assert bytes(sink.data["stdout"]) == (b"before\nsrun: error: boom\n"
                                          b"logcapture: task 1 of step 0 not captured\nafter\n")
    # The same script without forwarding: the same bytes, every one of them captured.
    _, plain, _, every = _batch(tmp_path, script, None)
    assert plain == out
    assert bytes(every.data["stdout"]) == out


def test_separate_streams_get_a_pipe_each(tmp_path: Path, address: bytes) -> None:
    steps = srun(address, f"out:task out{NL}", f"err:task err{NL}",
                 f"err:srun: error: task 0: Exited with exit code 3{NL}")
    script = f"echo before; echo e-before >&2; {steps}; echo after; echo e-after >&2"
    _, out, err, sink = _batch(tmp_path, script, address, merge=False)
    assert out == b"before\ntask out\nafter\n"
    assert err == b"e-before\ntask err\nsrun: error: task 0: Exited with exit code 3\ne-after\n"
    assert bytes(sink.data["stdout"]) == b"before\nafter\n"
    assert bytes(sink.data["stderr"]) == (b"e-before\nsrun: error: task 0: Exited with exit "
                                          b"code 3\ne-after\n")


def test_an_fd_that_is_not_the_batch_pty_is_left_alone(tmp_path: Path, address: bytes) -> None:
    side = tmp_path / "side"
    steps = srun(address, "show", f"out:to the side{NL}", f"err:task err{NL}")
    _, out, _, sink = _batch(tmp_path, f"{steps} >{side}; echo after", address)
    assert side.read_bytes() == b"F-0\nto the side\n"  # fd 1 left as it was: "-"
    assert out == b"task err\nafter\n"
    assert bytes(sink.data["stdout"]) == b"after\n"
    # Neither fd the batch's (srun within a task, or redirected): refused, nothing changes.
    _, out, _, sink = _batch(tmp_path, f"{steps} >{side} 2>&1; echo after", address)
    assert side.read_bytes() == b"N--\nto the side\ntask err\n"
    assert out == b"after\n"


def test_an_srun_killed_before_its_exit_hook_keeps_its_order(tmp_path: Path,
                                                             address: bytes) -> None:
    steps = srun(address, f"out:last words{NL}", "kill")
    script = f"echo before; {steps}; echo after; {steps}; echo end"
    _, out, _, sink = _batch(tmp_path, script, address)
    assert out == b"before\nlast words\nafter\nlast words\nend\n"
    assert bytes(sink.data["stdout"]) == b"before\nafter\nend\n"


def test_a_pipe_that_outlives_its_srun_does_not_refuse_the_next(tmp_path: Path,
                                                                address: bytes) -> None:
    first = srun(address, "hold:1", f"out:first{NL}", "kill")
    second = srun(address, "show", f"out:second{NL}")
    _, out, _, sink = _batch(tmp_path, f"{first}; sleep 0.2; {second}; echo end", address)
    assert out == b"first\nF00\nsecond\nend\n"
    assert bytes(sink.data["stdout"]) == b"end\n"
    # Whatever number the next connection gets: a pipe lets go of its srun's connection.
    forwarder = Forwarder(address)
    forwarder.pipes[99] = _Pipe(99, "stdout", 8)
    forwarder._drop(8)
    assert forwarder.pipes[99].conn == -1


def test_a_background_srun_keeps_each_writers_order(tmp_path: Path, address: bytes) -> None:
    steps = srun(address, *[f"out:task {i}{NL}" if i % 2 else "sleep:0.03" for i in range(20)])
    script = f"{steps} & for i in 1 2 3 4 5 6; do echo batch $i; sleep 0.04; done; wait"
    _, out, _, sink = _batch(tmp_path, script, address)
    lines = out.decode().splitlines()
    # Whole lines, each writer's in its order; how the two interleave is the scheduler's,
    # as it is without logcapture.
    assert [ln for ln in lines if ln.startswith("task")] == [f"task {i}" for i in range(1, 20, 2)]
    assert [ln for ln in lines if ln.startswith("batch")] == [f"batch {i}" for i in range(1, 7)]
    assert len(lines) == 16
    assert bytes(sink.data["stdout"]).decode().splitlines() == [f"batch {i}"
                                                                for i in range(1, 7)]


def test_an_address_taken_leaves_srun_as_it_was(tmp_path: Path, address: bytes) -> None:
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squatter.bind(address)
    try:
        # The client would connect to the squatter: the plugin refuses a peer of another uid;
        # here (one uid) it is simply not listening, and srun's connect is refused.
        steps = srun(address, f"out:task 1{NL}")
        _, out, _, sink = _batch(tmp_path, f"echo before; {steps}; echo after", address)
    finally:
        squatter.close()
    assert out == b"before\ntask 1\nafter\n"
    assert bytes(sink.data["stdout"]) == out  # stored with the batch run, as before


def test_the_listener_is_gone_with_the_batch_script(tmp_path: Path, address: bytes) -> None:
    _batch(tmp_path, "true", address)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with pytest.raises(ConnectionRefusedError):
        probe.connect(address)
    probe.close()


# --- srun's own lines -------------------------------------------------------------------------

LINES = st.lists(st.sampled_from([
    b"srun: error: n3: task 1: Exited with exit code 3\n", b"logcapture: task 1 not captured\n",
    b"rank 0 step 1\n", b"0: srun: not srun's\n", b"sru\n", b"srun:no space\n", b"\n",
    b"x srun: mid-line\n", b"\rprogress 50%\r", b"srun", b": tail\n", b"logcap", b"ture: x\n",
    b"bar\rsrun: error: after a bar\n", b"\r"]),
    max_size=12)


def _kept(lines: list[bytes]) -> bytes:
    """The kept lines of the whole text (the rule, spelled out): from a start of the text or
    after a newline or carriage return, a prefix, to the next newline or the end."""
    text = b"".join(lines)
    return b"".join(re.findall(rb"(?:\A|(?<=[\r\n]))(?:srun|logcapture): [^\n]*(?:\n|\Z)",
                               text))


@settings(max_examples=300, deadline=None)
@given(LINES, st.lists(st.integers(min_value=1, max_value=40), max_size=10))
def test_srun_messages_are_found_however_the_bytes_are_cut(lines: list[bytes],
                                                           cuts: list[int]) -> None:
    text = b"".join(lines)
    found = SrunMessages()
    got, pos = b"", 0
    for size in cuts:
        got += found.feed(text[pos:pos + size])
        pos += size
    got += found.feed(text[pos:]) + found.finish()
    assert got == _kept(lines)


def test_a_long_line_is_no_message_of_srun() -> None:
    found = SrunMessages()
    assert found.feed(b"srun: " + b"x" * 70000) == b""
    assert found.feed(b"y\nsrun: error: z\n") == b"srun: error: z\n"
    assert found.finish() == b""
