"""The web application of ``logcapture serve``: a Starlette app, read-only, behind a token.

Pages are static HTML and JavaScript shipped in ``static/`` (uPlot, vendored, draws the
graphs); they ask the JSON endpoints below, which answer from :mod:`.reads`. A running job's
new log entries come as server-sent events (``/api/runs/RUN/follow``).

Access: the token is in the URL ``serve`` prints (Jupyter's convention). A request carrying it
(``?token=``) gets it set as a cookie, so later requests and links need not repeat it; a
request with neither gets 403. Cookies are not kept apart by port (RFC 6265, section 8.5): a
browser sends a cookie for 127.0.0.1 to every port of it, so the cookie's name carries the
port (``cookie_name``), and two pages served on one host never overwrite each other's token.
Only GET and HEAD exist: nothing here changes data.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from string import Template
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import LogcaptureError, NotFound, UsageError
from ..logview import parse_cursor
from ..query import LOG_PAGE, LOG_PAGE_MAX
from .reads import Pages

STATIC = Path(__file__).with_name("static")
COOKIE = "logcapture_token"  # + "_<port>": cookie_name
FOLLOW_POLL = 0.5  # seconds between reads of a running job's new entries
HEARTBEAT = 15.0  # seconds: an SSE comment keeps proxies and ssh tunnels from closing
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; "
                                 b"style-src 'self'; script-src 'self'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


def cookie_name(port: int | None) -> str:
    """The token's cookie for the page on ``port`` (None: a page not on a port, in tests)."""
    return COOKIE if port is None else f"{COOKIE}_{port}"


