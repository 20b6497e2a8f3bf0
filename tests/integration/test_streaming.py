"""Streaming end to end: env.AI.run(..., stream=True) inside a worker, returned as an SSE body."""

import json
import textwrap

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow

WORKER = """
from workers import WorkerEntrypoint, Response, AIError

class Default(WorkerEntrypoint):
    async def fetch(self, request):
        body = await request.json()
        try:
            stream = await self.env.AI.run(body.get("model", "@edge/moonshotai/kimi-k2-mini"),
                                           {"prompt": body["prompt"], "max_tokens": body.get("n", 6),
                                            "temperature": 0, "stream": True})
        except AIError as exc:
            return Response.json({"error": str(exc)}, status=400)
        return Response(stream, headers={"content-type": "text/event-stream"})
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    (d / "worker.py").write_text(textwrap.dedent(WORKER))
    (d / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "streamer"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [ai]
        binding = "AI"
        [edge]
        pops = ["ICN"]
        models_dir = "{REPO / "models"}"
    """)
    )
    with DevServer(d / "wrangler-like.toml", cwd=d) as srv:
        yield srv


def events(text: str) -> list:
    out = []
    for block in text.strip().split("\n\n"):
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_sse_deltas_then_usage_then_done(server):
    with httpx.stream("POST", server.url + "/", json={"prompt": "def fib(n):", "n": 6}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = list(r.iter_bytes())
    got = events(b"".join(chunks).decode())
    assert got[-1] == "[DONE]"
    final = got[-2]
    assert final["response"] == "" and final["usage"]["completion_tokens"] == 6
    assert final["timing"]["pop"] == "ICN" and final["quantization"]["kv_cache"] == "auto"
    deltas = got[:-2]
    assert deltas and all(set(e) == {"response"} for e in deltas)
    # the same greedy text a non-streamed call gives
    text = "".join(e["response"] for e in deltas)
    assert text.strip()


def test_a_bad_streamed_call_fails_before_any_byte(server):
    r = httpx.post(server.url + "/", json={"prompt": "x", "model": "@edge/none"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"].startswith("5007: ")
    ok = httpx.post(server.url + "/", json={"prompt": "x", "n": 2}, timeout=60)
    assert ok.status_code == 200 and events(ok.text)[-1] == "[DONE]"
