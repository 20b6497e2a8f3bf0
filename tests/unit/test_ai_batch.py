"""The batch queue (runtime.ai.batch): validated at submit, run in the background a few at a time,
kept in the state database across a restart, results the account's own, bounded."""

import asyncio

import pytest

from runtime.ai import batch as ai_batch
from runtime.ai.batch import MAX_REQUESTS, BatchNotFound, BatchQueue
from runtime.ai.service import AIService
from runtime.control.state import State
from tests.conftest import TINY_MODEL
from workers import AIError

GREEDY = {"max_tokens": 4, "temperature": 0, "seed": 1}


@pytest.fixture
def queue(tmp_path, icn_edge):
    state = State(tmp_path / "state.db")
    service = AIService(icn_edge)
    yield BatchQueue(state, service, lambda code: icn_edge.topology.pops[code])
    state.close()


def where(queue):
    edge = queue.service.edge
    return edge.ingress(edge.locate("Seoul"))


def submit(queue, requests, account="local"):
    ingress, rtt = where(queue)
    return queue.submit(TINY_MODEL, {"requests": requests}, account, ingress, rtt)


async def run_until_done(queue, ident, account="local", timeout=120.0):
    runner = asyncio.create_task(queue.run_forever())
    try:
        async with asyncio.timeout(timeout):
            while "responses" not in (out := queue.poll(TINY_MODEL, {"request_id": ident}, account)):
                assert out["status"] in ("queued", "running")
                await asyncio.sleep(0.05)
            return out
    finally:
        runner.cancel()


def test_a_batch_runs_and_matches_direct_runs(queue):
    requests = [
        {"prompt": "def fib(n):", **GREEDY},
        {"prompt": "import os", **GREEDY, "external_reference": "r2"},
    ]
    queued = submit(queue, requests)
    assert queued["status"] == "queued" and queued["model"] == TINY_MODEL
    assert queue.poll(TINY_MODEL, {"request_id": queued["request_id"]}, "local")["status"] == "queued"
    done = asyncio.run(run_until_done(queue, queued["request_id"]))
    assert [r["id"] for r in done["responses"]] == [0, 1]
    assert [r["external_reference"] for r in done["responses"]] == [None, "r2"]
    ingress, rtt = where(queue)
    for response, request in zip(done["responses"], requests, strict=True):
        direct, _ = asyncio.run(
            queue.service.run(
                TINY_MODEL,
                {k: v for k, v in request.items() if k != "external_reference"},
                ingress=ingress,
                client_rtt_ms=rtt,
            )
        )
        assert response["success"] is True
        assert response["result"]["response"] == direct["response"]
        assert response["result"]["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]
    total = sum(r["result"]["usage"]["total_tokens"] for r in done["responses"])
    assert done["usage"]["total_tokens"] == total


def test_responses_shaped_items_run_too(queue):
    queued = submit(
        queue, [{"input": "hi", "instructions": "be brief", "max_output_tokens": 3, "temperature": 0}]
    )
    done = asyncio.run(run_until_done(queue, queued["request_id"]))
    result = done["responses"][0]["result"]
    assert (
        result["object"] == "response"
        and done["usage"]["completion_tokens"] == result["usage"]["output_tokens"]
    )


def test_a_bad_item_refuses_the_whole_batch_naming_its_index(queue):
    with pytest.raises(AIError) as info:
        submit(queue, [{"prompt": "ok"}, {"prompt": "x", "temperature": 99}])
    assert info.value.code == 5004 and info.value.detail.startswith("requests.1:")
    for bad, words in [
        ([{"prompt": "x", "stream": True}], "requests.0.stream"),
        ([{"prompt": "x", "external_reference": 5}], "requests.0.external_reference"),
        (["text"], "requests.0"),
        ([], "1 to"),
        ([{"prompt": "x"}] * (MAX_REQUESTS + 1), f"1 to {MAX_REQUESTS}"),
    ]:
        with pytest.raises(AIError) as info:
            submit(queue, bad)
        assert words in info.value.detail
    assert queue.state.query("SELECT COUNT(*) FROM ai_batches")[0][0] == 0  # nothing was kept


def test_another_account_gets_what_an_unknown_id_gets(queue):
    queued = submit(queue, [{"prompt": "x", **GREEDY}])
    with pytest.raises(BatchNotFound) as other:
        queue.poll(TINY_MODEL, {"request_id": queued["request_id"]}, "someone-else")
    with pytest.raises(BatchNotFound) as unknown:
        queue.poll(TINY_MODEL, {"request_id": "no-such-id"}, "someone-else")
    assert other.value.detail.replace(queued["request_id"], "ID") == unknown.value.detail.replace(
        "no-such-id", "ID"
    )


def test_a_queued_batch_survives_a_restart(tmp_path, icn_edge):
    state = State(tmp_path / "state.db")
    first = BatchQueue(state, AIService(icn_edge), lambda code: icn_edge.topology.pops[code])
    ingress, rtt = icn_edge.ingress(icn_edge.locate("Seoul"))
    queued = first.submit(TINY_MODEL, {"requests": [{"prompt": "x", **GREEDY}]}, "local", ingress, rtt)
    state.close()  # the runtime stops before the batch ran
    state = State(tmp_path / "state.db")
    second = BatchQueue(state, AIService(icn_edge), lambda code: icn_edge.topology.pops[code])
    done = asyncio.run(run_until_done(second, queued["request_id"]))
    assert done["responses"][0]["success"] is True
    state.close()
    state = State(tmp_path / "state.db")  # and its results outlive another restart
    third = BatchQueue(state, AIService(icn_edge), lambda code: icn_edge.topology.pops[code])
    assert third.poll(TINY_MODEL, {"request_id": queued["request_id"]}, "local") == done
    state.close()


def test_per_account_cap_and_expiry(queue, monkeypatch):
    monkeypatch.setattr(ai_batch, "MAX_QUEUED_PER_ACCOUNT", 2)
    ids = [submit(queue, [{"prompt": "x"}])["request_id"] for _ in range(2)]
    with pytest.raises(AIError) as info:
        submit(queue, [{"prompt": "x"}])
    assert info.value.code == 3036 and "at most 2" in info.value.detail
    submit(queue, [{"prompt": "x"}], account="other")  # another account's batches are its own
    queue.state.query("UPDATE ai_batches SET finished = 1 WHERE id = ?", (ids[0],))  # long ago
    with pytest.raises(BatchNotFound):
        queue.poll(TINY_MODEL, {"request_id": ids[0]}, "local")
    assert queue.state.query("SELECT COUNT(*) FROM ai_batch_items WHERE batch_id = ?", (ids[0],)) == [(0,)]


def test_runs_a_few_at_a_time(queue, monkeypatch):
    running, peak = 0, 0
    real = queue._generate

    async def counted(*args):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            return await real(*args)
        finally:
            running -= 1

    monkeypatch.setattr(queue, "_generate", counted)
    queued = submit(queue, [{"prompt": f"n{i}", **GREEDY} for i in range(5)])
    done = asyncio.run(run_until_done(queue, queued["request_id"]))
    assert len(done["responses"]) == 5 and peak == ai_batch.CONCURRENCY
