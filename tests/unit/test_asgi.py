"""The `asgi` bridge (Cloudflare's `asgi.fetch(app, request, env)`): the scope an ASGI 3 app
sees, the body in and out, streaming, lifespan once, and a Starlette app in a jailed isolate."""

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest
import starlette

from runtime.isolate import ipc
from runtime.isolate.host import QuietHost
from runtime.isolate.process import Isolate, use_insecure_isolation
from runtime.isolate.view import PYODIDE_MODULES
from workers import Request, Response

sys.path.insert(0, str(PYODIDE_MODULES))  # a top-level name inside an isolate only, as there
import asgi  # noqa: E402


def run(coro):
    return asyncio.run(coro)


class Recorder:
    """A hand-written ASGI 3 app: records its scope and body, answers with what it is told."""

    def __init__(self, chunks=(b"ok",), status=200, headers=((b"x-app", b"1"),), lifespan=False):
        self.chunks, self.status, self.headers, self.lifespan = list(chunks), status, list(headers), lifespan
        self.scopes, self.bodies, self.startups = [], [], 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            if not self.lifespan:
                raise AssertionError("no lifespan here")
            assert (await receive())["type"] == "lifespan.startup"
            self.startups += 1
            scope["state"]["db"] = "opened"
            await send({"type": "lifespan.startup.complete"})
            await receive()  # shutdown: never comes inside an isolate
            return
        self.scopes.append(scope)
        body = b""
        while True:
            message = await receive()
            assert message["type"] == "http.request"
            body += message["body"]
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        for i, chunk in enumerate(self.chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(self.chunks) - 1})
            await asyncio.sleep(0)


def test_the_scope_has_what_asgi_3_and_cloudflare_put_in_it():
    app = Recorder()
    env = {"GREETING": "hi"}
    request = Request(
        "https://example.com:8443/a%20b/c?x=1&y=%20",
        "POST",
        [("Content-Type", "text/plain"), ("X-Two", "a"), ("X-Two", "b"), ("cf-connecting-ip", "203.0.113.7")],
        b"hello",
    )
    response = run(asgi.fetch(app, request.js_object, env))
    assert response.status == 200 and response.headers.get("x-app") == "1"
    scope = app.scopes[0]
    assert scope["type"] == "http" and scope["asgi"]["version"] == "3.0" and scope["http_version"] == "1.1"
    assert scope["method"] == "POST" and scope["scheme"] == "https"
    assert scope["path"] == "/a b/c" and scope["raw_path"] == b"/a%20b/c"
    assert scope["query_string"] == b"x=1&y=%20" and scope["root_path"] == ""
    assert (b"content-type", b"text/plain") in scope["headers"]
    assert [v for k, v in scope["headers"] if k == b"x-two"] == [b"a", b"b"]  # repeated headers kept
    assert all(isinstance(k, bytes) and isinstance(v, bytes) for k, v in scope["headers"])
    assert (b"host", b"example.com:8443") in scope["headers"]  # from the URL when not sent
    assert scope["server"] == ("example.com", 8443) and scope["client"] == ("203.0.113.7", 0)
    assert scope["env"] is env  # Cloudflare's request.scope["env"]
    assert app.bodies == [b"hello"]


def test_a_streamed_request_body_arrives_in_chunks_and_env_is_optional():
    seen = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return  # no lifespan support: returning at once is allowed
        while True:
            message = await receive()
            seen.append(message)
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"".join(m["body"] for m in seen)})

    async def upload():
        for part in (b"one,", b"two,", b"three"):
            yield part

    async def go():
        response = await asgi.fetch(app, Request("http://x/up", "PUT", body=upload()))
        return response, await response.bytes()

    response, body = run(go())
    assert response.status == 201 and body == b"one,two,three"
    assert [m["body"] for m in seen] == [b"one,", b"two,", b"three", b""]
    assert [m["more_body"] for m in seen] == [True, True, True, False]


def test_one_body_message_is_a_plain_body_and_several_stream():
    plain = run(asgi.fetch(Recorder(chunks=[b"whole"]), Request("http://x/")))
    assert plain.body == b"whole"

    async def slow_stream(scope, receive, send):
        if scope["type"] != "http":
            raise RuntimeError("unsupported")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/x")]})
        for i in range(3):
            await asyncio.sleep(0.01)  # the response begins before the body is finished
            await send({"type": "http.response.body", "body": f"part{i};".encode(), "more_body": i < 2})

    async def go():
        response = await asgi.fetch(slow_stream, Request("http://x/"))
        assert not isinstance(response.body, bytes)  # an async iterator: streamed
        return response, [chunk async for chunk in response.body]

    response, parts = run(go())
    assert response.headers.get("content-type") == "text/x"
    assert parts == [b"part0;", b"part1;", b"part2;"]


def test_an_app_that_fails_before_responding_raises_and_an_empty_body_is_fine():
    async def broken(scope, receive, send):
        if scope["type"] == "http":
            raise ValueError("boom")

    async def silent(scope, receive, send):
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    try:
        run(asgi.fetch(broken, Request("http://x/")))
    except ValueError as exc:
        assert str(exc) == "boom"
    else:
        raise AssertionError("the app's exception must reach the worker")
    empty = run(asgi.fetch(silent, Request("http://x/")))
    assert empty.status == 204 and empty.body == b""


