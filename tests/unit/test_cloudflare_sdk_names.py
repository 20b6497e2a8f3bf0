"""Every public name of Cloudflare's Python Workers SDK (workers-runtime-sdk, recorded in
tests/fixtures/cloudflare_workers_sdk_all.json) exists in our `workers` with a compatible call
shape, and the ones that can work here do."""

import asyncio
import inspect
import json
import sys
from pathlib import Path

import pytest

import workers

fetch_module = sys.modules["workers.fetch"]  # `workers.fetch` is the function

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "cloudflare_workers_sdk_all.json").read_text())
NAMES = FIXTURE["names"]
# Fetch-API metadata of a browser's Request that a request arriving at a server has no use for
NOT_SIMULATED = {
    "Request": {
        "cache",
        "credentials",
        "destination",
        "integrity",
        "is_history_navigation",
        "keepalive",
        "mode",
        "redirect",
        "referrer",
        "referrer_policy",
    }
}
# values of instances, not class attributes
INSTANCES = {
    "Request": lambda: workers.Request("https://x/"),
    "FetchResponse": lambda: workers.Response("x"),
    "Response": lambda: workers.Response("x"),
}


def test_the_fixture_is_cloudflares_1_9_list():
    assert FIXTURE["package"] == "workers-runtime-sdk" and FIXTURE["version"].startswith("1.9.")
    assert set(FIXTURE["all"]) == set(NAMES) and len(NAMES) >= 27


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_name_is_exported(name):
    assert name in workers.__all__
    assert getattr(workers, name) is not None
    from_import = {}
    exec(f"from workers import {name}", from_import)  # noqa: S102 - the way a script imports it
    assert name in from_import


def _required_positional(fn, drop_self: bool) -> int:
    params = list(inspect.signature(fn).parameters.values())
    if drop_self:
        params = params[1:]
    return sum(
        1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    )


