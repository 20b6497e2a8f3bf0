"""`env.AI` as Cloudflare ships it, through a real `edge dev`: each method and option a worker
reaches for (lastRequestId, returnRawResponse, tags, signal, models(), toMarkdown(), the error
Cloudflare raises), every other option refused by name, and an aborted call's KV blocks freed at
the PoP at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow

MODEL = "@edge/moonshotai/kimi-k2-mini"

WORKER = """
import asyncio, json
from js import AbortController, AbortSignal
from workers import AIError, Blob, Response, WorkerEntrypoint
from workers.abort import AbortError
from workers.errors import AiGatewayLogNotFound, InferenceUpstreamError

MODEL = "@MODEL@"
ASK = {"messages": [{"role": "user", "content": "def fib(n):"}], "max_tokens": 8}


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        path = request.url.split("/", 3)[3].split("?")[0]
        ai = self.env.AI
        if path == "option":
            body = await request.json()
            try:
                await ai.run(MODEL, ASK, body)
            except AIError as exc:
                return Response.json({"error": str(exc), "code": exc.code, "type": type(exc).__name__})
            return Response.json({"ok": True, "id": ai.lastRequestId})
        if path == "ids":
            out = await ai.run(MODEL, ASK, {"tags": ["a", "b"]})
            first = ai.lastRequestId
            await ai.run(MODEL, ASK)
            return Response.json({"first": first, "second": ai.lastRequestId,
                                  "gateway": ai.aiGatewayLogId, "response": out["response"]})
        if path == "raw":
            raw = await ai.run(MODEL, ASK, {"returnRawResponse": True})
            return Response.json({"status": raw.status, "type": type(raw).__name__,
                                  "headers": dict(raw.headers.items()), "body": await raw.json(),
                                  "id": ai.lastRequestId})
        if path == "raw-stream":
            raw = await ai.run(MODEL, {**ASK, "stream": True}, {"returnRawResponse": True})
            return Response.json({"headers": dict(raw.headers.items()), "body": await raw.text()})
        if path == "abort-before":
            controller = AbortController.new()
            controller.abort("changed my mind")
            try:
                await ai.run(MODEL, ASK, {"signal": controller.signal})
            except AbortError as exc:
                return Response.json({"aborted": str(exc), "name": exc.name})
            return Response.json({"aborted": None})
        if path == "abort-during":
            controller = AbortController.new()
            ask = {"messages": ASK["messages"], "max_tokens": 400, "stream": True}
            stream = await ai.run(MODEL, ask, {"signal": controller.signal})
            chunks = 0
            try:
                async for _ in stream:
                    chunks += 1
                    if chunks == 3:
                        controller.abort()
            except AbortError as exc:
                # the request goes on: only the aborted call ends (not the request's end ending it)
                await asyncio.sleep(1.5)
                return Response.json({"chunks": chunks, "aborted": exc.name})
            return Response.json({"chunks": chunks, "aborted": None})
        if path == "abort-timeout":
            try:
                await ai.run(MODEL, {**ASK, "max_tokens": 400}, {"signal": AbortSignal.timeout(1)})
            except AbortError as exc:
                return Response.json({"aborted": exc.name})
            return Response.json({"aborted": None})
        if path == "models":
            every = await ai.models()
            found = await ai.models({"author": "moonshotai", "task": "Text Generation"})
            try:
                await ai.models({"colour": "blue"})
            except Exception as exc:
                refused = str(exc)
            return Response.json({"every": [m.name for m in every], "found": [m.name for m in found],
                                  "refused": refused})
        if path == "markdown":
            html = "<h1>Hi</h1><p>A <a href='https://x.example'>link</a>.</p><script>x()</script>"
            out = await ai.toMarkdown([
                {"name": "page.html", "blob": Blob([html], "text/html")},
                {"name": "notes.txt", "blob": "plain words"},
                {"name": "paper.pdf", "blob": Blob([b"%PDF-1.7"], "application/pdf")},
            ])
            one = await ai.toMarkdown({"name": "a.md", "blob": "# title"})
            return Response.json({"results": [r.to_py() for r in out], "one": one.to_py()})
        if path == "missing":
            try:
                await ai.run("@cf/no/such-model", ASK)
            except InferenceUpstreamError as exc:
                return Response.json({"type": type(exc).__name__, "name": exc.name, "message": str(exc),
                                      "code": exc.code, "is_ai_error": isinstance(exc, AIError)})
        if path == "ai-search":
            try:
                await ai.autorag("docs").search({"query": "x"})
            except Exception as exc:
                return Response.json({"type": type(exc).__name__, "message": str(exc)})
        if path == "gateway-run":
            gw = ai.gateway("gw")
            out = await ai.run(MODEL, ASK, {"gateway": {"id": "gw"}, "tags": ["checkout", "eu"]})
            log_id, request_id = ai.aiGatewayLogId, ai.lastRequestId
            raw = await ai.run(MODEL, ASK, {"gateway": {"id": "gw"}, "returnRawResponse": True})
            log = await gw.getLog(log_id)
            await gw.patchLog(log_id, {"feedback": 1, "score": 90})
            try:
                await gw.getLog("no-such-log")
            except AiGatewayLogNotFound as exc:
                missing = exc.name
            return Response.json({"response": out["response"], "log_id": log_id, "request_id": request_id,
                                  "raw_headers": dict(raw.headers.items()), "raw_log_id": ai.aiGatewayLogId,
                                  "log": log.to_py(), "missing": missing,
                                  "url": await gw.getUrl("workers-ai")})
        if path == "gateway-universal":
            steps = [
                {"provider": "workers-ai", "endpoint": "@cf/no/such-model", "headers": {}, "query": ASK},
                {"provider": "workers-ai", "endpoint": MODEL, "headers": {"cf-aig-cache-ttl": 60},
                 "query": ASK},
            ]
            resp = await ai.gateway("gw").run(steps)
            return Response.json({"status": resp.status, "headers": dict(resp.headers.items()),
                                  "body": await resp.json(), "log_id": ai.aiGatewayLogId})
        return Response("no such path", status=404)
