"""srun's output in a captured batch job: copied to the job's outputs, stored once.

``srun`` writes what its tasks print to its own stdout and stderr, which in a captured batch
job are the batch script's pty. Each task is captured on its own already (``slurm.task``), so
those lines would be stored twice: in the task's run and again as lines of the batch run. The
SPANK plugin (``slurm/spank/logcapture_task.c``) therefore acts in ``srun`` as well, in its
``slurm_spank_init_post_opt`` (srun, as the user, after option parsing and before the step is
created, which is when srun first writes anything a task printed):

1. it connects to the batch capture's abstract unix socket (``batch_address``: named after the
   job) and checks that its peer is the job's user (``SO_PEERCRED``);
2. it sends its fds 1 and 2 (``SCM_RIGHTS``); the ``Forwarder`` here (in the wrapper's reader,
   ``runner.readloop.ReadLoop``) answers for each one that is one of the batch's ptys with the write
   end of a pipe of its own (one pipe per pty: stdout and stderr that share a pty share a pipe,
   so their order is kept), first copying out what the ptys hold, so that what the script
   printed before srun started reaches the output first;
3. the plugin puts the pipes on srun's fds 1 and 2 (keeping the originals) and srun runs;
   the reader copies every byte from the pipes to the batch's outputs exactly as it copies the
   pty's bytes (the output files are what they would be without logcapture) but stores none of
   them as batch lines except srun's own messages (``SrunMessages``: ``srun: error: ...``,
   and logcapture's warnings about a task it could not capture): the tasks' lines are in the
   task runs;
4. in ``slurm_spank_exit`` (srun's exit) the plugin puts the original fds back, says ``E``,
   and waits for the ``K`` that the reader sends once it has copied all srun wrote: only then
   does srun exit and the script go on, so what the script prints after srun comes after it.

Anything that fails leaves srun as it was: its output then goes through the batch's pty and
is stored with the batch run, as before. The socket is the job user's: the reader accepts
only connections of its own uid, and the plugin only a peer of its own uid.

The reply to ``F`` (three bytes, with the pipes' write ends): ``F`` then, for srun's fd 1 and
fd 2, the index of the pipe among the descriptors sent, or ``-`` to leave that fd alone;
``N--`` when neither fd is the batch's pty (an srun within a task, or with its output
redirected elsewhere).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing's: this package imports only os and sys up front
if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping

    from ..runner.readloop import ReadLoop

# Lines of srun's own (its log prefix is its program name) and logcapture's (a task that could
# not be captured says so on its stderr): kept as lines of the batch run.
KEPT_PREFIXES = (b"srun: ", b"logcapture: ")
KEPT_MAX = 64 * 1024  # a longer "line" is no message of theirs
READ_SIZE = 65536
READS_IN_A_ROW = 16
PIPE_BYTES = 1 << 20  # asked of F_SETPIPE_SZ: fewer wake-ups for a flood; the kernel may grant less
REQUEST, END, DONE, REFUSED = b"F", b"E", b"K", b"N--"


def batch_address(job: str) -> bytes:
    """The abstract socket name (unix(7)) of a job's batch capture; the plugin's
    ``batch_address`` makes the same."""
    return f"\0logcapture/batch/{job}".encode()


class SrunMessages:
    """Finds srun's own lines in what srun wrote (its tasks' output and its messages, as it
    wrote them, in pieces of any size): ``feed`` returns the complete lines of the bytes fed
    that start with a ``KEPT_PREFIXES`` prefix, ``finish`` an unfinished last one. A line
    starts after a newline or a carriage return (srun's message after a task's progress bar
    is drawn at the start of the terminal's line) and ends at a newline."""

    def __init__(self) -> None:
        self.line = bytearray()  # the unfinished last line, while it is or may be a kept one
        self.other = False  # the unfinished last line is the tasks'

    def feed(self, data: bytes) -> bytes:
        if self.line:  # go on from that line's start
            data = bytes(self.line) + data
            self.line.clear()
        kept = bytearray()
        pos, n = 0, len(data)
        if self.other:
            pos = _next_start(data, 0)
            if pos < 0:
                return b""
            self.other = False
        while pos < n:  # at a line start
            at = _first_prefix(data, pos)  # most pieces have none
            if at < 0:
                break
            if _last_start(data, pos, at) != at:  # inside a line of the tasks'
                pos = _next_start(data, at)
                if pos < 0:
                    self.other = True
                    return bytes(kept)
                continue
            nl = data.find(b"\n", at)
            if nl < 0:
                self._hold(data[at:])
                return bytes(kept)
            kept += data[at:nl + 1]
            pos = nl + 1
        tail = data[max(pos, _last_start(data, pos, n)):]
        if tail:
            self._hold(tail)
        return bytes(kept)

    def _hold(self, tail: bytes) -> None:
        if _may_be_kept(tail):
            self.line += tail
        else:
            self.other = True

    def finish(self) -> bytes:
        line, self.line = bytes(self.line), bytearray()
        self.other = False
        return line if line.startswith(KEPT_PREFIXES) else b""


def _next_start(data: bytes, pos: int) -> int:
    """Where the next line starts after ``pos`` (after a newline or a carriage return); -1."""
    found = [i for i in (data.find(b"\n", pos), data.find(b"\r", pos)) if i >= 0]
    return min(found) + 1 if found else -1


def _last_start(data: bytes, pos: int, end: int) -> int:
    """The start of the line that ``end`` is in, or ``pos`` when that is later."""
    return max(pos, data.rfind(b"\n", pos, end) + 1, data.rfind(b"\r", pos, end) + 1)


def _first_prefix(data: bytes, pos: int) -> int:
    found = [i for i in (data.find(p, pos) for p in KEPT_PREFIXES) if i >= 0]
    return min(found) if found else -1


def _may_be_kept(line: bytes | bytearray) -> bool:
    """Is ``line`` (unfinished) a kept line, or the beginning of one?"""
    if len(line) > KEPT_MAX:
        return False
    return any(line[:len(p)] == p[:len(line)] for p in KEPT_PREFIXES)


class _Pipe:
    """One pipe srun writes instead of a batch pty: its read end, the batch stream it stands
    for, its srun's connection."""

    __slots__ = ("fd", "stream", "conn", "messages")

    def __init__(self, fd: int, stream: str, conn: int):
        self.fd = fd
        self.stream = stream
        self.conn = conn
        self.messages = SrunMessages()


class Forwarder:
    """The batch capture's side (``runner.outcome.Options.beside``): the listening socket, each
    srun's connection and pipes, served in the reader's rounds. Never raises into the reader:
    an srun it cannot serve is refused (it then runs as without forwarding)."""

    def __init__(self, address: bytes):
        self.address = address
        self.sock: socket.socket | None = None
        self.slaves: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) of a batch pty: stream
        self.conns: dict[int, socket.socket] = {}
        self.pipes: dict[int, _Pipe] = {}
        self.loop: ReadLoop | None = None

    # --- runner.outcome.Beside -----------------------------------------------------------------
    def open(self, slaves: Mapping[int, str]) -> None:
        """Listen, before the batch script starts; ``slaves``: {pty slave fd: stream}."""
        import socket

        try:
            for fd, stream in slaves.items():
                st = os.fstat(fd)
                self.slaves[(st.st_dev, st.st_ino)] = stream
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        except OSError:
            return
        try:
            sock.bind(self.address)  # taken (by anyone): srun is left as it is
            sock.listen(64)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return
        self.sock = sock

    def start(self, loop: ReadLoop) -> None:
        self.loop = loop
        if self.sock is not None:
            self._watch(self.sock.fileno())

    def round(self, events: list[tuple[int, int]], now: float, now_m: float) -> bool:
        """Serve the socket's and connections' events, then read every pipe (each round,
        before the ptys are read: see ``runner.readloop.ReadLoop._round``). Whether the worker was
        given output."""
        sent = False
        if self.sock is None and not self.pipes:
            return False
        listening = self.sock.fileno() if self.sock is not None else -1
        for fd, _ in events:
            if fd == listening:
                self._accept()
            elif fd in self.conns:
                sent = self._serve(fd, now, now_m) or sent
        for pipe in list(self.pipes.values()):
            sent = self._read(pipe, now, now_m, READS_IN_A_ROW) or sent
        return sent

    def stop(self) -> None:
        """The reader's last round: copy what the pipes hold, refuse new sruns, let those that
        wait at their exit go on. The pipes' read ends stay open until this process exits, so
        that an srun still running writes on (a broken pipe would kill it)."""
        if self.loop is not None:
            import time

            now, now_m = time.time(), time.monotonic()
            for pipe in list(self.pipes.values()):
                self._read(pipe, now, now_m, None)
                if pipe.fd in self.pipes:  # still open
                    self._finish(pipe, now, now_m)
                    self._unwatch(pipe.fd)
            self.pipes.clear()
        for fd in list(self.conns):
            self._drop(fd)
        if self.sock is not None:
            self._unwatch(self.sock.fileno())
            self.sock.close()
            self.sock = None

    # --- connections --------------------------------------------------------------------------
    def _accept(self) -> None:
        from .task import peer_uid

        assert self.sock is not None
        for _ in range(16):
            try:
                conn, _ = self.sock.accept()
            except OSError:  # none left (BlockingIOError), or a transient failure
                return
            if peer_uid(conn) != os.getuid():  # the job's own srun only
                conn.close()
                continue
            conn.setblocking(False)
            self.conns[conn.fileno()] = conn
            self._watch(conn.fileno())

    def _serve(self, fd: int, now: float, now_m: float) -> bool:
        import socket

        conn = self.conns[fd]
        try:
            msg, fds, _, _ = socket.recv_fds(conn, 16, 2)
        except BlockingIOError:
            return False
        except OSError:
            msg, fds = b"", []
        sent = False
        try:
            if not msg:  # srun has exited (or was killed): what it wrote goes out first
                sent = self._drain_conn(fd, now, now_m)
                self._drop(fd)
                return sent
            for byte in msg:
                if byte == REQUEST[0]:
                    sent = self._hand_out(conn, fds, now, now_m) or sent
                    fds = []
                elif byte == END[0]:
                    sent = self._drain_conn(fd, now, now_m) or sent
                    try:
                        conn.send(DONE)
                    except OSError:
                        pass
        finally:
            for received in fds:
                os.close(received)
        return sent

    def _hand_out(self, conn: socket.socket, fds: list[int], now: float, now_m: float) -> bool:
        """srun's fds 1 and 2 came: a pipe for each that is a batch pty (the reply, module
        docstring)."""
        import fcntl
        import socket

        targets = []
        for fd in fds[:2]:
            try:
                st = os.fstat(fd)
                targets.append(self.slaves.get((st.st_dev, st.st_ino)))
            except OSError:
                targets.append(None)
            os.close(fd)
        if len(targets) != 2 or not any(targets) or any(
                p.conn == conn.fileno() for p in self.pipes.values()):
            self._reply(conn, REFUSED)
            return False
        assert self.loop is not None
        # What the script wrote before srun started goes out before anything srun writes.
        sent = self.loop.drain_ptys(now, now_m)
        streams: dict[str, int] = {}
        ends: list[int] = []
        made: list[int] = []
        reply = REQUEST
        try:
            for stream in targets:
                if stream is None:
                    reply += b"-"
                    continue
                if stream not in streams:
                    r, w = os.pipe2(os.O_CLOEXEC)
                    made += [r, w]
                    try:
                        fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
                    except OSError:
                        pass
                    os.set_blocking(r, False)
                    streams[stream] = len(ends)
                    ends.append(w)
                    self.pipes[r] = _Pipe(r, stream, conn.fileno())
                reply += str(streams[stream]).encode()
            socket.send_fds(conn, [reply], ends)
        except OSError:
            for r in [p.fd for p in self.pipes.values() if p.conn == conn.fileno()]:
                del self.pipes[r]
            for fd in made:
                os.close(fd)
            self._drop(conn.fileno())
            return sent
        for w in ends:
            os.close(w)  # srun has them now
        for pipe in self.pipes.values():
            if pipe.conn == conn.fileno():
                self._watch(pipe.fd)
        return sent

    def _reply(self, conn: socket.socket, reply: bytes) -> None:
        try:
            conn.send(reply)
        except OSError:
            self._drop(conn.fileno())

    def _drain_conn(self, conn: int, now: float, now_m: float) -> bool:
        """Everything the connection's srun wrote, copied out now (it has stopped writing)."""
        sent = False
        for pipe in [p for p in self.pipes.values() if p.conn == conn]:
            sent = self._read(pipe, now, now_m, None) or sent
        return sent

    def _drop(self, fd: int) -> None:
        for pipe in self.pipes.values():  # (one still open outlives its srun's connection,
            if pipe.conn == fd:           # whose number the next srun's may get)
                pipe.conn = -1
        conn = self.conns.pop(fd, None)
        if conn is not None:
            self._unwatch(fd)
            conn.close()

    # --- the pipes ----------------------------------------------------------------------------
    def _read(self, pipe: _Pipe, now: float, now_m: float, reads: int | None) -> bool:
        """Read ``pipe`` until it is empty (at most ``reads`` reads; None: no bound) and pass
        every byte on (``ReadLoop.pass_through``)."""
        assert self.loop is not None
        sent = False
        n = 0
        while reads is None or n < reads:
            n += 1
            try:
                data = os.read(pipe.fd, READ_SIZE)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:  # every writer closed it: srun and any process it started
                sent = self._finish(pipe, now, now_m) or sent
                self._unwatch(pipe.fd)
                del self.pipes[pipe.fd]
                os.close(pipe.fd)
                break
            sent = self.loop.pass_through(pipe.stream, data, pipe.messages.feed(data), now,
                                          now_m) or sent
            if len(data) < READ_SIZE:
                break
        return sent

    def _finish(self, pipe: _Pipe, now: float, now_m: float) -> bool:
        last = pipe.messages.finish()
        assert self.loop is not None
        return bool(last) and self.loop.pass_through(pipe.stream, b"", last, now, now_m)

    def _watch(self, fd: int) -> None:
        import select

        assert self.loop is not None
        self.loop.poller.register(fd, select.POLLIN)

    def _unwatch(self, fd: int) -> None:
        assert self.loop is not None
        try:
            self.loop.poller.unregister(fd)
        except KeyError:
            pass