def _accepts(fn, names: set[str]) -> set[str]:
    """The names among `names` that `fn` cannot take as keywords."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return set()
    return {n for n in names if n not in params}


@pytest.mark.parametrize(
    "name", sorted(n for n, e in NAMES.items() if e and e["kind"] in ("class", "function"))
)
def test_call_shape_matches(name):
    theirs, ours = NAMES[name], getattr(workers, name)
    if theirs["kind"] == "function":
        assert callable(ours)
        assert inspect.iscoroutinefunction(ours) == theirs["async"]
        required = sum(1 for p in theirs["params"] if p["required"] and p["kind"] == "positional")
        assert _required_positional(ours, drop_self=False) == required
        named = {p["name"] for p in theirs["params"] if p["kind"] in ("positional", "keyword_only")}
        if name != "fetch":  # fetch(resource, ...): Cloudflare names it `resource` too
            assert not _accepts(ours, named - {p["name"] for p in theirs["params"] if p["required"]})
        return
    assert inspect.isclass(ours)
    if "init" in theirs:
        required = sum(1 for p in theirs["init"] if p["required"] and p["kind"] == "positional")
        assert _required_positional(ours.__init__, drop_self=True) == required, name
        optional = {p["name"] for p in theirs["init"] if not p["required"] and p["kind"] != "var_keyword"}
        assert not _accepts(ours.__init__, optional), name
    instance = INSTANCES.get(name, lambda: None)()
    missing = {
        m
        for m in theirs["methods"]
        if not hasattr(ours, m) and not (instance is not None and hasattr(instance, m))
    }
    assert missing <= NOT_SIMULATED.get(name, set()), f"{name} lacks {sorted(missing)}"


def test_fetch_takes_cloudflares_options():
    fetch_kwargs = set(workers.FetchKwargs.__annotations__)
    assert fetch_kwargs == {"headers", "body", "method", "redirect", "cf", "fetcher"}
    params = inspect.signature(workers.fetch).parameters
    assert {"method", "headers", "body"} <= set(params)
    assert any(p.kind is p.VAR_KEYWORD for p in params.values())
    # Request(input, **FetchKwargs) as Cloudflare's
    assert {"method", "headers", "body"} <= set(inspect.signature(workers.Request).parameters)


def test_the_sdk_still_stands_alone():
    import subprocess

    code = (
        "import sys, workers\n"
        "ours = [m for m in sys.modules if m.split('.')[0] in ('runtime', 'edge_sim', 'engine', 'kernels')]\n"
        "assert not ours, ours\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# --- the names at work ------------------------------------------------------------------------------


def run(coro):
    return asyncio.run(coro)


def test_blob_and_file():
    blob = workers.Blob(["ab", b"cd", workers.Blob("ef")], content_type="Text/Plain")
    assert blob.size == 6 and blob.content_type == "text/plain" and run(blob.text()) == "abcdef"
    assert run(blob.slice(1, 3).bytes()) == b"bc"
    assert workers.Blob(blob).content_type == "text/plain"  # one Blob passes its type on
    assert run(workers.Blob("a\r\nb", endings=workers.BlobEnding.NATIVE).text()) == "a\nb"
    file = workers.File([b"\x00\x01"], "x.bin", "application/octet-stream", last_modified=1234)
    assert file.name == "x.bin" and file.last_modified == 1234 and isinstance(file, workers.Blob)
    with pytest.raises(TypeError):
        workers.Blob([object()])


def test_form_data_is_a_multimap_that_round_trips_as_a_response_body():
    form = workers.FormData({"a": "1"})
    form.append("a", "2")
    form.append("upload", workers.Blob([b"PNG\x00"], "image/png"), "pic.png")
    form["b"] = "é"
    assert form["a"] == "1" and form.get_all("a") == ["1", "2"] and "upload" in form and len(form) == 4
    assert form["missing"] is None  # as Cloudflare's: None, not KeyError
    response = workers.Response(form)
    assert response.headers["content-type"].startswith("multipart/form-data; boundary=")
    back = run(response.form_data())
    assert back.get_all("a") == ["1", "2"] and back["b"] == "é"
    upload = back["upload"]
    assert isinstance(upload, workers.File) and upload.name == "pic.png"
    assert upload.content_type == "image/png" and run(upload.bytes()) == b"PNG\x00"
    del back["a"]
    assert list(back.keys()) == ["upload", "b"]


def test_request_form_data_reads_urlencoded_and_refuses_other_bodies():
    req = workers.Request(
        "https://x/", "POST", {"content-type": "application/x-www-form-urlencoded"}, b"q=a+b&q=c&e="
    )
    form = run(req.form_data())
    assert form.get_all("q") == ["a b", "c"] and form["e"] == ""
    with pytest.raises(TypeError):
        run(workers.Request("https://x/", "POST", {"content-type": "text/plain"}, b"x").form_data())


def test_blob_body_and_cloudflares_response_arguments():
    response = workers.Response(workers.Blob(["{}"], "application/json"), status=201, status_text="Created")
    assert response.headers["content-type"] == "application/json" and response.status_text == "Created"
    assert run(response.bytes()) == b"{}"
    positional = workers.Response("x", 202, "Accepted", {"x-a": "1"})  # Cloudflare's order
    assert (
        positional.status == 202 and positional.status_text == "Accepted" and positional.headers["x-a"] == "1"
    )
    replaced = positional.replace_body("y")
    assert replaced.status == 202 and replaced.headers["x-a"] == "1" and run(replaced.text()) == "y"


def test_request_cf_reads_by_attribute_and_key():
    req = workers.Request("https://x/", cf={"colo": "ICN", "botManagement": {"score": 99}})
    assert req.cf.colo == "ICN" == req.cf["colo"] and req.cf.botManagement.score == 99
    with pytest.raises(AttributeError):
        _ = req.cf.missing
    assert run(req.clone().text()) == "" and req.body_used is False


def test_fetch_sends_form_data_with_its_content_type_and_accepts_cloudflare_options():
    sent = {}

    async def transport(method, url, headers, body):
        sent.update(method=method, url=url, headers=dict(headers), body=body)
        return workers.Response("ok")

    saved = fetch_module._transport
    fetch_module._install(transport)
    try:
        form = workers.FormData({"k": "v"})
        out = run(
            workers.fetch("https://api/x", method="POST", body=form, redirect="follow", cf={"cacheTtl": 5})
        )
        assert run(out.text()) == "ok"
        assert sent["method"] == "POST" and sent["headers"]["content-type"].startswith("multipart/form-data")
        assert b'name="k"' in sent["body"]
        with pytest.raises(TypeError, match="unexpected keyword"):
            run(workers.fetch("https://api/x", timeout=3))
    finally:
        fetch_module._transport = saved


class _Ctx:
    def __init__(self):
        self.waited = []

    def waitUntil(self, awaitable):  # noqa: N802 - Cloudflare's name
        self.waited.append(awaitable)


def test_env_and_wait_until_follow_the_request_being_handled():
    from workers import context

    class Default(workers.WorkerEntrypoint):
        async def fetch(self, request):
            workers.wait_until(asyncio.sleep(0))
            return workers.env.GREETING

    ctx = _Ctx()
    env = type("Env", (), {"GREETING": "hi", "__contains__": lambda self, n: n == "GREETING"})()

    async def handle():
        return await Default(ctx, env).fetch(None)

    saved = context._env
    context._env = None
    try:
        assert run(handle()) == "hi" and len(ctx.waited) == 1
        ctx.waited[0].close()
        with workers.patch_env(GREETING="patched"):
            assert workers.env.GREETING == "patched" and "GREETING" in workers.env
        assert workers.env.GREETING == "hi"
        cf_workers = workers.import_from_javascript("cloudflare:workers")
        assert cf_workers.env.GREETING == "hi" and cf_workers.waitUntil is workers.waitUntil
        with pytest.raises(ImportError):
            workers.import_from_javascript("cloudflare:sockets")
    finally:
        context._env = saved
    orphan = asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="while a worker handles a request"):
        workers.wait_until(orphan)  # no request here (a fresh context)
    orphan.close()


def test_handler_passes_arguments_and_asks_for_ctx():
    from workers import context

    @workers.handler
    async def on_fetch(request, env):
        workers.wait_until(asyncio.sleep(0))
        return request, env

    assert inspect.iscoroutinefunction(on_fetch)
    assert list(inspect.signature(on_fetch).parameters) == ["request", "env", "ctx"]  # the isolate passes ctx
    ctx = _Ctx()
    saved = context._env
    try:
        assert run(on_fetch("req", "env", ctx)) == ("req", "env") and len(ctx.waited) == 1
    finally:
        context._env = saved
    ctx.waited[0].close()


def test_durable_object_and_workflow_have_their_shape():
    for cls in (workers.DurableObject, workers.WorkflowEntrypoint):
        obj = cls("ctx", "env")
        assert (obj.ctx, obj.env) == ("ctx", "env")
    from workers.workflows import NonRetryableError

    assert issubclass(NonRetryableError, Exception)


def test_rpc_conversions_and_context_protocol():
    assert workers.python_to_rpc({"a": [1]}) == {"a": [1]}
    assert workers.python_from_rpc("x") == "x"
    assert isinstance(_Ctx(), workers.Context)
    assert workers.FetchResponse is workers.Response
