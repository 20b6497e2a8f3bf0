"""The live dashboard in a real Chromium (Debian's `chromium`, over the DevTools protocol): it refuses
without the admin token and loads with it; requests appear in the list with their waterfall; a PoP
taken down turns red on the map and its requests go elsewhere; a rate-limited burst shows its 429s
in the per-account table; no console errors. One `edge dev` and one browser for the module; each
view's screenshot (1280x800) is written under .edge-screenshots/ (ignored) or $EDGE_SCREENSHOTS.

The login's HTTP contract (cookie flags, the token never taken from a URL) is checked without a
browser, so it runs where Chromium is missing too."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tests.browser.cdp import Browser, find_chromium
from tests.integration.dev_server import REPO, DevServer

DASHBOARD = "/cdn-cgi/edge/dashboard"
RPM = 10  # the dev account's AI calls a minute: the burst below passes it, the tests before stay under
SCREENS = Path(os.environ.get("EDGE_SCREENSHOTS", REPO / ".edge-screenshots"))

WORKER = """
from workers import AIError, Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        path = request.url.split("/", 3)[3].split("?")[0]
        if not path.startswith("ai/"):
            return Response("ok")
        print("<img src=x onerror=window.pwned=1> asked for", path)
        try:
            out = await self.env.AI.run(
                "@edge/moonshotai/kimi-k2-mini", {"prompt": "def fib(n):", "max_tokens": 3, "temperature": 0}
            )
        except AIError as exc:
            return Response(str(exc), status=429 if "3036" in str(exc) else 503)
        return Response.json(out)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dashboard")
    (folder / "worker.py").write_text(WORKER)
    (folder / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "dash"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [ai]
        binding = "AI"
        [edge]
        pops = ["ICN", "FRA"]
        models = ["@edge/moonshotai/kimi-k2-mini"]
        models_dir = "{REPO / "models"}"
        [edge.accounts.local]
        rpm = {RPM}
        """)
    )
    env = {"EDGE_ADMIN_TOKEN": ""}  # edge dev makes and saves its own
    with DevServer(folder / "wrangler-like.toml", cwd=folder, env=env) as srv:
        srv.admin_token = (folder / ".edge" / "admin-token").read_text().strip()
        srv.banner = srv.log.read_text()
        yield srv


@pytest.fixture(scope="module")
def browser(server):
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium found: `apt-get install -y chromium` (Debian), or set EDGE_CHROMIUM to one")
    b = Browser(executable)
    try:
        yield b
    finally:
        b.close()


def ai(server, tag: str, location: str = "Seoul") -> httpx.Response:
    return httpx.get(f"{server.url}/ai/{tag}", headers={"x-edge-client-location": location}, timeout=60)


def sign_in(browser: Browser, server, token: str) -> None:
    browser.goto(server.url + DASHBOARD)
    browser.wait_for("!!document.getElementById('token')")
    browser.evaluate(
        f"document.getElementById('token').value = {json.dumps(token)}; "
        "document.querySelector('form').submit(); 1"
    )


def test_the_login_trades_the_token_once_for_a_strict_http_only_cookie(server):
    assert f"dashboard: http://127.0.0.1:{server.port}{DASHBOARD}" in server.banner
    page = httpx.get(server.url + DASHBOARD)
    assert page.status_code == 200 and 'name="token"' in page.text and 'id="map"' not in page.text
    assert httpx.get(server.url + DASHBOARD + "/events").status_code == 401
    # the token is taken from the form's body only: not from the URL, nor a bearer header
    from_url = httpx.post(f"{server.url}{DASHBOARD}/login?token={server.admin_token}")
    assert from_url.status_code == 403 and "set-cookie" not in from_url.headers
    bearer = {"authorization": f"Bearer {server.admin_token}"}
    assert httpx.get(server.url + DASHBOARD + "/events", headers=bearer).status_code == 401
    assert httpx.post(server.url + DASHBOARD + "/login", data={"token": "edgeadm_wrong"}).status_code == 403
    huge = httpx.post(server.url + DASHBOARD + "/login", content=b"token=" + b"x" * 100_000)
    assert huge.status_code == 413
    signed = httpx.post(server.url + DASHBOARD + "/login", data={"token": server.admin_token})
    assert signed.status_code == 303
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and f"Path={DASHBOARD}" in cookie
    assert server.admin_token not in cookie and server.admin_token not in signed.headers["location"]
    sid = signed.cookies["edge_dashboard"]
    with httpx.stream("GET", server.url + DASHBOARD + "/events", cookies={"edge_dashboard": sid}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        assert next(lines) == "event: topology"
        # signing out ends the open stream too, at its next update
        out = httpx.post(server.url + DASHBOARD + "/logout", cookies={"edge_dashboard": sid})
        assert out.status_code == 303
        deadline = time.monotonic() + 30
        for _ in lines:
            assert time.monotonic() < deadline, "the stream went on after its session was closed"
    assert httpx.get(server.url + DASHBOARD + "/events", cookies={"edge_dashboard": sid}).status_code == 401
    assert httpx.get(f"{server.url}{DASHBOARD}/static/..%2Fdashboard.py").status_code == 404


def test_the_page_refuses_a_wrong_token_and_loads_with_the_admin_token(browser, server):
    sign_in(browser, server, "edgeadm_not-it")
    browser.wait_for("document.body.textContent.includes('That is not the admin token')")
    assert browser.evaluate("document.getElementById('map')") is None
    browser.errors.clear()  # the refusal's own "403" line, expected here
    sign_in(browser, server, server.admin_token)
    browser.wait_for("document.querySelectorAll('#map .pop.gpu').length === 2")
    browser.wait_for("document.getElementById('conn').textContent === 'live'")
    assert server.admin_token not in browser.evaluate("location.href + document.cookie")  # HttpOnly


def test_requests_appear_in_the_list_with_their_waterfall(browser, server):
    for i in range(2):
        assert ai(server, f"wf-{i}").status_code == 200
    assert ai(server, "wf-paris", "Paris").status_code == 200
    row = "#requests tr[data-path='/ai/wf-paris']"
    browser.wait_for(f'!!document.querySelector("{row} svg.wf rect.prefill")')
    assert browser.evaluate(f'document.querySelector("{row}").dataset.pop') == "FRA"
    assert browser.evaluate("document.querySelectorAll(\"#requests tr[data-path^='/ai/wf-']\").length") == 3
    browser.evaluate("document.querySelector('#tabs button[data-view=requests]').click(); 1")
    browser.evaluate(f'document.querySelector("{row}").click(); 1')
    detail = browser.wait_for("document.getElementById('detail').textContent.includes('modeled') && "
                              "document.getElementById('detail').textContent")  # fmt: skip
    assert "CDG" in detail and "FRA" in detail and "prefill" in detail
    # the worker's log line holds markup: shown as text, never run
    assert "<img src=x onerror=window.pwned=1> asked for ai/wf-paris" in detail
    assert browser.evaluate("window.pwned === undefined")
    browser.screenshot(SCREENS / "requests.png")


def test_a_pop_taken_down_turns_red_and_its_requests_go_elsewhere(browser, server):
    admin = {"authorization": f"Bearer {server.admin_token}"}
    browser.evaluate("document.querySelector('#tabs button[data-view=map]').click(); 1")
    assert (
        httpx.post(f"{server.url}/cdn-cgi/edge/pops/ICN/down", headers=admin, timeout=60).status_code == 200
    )
    try:
        browser.wait_for("document.querySelector('#pop-ICN circle.pop').classList.contains('down')")
        assert browser.evaluate("document.getElementById('card-ICN').classList.contains('down')")
        assert not browser.evaluate(
            "document.querySelector('#pop-FRA circle.pop').classList.contains('down')"
        )
        assert ai(server, "after-down").status_code == 200  # from Seoul, whose PoP is down
        row = "#requests tr[data-path='/ai/after-down']"
        browser.wait_for(f'!!document.querySelector("{row}")')
        assert browser.evaluate(f'document.querySelector("{row}").dataset.pop') == "FRA"
        browser.screenshot(SCREENS / "map.png")
    finally:
        httpx.post(f"{server.url}/cdn-cgi/edge/pops/ICN/up", headers=admin, timeout=60)
    browser.wait_for("!document.querySelector('#pop-ICN circle.pop').classList.contains('down')")


def test_a_rate_limited_burst_shows_its_429s_in_the_account_table(browser, server):
    browser.evaluate("document.querySelector('#tabs button[data-view=accounts]').click(); 1")
    statuses = []
    for i in range(3 * RPM):  # past the limit in any one window, wherever the minute turns
        statuses.append(ai(server, f"burst-{i}").status_code)
        if statuses[-1] == 429:
            break
    assert statuses[-1] == 429, statuses
    cell = "document.querySelector('#accounts tr[data-account=local] td.limited')"
    assert int(browser.wait_for(f"{cell} && Number({cell}.textContent) > 0 && {cell}.textContent")) >= 1
    browser.screenshot(SCREENS / "accounts.png")
    # the request list filtered to 4xx shows the refused call and none of the served ones
    last = f"#requests tr[data-path='/ai/burst-{len(statuses) - 1}']"
    browser.wait_for(f'!!document.querySelector("{last}")')
    shown = browser.evaluate(
        "(() => { const f = document.getElementById('f-status'); f.value = '4';"
        " f.dispatchEvent(new Event('change'));"
        " return [...document.querySelectorAll('#requests tbody tr')].filter((r) => !r.hidden)"
        ".map((r) => r.cells[4].textContent); })()"
    )
    assert shown and set(shown) == {"429"}, shown
    browser.evaluate(
        "(() => { const f = document.getElementById('f-status'); f.value = '';"
        " f.dispatchEvent(new Event('change')); return 1; })()"
    )


def test_the_other_views_draw_and_the_console_stayed_clean(browser, server):
    browser.evaluate("document.querySelector('#tabs button[data-view=models]').click(); 1")
    browser.wait_for("!!document.querySelector(\"#models tr[data-model='@edge/moonshotai/kimi-k2-mini']\")")
    assert "bf16" in browser.evaluate("document.querySelector('#models tbody').textContent")
    browser.screenshot(SCREENS / "models.png")
    browser.evaluate("document.querySelector('#tabs button[data-view=charts]').click(); 1")
    browser.wait_for("document.querySelectorAll('#charts polyline').length >= 3")
    browser.screenshot(SCREENS / "charts.png")
    assert browser.errors == []
