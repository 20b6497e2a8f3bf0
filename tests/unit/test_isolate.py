"""The isolate is a real OS process speaking msgpack over a socket pair."""

import asyncio
import os
import textwrap

import pytest

from runtime.isolate import ipc
from runtime.isolate.host import QuietHost
from runtime.isolate.process import Isolate, IsolateCrashed, WorkerLoadError


def write(tmp_path, source: str):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(source))
    return path


async def echo_ai(call: ipc.AIRun) -> ipc.AIReply:
    if call.model == "missing":
        return ipc.AIReply(call.call, error_code=5007, error_message="no such model 'missing'")
    return ipc.AIReply(
        call.call, result={"response": f"{call.model}:{call.inputs['prompt']}", "request": call.request}
    )


def run(coro):
    return asyncio.run(coro)


async def with_isolate(script, fn, vars=None):
    iso = Isolate("test", script, vars or {}, "AI", QuietHost(ai=echo_ai))
    await iso.start()
    try:
        return await fn(iso)
    finally:
        await iso.stop()


def test_default_class_gets_request_env_and_ai(tmp_path):
    script = write(
        tmp_path,
        """
        import os
        from workers import WorkerEntrypoint, Response

        class Default(WorkerEntrypoint):
            async def fetch(self, request):
                body = await request.json()
                out = await self.env.AI.run("m", {"prompt": body["prompt"]})
                return Response.json({"ai": out, "greeting": self.env.GREETING, "colo": request.cf["colo"],
                                      "pid": os.getpid(), "method": request.method,
                                      "ua": request.headers.get("User-Agent")})
    """,
    )

    async def go(iso):
        res = await iso.invoke(
            "POST", "http://x/", [("user-agent", "t")], b'{"prompt": "hi"}', {"colo": "ICN"}, request_id=7
        )
        return res, iso._proc.pid

    res, pid = run(with_isolate(script, go, {"GREETING": "hello"}))
    assert isinstance(res, ipc.InvokeResult) and res.status == 200
    import json

    data = json.loads(res.body)
    assert data["ai"] == {"response": "m:hi", "request": 7}
    assert data["greeting"] == "hello" and data["colo"] == "ICN" and data["method"] == "POST"
    assert data["ua"] == "t"
    assert pid != os.getpid() and data["pid"] == 1  # its own process, PID 1 of its own namespace
    assert ("content-type", "application/json") in res.headers


def test_on_fetch_style_and_ai_errors_raise_with_code(tmp_path):
    script = write(
        tmp_path,
        """
        from workers import Response, AIError

        async def on_fetch(request, env):
            try:
                await env.AI.run("missing", {"prompt": "x"})
            except AIError as exc:
                return Response(str(exc), status=404)
    """,
    )
    res = run(with_isolate(script, lambda iso: iso.invoke("GET", "http://x/", [], b"", {})))
    assert res.status == 404 and res.body.startswith(b"5007: no such model")


def test_uncaught_exception_is_reported_and_isolate_keeps_serving(tmp_path):
    script = write(
        tmp_path,
        """
        from workers import WorkerEntrypoint, Response

        class Default(WorkerEntrypoint):
            async def fetch(self, request):
                if request.url.endswith("/boom"):
                    raise KeyError("prompt")
                return Response("ok")
    """,
    )

    async def go(iso):
        bad = await iso.invoke("GET", "http://x/boom", [], b"", {})
        good = await iso.invoke("GET", "http://x/", [], b"", {})
        return bad, good

    bad, good = run(with_isolate(script, go))
    assert isinstance(bad, ipc.InvokeError) and bad.message == "KeyError: 'prompt'"
    assert "Traceback" in bad.traceback
    assert good.status == 200 and good.body == b"ok"


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("def broken(:\n", "SyntaxError"),
        ("x = 1\n", "has no entry point"),
        (
            "from workers import WorkerEntrypoint\n"
            "class Default(WorkerEntrypoint):\n    async def fetch(self, r): pass\n"
            "async def on_fetch(request, env): pass\n",
            "defines both",
        ),
        ("class Default:\n    async def fetch(self, r): pass\n", "deriving from workers.WorkerEntrypoint"),
    ],
)
def test_bad_scripts_fail_to_load_with_the_reason(tmp_path, source, fragment):
    script = write(tmp_path, source)
    with pytest.raises(WorkerLoadError, match=fragment):
        run(with_isolate(script, lambda iso: asyncio.sleep(0)))


