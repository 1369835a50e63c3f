"""srun's side of the forwarding protocol (logcapture.slurm.forward), as the SPANK plugin
(slurm/spank/logcapture_task.c) does it, for tests: ``python forward_client.py ADDRESS STEP...``
connects, puts the pipes it gets on fds 1 and 2, and runs each STEP: ``out:TEXT`` or
``err:TEXT`` writes TEXT (with ``\\n`` expanded) to fd 1 or 2, ``sleep:S`` sleeps, ``kill``
ends at once without saying ``E`` (srun killed), ``show`` prints the reply on fd 1,
``hold:S`` leaves a child holding fds 1 and 2 for S seconds."""

from __future__ import annotations

import os
import socket
import sys
import time


def forward(address: bytes) -> tuple[socket.socket | None, dict[int, int], bytes]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
    except OSError:
        return None, {}, b""
    socket.send_fds(sock, [b"F"], [1, 2])
    reply, fds, _, _ = socket.recv_fds(sock, 3, 2)
    saved: dict[int, int] = {}
    if reply[:1] == b"F" and len(reply) == 3:
        for fd, index in zip((1, 2), reply[1:], strict=True):
            if index != ord("-"):
                saved[fd] = os.dup(fd)
                os.dup2(fds[index - ord("0")], fd)
    for fd in fds:
        os.close(fd)
    return sock, saved, reply


def end(sock: socket.socket, saved: dict[int, int]) -> bytes:
    for fd, original in saved.items():
        os.dup2(original, fd)
        os.close(original)
    sock.send(b"E")
    return sock.recv(1)


def main(argv: list[str]) -> int:
    sock, saved, reply = forward(argv[0].encode().replace(b"@", b"\0", 1))
    for step in argv[1:]:
        what, _, arg = step.partition(":")
        if what in ("out", "err"):
            os.write(1 if what == "out" else 2, arg.replace("\\n", "\n").encode())
        elif what == "sleep":
            time.sleep(float(arg))
        elif what == "hold":  # a child that keeps fds 1 and 2 open for S seconds
            if os.fork() == 0:
                time.sleep(float(arg))
                os._exit(0)
        elif what == "show":
            os.write(1, reply + b"\n")
        elif what == "kill":
            os._exit(0)
    if sock is not None and saved:
        end(sock, saved)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