def test_lifespan_starts_once_and_its_state_reaches_every_request():
    app = Recorder(lifespan=True)

    async def go():
        await asyncio.gather(*(asgi.fetch(app, Request(f"http://x/{i}")) for i in range(3)))
        await asgi.fetch(app, Request("http://x/again"))

    run(go())
    assert app.startups == 1
    assert len(app.scopes) == 4 and all(s["state"] == {"db": "opened"} for s in app.scopes)


def test_lifespan_startup_failed_fails_the_request():
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.failed", "message": "no database"})

    try:
        run(asgi.fetch(app, Request("http://x/")))
    except RuntimeError as exc:
        assert "lifespan startup failed: no database" in str(exc)
    else:
        raise AssertionError("a failed startup must fail the request")


STARLETTE_WORKER = """
import asgi
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from workers import WorkerEntrypoint

started = []


async def lifespan(app):
    started.append(1)
    yield


async def echo(request):
    body = await request.body()
    return JSONResponse({
        "path": request.url.path,
        "query": dict(request.query_params),
        "method": request.method,
        "agent": request.headers.get("user-agent"),
        "body": body.decode(),
        "greeting": request.scope["env"].GREETING,
        "startups": len(started),
    })


async def count(request):
    async def numbers():
        for i in range(3):
            yield f"{i}\\n"
    return StreamingResponse(numbers(), media_type="text/plain")


app = Starlette(routes=[Route("/echo/{rest:path}", echo, methods=["GET", "POST"]), Route("/count", count)],
                lifespan=lifespan)


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return await asgi.fetch(app, request.js_object, self.env)
"""


def _serve_starlette(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(STARLETTE_WORKER))
    # Starlette and what it needs are not in the isolate's view: bound as the project's deps
    site_packages = Path(starlette.__file__).resolve().parent.parent

    async def no_ai(call):
        return ipc.AIReply(call.call, error_code=5007, error_message="no AI here")

    async def go():
        iso = Isolate("asgi", script, {"GREETING": "hello"}, None, QuietHost(ai=no_ai), deps=site_packages)
        await iso.start()
        try:
            a = await iso.invoke("POST", "http://x/echo/a/b?q=1", [("user-agent", "t")], b"payload", {})
            b = await iso.invoke("GET", "http://x/echo/", [], b"", {})
            c = await iso.invoke("GET", "http://x/count", [], b"", {})
            missing = await iso.invoke("GET", "http://x/nowhere", [], b"", {})
            return iso.jailed, a, b, c, missing
        finally:
            await iso.stop()

    return run(go())


def _check_starlette(a, b, c, missing):
    assert isinstance(a, ipc.InvokeResult) and a.status == 200, a
    assert json.loads(a.body) == {
        "path": "/echo/a/b",
        "query": {"q": "1"},
        "method": "POST",
        "agent": "t",
        "body": "payload",
        "greeting": "hello",
        "startups": 1,
    }
    assert isinstance(b, ipc.InvokeResult) and json.loads(b.body)["startups"] == 1  # lifespan once
    assert isinstance(c, ipc.InvokeResult) and c.status == 200 and c.body == b"0\n1\n2\n", c
    assert ("content-type", "text/plain; charset=utf-8") in c.headers
    assert isinstance(missing, ipc.InvokeResult) and missing.status == 404


def test_a_starlette_app_runs_in_a_jailed_isolate(tmp_path):
    jailed, *answers = _serve_starlette(tmp_path)
    assert jailed
    _check_starlette(*answers)


def test_a_starlette_app_runs_without_the_jail(tmp_path):  # Landlock must let asgi and the deps in
    use_insecure_isolation(True)
    try:
        jailed, *answers = _serve_starlette(tmp_path)
    finally:
        use_insecure_isolation(False)
    assert not jailed
    _check_starlette(*answers)


def test_response_js_object_and_request_js_object_are_themselves():
    request = Request("http://x/")
    assert request.js_object is request
    response = Response("x")
    assert response.js_object is response


def _upgrade(path="/ws"):
    headers = [("upgrade", "websocket"), ("sec-websocket-protocol", "chat, v2")]
    return Request(f"https://edge.example{path}", "GET", headers, b"")


def test_a_websocket_scope_accept_answers_101_with_the_pairs_client_end():
    seen = {}

    async def app(scope, receive, send):
        seen.update(scope)
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept", "subprotocol": "chat"})
        await receive()  # held open: the socket's life is the client's

    response = run(asgi.fetch(app, _upgrade(), env={"E": 1}))
    assert response.status == 101 and response.web_socket is not None and not response.web_socket._server
    assert response.headers.get("sec-websocket-protocol") == "chat"
    assert seen["type"] == "websocket" and seen["scheme"] == "wss" and seen["path"] == "/ws"
    assert seen["subprotocols"] == ["chat", "v2"] and "method" not in seen and seen["env"] == {"E": 1}


def test_a_websocket_closed_before_accept_is_refused_and_a_broken_app_raises():
    async def refuses(scope, receive, send):
        await receive()
        await send({"type": "websocket.close", "code": 1008})

    assert run(asgi.fetch(refuses, _upgrade())).status == 403

    async def sends_first(scope, receive, send):
        await receive()
        await send({"type": "websocket.send", "text": "too soon"})

    with pytest.raises(RuntimeError, match="before websocket.accept"):
        run(asgi.fetch(sends_first, _upgrade()))
