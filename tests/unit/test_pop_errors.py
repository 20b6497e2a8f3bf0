"""Error codes chosen by exception type, never by message text."""

import asyncio

import pytest

from edge_sim.errors import EdgeError, from_engine
from edge_sim.pop import ModelSpec, PopNode
from edge_sim.request import GenerateRequest
from edge_sim.topology import Topology
from engine import InvalidRequestError, RequestTooLargeError, SamplingParams

MODEL = "@edge/test/tiny"


@pytest.fixture(scope="module")
def node(tiny_model_dir):
    n = PopNode.load(
        Topology.default().pop("FRA"), [ModelSpec(MODEL, str(tiny_model_dir), allow_unsigned=True)], "cpu"
    )
    yield n
    n.close()


def test_the_error_code_comes_from_the_exception_type():
    assert from_engine(RequestTooLargeError("prompt", "is 9 tokens")).kind == "too_large"
    assert from_engine(InvalidRequestError("top_p", "must be in (0, 1]")).kind == "invalid_input"
    # the words the code used to be read from change nothing now
    magic = InvalidRequestError("max_tokens", "the context window and the KV cache")
    assert from_engine(magic).kind == "invalid_input" and from_engine(magic).message == str(magic)


def test_a_pop_maps_the_engines_rejections_by_type(node, monkeypatch):
    async def first_error(req):
        with pytest.raises(EdgeError) as err:
            async for _ in node.stream(req):
                pass
        return err.value.kind

    window = node.engines[MODEL].context_window
    too_long = GenerateRequest(model=MODEL, prompt="x " * (window * 2), params=SamplingParams(max_tokens=1))
    assert asyncio.run(first_error(too_long)) == "too_large"

    def says_context_window(prompt_ids, params):
        raise InvalidRequestError("max_tokens", "mentions the context window and KV, but is malformed")

    monkeypatch.setattr(node.engines[MODEL], "check_request", says_context_window)
    ok = GenerateRequest(model=MODEL, prompt="def f(x):", params=SamplingParams(max_tokens=1))
    assert asyncio.run(first_error(ok)) == "invalid_input"
