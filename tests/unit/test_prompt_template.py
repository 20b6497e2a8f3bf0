"""A Workers AI `prompt` goes through the model's chat template, as Workers AI does, unless the
request says `raw: true` (issue 57, item 5); OpenAI's legacy `/completions` keeps its prompt raw, as
Cloudflare's OpenAI-compatible completions and OpenAI's own do (a text completion, not a chat)."""

import asyncio

import pytest

from edge_sim.edge import Edge
from edge_sim.network import NetworkModel
from edge_sim.pop import ModelSpec
from edge_sim.topology import Topology
from runtime.ai.inputs import CompletionRequest
from runtime.ai.params import chat_request, generate_request
from runtime.ai.refusals import InputError
from runtime.ai.service import AIService
from tests.conftest import SHIPPED_KIMI

KIMI = "@edge/moonshotai/kimi-k2-mini"
QUESTION = "What is the capital of France?"
TOOL = {"name": "f", "description": "", "parameters": {"type": "object", "properties": {}}}


def test_a_prompt_is_one_user_message_through_the_chat_template():
    req = chat_request({"prompt": QUESTION}, model=KIMI)
    assert req.prompt is None and req.messages == [{"role": "user", "content": QUESTION}]


def test_raw_true_sends_the_prompt_as_written():
    req = chat_request({"prompt": "def fib(n):", "raw": True}, model=KIMI)
    assert req.prompt == "def fib(n):" and req.messages is None


def test_a_prompt_may_call_tools_but_a_raw_one_may_not():
    # templated, a prompt declares tools as messages do; raw text has no template to declare them in
    req = chat_request({"prompt": QUESTION, "tools": [TOOL]}, model=KIMI)
    assert req.messages == [{"role": "user", "content": QUESTION}] and req.tools
    with pytest.raises(InputError, match="^5004: raw: a raw prompt has no chat template"):
        chat_request({"prompt": QUESTION, "raw": True, "tools": [TOOL]}, model=KIMI)


def test_openai_completions_keep_the_prompt_raw():
    req = generate_request(CompletionRequest(model=KIMI, prompt="def fib(n):"), model=KIMI)
    assert req.prompt == "def fib(n):" and req.messages is None


@pytest.fixture(scope="module")
def kimi():
    edge = Edge.start(
        Topology.default(), NetworkModel(), ["ICN"], [ModelSpec(KIMI, str(SHIPPED_KIMI))], device="cpu"
    )
    yield AIService(edge)
    edge.close()


def run(service, inputs):
    ingress, rtt = service.edge.ingress(service.edge.locate("Seoul"))
    return asyncio.run(service.run(KIMI, inputs, ingress=ingress, client_rtt_ms=rtt))[0]


def test_the_shipped_kimi_answers_a_question_sent_as_a_prompt(kimi):
    # measured greedy: "Paris is the capital of France." through the template; raw, the question
    # is continued as text ("A few in the fope of the few faster than ...")
    ask = {"prompt": QUESTION, "max_tokens": 16, "temperature": 0}
    templated = run(kimi, ask)["response"]
    as_chat = run(kimi, {**ask, "prompt": None, "messages": [{"role": "user", "content": QUESTION}]})
    assert "Paris" in templated and templated == as_chat["response"]
    assert "Paris" not in run(kimi, {**ask, "raw": True})["response"]