""".replace("@MODEL@", MODEL)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ai-binding")
    (folder / "worker.py").write_text(textwrap.dedent(WORKER))
    config = {
        "name": "ai-binding",
        "main": "worker.py",
        "compatibility_date": "2026-11-01",
        "ai": {"binding": "AI"},
        "edge": {"pops": ["ICN"], "models": [MODEL], "models_dir": str(REPO / "models")},
    }
    (folder / "wrangler.jsonc").write_text(json.dumps(config))
    with DevServer(folder / "wrangler.jsonc", cwd=folder) as srv:
        srv.folder = folder
        yield srv


def get(server, path, **kw):
    r = httpx.get(f"{server.url}/{path}", timeout=120, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def option(server, options):
    r = httpx.post(f"{server.url}/option", json=options, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def engine_status(server) -> dict:
    """The ICN engine's status for MODEL: its KV blocks in use, tokens generated so far."""
    saved = server.folder / ".edge" / "admin-token"
    token = os.environ.get("EDGE_ADMIN_TOKEN") or saved.read_text().strip()
    admin = {"authorization": f"Bearer {token}"}
    r = httpx.get(f"{server.url}/cdn-cgi/edge/pops", headers=admin, timeout=30)
    pops = {p["code"]: p for p in r.json()["pops"]}
    return pops["ICN"]["models"][MODEL]


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"temperature": 0.5}, "temperature"),
        ({"gatway": {"id": "x"}}, "gatway"),
        ({"websocket": True}, "websocket"),
        ({"prefix": "my:org"}, "prefix"),
        ({"sessionOptions": {"colour": 1}}, "sessionOptions"),
        ({"tags": ["1", "2", "3", "4", "5", "6"]}, "tags"),
        ({"returnRawResponse": "yes"}, "returnRawResponse"),
        ({"queueRequest": 1}, "queueRequest"),
        ({"extraHeaders": {"x-session-affinity": ["a"]}}, "extraHeaders.x-session-affinity"),
    ],
)
def test_an_option_not_served_is_refused_by_name(server, options, names):
    out = option(server, options)
    assert out["code"] == 5004 and out["type"] == "InferenceUpstreamError", out
    assert out["error"].startswith(f"5004: env.AI.run options: {names}:"), out


def test_the_options_served_are_accepted(server):
    out = option(
        server,
        {"tags": ["a", "b", "c", "d", "e"], "extraHeaders": {"x-session-affinity": "s-1"}, "prefix": ""},
    )
    assert out["ok"] is True and len(out["id"]) == 36


def test_a_prefix_names_the_model_called_as_workerd_does(server):
    out = option(server, {"prefix": "my-org"})  # no model of that name here: refused naming it
    assert out["code"] == 5007 and f"my-org:{MODEL}" in out["error"], out


