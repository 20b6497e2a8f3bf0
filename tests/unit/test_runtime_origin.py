"""The runtime's own origin, which URLs handed to a worker start with (an AI Gateway's getUrl): the
address `edge dev` listens on, or `[edge] public_url`; never a request's Host or X-Forwarded-*
headers, which any client writes (a worker sending its token to such a URL would hand it over)."""

import textwrap

import pytest
from starlette.requests import Request

from edge_sim.edge import Edge
from edge_sim.network import NetworkModel
from edge_sim.topology import Topology
from runtime.app import Runtime
from runtime.control.addresses import DEFAULT_ORIGIN, listen_origin, parse_origin
from runtime.control.config import ConfigError, parse_config
from runtime.host.addressing import Locator
from runtime.host.fetch_guard import FetchGuard

HOSTILE = [
    (b"host", b"mallory.example"),
    (b"x-forwarded-host", b"mallory.example"),
    (b"x-forwarded-proto", b"https"),
    (b"forwarded", b"host=mallory.example;proto=https"),
]


@pytest.fixture(scope="module")
def edge():
    e = Edge.start(Topology.default(), NetworkModel(), ["ICN"], [], device="cpu")
    yield e
    e.close()


def hostile_request() -> Request:
    return Request(
        {
            "type": "http",
            "method": "GET",
            "path": "/",
            "raw_path": b"/",
            "query_string": b"",
            "headers": HOSTILE,
            "scheme": "https",  # as a proxy-headers middleware would set it from X-Forwarded-Proto
            "server": ("127.0.0.1", 8787),
        }
    )


def config(tmp_path, edge_table: str = ""):
    (tmp_path / "worker.py").write_text("from workers import WorkerEntrypoint\n")
    text = 'name = "w"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n'
    return parse_config(text + textwrap.dedent(edge_table), base_dir=tmp_path)


def test_a_requests_origin_is_the_runtimes_whatever_host_it_names(edge):
    locator = Locator(edge, edge.locate("Seoul"), FetchGuard(), "http://127.0.0.1:9911")
    ctx = locator.locate(hostile_request())
    assert ctx.url.startswith("https://mallory.example/")  # the request's own URL is the client's
    assert ctx.origin == "http://127.0.0.1:9911"
    assert ctx.sub("GET", "http://other/").origin == "http://127.0.0.1:9911"


def test_the_runtime_names_where_it_listens_or_its_public_url(edge, tmp_path):
    listening = Runtime(config(tmp_path), edge, origin=listen_origin("0.0.0.0", 9912))
    public = Runtime(config(tmp_path, '[edge]\npublic_url = "https://Edge.Example.com/"\n'), edge, origin="x")
    try:
        for runtime, origin in ((listening, "http://127.0.0.1:9912"), (public, "https://edge.example.com")):
            ctx = runtime.locator.locate(hostile_request())
            assert runtime.origin == ctx.origin == origin
            url = runtime.gateways.url("acct", "gw", "workers-ai", ctx.origin)  # what getUrl answers
            assert url == f"{origin}/cdn-cgi/ai-gateway/v1/acct/gw/workers-ai"
            assert runtime.workers.dev.services.origin == origin  # cron, queue and alarm events too
    finally:
        for runtime in (listening, public):
            runtime.gateways.close()
            runtime.state.close()
            runtime.bindings.close()


def test_origins_are_read_strictly():
    assert parse_origin("https://edge.example.com") == "https://edge.example.com"
    assert parse_origin("http://[::1]:8787/") == "http://[::1]:8787"
    for bad, why in [
        ("edge.example.com", "http:// or https://"),
        ("ftp://edge.example.com", "http:// or https://"),
        ("https://edge.example.com/v1", "no path"),
        ("https://edge.example.com?x=1", "no path"),
        ("https://edge.example.com:99999", "port"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_origin(bad)
    assert listen_origin("::", 8787) == "http://[::1]:8787"
    assert listen_origin("192.168.1.5", 80) == "http://192.168.1.5:80"
    assert DEFAULT_ORIGIN == listen_origin("127.0.0.1", 8787)


def test_a_public_url_that_is_not_an_origin_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="edge.public_url: .* no path"):
        config(tmp_path, '[edge]\npublic_url = "https://edge.example.com/base"\n')
