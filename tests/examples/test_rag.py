"""examples/rag with the pytest plugin (runtime.testing): its Vectorize index made per test, the
passages it retrieves, and the real model's answer, the same for the same question."""

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.edge_config("../../examples/rag/wrangler.jsonc")]

DOCUMENTS = [
    {"text": "The office cat is called Miso.", "id": "cat"},
    {"text": "The coffee machine is on the third floor.", "id": "coffee"},
    {"text": "Standup is at ten every weekday.", "id": "standup"},
]


async def test_answers_cite_the_nearest_passages_and_repeat(worker):
    await worker.create_vectorize_index("VECTORIZE", preset="@cf/baai/bge-base-en-v1.5")
    added = await worker.fetch("/documents", method="POST", json={"documents": DOCUMENTS})
    assert added.status == 201 and added.json() == {"upserted": ["cat", "coffee", "standup"]}
    assert (await worker.vectorize("VECTORIZE").describe())["vectorCount"] == 3

    ask = {"question": "Where is the coffee machine?", "max_tokens": 24}
    first = await worker.fetch("/", method="POST", json=ask)
    assert first.status == 200, first
    assert first.json()["matches"][0]["id"] == "coffee"
    assert "[1] The coffee machine is on the third floor." in first.json()["prompt"][0]["content"]
    assert first.json()["answer"]
    again = await worker.fetch("/", method="POST", json=ask)
    assert again.json()["answer"] == first.json()["answer"]


async def test_without_its_index_the_worker_says_so(worker):
    r = await worker.fetch("/?q=anything")
    assert r.status == 503 and "docs" in r.json()["error"]
