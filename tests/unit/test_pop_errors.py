"""Error codes chosen by exception type, never by message text."""

import asyncio

import pytest

from edge_sim.errors import EdgeError, from_engine
from edge_sim.request import GenerateRequest
from engine import InvalidRequestError, RequestTooLargeError, SamplingParams
from tests.conftest import TINY_MODEL

MODEL = TINY_MODEL  # what the fra_node fixture serves


def test_the_error_code_comes_from_the_exception_type():
    assert from_engine(RequestTooLargeError("prompt", "is 9 tokens")).kind == "too_large"
    assert from_engine(InvalidRequestError("top_p", "must be in (0, 1]")).kind == "invalid_input"
    # the words the code used to be read from change nothing now
    magic = InvalidRequestError("max_tokens", "the context window and the KV cache")
    assert from_engine(magic).kind == "invalid_input" and from_engine(magic).message == str(magic)


def test_a_pop_maps_the_engines_rejections_by_type(fra_node, monkeypatch):
    async def first_error(req):
        with pytest.raises(EdgeError) as err:
            async for _ in fra_node.stream(req):
                pass
        return err.value.kind

    window = fra_node.engines[MODEL].context_window
    too_long = GenerateRequest(model=MODEL, prompt="x " * (window * 2), params=SamplingParams(max_tokens=1))
    assert asyncio.run(first_error(too_long)) == "too_large"

    def says_context_window(prompt_ids, params):
        raise InvalidRequestError("max_tokens", "mentions the context window and KV, but is malformed")

    monkeypatch.setattr(fra_node.engines[MODEL], "check_request", says_context_window)
    ok = GenerateRequest(model=MODEL, prompt="def f(x):", params=SamplingParams(max_tokens=1))
    assert asyncio.run(first_error(ok)) == "invalid_input"