def test_a_crash_fails_the_request_and_the_next_one_gets_a_fresh_process(tmp_path):
    script = write(
        tmp_path,
        """
        import os, secrets
        from workers import WorkerEntrypoint, Response
        BORN = secrets.token_hex(8)  # which process: every isolate is PID 1 of its own namespace

        class Default(WorkerEntrypoint):
            async def fetch(self, request):
                if request.url.endswith("/die"):
                    os._exit(3)
                return Response(BORN)
    """,
    )

    async def go(iso):
        first = (await iso.invoke("GET", "http://x/", [], b"", {})).body
        with pytest.raises(IsolateCrashed):
            await iso.invoke("GET", "http://x/die", [], b"", {})
        second = (await iso.invoke("GET", "http://x/", [], b"", {})).body
        return first, second

    first, second = run(with_isolate(script, go))
    assert first != second  # a new process took over


def test_isolate_does_not_inherit_runtime_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_API_TOKEN", "secret-token")
    script = write(
        tmp_path,
        """
        import os
        from workers import Response
        async def on_fetch(request, env):
            return Response(os.environ.get("EDGE_API_TOKEN", "none"))
    """,
    )
    res = run(with_isolate(script, lambda iso: iso.invoke("GET", "http://x/", [], b"", {})))
    assert res.body == b"none"


# --- limits, enforced by the operating system -------------------------------------------------------

from runtime.isolate.process import ExceededResources, IsolateLimits  # noqa: E402


async def with_limits(script, fn, limits, on_fetch=None, on_log=None, **kw):
    host = QuietHost(ai=echo_ai, fetch=on_fetch, log=on_log)
    iso = Isolate("limited", script, {}, None, host, limits=limits, **kw)
    await iso.start()
    try:
        return await fn(iso)
    finally:
        await iso.stop()


def test_an_infinite_loop_is_stopped_at_its_cpu_budget_and_the_isolate_replaced(tmp_path):
    script = write(
        tmp_path,
        """
        from workers import Response
        async def on_fetch(request, env):
            if request.url.endswith("/spin"):
                while True:
                    pass
            return Response("fine")
    """,
    )

    async def go(iso):
        with pytest.raises(ExceededResources) as err:
            await iso.invoke("GET", "http://x/spin", [], b"", {})
        assert err.value.outcome == "exceededCpu"
        return await iso.invoke("GET", "http://x/", [], b"", {})  # a fresh process serves the next one

    assert run(with_limits(script, go, IsolateLimits(cpu_ms=300))).body == b"fine"


def test_a_memory_bomb_fails_inside_its_cap(tmp_path):
    script = write(
        tmp_path,
        """
        from workers import Response
        async def on_fetch(request, env):
            hoard = bytearray(400 * 1024 * 1024)
            return Response(str(len(hoard)))
    """,
    )
    res = run(
        with_limits(
            script, lambda iso: iso.invoke("GET", "http://x/", [], b"", {}), IsolateLimits(memory_mb=64)
        )
    )
    assert isinstance(res, ipc.InvokeError) and res.message.startswith("MemoryError")


def test_the_sandbox_denies_other_files_and_the_network(tmp_path):
    from tests.conftest import REPO

    script = write(
        tmp_path,
        f"""
        import socket
        from workers import Response
        async def on_fetch(request, env):
            out = []
            for path in ({str(REPO / "pyproject.toml")!r}, "/etc/hostname", "/proc/{os.getpid()}/environ"):
                try:
                    open(path).read()
                    out.append("read")
                except OSError as exc:
                    out.append(type(exc).__name__)
            try:
                socket.create_connection(("127.0.0.1", 9), timeout=1)
                out.append("connected")
            except OSError as exc:
                out.append(type(exc).__name__)
            import json, decimal  # the standard library still imports
            return Response(",".join(out))
    """,
    )
    res = run(with_limits(script, lambda iso: iso.invoke("GET", "http://x/", [], b"", {}), IsolateLimits()))
    # outside the jail's view (or, without namespaces, refused by Landlock); no socket but Unix ones
    assert res.body.decode().split(",") == ["FileNotFoundError"] * 3 + ["OSError"]


