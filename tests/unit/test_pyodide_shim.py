"""The pyodide.ffi and js stand-ins: Pyodide-style scripts written for Cloudflare run unmodified,
in a real (jailed) isolate too."""

import asyncio
import json
import sys
import textwrap

import pytest

import workers
from runtime.isolate import ipc
from runtime.isolate.host import QuietHost
from runtime.isolate.process import Isolate, IsolateLimits, use_insecure_isolation
from runtime.isolate.view import PYODIDE_MODULES

sys.path.insert(0, str(PYODIDE_MODULES))  # top-level names inside an isolate only, as there
from js import JSON, URL, Headers, Object, Response, console  # noqa: E402
from pyodide.ffi import (  # noqa: E402
    JsArray,
    JsBuffer,
    JsObject,
    JsProxy,
    create_proxy,
    jsnull,
    to_js,
    to_py,
)


def run(coro):
    return asyncio.run(coro)


def test_to_js_and_to_py_round_trip():
    data = {"a": [1, {"b": b"\x00"}], "c": None, "d": (1, 2)}
    js = to_js(data)
    assert isinstance(js, JsObject) and isinstance(js, JsProxy) and isinstance(js.a, JsArray)
    assert isinstance(js.a[1].b, JsBuffer) and js.a[1].b.buffer.to_bytes() == b"\x00"
    assert to_py(js) == {"a": [1, {"b": b"\x00"}], "c": None, "d": [1, 2]}
    assert type(to_py(js)) is dict
    plain = {"x": 1}
    assert to_py(plain) is plain and to_py(jsnull) is None and not jsnull
    obj = to_js({"k": "v"}, dict_converter=Object.fromEntries)
    assert obj.k == "v" and Object.keys(obj) == ["k"]
    assert to_js({"k": {"n": 1}}, depth=1)["k"] == {"n": 1}
    proxy = create_proxy(lambda x: x + 1)
    assert proxy(1) == 2
    proxy.destroy()
    with pytest.raises(RuntimeError):
        proxy(1)


def test_js_globals_build_workers_objects():
    init = to_js({"status": 201, "headers": {"x-a": "1"}}, dict_converter=Object.fromEntries)
    response = Response.new("hi", init)
    assert isinstance(response, workers.Response) and response.status == 201
    assert response.headers["x-a"] == "1"
    data = Response.json(to_js({"n": [1, 2]}), status=202)
    assert data.status == 202 and data.headers["content-type"] == "application/json"
    assert run(data.json()) == {"n": [1, 2]}
    assert Headers.new([["a", "b"]])["a"] == "b"
    assert JSON.parse(JSON.stringify({"a": 1})).a == 1
    url = URL.new("/p?q=1&q=2#f", "https://h.example:8443/x")
    assert (url.hostname, url.port, url.pathname, url.searchParams.getAll("q")) == (
        "h.example",
        "8443",
        "/p",
        ["1", "2"],
    )
    assert callable(console.log)
    with pytest.raises(ImportError, match="not simulated"):
        from js import HTMLRewriter  # noqa: F401


def test_js_websocket_pair_in_both_shapes_and_a_101_response():
    from js import Object, Response, WebSocketPair
    from pyodide.ffi import to_js

    client, server = WebSocketPair.new().object_values()
    other_client, other_server = WebSocketPair()  # plain unpacking too
    assert client._id == server._id != other_client._id == other_server._id
    server.accept()
    for init in (
        {"status": 101, "webSocket": client},
        to_js({"status": 101, "webSocket": client}, dict_converter=Object.fromEntries),
    ):
        response = Response.new(None, init)
        assert response.status == 101 and response.web_socket is client
    with pytest.raises(TypeError, match="client end"):
        client.send("the client end is the runtime's")
    with pytest.raises(TypeError, match="status=101"):
        workers.Response(None, status=200, web_socket=client)
    with pytest.raises(TypeError, match="web_socket=client"):
        workers.Response(None, status=101)
    with pytest.raises(ValueError, match="1 MiB"):
        server.send("x" * (1024 * 1024 + 1))
    with pytest.raises(TypeError, match="1000 or in 3000-4999"):
        server.close(1006)


WORKER = """
import json
from js import JSON, Object, Response as JsResponse, console, fetch as js_fetch
from pyodide.ffi import create_proxy, to_js, to_py
from workers import FormData, Response, WorkerEntrypoint, wait_until


async def later():
    print("later ran")


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        console.log("cf", request.cf.colo)
        if request.url.endswith("/js"):
            answer = await self.env.AI.run("m", to_js({"prompt": "hi"}, dict_converter=Object.fromEntries))
            return JsResponse.new(JSON.stringify(answer), to_js({"status": 203, "headers": {"x-js": "1"}}))
        if request.url.endswith("/form"):
            form = FormData({"a": "1"})
            return Response(form)
        wait_until(later())
        return Response.json({"echo": to_py(to_js({"n": [1]})), "buf": len(to_js(b"abc").buffer)})
"""


async def echo_ai(call: ipc.AIRun) -> ipc.AIReply:
    return ipc.AIReply(call.call, result={"response": f"{call.model}:{call.inputs['prompt']}"})


def _serve(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    logs = []

    async def go():
        iso = Isolate("cf", script, {}, "AI", QuietHost(ai=echo_ai, log=logs.append), limits=IsolateLimits())
        await iso.start()
        try:
            out = []
            for path in ("/js", "/form", "/"):
                out.append(await iso.invoke("GET", f"http://x{path}", [], b"", {"colo": "ICN"}))
            for _ in range(50):  # the waitUntil work logs after the response
                if any(m.message == "later ran" for m in logs):
                    break
                await asyncio.sleep(0.05)
            return iso.jailed, out
        finally:
            await iso.stop()

    jailed, out = run(go())
    return jailed, out, [m.message for m in logs]


def _check(out, logs):
    js, form, plain = out
    assert isinstance(js, ipc.InvokeResult), js
    assert js.status == 203 and ("x-js", "1") in js.headers
    assert json.loads(js.body) == {"response": "m:hi"}
    assert isinstance(form, ipc.InvokeResult), form
    assert dict(form.headers)["content-type"].startswith("multipart/form-data") and b'name="a"' in form.body
    assert isinstance(plain, ipc.InvokeResult), plain
    assert json.loads(plain.body) == {"echo": {"n": [1]}, "buf": 3}
    assert "cf ICN" in logs and "later ran" in logs  # wait_until reached the request's ctx


def test_a_pyodide_style_worker_runs_in_a_jailed_isolate(tmp_path):
    jailed, out, logs = _serve(tmp_path)
    _check(out, logs)
    assert jailed


def test_a_pyodide_style_worker_runs_without_the_jail(tmp_path):  # Landlock must let the shims in
    use_insecure_isolation(True)
    try:
        _, out, logs = _serve(tmp_path)
    finally:
        use_insecure_isolation(False)
    _check(out, logs)
