"""examples/hello_ai (the demo `make dev` serves), tested as its user would with the pytest plugin
(runtime.testing): the repository's wrangler-like.toml, the real model on three GPU PoPs."""

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.edge_config("../../wrangler-like.toml")]

PROMPT = {"prompt": "def fib(n):", "raw": True, "max_tokens": 16}  # raw: continued as written
QUESTION = "What is the capital of France?"
CHAT = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 24}


async def test_a_prompt_gets_the_models_completion_and_its_latency_account(worker):
    r = await worker.fetch("/", method="POST", json=PROMPT)
    assert r.status == 200, r
    out = r.json()
    assert out["model"] == "@edge/moonshotai/kimi-k2-mini"
    assert out["response"] and out["usage"]["completion_tokens"] == 16  # max_tokens, as it was asked
    assert "prefill;dur=" in r.headers["server-timing"] and "decode;dur=" in r.headers["server-timing"]


async def test_a_chat_question_gets_an_answer_in_english(worker):
    r = await worker.fetch("/", method="POST", json=CHAT)
    assert r.status == 200, r
    answer = r.json()["response"]
    assert "capital" in answer and "France" in answer and "def " not in answer


async def test_the_readmes_first_request_gets_an_answer(worker):
    # README's first request: a prompt goes through the chat template, as on Workers AI
    r = await worker.fetch("/", method="POST", json={"prompt": QUESTION})
    assert r.status == 200, r
    assert "Paris" in r.json()["response"]


async def test_the_same_prompt_gets_the_same_completion(worker):
    first = (await worker.fetch("/", method="POST", json=PROMPT)).json()["response"]
    again = (await worker.fetch("/", method="POST", json=PROMPT)).json()["response"]
    assert again == first
    own_seed = {**PROMPT, "seed": 12345}  # hello_ai passes no seed through: the plugin's applies
    assert (await worker.fetch("/", method="POST", json=own_seed)).json()["response"] == first


async def test_a_client_in_frankfurt_is_served_at_fra(worker):
    r = await worker.fetch("/", method="POST", json=PROMPT, location="Frankfurt")
    assert r.status == 200 and r.headers["cf-ray"].endswith("-FRA")


async def test_bad_requests_are_refused_with_what_to_send(worker):
    no_json = await worker.fetch("/", method="POST", body="def fib(n):")
    assert no_json.status == 400 and "send a JSON body" in no_json.json()["error"]
    no_prompt = await worker.fetch("/", method="POST", json={"text": "x"})
    assert no_prompt.status == 400 and '"messages" or a "prompt" string' in no_prompt.json()["error"]
    unknown = await worker.fetch("/", method="POST", json={**PROMPT, "model": "@edge/none"})
    assert unknown.status == 400 and unknown.json()["error"].startswith("5007")