def test_logs_fetch_and_service_calls_cross_to_the_runtime(tmp_path):
    script = write(
        tmp_path,
        """
        import logging
        from workers import Response, fetch
        async def on_fetch(request, env):
            print("hello from", request.method)
            logging.getLogger("app").warning("careful")
            upstream = await fetch("https://example.com/data", headers={"x-a": "1"})
            other = await env.OTHER.fetch("https://other/x")
            return Response(f"{upstream.status}:{await upstream.text()}|{await other.text()}")
    """,
    )
    logs, calls = [], []

    async def on_fetch(call):
        calls.append((call.method, call.url, dict(call.headers), call.service))
        return ipc.FetchReply(
            call.call, 200, [("content-type", "text/plain")], f"from {call.service or 'web'}".encode()
        )

    async def go(iso):
        return await iso.invoke("GET", "http://x/", [], b"", {}, request_id=42)

    res = run(
        with_limits(script, go, IsolateLimits(), services=["OTHER"], on_fetch=on_fetch, on_log=logs.append)
    )
    assert res.body == b"200:from web|from OTHER"
    assert [(m.request, m.level, m.message) for m in logs] == [
        (42, "log", "hello from GET"),
        (42, "warning", "careful"),
    ]
    assert calls[0] == ("GET", "https://example.com/data", {"x-a": "1"}, None) and calls[1][3] == "OTHER"


def test_module_level_env_and_wait_until_reach_the_current_request(tmp_path):
    script = write(
        tmp_path,
        """
        import asyncio
        from workers import Response, env, wait_until
        DONE = []

        async def later():
            DONE.append(env.GREETING)

        async def on_fetch(request, env_arg):
            if request.url.endswith("/check"):
                return Response(",".join(DONE))
            wait_until(later())  # no ctx in sight: the SDK finds this request's
            return Response("queued")
    """,
    )

    async def go(iso):
        first = await iso.invoke("GET", "http://x/", [], b"", {})
        for _ in range(100):
            second = await iso.invoke("GET", "http://x/check", [], b"", {})
            if second.body:
                return first.body, second.body
            await asyncio.sleep(0.02)
        return first.body, b""

    assert run(with_isolate(script, go, {"GREETING": "hello"})) == (b"queued", b"hello")


def test_what_a_script_prints_while_it_loads_reaches_the_console_and_it_still_starts(tmp_path):
    script = write(
        tmp_path,
        """
        import sys
        from workers import Response
        print("loading the worker")
        print("a warning at import", file=sys.stderr)

        async def on_fetch(request, env):
            return Response("ok")
        """,
    )
    logs = []
    res = run(with_limits(script, lambda iso: iso.invoke("GET", "http://x/", [], b"", {}), IsolateLimits(),
                          on_log=logs.append))  # fmt: skip
    assert res.body == b"ok"
    assert [(m.level, m.message) for m in logs] == [
        ("log", "loading the worker"),
        ("error", "a warning at import"),
    ]


def test_a_missing_binding_names_the_bindings_the_worker_has_and_the_close_one(tmp_path):
    # issue 57, item 3: env.MISSING was a bare AttributeError; it lists env's names as the pytest
    # plugin's worker.binding does, with a close match, and stays an AttributeError (getattr defaults)
    script = write(
        tmp_path,
        """
        from workers import WorkerEntrypoint, Response

        class Default(WorkerEntrypoint):
            async def fetch(self, request):
                assert getattr(self.env, "NOPE", None) is None and not hasattr(self.env, "NOPE")
                name = request.url.rsplit("/", 1)[1]
                return Response(str(getattr(self.env, name)))
    """,
    )
    iso = Isolate(
        "test", script, {"GREETING": "hi"}, "AI", QuietHost(), bindings={"CACHE": "workers.kv:KVNamespace"}
    )

    async def go():
        await iso.start()
        try:
            return [await iso.invoke("GET", f"http://x/{n}", [], b"", {}) for n in ("CAHCE", "ai", "ZZZ")]
        finally:
            await iso.stop()

    typo, case, far = run(go())
    listed = "(its bindings: AI (Ai), CACHE (KVNamespace), GREETING (var))"
    assert isinstance(typo, ipc.InvokeError) and typo.message.startswith("AttributeError: "), typo
    assert f"the worker has no binding named 'CAHCE' {listed}; did you mean 'CACHE'?" in typo.message
    assert "no binding named 'ai'" in case.message and "did you mean 'AI'?" in case.message
    assert f"no binding named 'ZZZ' {listed}" in far.message and "did you mean" not in far.message
