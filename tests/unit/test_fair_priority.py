"""Priority within an account (`priority`, vLLM's convention: lower is served first, default 0):
it orders the account's own waiting requests and never lifts the account above its share."""

from __future__ import annotations

import pytest

from engine.sampling import SamplingParams
from runtime.ai.inputs import ChatCompletionRequest, TextGenerationInputs
from runtime.ai.params import generate_request
from runtime.ai.refusals import InputError
from tests.unit.test_fair_preemption import policy, seats_by_tenant
from tests.unit.test_fair_share import Seq, run, step


def admitted(events):
    return [name for kind, name, _ in events if kind == "admit"]


def test_a_higher_priority_request_of_an_account_is_scheduled_before_its_lower_ones():
    p, blocks, events = policy(seats=1)
    for i in range(4):
        p.add(Seq(f"low{i}", "a", 16, 4, blocks))
    urgent = Seq("urgent", "a", 16, 4, blocks)
    urgent.priority = -5
    p.add(urgent)
    late = Seq("later", "a", 16, 4, blocks)
    late.priority = 3
    p.add(late)
    run(p)
    # all waited together: the urgent one first, the later (priority 3) one last
    assert admitted(events) == ["urgent", "low0", "low1", "low2", "low3", "later"]


def test_a_preempted_request_goes_back_first_within_its_priority():
    p, blocks, events = policy(seats=2)
    for i in range(2):
        p.add(Seq(f"h{i}", "heavy", 16, 200, blocks))
    for _ in range(5):
        step(p)
    waiting_low = Seq("h-low", "heavy", 16, 5, blocks)
    waiting_low.priority = 1
    p.add(waiting_low)
    p.add(Seq("light", "light", 16, 5, blocks))
    step(p)  # h1 preempted for the light tenant's share
    assert [name for kind, name, _ in events if kind == "preempt"] == ["h1"]
    order = [s.name for s in p.waiting if s.tenant == "heavy"]
    assert order[0] == "h1"


def test_priority_never_lifts_an_account_above_its_share():
    p, blocks, events = policy(seats=4)
    for i in range(10):
        seq = Seq(f"a{i}", "a", 16, 50, blocks)
        seq.priority = -100  # as urgent as can be, within its own account
        p.add(seq)
    for i in range(10):
        p.add(Seq(f"b{i}", "b", 16, 50, blocks))
    for _ in range(10):
        step(p)
    assert seats_by_tenant(p) == {"a": 2, "b": 2}


@pytest.mark.parametrize("schema", [TextGenerationInputs, ChatCompletionRequest])
def test_priority_is_taken_from_both_bodies_and_checked(schema):
    import msgspec

    body = {"messages": [{"role": "user", "content": "hi"}], "priority": -3}
    if schema is ChatCompletionRequest:
        body["model"] = "m"
    req = generate_request(msgspec.convert(body, schema), model="m")
    assert req.params.priority == -3
    assert generate_request(msgspec.convert({**body, "priority": 0}, schema), model="m").params.priority == 0
    with pytest.raises(InputError, match="priority"):
        generate_request(msgspec.convert({**body, "priority": 2**40}, schema), model="m")
    with pytest.raises(msgspec.ValidationError, match="priority"):
        msgspec.convert({**body, "priority": "high"}, schema)


def test_the_engine_checks_priority_as_the_other_parameters():
    from engine.errors import InvalidRequestError

    SamplingParams(priority=7).validate()
    with pytest.raises(InvalidRequestError, match="priority"):
        SamplingParams(priority=-(2**40)).validate()
