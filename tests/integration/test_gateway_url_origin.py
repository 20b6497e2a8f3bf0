"""`env.AI.gateway(id).getUrl()` through a real `edge dev`, asked by a client that names another host
(Host, X-Forwarded-Host, X-Forwarded-Proto, Forwarded): the URL names the runtime, where `edge dev`
listens or its `[edge] public_url`, never the client's host, to which a worker would send its calls
and its token. No GPU PoP: getUrl needs no model."""

import textwrap

import httpx
import pytest

from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow

WORKER = """
from workers import Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        gateway = self.env.AI.gateway("gw")
        return Response.json({"url": await gateway.getUrl("workers-ai"), "base": await gateway.getUrl()})
"""
HOSTILE = {
    "host": "mallory.example",
    "x-forwarded-host": "mallory.example",
    "x-forwarded-proto": "https",
    "forwarded": "host=mallory.example;proto=https",
}


def serve(tmp_path, edge_table: str) -> DevServer:
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "wrangler-like.toml").write_text(
        textwrap.dedent("""
        name = "gateway-url"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [ai]
        binding = "AI"
        [edge]
        pops = []
    """)
        + edge_table
    )
    return DevServer(tmp_path / "wrangler-like.toml", cwd=tmp_path)


def urls(server: DevServer) -> dict:
    r = httpx.get(server.url + "/", headers=HOSTILE, timeout=30)  # from 127.0.0.1: a trusted proxy's address
    assert r.status_code == 200, r.text
    return r.json()


def test_get_url_names_where_edge_dev_listens_whatever_host_the_client_names(tmp_path):
    with serve(tmp_path, "") as server:
        out = urls(server)
    assert out["url"] == f"{server.url}/cdn-cgi/ai-gateway/v1/local/gw/workers-ai"
    assert out["base"] == f"{server.url}/cdn-cgi/ai-gateway/v1/local/gw"


def test_get_url_names_the_configured_public_url(tmp_path):
    with serve(tmp_path, 'public_url = "https://edge.example.com"\n') as server:
        out = urls(server)
    assert out["url"] == "https://edge.example.com/cdn-cgi/ai-gateway/v1/local/gw/workers-ai"