def test_the_legacy_ai_search_names_an_instance_that_is_not_there(server):
    out = get(server, "ai-search")  # env.AI.autorag is served (runtime.ai.search): no instance "docs" here
    assert out["type"] == "AutoRAGNotFoundError" and out["message"].startswith("7002: ")


def test_each_call_names_its_request(server):
    out = get(server, "ids")
    assert out["first"] and out["second"] and out["first"] != out["second"]
    assert out["gateway"] is None  # not through a gateway
    assert out["response"]


def test_a_raw_response_carries_the_rest_apis_headers_and_envelope(server):
    out = get(server, "raw")
    assert out["type"] == "Response" and out["status"] == 200
    assert out["headers"]["cf-ai-req-id"] == out["id"]
    assert out["headers"]["content-type"] == "application/json"
    assert "server-timing" in out["headers"]
    assert out["body"]["success"] is True and out["body"]["result"]["response"]


def test_a_raw_streamed_response_is_the_event_stream(server):
    out = get(server, "raw-stream")
    assert out["headers"]["content-type"] == "text/event-stream" and out["headers"]["cf-ai-req-id"]
    events = [line[6:] for line in out["body"].splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and any(json.loads(e).get("response") for e in events[:-1])


def test_the_rest_api_names_each_request_too(server):
    url = f"{server.url}/client/v4/accounts/local/ai/run/{MODEL}"
    first, second = (httpx.post(url, json={"prompt": "x"}, timeout=60) for _ in range(2))
    assert first.status_code in (401, 403)  # no token: even a refused call names its request
    ids = {first.headers.get("cf-ai-req-id"), second.headers.get("cf-ai-req-id")}
    assert None not in ids and len(ids) == 2


def test_an_aborted_signal_cancels_before_and_during_and_frees_the_blocks(server):
    assert get(server, "abort-before") == {"aborted": "AbortError: changed my mind", "name": "AbortError"}
    generated = engine_status(server)["generated_tokens"]
    out = get(server, "abort-during")  # asks for 400 tokens, aborts at the third chunk
    assert out == {"chunks": 3, "aborted": "AbortError"}
    deadline = time.monotonic() + 10
    while engine_status(server)["kv_blocks_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    status = engine_status(server)
    assert status["kv_blocks_used"] == 0
    # the generation ended at the PoP when the call was aborted, not after its 400 tokens
    assert status["generated_tokens"] - generated < 100
    assert get(server, "abort-timeout") == {"aborted": "TimeoutError"}


def test_models_lists_and_filters_as_model_search(server):
    out = get(server, "models")
    assert MODEL in out["every"]
    assert MODEL in out["found"] and all(name.split("/")[1] == "moonshotai" for name in out["found"])
    assert len(out["found"]) < len(out["every"])
    assert "colour" in out["refused"] and "search" in out["refused"]


def test_to_markdown_converts_html_and_text_and_refuses_pdf_naming_what_is_supported(server):
    out = get(server, "markdown")
    page, notes, paper = out["results"]
    assert page["format"] == "markdown" and page["mimeType"] == "text/html"
    assert page["data"] == "# Hi\n\nA [link](https://x.example).\n" and page["tokens"] > 0
    assert notes["format"] == "markdown" and notes["data"] == "plain words\n"
    assert (
        paper["format"] == "error" and "application/pdf" in paper["error"] and "text/html" in paper["error"]
    )
    assert out["one"]["name"] == "a.md" and out["one"]["data"] == "# title\n"


def test_a_failed_call_raises_cloudflares_error_as_an_ai_error(server):
    out = get(server, "missing")
    assert out["type"] == out["name"] == "InferenceUpstreamError" and out["is_ai_error"] is True
    assert out["code"] == 5007 and out["message"].startswith("5007: ")


# --- through an AI Gateway (runtime.ai.gateway) ------------------------------------------------------


def test_a_call_through_a_gateway_names_its_log_which_the_gateway_serves(server):
    out = get(server, "gateway-run")
    assert out["response"] and out["log_id"] and out["request_id"]
    headers = out["raw_headers"]
    assert headers["cf-aig-log-id"] == out["raw_log_id"] != out["log_id"]  # one log per call
    assert headers["cf-ai-req-id"] and headers["content-type"] == "application/json"
    assert out["log"]["id"] == out["log_id"]
    assert "checkout" in json.dumps(out["log"])  # the call's tags are kept in its log
    assert out["missing"] == "AiGatewayLogNotFound"
    assert out["url"].startswith(server.url) and "gw" in out["url"]


def test_a_universal_run_falls_back_and_says_which_step_answered(server):
    out = get(server, "gateway-universal")
    assert out["status"] == 200
    assert out["headers"]["cf-aig-step"] == "1" and out["headers"]["cf-aig-log-id"] == out["log_id"]
    assert "response" in json.dumps(out["body"])


def edge_cli(server, *args):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime.cli",
            *args,
            "--config",
            str(server.folder / "wrangler.jsonc"),
            "--url",
            server.url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=server.folder,
    )


def test_the_gateways_http_door_serves_a_repeat_from_the_cache_and_keeps_accounts_apart(server):
    token = (server.folder / ".edge" / "api-token").read_text().strip()
    mine = {"authorization": f"Bearer {token}"}
    door = f"{server.url}/cdn-cgi/ai-gateway/v1/local/shop/workers-ai/{MODEL}"
    ask = {"prompt": "def cached(x):", "max_tokens": 12}
    cache = {"cf-aig-cache-ttl": "60", "cf-aig-metadata": '{"team": "edge"}'}
    first = httpx.post(door, json=ask, headers={**mine, **cache}, timeout=120)
    assert first.status_code == 200, first.text
    assert first.headers["cf-aig-cache-status"] == "MISS"
    generated = engine_status(server)["generated_tokens"]
    again = httpx.post(door, json=ask, headers={**mine, **cache}, timeout=120)
    assert again.headers["cf-aig-cache-status"] == "HIT" and again.json() == first.json()
    assert engine_status(server)["generated_tokens"] == generated  # not generated again
    # its logs read back over the API and from the CLI
    logs = f"{server.url}/client/v4/accounts/local/ai-gateway/gateways/shop/logs"
    rows = httpx.get(logs, headers=mine, timeout=30).json()["result"]
    # metadata as Cloudflare's API and its SDK type it: JSON text
    assert [r["cached"] for r in rows] == [True, False]
    assert json.loads(rows[0]["metadata"]) == {"team": "edge"}
    assert rows[0]["id"] == again.headers["cf-aig-log-id"]
    patched = httpx.patch(f"{logs}/{rows[0]['id']}", json={"score": 80}, headers=mine, timeout=30)
    assert patched.json()["result"]["score"] == 80
    listed = edge_cli(server, "gateway", "logs", "shop", "--limit", "5")
    assert listed.returncode == 0 and rows[0]["id"] in listed.stdout and "cached" in listed.stdout
    # another account: its own token cannot reach this account's door or logs, and its own
    # gateway of the same name never hits this one's cache
    made = edge_cli(server, "accounts", "create", "other")
    assert made.returncode == 0, made.stderr
    theirs = {"authorization": f"Bearer {made.stdout.strip()}"}
    assert httpx.post(door, json=ask, headers={**theirs, **cache}, timeout=60).status_code == 403
    assert httpx.get(logs, headers=theirs, timeout=30).status_code == 403
    own_door = door.replace("/v1/local/", "/v1/other/")
    own = httpx.post(own_door, json=ask, headers={**theirs, **cache}, timeout=120)
    assert own.status_code == 200 and own.headers["cf-aig-cache-status"] == "MISS"
    other_logs = logs.replace("/accounts/local/", "/accounts/other/")
    assert len(httpx.get(other_logs, headers=theirs, timeout=30).json()["result"]) == 1


def test_an_openai_client_pointed_at_the_gateways_compat_door_is_served_through_the_gateway(server):
    openai = pytest.importorskip("openai")
    token = (server.folder / ".edge" / "api-token").read_text().strip()
    client = openai.OpenAI(
        base_url=f"{server.url}/cdn-cgi/ai-gateway/v1/local/compat-gw/compat", api_key=token
    )
    ask = {
        "model": f"workers-ai/{MODEL}",
        "messages": [{"role": "user", "content": "def f():"}],
        "max_tokens": 6,
    }
    cache = {"cf-aig-cache-ttl": "60"}
    first = client.chat.completions.with_raw_response.create(**ask, extra_headers=cache)
    again = client.chat.completions.with_raw_response.create(**ask, extra_headers=cache)
    assert (first.headers["cf-aig-cache-status"], again.headers["cf-aig-cache-status"]) == ("MISS", "HIT")
    assert again.parse().choices[0].message.content == first.parse().choices[0].message.content
    streamed = client.chat.completions.create(**ask, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**{**ask, "model": "openai/gpt-5"})
    assert "cannot be reached from this edge" in str(refused.value)
