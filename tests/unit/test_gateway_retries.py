"""AI Gateway's retries and timeouts (runtime.ai.gateway): a call that fails with what is worth
retrying (out of capacity, timed out) is tried again after retryDelayMs, growing by its backoff, up
to maxAttempts; bad input is never retried; requestTimeoutMs bounds each attempt, a stream's until
its first event. The waits are recorded, never slept."""

from __future__ import annotations

import asyncio

import pytest

from runtime.ai.service import Answer
from tests.unit.gateway_fakes import CountingAI, call, close_gateways, make_gateways, opts, read, run
from workers import AIError


@pytest.fixture
def gw(tmp_path):
    gateways = make_gateways(tmp_path)
    yield gateways
    close_gateways(gateways)


@pytest.mark.parametrize(
    ("backoff", "waits"),
    [("constant", [0.1, 0.1]), ("linear", [0.1, 0.2]), ("exponential", [0.1, 0.2])],
)
def test_a_service_failing_twice_is_answered_on_the_third_attempt(gw, backoff, waits):
    gw.ai.fail = [3040, 3007]
    retries = {"maxAttempts": 3, "retryDelayMs": 100, "backoff": backoff}
    out = run(gw.run(call(), opts(retries=retries)))
    assert out.answer.body["response"] == "answer 3" and gw.ai.calls == 3
    assert gw.sleep.waited == pytest.approx(waits)
    assert run(gw.get_log("acct", "gw", out.log_id))["attempts"] == 3


def test_exponential_backoff_doubles_each_wait(gw):
    gw.ai.fail = [3040] * 4
    out = run(gw.run(call(), opts(retries={"maxAttempts": 5, "retryDelayMs": 50, "backoff": "exponential"})))
    assert out.answer.body["response"] == "answer 5"
    assert gw.sleep.waited == pytest.approx([0.05, 0.1, 0.2, 0.4])


def test_bad_input_is_not_retried_and_the_last_failure_is_raised(gw):
    gw.ai.fail = [5004]
    with pytest.raises(AIError, match="^5004"):
        run(gw.run(call(), opts(retries={"maxAttempts": 3})))
    assert gw.ai.calls == 1 and gw.sleep.waited == []
    gw.ai.fail = [3040, 3040]
    with pytest.raises(AIError, match="^3040"):
        run(gw.run(call(), opts(retries={"maxAttempts": 2})))
    assert gw.ai.calls == 3
    gw.ai.fail = [3040]  # no retries asked: one attempt
    with pytest.raises(AIError, match="^3040"):
        run(gw.run(call(), opts()))


def test_request_timeout_bounds_each_attempt_with_a_clear_error(tmp_path):
    gw = make_gateways(tmp_path, ai=CountingAI(delay=5.0))
    try:
        with pytest.raises(AIError, match=r"^3007: the gateway's requestTimeoutMs \(20 ms\) passed"):
            run(gw.run(call(), opts(requestTimeoutMs=20, retries={"maxAttempts": 2})))
        assert gw.ai.calls == 2  # a timed-out attempt is worth retrying
    finally:
        close_gateways(gw)


class SlowFirstEvent:
    """A stream whose first event comes late (a PoP queue), or an error event first."""

    def __init__(self, first_error: int | None = None):
        self.calls = 0
        self.first_error = first_error
        self.closed = 0

    async def answer(self, call):
        self.calls += 1
        owner = self

        async def events():
            try:
                if owner.first_error and owner.calls == 1:
                    code = owner.first_error
                    yield f'data: {{"error": "{code}: busy", "code": {code}}}\n\n'.encode()
                    return
                if owner.calls == 1:
                    await asyncio.sleep(5)
                yield b'data: {"response": "ok"}\n\n'
                yield b"data: [DONE]\n\n"
            finally:
                owner.closed += 1

        return Answer(stream=events())


def test_a_stream_whose_first_event_is_late_times_out_and_is_retried(tmp_path):
    ai = SlowFirstEvent()
    gw = make_gateways(tmp_path, ai=ai)
    try:

        async def go():
            through = await gw.run(
                call(inputs={"prompt": "hi", "stream": True}),
                opts(requestTimeoutMs=30, retries={"maxAttempts": 2}),
            )
            return await read(through.answer.stream)

        assert run(go()) == b'data: {"response": "ok"}\n\ndata: [DONE]\n\n'
        assert ai.calls == 2 and ai.closed == 2  # the late stream was closed, not left running
    finally:
        close_gateways(gw)


def test_a_stream_that_fails_before_its_first_token_is_retried(tmp_path):
    ai = SlowFirstEvent(first_error=3040)
    gw = make_gateways(tmp_path, ai=ai)
    try:

        async def go():
            through = await gw.run(
                call(inputs={"prompt": "hi", "stream": True}), opts(retries={"maxAttempts": 2})
            )
            return await read(through.answer.stream)

        assert run(go()).startswith(b'data: {"response": "ok"}') and ai.calls == 2
    finally:
        close_gateways(gw)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"id": "bad id"}, "gateway.id: name the gateway"),
        ({"id": "gw", "cacheTTL": 5}, "gateway.cacheTTL: no such option"),
        ({"id": "gw", "cacheTtl": -1}, "gateway.cacheTtl: expected an integer"),
        ({"id": "gw", "requestTimeoutMs": 0}, "gateway.requestTimeoutMs: expected an integer from 1"),
        (
            {"id": "gw", "retries": {"maxAttempts": 9}},
            "gateway.retries.maxAttempts: expected an integer from 1 to 5",
        ),
        ({"id": "gw", "retries": {"backoff": "random"}}, "gateway.retries.backoff"),
        ({"id": "gw", "retries": {"tries": 2}}, "gateway.retries.tries: no such option"),
        ({"id": "gw", "skipCache": "yes"}, "gateway.skipCache: expected true or false"),
        ({"id": "gw", "metadata": {"a": [1]}}, "gateway.metadata.a: a value is a string"),
    ],
)
def test_gateway_options_are_checked_naming_the_key(options, fragment):
    from runtime.ai.gateway import GatewayOptions

    with pytest.raises(AIError, match=f"^5004: env.AI.run options: {fragment}"):
        GatewayOptions.parse(options)