class TokenGate:
    """403 for any request without the token (query ``token`` or the cookie ``cookie``); 405
    for any method but GET and HEAD. A request with ``?token=`` gets the cookie."""

    def __init__(self, app: ASGIApp, token: str, cookie: str = COOKIE) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = request.query_params.get("token")
        if given is None:  # no token in the URL: the cookie an earlier one set
            given = request.cookies.get(self.cookie)
            set_cookie = False
        else:  # a token in the URL decides, even beside a valid cookie
            set_cookie = True
        ok = given is not None and hmac.compare_digest(given.encode(), self.token.encode())
        if not ok:
            response: Response = PlainTextResponse(
                "403: this page needs the token printed by `logcapture serve` "
                "(open the URL it printed)\n", status_code=403)
            await response(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await PlainTextResponse("405: read-only\n", status_code=405)(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", [])) + SECURITY_HEADERS
                if set_cookie:
                    cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                    headers.append((b"set-cookie", cookie.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _json(data: Any) -> Response:
    return Response(json.dumps(data, allow_nan=False, default=_finite, separators=(",", ":")),
                    media_type="application/json")


def _finite(o: Any) -> Any:
    return str(o)


def _clean(value: Any) -> Any:
    """JSON has no NaN: a non-finite float becomes its name, as the spool writes it."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "0") in ("1", "true", "on")


def _limit(request: Request, default: int = LOG_PAGE) -> int:
    try:
        n = int(request.query_params.get("limit", default))
    except ValueError:
        raise UsageError("limit must be a whole number") from None
    return max(1, min(n, LOG_PAGE_MAX))


def _line(request: Request) -> int | None:
    """``?line=N``: the page that begins with line N (the page's ``#LN``)."""
    value = request.query_params.get("line")
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise UsageError("line must be a line number (1, 2, ...)")
    return int(value)


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread: the readers block (store queries, spool reads)."""
    return await anyio.to_thread.run_sync(fn, *args)


# The pages: (file of its <main> and scripts, title, whether it draws charts). Each is put
# into layout.html, the one head and top bar they share, once when the app is built.
PAGES = {"/": ("runs.html", "Runs", False), "/job/{ref}": ("job.html", "Job", True),
         "/compare": ("compare.html", "Compare", True)}
_NAV = (("/", "Runs"), ("/compare", "Compare"))


def page_html(path: str) -> str:
    """The whole HTML of the page served at ``path`` (a key of ``PAGES``)."""
    name, title, charts = PAGES[path]
    nav = "".join(f'<a href="{href}"' + (' class="here"' if href == path else "")
                  + (' id="compare-link"' if href == "/compare" else "") + f">{text}</a>"
                  for href, text in _NAV)
    styles = '<link rel="stylesheet" href="/static/vendor/uPlot.min.css">\n' if charts else ""
    return Template((STATIC / "layout.html").read_text()).substitute(
        title=title, styles=styles, nav=nav, main=(STATIC / name).read_text())


def _html(path: str) -> Callable[[Request], Any]:
    html = page_html(path)

    async def endpoint(request: Request) -> Response:
        return HTMLResponse(html)
    return endpoint


def _per_run(question: Callable[[str], Any]) -> Callable[[Request], Any]:
    """An endpoint answering ``question(ref)`` for the run in the path, as JSON."""
    async def endpoint(request: Request) -> Response:
        return _json(_clean(await _call(question, request.path_params["ref"])))
    return endpoint


class _Api:
    """The endpoints that take more than the run: each asks ``pages`` in a worker thread."""

    def __init__(self, pages: Pages):
        self.pages = pages

    async def runs(self, request: Request) -> Response:
        return _json(await _call(self.pages.runs))

    async def log(self, request: Request) -> Response:
        q = request.query_params
        return _json(await _call(self.pages.log, request.path_params["ref"],
                                 _flag(request, "stderr"), q.get("before"), q.get("after"),
                                 _limit(request), _line(request)))

    async def metadata(self, request: Request) -> Response:
        # ?rank=N|all: which ranks' metadata of a job with task runs (default 0)
        return _json(_clean(await _call(self.pages.metadata, request.path_params["ref"],
                                        request.query_params.get("rank") or None)))

    async def job_log(self, request: Request) -> Response:
        q = request.query_params
        return _json(await _call(self.pages.job_log, request.path_params["ref"],
                                 q.get("rank", ""), q.get("node", ""), _limit(request),
                                 _line(request)))

    async def follow(self, request: Request) -> Response:
        ref = request.path_params["ref"]
        stderr = _flag(request, "stderr")
        after = request.query_params.get("after")
        if after is not None:
            parse_cursor(after)  # 400 now rather than inside the stream
        first = await _call(self.pages.log, ref, stderr, None, after, LOG_PAGE_MAX)
        if after is None:
            first["more"] = False  # the newest page: what lies beyond it is older
        return StreamingResponse(self._events(ref, stderr, first, after),
                                 media_type="text/event-stream",
                                 headers={"X-Accel-Buffering": "no"})

    async def _events(self, ref: str, stderr: bool, page: dict[str, Any],
                      cursor: str | None) -> AsyncIterator[str]:
        """Server-sent events: each new page's entries, a comment every HEARTBEAT seconds of
        quiet (a proxy keeps the connection), and ``end`` once the run ended and all is sent."""
        quiet = 0.0
        while True:
            if page["entries"]:
                cursor, quiet = page["entries"][-1]["cursor"], 0.0
                yield "event: entries\ndata: " + json.dumps({"entries": page["entries"]}) + "\n\n"
            if page["ended"] and not page["more"]:
                yield "event: end\ndata: {}\n\n"
                return
            if not page["more"]:
                await asyncio.sleep(FOLLOW_POLL)
                quiet += FOLLOW_POLL
                if quiet >= HEARTBEAT:
                    quiet = 0.0
                    yield ": still here\n\n"
            page = await _call(self.pages.log, ref, stderr, None, cursor, LOG_PAGE_MAX)

    async def export(self, request: Request) -> Response:
        q = request.query_params
        body, name, media = await _call(self.pages.export, request.path_params["ref"],
                                        q.get("what", "lines"), q.get("format", "csv"))
        return Response(body, media_type=media,
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})

    async def search(self, request: Request) -> Response:
        return _json(_clean(await _call(self.pages.search, dict(request.query_params))))

    async def compare(self, request: Request) -> Response:
        refs = [r for r in request.query_params.get("runs", "").split(",") if r][:20]
        key = request.query_params.get("key", "")
        return _json(_clean(await _call(self.pages.compare, refs, key)))


async def _on_error(request: Request, exc: Exception) -> Response:
    status = 404 if isinstance(exc, NotFound) else 400
    message = exc.message if isinstance(exc, LogcaptureError) else str(exc)
    return JSONResponse({"error": message}, status_code=status)


def create_app(pages: Pages, token: str, port: int | None = None) -> Starlette:
    """The app for ``pages`` behind ``token``, served on ``port`` (its cookie's name)."""
    api = _Api(pages)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def releaser() -> None:
            while True:
                await asyncio.sleep(1.0)
                await _call(pages.release_idle)

        task = asyncio.create_task(releaser())
        try:
            yield
        finally:
            task.cancel()
            await _call(pages.close)

    routes = [
        *(Route(path, _html(path)) for path in PAGES),
        Route("/api/runs", api.runs),
        Route("/api/runs/{ref}", _per_run(pages.header)),
        Route("/api/runs/{ref}/insights", _per_run(pages.insights)),
        Route("/api/runs/{ref}/log", api.log),
        Route("/api/runs/{ref}/follow", api.follow),
        Route("/api/runs/{ref}/tasks", _per_run(pages.tasks)),
        Route("/api/runs/{ref}/joblog", api.job_log),
        Route("/api/runs/{ref}/metadata", api.metadata),
        Route("/api/runs/{ref}/resources", _per_run(pages.resources)),
        Route("/api/runs/{ref}/progress", _per_run(pages.progress)),
        Route("/api/arrays/{ref}", _per_run(pages.array)),
        Route("/api/runs/{ref}/export", api.export),
        Route("/api/compare", api.compare),
        Route("/api/search", api.search),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]
    return Starlette(routes=routes, middleware=[Middleware(TokenGate, token=token,
                                                           cookie=cookie_name(port))],
                     exception_handlers={LogcaptureError: _on_error}, lifespan=lifespan)
