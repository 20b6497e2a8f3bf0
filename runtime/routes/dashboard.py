"""The live dashboard, for the admin, in a browser:

    GET  /cdn-cgi/edge/dashboard              the page (a login form without a session)
    POST /cdn-cgi/edge/dashboard/login        form field `token`: the admin token, traded for an
                                              HttpOnly, SameSite=Strict session cookie
    POST /cdn-cgi/edge/dashboard/logout
    GET  /cdn-cgi/edge/dashboard/events       the Server-Sent Events stream (session cookie)
    GET  /cdn-cgi/edge/dashboard/static/NAME  the page's own CSS and JavaScript (no state in them)

The stream's bounds are runtime.control.dashboard_feed's; what it shows is runtime.routes.dashboard_view's."""

from __future__ import annotations

import asyncio
import hmac
import html
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from edge_sim.edge import Edge
from runtime.control.admin import ADMIN_TOKEN_ENV, CONTROL_BODY_BYTES, read_capped
from runtime.control.dashboard_feed import DashboardFeed, sse
from runtime.control.dashboard_sessions import COOKIE, SESSION_SECONDS, DashboardSessions
from runtime.control.rollout import Rollouts
from runtime.http.errors import ADMIN_AUTH, BAD_CONTROL_REQUEST, BODY_TOO_LARGE, error_response
from runtime.routes.dashboard_view import SnapshotBuilder, topology_view

log = logging.getLogger("edge.runtime")

PATH = "/cdn-cgi/edge/dashboard"
STATIC = Path(__file__).parent / "dashboard_static"
STATIC_FILES = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}
UPDATES_PER_SECOND = 2  # "at most a few": one snapshot built and encoded per tick for all browsers
KEEPALIVE_S = 15.0
# the page loads only its own files: no CDN, no inline script, nothing framed
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class DashboardEndpoints:
    def __init__(
        self,
        edge: Edge,
        feed: DashboardFeed,
        rollouts: Rollouts | None,
        admin_token: str | None,
        ai_search: Callable[[], list[dict[str, Any]]] | None = None,
    ):
        self.edge, self.feed, self.admin_token = edge, feed, admin_token
        self.sessions = DashboardSessions()
        self.snapshots = SnapshotBuilder(edge, feed, rollouts, ai_search)

    def routes(self) -> list[Route]:
        return [
            Route(PATH, self.page, methods=["GET"]),
            Route(PATH + "/login", self.login, methods=["POST"]),
            Route(PATH + "/logout", self.logout, methods=["POST"]),
            Route(PATH + "/events", self.events, methods=["GET"]),
            Route(PATH + "/static/{name}", self.static, methods=["GET"]),
        ]

    def _signed_in(self, request: Request) -> bool:
        return self.sessions.valid(request.cookies.get(COOKIE))

    async def page(self, request: Request) -> Response:
        if not self._signed_in(request):
            return _login_form(None, 200)
        return _secured(FileResponse(STATIC / "dashboard.html", media_type="text/html"))

    async def login(self, request: Request) -> Response:
        body = await read_capped(request, CONTROL_BODY_BYTES)
        if body is None:
            return error_response(413, BODY_TOO_LARGE, "a login form is a few bytes")
        try:
            token = parse_qs(body.decode(), max_num_fields=4).get("token", [""])[0].strip()
        except (UnicodeDecodeError, ValueError):
            return error_response(400, BAD_CONTROL_REQUEST, "send the form field token=<admin token>")
        expected = (self.admin_token or "").encode()
        if not expected or not token or not hmac.compare_digest(token.encode(), expected):
            return _login_form("That is not the admin token.", 403)
        response = RedirectResponse(PATH, status_code=303)
        response.set_cookie(
            COOKIE,
            self.sessions.open(),
            max_age=SESSION_SECONDS,
            path=PATH,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(self, request: Request) -> Response:
        self.sessions.close(request.cookies.get(COOKIE))
        response = RedirectResponse(PATH, status_code=303)
        response.delete_cookie(COOKIE, path=PATH)
        return response

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC_FILES:  # only the page's own files, never a path
            return error_response(404, BAD_CONTROL_REQUEST, f"the dashboard has no file {name!r}")
        return _secured(FileResponse(STATIC / name, media_type=STATIC_FILES[name]))

    async def events(self, request: Request) -> Response:
        if not self._signed_in(request):
            return error_response(401, ADMIN_AUTH, f"sign in at {PATH} with the admin token first")
        client = self.feed.join()
        if client is None:
            why = (
                "the runtime is stopping"
                if self.feed.closed
                else f"{self.feed.max_clients} dashboards are open already; close one"
            )
            return error_response(503, BAD_CONTROL_REQUEST, why)
        feed, snapshots, sid = self.feed, self.snapshots, request.cookies.get(COOKIE)

        async def stream() -> AsyncIterator[bytes]:
            told = 0
            try:
                yield sse("topology", topology_view(self.edge))
                yield sse("snapshot", snapshots.build())
                while True:
                    items = await client.next(KEEPALIVE_S)
                    if items is None or not self.sessions.valid(sid):  # stopping, or signed out / expired
                        return
                    if not items:
                        yield b": keep-alive\n\n"
                    for data in items:
                        yield data
                    if client.dropped != told:  # say once per change how far this browser fell behind
                        told = client.dropped
                        yield sse("dropped", {"requests": told})
            finally:
                feed.leave(client)

        response = StreamingResponse(stream(), media_type="text/event-stream")
        response.headers["cache-control"] = "no-store"
        response.headers["x-accel-buffering"] = "no"
        return response

    async def publish_forever(self) -> None:
        """While a browser is open, a snapshot UPDATES_PER_SECOND times a second, built once for all."""
        while True:
            await asyncio.sleep(1.0 / UPDATES_PER_SECOND)
            if not self.feed.clients:
                continue
            try:
                started = time.perf_counter()
                snapshot = self.snapshots.build()
                self.feed.work_s += time.perf_counter() - started
                self.feed.publish_snapshot(snapshot)
            except Exception:  # a bug here must not stop the updates for good, nor reach serving
                log.exception("the dashboard's snapshot failed")


def _secured(response: Response) -> Response:
    response.headers["content-security-policy"] = CSP
    response.headers["x-content-type-options"] = "nosniff"
    response.headers["cache-control"] = "no-store"
    response.headers["referrer-policy"] = "no-referrer"
    return response


def _login_form(problem: str | None, status: int) -> Response:
    note = f'<p class="problem" role="alert">{html.escape(problem)}</p>' if problem else ""
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edge dashboard: sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{PATH}/static/dashboard.css"></head>
<body class="login"><main>
<h1>edge dashboard</h1>
<form method="post" action="{PATH}/login" autocomplete="off">
<label for="token">Admin token</label>
<input id="token" name="token" type="password" required autofocus>
<button type="submit">Sign in</button>
</form>{note}
<p class="hint">It is in <code>.edge/admin-token</code> (edge dev writes it at first start) or
<code>${ADMIN_TOKEN_ENV}</code>. It is sent once, in this form's body; the page then uses an
HttpOnly session cookie.</p>
</main></body></html>"""
    return _secured(HTMLResponse(page, status_code=status))
