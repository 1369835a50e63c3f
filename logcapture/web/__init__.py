"""``logcapture serve``: the user's runs as web pages (runs, job, compare), read-only."""

from __future__ import annotations

import os
import secrets
import socket
import sys
from typing import Any, TextIO

from ..errors import UsageError

DEFAULT_PORT = 8750
PORT_TRIES = 20  # like Jupyter: the default port taken, try the next ones
TOKEN_ENV = "LOGCAPTURE_SERVE_TOKEN"  # the token handed to a fresh start in place
WEAR_CHECK = 1.0  # seconds between looks at the store's wear on the process


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; with the default port, the next free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    tries = PORT_TRIES if port == DEFAULT_PORT else 1
    last: OSError | None = None
    for p in range(port, port + tries):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, p))
        except OSError as e:
            sock.close()
            last = e
            continue
        # Accepted connections inherit it: a response's head and body go out as separate
        # writes, and Nagle's algorithm held the body for the client's delayed ACK (~40 ms
        # on every request).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.listen(128)
        sock.set_inheritable(True)
        return sock
    raise UsageError(f"cannot listen on {host}:{port}: {last.strerror if last else ''}")


def url_of(sock: socket.socket, token: str) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/?token={token}"


def serve(reader: Any, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          open_browser: bool = True, out: TextIO = sys.stdout,
          token: str | None = None, header_timeout: float | None = None,
          idle_timeout: int | None = None, max_connections: int | None = None,
          start_afresh_when_worn: bool = False) -> None:
    """Serve ``reader`` (a ``query.Reader``: what the pages may show) until interrupted; the
    first line on ``out`` is the URL with the token. The limits on connections (None: the
    defaults) are ``connections``'s. ``start_afresh_when_worn`` (the command's): once the
    embedded store has worn the process, execute the command again in place
    (``recycle.start_afresh``) on the same socket and token."""
    import asyncio

    import uvicorn

    from ..recycle import adopt_listener, start_afresh
    from ..store import engine_turns, engine_worn
    from . import connections as C
    from .app import create_app
    from .reads import Pages

    sock = adopt_listener((socket.AF_INET, socket.AF_INET6))
    again = sock is not None and bool(os.environ.get(TOKEN_ENV))
    token = os.environ.pop(TOKEN_ENV, "") if again else token or secrets.token_urlsafe(24)
    if sock is None:
        sock = bind(host, port)
    url = url_of(sock, token)
    if not again:  # a fresh start in place: the URL given before still holds
        print(url, file=out, flush=True)
        if host not in ("127.0.0.1", "localhost", "::1"):
            print(f"logcapture serve: listening on {host}: anyone who can reach it and has "
                  "the token reads your runs", file=sys.stderr, flush=True)
        if open_browser and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                             or sys.platform == "darwin"):
            import webbrowser

            webbrowser.open(url)
    protocol = C.guarded_h11(C.HEADER_TIMEOUT if header_timeout is None else header_timeout,
                             C.MAX_CONNECTIONS if max_connections is None else max_connections)
    config = uvicorn.Config(create_app(Pages(reader), token, sock.getsockname()[1]),
                            log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=1, http=protocol,
                            timeout_keep_alive=idle_timeout or C.IDLE_TIMEOUT)
    server = uvicorn.Server(config)
    worn = False

    async def watch_wear() -> None:
        """An embedded store wears the process a little at each opening
        (``store.engine_worn``): once worn, the server ends at a moment no connection is
        open, for a fresh start in place on the same socket and token."""
        nonlocal worn
        since = engine_turns()
        while not server.should_exit:
            await asyncio.sleep(WEAR_CHECK)
            if not server.server_state.connections and engine_worn(since=since):
                worn = server.should_exit = True

    async def run() -> None:
        asyncio.get_running_loop().set_exception_handler(C.AcceptErrors())
        watch = asyncio.create_task(watch_wear()) if start_afresh_when_worn else None
        try:  # uvicorn closes the sockets it serves: its own copy, so this one stays
            await server.serve(sockets=[sock.dup()])
        finally:
            if watch is not None:
                watch.cancel()

    # asyncio's own loop (not uvloop where installed): AcceptErrors knows how it reports a
    # failed accept().
    asyncio.run(run())  # a TERM or INT it caught is raised again as it returns (uvicorn)
    if worn:
        start_afresh(f"logcapture serve: starting afresh after {engine_turns()} turns on the "
                     "embedded store (chDB leaves threads behind each turn), on the same "
                     "address and token", listener=sock.fileno(), env={TOKEN_ENV: token})

