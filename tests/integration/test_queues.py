"""Queues as a user meets them: a real `edge dev` in a temporary project whose worker is both the
producer and the consumer of a queue (and of its dead-letter queue), real HTTP."""

import json
import textwrap
import threading
import time

import httpx
import pytest

from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow

WORKER = """
    import json
    from urllib.parse import parse_qs, urlsplit

    from workers import Response, WorkerEntrypoint


    class Default(WorkerEntrypoint):
        async def fetch(self, request):
            url = urlsplit(request.url)
            args = parse_qs(url.query)
            if url.path == "/send":
                names = args["name"]
                if names[1:]:
                    await self.env.JOBS.sendBatch([{"body": {"name": n}} for n in names[1:]])
                await self.env.JOBS.send({"name": names[0]}, contentType="json")
                return Response("queued")
            if url.path == "/seen":
                listed = await self.env.SEEN.list(prefix=args["prefix"][0])
                out = {}
                for key in listed.keys:
                    out[key["name"]] = json.loads(await self.env.SEEN.get(key["name"]))
                return Response.json(out)
            return Response("not found", status=404)

        async def queue(self, batch):
            for message in batch.messages:
                name = message.body["name"]
                if batch.queue == "jobs-dlq":
                    await self.env.SEEN.put(f"dlq:{name}", json.dumps(message.attempts))
                elif name.startswith("bad"):
                    await self.env.SEEN.put(f"tried:{name}", json.dumps(message.attempts))
                    raise RuntimeError(f"cannot handle {name}")
                else:
                    await self.env.SEEN.put(f"done:{name}", json.dumps(message.attempts))
                    message.ack()
"""

CONFIG = {
    "name": "qworker",
    "main": "worker.py",
    "compatibility_date": "2026-11-01",
    "kv_namespaces": [{"binding": "SEEN", "id": "seen"}],
    "queues": {
        "producers": [{"binding": "JOBS", "queue": "jobs"}],
        "consumers": [
            {"queue": "jobs", "max_batch_size": 5, "max_batch_timeout": 0.1, "max_retries": 1,
             "dead_letter_queue": "jobs-dlq"},
            {"queue": "jobs-dlq", "max_batch_timeout": 0.1},
        ],
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("queues")
    (d / "worker.py").write_text(textwrap.dedent(WORKER))
    (d / "wrangler.jsonc").write_text("// a producer and a consumer of one queue\n" + json.dumps(CONFIG))
    with DevServer(d / "wrangler.jsonc", cwd=d) as srv:
        srv.token = (d / ".edge" / "api-token").read_text().strip()
        yield srv


def seen(server, prefix: str, want: int, timeout: float = 30.0) -> dict:
    """The consumer's records under `prefix` once there are `want` of them (or the deadline passed)."""
    deadline = time.monotonic() + timeout
    while True:
        out = httpx.get(f"{server.url}/seen", params={"prefix": prefix}, timeout=10).json()
        if len(out) >= want or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def test_messages_sent_by_a_request_are_delivered_to_the_queue_handler(server):
    r = httpx.get(f"{server.url}/send", params={"name": ["a", "b", "c"]}, timeout=10)
    assert r.status_code == 200 and r.text == "queued"
    assert seen(server, "done:", 3) == {"done:a": 1, "done:b": 1, "done:c": 1}


def test_a_message_whose_handler_raises_is_retried_then_lands_in_the_dead_letter_queue(server):
    r = httpx.get(f"{server.url}/send", params={"name": ["bad-1"]}, timeout=10)
    assert r.status_code == 200
    assert seen(server, "dlq:", 1) == {"dlq:bad-1": 1}  # first delivery from the dead-letter queue
    assert seen(server, "tried:", 1) == {"tried:bad-1": 2}  # max_retries 1: two attempts


def test_a_delivery_shows_in_the_tail_as_a_queue_event(server):
    events: list[dict] = []
    connected = threading.Event()

    def listen():
        with httpx.stream(
            "GET",
            f"{server.url}/client/v4/accounts/local/workers/scripts/qworker/tail",
            headers={"authorization": f"Bearer {server.token}"},
            timeout=30,
        ) as r:
            for line in r.iter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "connected":
                    connected.set()
                elif "queue" in (event.get("event") or {}):
                    events.append(event)
                    return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert connected.wait(10)
    httpx.get(f"{server.url}/send", params={"name": ["t1", "t2"]}, timeout=10)
    thread.join(timeout=30)
    assert events, "no queue event reached the tail"
    (event,) = events
    assert event["event"]["queue"] == "jobs" and 1 <= event["event"]["batchSize"] <= 2
    assert event["outcome"] == "ok" and event["scriptName"] == "qworker"
