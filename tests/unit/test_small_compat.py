"""Small Cloudflare compatibilities: a UTF-8 client location header, tail timestamps in
milliseconds, the models search API's query parameters, and help on every CLI argument."""

import argparse
import time
import types

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.testclient import TestClient

from edge_sim.edge import Edge
from edge_sim.network import NetworkModel
from edge_sim.topology import Topology
from runtime.control.dashboard_feed import DashboardFeed
from runtime.host.addressing import Locator
from runtime.host.fetch_guard import FetchGuard
from runtime.host.worker import WorkerHandle
from runtime.host.worker_calls import WorkerCalls
from runtime.isolate import ipc
from runtime.routes.ai_rest import AIApi


@pytest.fixture(scope="module")
def edge():
    e = Edge.start(Topology.default(), NetworkModel(), ["ICN"], [], device="cpu")
    yield e
    e.close()


def _request(headers: list[tuple[bytes, bytes]]) -> Request:
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "headers": [(b"host", b"x"), *headers],
        "scheme": "http",
        "server": ("127.0.0.1", 8787),
    }
    return Request(scope)


def _locate(edge, value: bytes):
    locator = Locator(edge, edge.locate("Seoul"), FetchGuard())
    return locator.locate(_request([(b"x-edge-client-location", value)]))


def test_a_utf8_location_header_is_read_as_utf8(edge):
    ctx = _locate(edge, "São Paulo".encode())
    assert ctx.location.city == "São Paulo" and ctx.ingress.code == "GRU"
    assert _locate(edge, "S\xe3o Paulo".encode("latin-1")).location.city == "São Paulo"  # Latin-1 still reads
    assert _locate(edge, b"Seoul").ingress.code == "ICN"


def _handle(requests=None):
    published = []
    tail = types.SimpleNamespace(publish=lambda account, worker, event: published.append(event))
    metrics = types.SimpleNamespace(request=lambda *a: None)
    services = types.SimpleNamespace(tail=tail, metrics=metrics, feed=DashboardFeed())
    spec = types.SimpleNamespace(account="local", name="w", version=None)
    requests = requests or {}
    fake = types.SimpleNamespace(requests=requests, services=services, spec=spec)
    fake._publish = lambda *args: WorkerHandle._publish(fake, *args)
    return WorkerCalls(spec, requests, services), fake, published


def test_tail_timestamps_are_integer_milliseconds(edge):
    from runtime.host.invocation import Invocation

    before = int(time.time() * 1000)
    calls, _, published = _handle()
    calls.log(ipc.Log(0, "log", "outside any request"))
    event = published[0]
    assert isinstance(event["eventTimestamp"], int) and before <= event["eventTimestamp"] <= before + 60_000
    assert isinstance(event["logs"][0]["timestamp"], int) and event["logs"][0]["timestamp"] >= before

    location = edge.locate("Seoul")
    ingress, _ = edge.ingress(location)
    ctx = Invocation(location, ingress, 0.0, method="GET", url="http://x/")
    calls, fake, published = _handle({7: ctx})
    calls.log(ipc.Log(7, "log", "inside"))
    WorkerHandle._finish(fake, 7, ctx, "ok", None, 200)
    event = published[0]
    assert event["eventTimestamp"] == int(ctx.started * 1000) and isinstance(event["eventTimestamp"], int)
    assert isinstance(event["logs"][0]["timestamp"], int) and event["logs"][0]["timestamp"] >= before


def test_edge_tail_prints_millisecond_timestamps_as_dates():
    from runtime.cli import _pretty

    at = 1_700_000_000_123
    line = _pretty({"eventTimestamp": at, "outcome": "ok", "event": {"request": {"method": "GET"}}})
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at / 1000)) in line


class _OpenApi(AIApi):
    def authenticate(self, request):
        return "local"


CATALOG = [
    {"name": f"@edge/moonshotai/m{i}", "description": f"model {i}", "task": {"name": "Text Generation"}}
    for i in range(5)
] + [{"name": "@cf/zai-org/glm-4.7-flash", "description": "GLM", "task": {"name": "Text Generation"}}]


@pytest.fixture
def client():
    api = _OpenApi(types.SimpleNamespace(catalog_view=lambda: CATALOG))
    return TestClient(Starlette(routes=api.routes()))


def _search(client, **params):
    return client.get("/client/v4/accounts/local/ai/models/search", params=params)


def test_models_search_takes_search_task_author_and_pages(client):
    body = _search(client).json()
    assert len(body["result"]) == 6 and body["result_info"] == {
        "page": 1,
        "per_page": 20,
        "count": 6,
        "total_count": 6,
    }
    assert [m["name"] for m in _search(client, search="glm").json()["result"]] == [
        "@cf/zai-org/glm-4.7-flash"
    ]
    assert _search(client, task="Text Generation").json()["result_info"]["total_count"] == 6
    assert _search(client, task="Text Embeddings").json()["result"] == []
    assert _search(client, author="moonshotai").json()["result_info"]["total_count"] == 5
    page = _search(client, per_page=2, page=3).json()
    assert [m["name"] for m in page["result"]] == ["@edge/moonshotai/m4", "@cf/zai-org/glm-4.7-flash"]
    assert page["result_info"] == {"page": 3, "per_page": 2, "count": 2, "total_count": 6}
    assert _search(client, per_page=2, page=9).json()["result"] == []
    bad = _search(client, per_page="many")
    assert bad.status_code == 400 and bad.json()["success"] is False


def _parsers(parser, path=("edge",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def test_every_edge_argument_has_help_and_shows_its_default(monkeypatch):
    from runtime import cli

    built = {}

    def grab(self, *args, **kwargs):
        built["parser"] = self
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    with pytest.raises(SystemExit):
        cli.main([])
    missing = []
    for path, parser in _parsers(built["parser"]):
        if path[:2] in (("edge", "sim"), ("edge", "plan")):  # capacity/cli.py's own
            continue
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help:
                missing.append(f"{' '.join(path)} {action.option_strings or action.dest}")
    assert not missing, missing
    dev = dict(_parsers(built["parser"]))[("edge", "dev")]
    assert "(default: 8787)" in dev.format_help()
    assert "(default: True)" not in dev.format_help()  # a flag's default is not shown
