"""rejectIfBusy (Workers AI's option: fail fast instead of waiting in a capacity queue): a call that
asks for it goes only to a PoP that would start it now, spills to the next that would, and is refused
with 3040 "Capacity temporarily exceeded" (HTTP 429) when none would; the REST body's `options` and
the binding's third argument carry it, and nothing else rides in `options` unnoticed."""

import asyncio
import threading

import pytest

from edge_sim.edge import Edge
from edge_sim.errors import EdgeError
from edge_sim.network import NetworkModel
from edge_sim.pop import ModelSpec
from edge_sim.request import GenerateRequest
from edge_sim.topology import Topology
from engine import SamplingParams
from runtime.ai.call import AICall
from runtime.ai.run_options import parse_run_options, rest_body_options
from runtime.ai.service import AIService
from runtime.routes.ai_rest import ai_error
from workers import AIError

MODEL = "@edge/test/tiny"


def start(tiny_model_dir, pops):
    spec = ModelSpec(MODEL, str(tiny_model_dir), allow_unsigned=True)
    return Edge.start(Topology.default(), NetworkModel(), pops, [spec], device="cpu")


def req(busy: bool) -> GenerateRequest:
    params = SamplingParams(max_tokens=2, temperature=0)
    return GenerateRequest(model=MODEL, prompt="def f(x):", params=params, reject_if_busy=busy)


async def stall(edge: Edge, code: str, gate: threading.Event) -> asyncio.Task:
    """Hold `code`'s engine in its step and queue a request there (waiting, not admitted): the PoP
    is busy as the router measures it. Returns the queued request's task."""
    icn = edge.nodes[code]
    real_step = icn.engines[MODEL].engine.step

    def held_step():
        gate.wait(timeout=30)
        return real_step()

    icn.engines[MODEL].engine.step = held_step
    ingress, rtt = edge.ingress(edge.locate("Seoul"))
    queued = asyncio.create_task(edge.run(req(False), ingress, rtt))
    for _ in range(300):
        if icn.route_load(MODEL).waiting:
            return queued
        await asyncio.sleep(0.01)
    raise AssertionError(f"{code} never showed a waiting request")


def test_a_busy_pop_refuses_at_once_and_an_idle_one_serves(tiny_model_dir):
    edge = start(tiny_model_dir, ["ICN"])
    gate = threading.Event()
    ingress, rtt = edge.ingress(edge.locate("Seoul"))

    async def scenario():
        queued = await stall(edge, "ICN", gate)
        with pytest.raises(EdgeError) as err:
            await edge.run(req(True), ingress, rtt)
        patient = asyncio.create_task(edge.run(req(False), ingress, rtt))  # without it: it waits
        await asyncio.sleep(0.05)
        assert not patient.done()
        gate.set()
        await asyncio.gather(queued, patient)
        served = await edge.run(req(True), ingress, rtt)  # idle again: served
        return err.value, served

    try:
        refused, served = asyncio.run(scenario())
    finally:
        gate.set()
        edge.close()
    assert refused.kind == "busy" and refused.message.startswith("Capacity temporarily exceeded")
    assert served.completion_tokens == 2


def test_a_busy_call_spills_to_a_pop_that_would_start_it(tiny_model_dir):
    edge = start(tiny_model_dir, ["ICN", "NRT"])
    gate = threading.Event()
    ingress, rtt = edge.ingress(edge.locate("Seoul"))

    async def scenario():
        queued = await stall(edge, "ICN", gate)
        served = await edge.run(req(True), ingress, rtt)
        gate.set()
        await queued
        return served

    try:
        served = asyncio.run(scenario())
    finally:
        gate.set()
        edge.close()
    assert served.timing.pop == "NRT"


def test_the_service_answers_3040_which_the_rest_api_sends_as_429(tiny_model_dir):
    edge = start(tiny_model_dir, ["ICN"])
    service = AIService(edge)
    gate = threading.Event()
    ingress, rtt = edge.ingress(edge.locate("Seoul"))

    async def scenario():
        queued = await stall(edge, "ICN", gate)
        call = AICall(
            MODEL, {"prompt": "x", "max_tokens": 2}, "acct", None, ingress, rtt, reject_if_busy=True
        )
        with pytest.raises(AIError) as err:
            await service.answer(call)
        gate.set()
        await queued
        return err.value

    try:
        error = asyncio.run(scenario())
    finally:
        gate.set()
        edge.close()
    assert error.code == 3040 and "Capacity temporarily exceeded" in error.detail
    assert ai_error(error).status_code == 429


def test_rest_body_options_carry_reject_if_busy_and_refuse_the_rest():
    inputs, busy = rest_body_options({"messages": [], "options": {"rejectIfBusy": True}})
    assert inputs == {"messages": []} and busy is True
    assert rest_body_options({"prompt": "x"}) == ({"prompt": "x"}, False)
    assert rest_body_options({"prompt": "x", "options": None}) == ({"prompt": "x"}, False)
    for bad, fragment in [
        ({"options": {"queueRequest": True}}, "options.queueRequest: no such request option"),
        ({"options": {"rejectIfBusy": "yes"}}, "rejectIfBusy: expected true or false"),
        ({"options": []}, "expected an object"),
    ]:
        with pytest.raises(AIError) as err:
            rest_body_options(bad)
        assert err.value.code == 5004 and fragment in err.value.detail


def test_the_binding_takes_reject_if_busy_in_its_third_argument():
    assert parse_run_options({"rejectIfBusy": True}, MODEL).reject_if_busy is True
    assert parse_run_options(None, MODEL).reject_if_busy is False
    with pytest.raises(AIError) as err:
        parse_run_options({"rejectIfBusy": 1}, MODEL)
    assert err.value.param == "rejectIfBusy"
