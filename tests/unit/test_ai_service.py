"""env.AI.run's service: input validation with Workers AI codes, routing, and the latency account."""

import asyncio

import pytest

from edge_sim.edge import Edge
from edge_sim.network import NetworkModel
from edge_sim.pop import ModelSpec
from edge_sim.topology import Topology
from engine.structured.choices import Delta
from runtime.ai.service import AIService
from workers import AIError

MODEL = "@edge/test/tiny"


@pytest.fixture(scope="module")
def service(tiny_model_dir):
    topo = Topology.default()
    edge = Edge.start(
        topo,
        NetworkModel(),
        ["ICN", "FRA", "IAD"],
        [ModelSpec(MODEL, str(tiny_model_dir), allow_unsigned=True)],
        device="cpu",
    )
    yield AIService(edge)
    edge.close()


def call(service, inputs, where="Seoul", model=MODEL):
    edge = service.edge
    ingress, rtt = edge.ingress(edge.locate(where))
    return asyncio.run(service.run(model, inputs, ingress=ingress, client_rtt_ms=rtt))


def test_result_shape_and_account_add_up(service):
    body, account = call(service, {"prompt": "def fib(n):", "max_tokens": 6, "temperature": 0})
    assert isinstance(body["response"], str)
    usage = body["usage"]
    assert 0 < usage["completion_tokens"] <= 6 and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    t = body["timing"]
    parts = t["client_rtt_ms"] + t["backbone_rtt_ms"] + t["queue_ms"] + t["prefill_ms"] + t["decode_ms"]
    assert t["total_ms"] == pytest.approx(parts, abs=1e-6)
    assert t["pop"] == "ICN" and t["ingress"] == "ICN"
    assert body["quantization"] == {
        "weights": "bf16",
        "weights_by_part": {
            "routed_experts": "bf16",
            "shared_experts": "bf16",
            "dense_mlp": "bf16",
            "attention": "bf16",
        },
        "kv_cache": "auto",
        "dense_path": "f32",  # the tiny checkpoint is float32: held and multiplied so on the CPU
    }
    assert t == {k: getattr(account, k) for k in t}


def test_calls_go_to_the_nearest_serving_pop_and_fail_over(service):
    assert call(service, {"prompt": "x", "max_tokens": 1}, "New York")[0]["timing"]["pop"] == "IAD"
    berlin = call(service, {"prompt": "x", "max_tokens": 1}, "Berlin")[0]["timing"]
    assert berlin["pop"] == "FRA" and berlin["backbone_rtt_ms"] > 0  # Berlin's ingress is not a GPU PoP
    service.edge.nodes["FRA"].up = False
    try:
        assert call(service, {"prompt": "x", "max_tokens": 1}, "Berlin")[0]["timing"]["pop"] in ("ICN", "IAD")
        for node in service.edge.nodes.values():
            node.up = False
        with pytest.raises(AIError, match="^3040: "):
            call(service, {"prompt": "x", "max_tokens": 1})
    finally:
        for node in service.edge.nodes.values():
            node.up = True


def test_chat_messages_use_the_template(service):
    body, _ = call(service, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert body["usage"]["prompt_tokens"] > 1


@pytest.mark.parametrize(
    "inputs, code, fragment",
    [
        ("just a string", 5004, "inputs: must be an object"),
        ({}, 5004, "exactly one of 'prompt'"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 5004, "exactly one of 'prompt'"),
        ({"prompt": "a", "max_tokens": "many"}, 5004, "max_tokens: expected `int | null`"),
        ({"messages": [{"role": "robot", "content": "b"}]}, 5004, "messages.0.role"),
        ({"prompt": "a", "temperature": -1}, 5004, "temperature"),
        ({"prompt": ""}, 5004, "prompt: must not be empty"),
        ({"prompt": "a", "stop": 5}, 5004, "stop: expected `str | array | null`"),
        # the reproductions of a tenant that failed another's generation, or held the engine
        ({"prompt": "a", "repetition_penalty": 1e-300}, 5004, "repetition_penalty: must be in [0.01, 2]"),
        ({"prompt": "a", "stop": ["z" * 1_000_000] * 2}, 5004, "at most 256 characters"),
        ({"prompt": "a", "seed": 2**70}, 5004, "seed: must be a 64-bit integer"),
        ({"prompt": "word " * 5000}, 3006, "context window"),
    ],
)
def test_bad_inputs_get_workers_ai_codes(service, inputs, code, fragment):
    with pytest.raises(AIError) as err:
        call(service, inputs)
    assert err.value.code == code and str(err.value).startswith(f"{code}: ")
    assert fragment in str(err.value)


def test_unknown_model_lists_the_catalog(service):
    with pytest.raises(AIError, match=f"^5007: no such model 'nope'; available: {MODEL}"):
        call(service, {"prompt": "x"}, model="nope")


def test_account_carries_roofline_times_for_a_catalog_target(service):
    from edge_sim.target import TargetSpec

    service.edge.targets[MODEL] = TargetSpec(model="kimi-k2", weights="fp8")
    try:
        short, _ = call(service, {"prompt": "def fib(n):", "max_tokens": 2, "temperature": 0})
        long, _ = call(service, {"prompt": "def fib(n):" * 40, "max_tokens": 12, "temperature": 0})
    finally:
        service.edge.targets.clear()
    for body in (short, long):
        t = body["timing"]
        m = t["modeled"]
        assert m["fits"] and m["target"] == "kimi-k2 fp8 weights, auto KV on 8 x H200"
        assert m["ttft_ms"] == pytest.approx(t["client_rtt_ms"] + t["backbone_rtt_ms"] + m["prefill_ms"])
        assert m["total_ms"] == pytest.approx(m["ttft_ms"] + m["decode_ms"])
    # a longer prompt costs more modeled prefill; more tokens cost more modeled decode
    assert long["timing"]["modeled"]["prefill_ms"] > short["timing"]["modeled"]["prefill_ms"]
    assert long["timing"]["modeled"]["decode_ms"] > short["timing"]["modeled"]["decode_ms"]
    plain, _ = call(service, {"prompt": "x", "max_tokens": 1})
    assert plain["timing"]["modeled"] is None


def test_a_request_is_tokenized_once_at_the_pop_that_serves_it(service, monkeypatch):
    tokenized = []
    for code, node in service.edge.nodes.items():
        llm = node.engines[MODEL]
        real = llm.encode_prompt
        monkeypatch.setattr(
            llm, "encode_prompt", lambda text, code=code, real=real: tokenized.append(code) or real(text)
        )
    body, _ = call(service, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, "Berlin")
    assert tokenized == [body["timing"]["pop"]]  # routing ranked PoPs by an estimate, not by tokenizing


def test_sampling_parameters_are_checked_where_the_call_enters(service):
    # before anything is queued or streamed: a streaming call fails with its code, not mid-stream
    with pytest.raises(AIError, match="^5004: temperature: "):
        service.prepare(MODEL, {"prompt": "a", "temperature": -1, "stream": True}, "local")
    req, _ = service.prepare(MODEL, {"prompt": "a", "max_completion_tokens": 3, "max_tokens": 9}, "acct")
    assert req.params.max_tokens == 3 and req.tenant == "acct"


def test_the_session_key_and_the_accounts_share_travel_with_the_request(service):
    from engine.sched.fair_queue import TenantShare
    from runtime.ai.run_options import parse_run_options

    req, _ = service.prepare(MODEL, {"prompt": "a"}, "acct", session="conv-7")
    assert req.session == "conv-7" and req.share == TenantShare()
    with pytest.raises(AIError, match="^5004: x-session-affinity: give at most 256"):
        service.prepare(MODEL, {"prompt": "a"}, "acct", session="k" * 300)
    from runtime.control.accounts import AccountSettings

    shared = AIService(service.edge, settings_of=lambda account: AccountSettings(weight=3.0, kv_share=0.5))
    req, _ = shared.prepare(MODEL, {"prompt": "a"}, "gold")
    assert req.share == TenantShare(3.0, 0.5)
    # the engine at the PoP learns the account's weight and KV share from the request
    call(shared, {"prompt": "a", "max_tokens": 1})
    engines = [node.engines[MODEL].engine for node in service.edge.nodes.values()]
    tenants = [e.scheduler.waiting.tenant("local") for e in engines]
    assert any(t is not None and (t.weight, t.kv_share) == (3.0, 0.5) for t in tenants)
    # env.AI.run(model, inputs, {"extraHeaders": {"x-session-affinity": KEY}}), as Cloudflare's binding
    assert parse_run_options({"extraHeaders": {"x-session-affinity": "s1"}}).session == "s1"
    assert parse_run_options({"extra_headers": {"X-Session-Affinity": "s2"}}).session == "s2"
    assert parse_run_options(None).session is None
    with pytest.raises(AIError, match="^5004: env.AI.run options: extraHeaders: expected a dict"):
        parse_run_options({"extraHeaders": "x"})


def test_a_stream_dropped_before_its_end_still_counts_against_tokens_per_minute(service):
    from runtime.control.rate_limit import AccountRateLimits, Limits

    limits = AccountRateLimits(lambda account: Limits(rpm=None, tpm=1_000_000))
    limited = AIService(service.edge, rate_limits=limits)
    dropped = _call(service, {"prompt": "def f(x):", "max_tokens": 32, "temperature": 0}, account="dropper")
    req = limited.check(dropped)

    async def take_one_then_drop():
        stream = limited.stream(dropped)
        first = await stream.__anext__()
        await stream.aclose()  # the client went away after one delta
        return first

    first = asyncio.run(take_one_then_drop())
    assert isinstance(first, Delta) and first.text and first.index == 0
    window = limits.limiter._windows[("dropper", MODEL)]
    assert window.token_sum >= req.estimated_tokens() + 1  # the prompt and what it was sent


def test_a_stream_that_fails_at_the_pop_is_not_charged_and_a_finished_one_once(service):
    from runtime.control.rate_limit import AccountRateLimits, Limits

    limits = AccountRateLimits(lambda account: Limits(rpm=None, tpm=1_000_000))
    limited = AIService(service.edge, rate_limits=limits)

    async def drain(inputs, account):
        checked = _call(service, inputs, account=account)
        limited.check(checked)
        return [item async for item in limited.stream(checked)]

    with pytest.raises(AIError, match="^3006"):
        asyncio.run(drain({"prompt": "word " * 5000, "max_tokens": 4}, "refused"))
    refused = limits.limiter._windows.get(("refused", MODEL))
    assert refused is None or refused.token_sum == 0  # nothing ran: nothing counted
    *_, result = asyncio.run(drain({"prompt": "def f(x):", "max_tokens": 3, "temperature": 0}, "whole"))
    assert limits.limiter._windows[("whole", MODEL)].token_sum == result.total_tokens


def test_a_rollouts_canary_is_reached_only_by_its_session_share_and_charged_as_the_model(
    service, tiny_model_dir
):
    """A client can name neither the canary (it would pick the new version, and count its calls in a
    rate-limit bucket of their own) nor see it listed; a session in the share is routed to it and
    charged to the model's own limits."""
    from runtime.control.rate_limit import AccountRateLimits, Limits
    from runtime.control.rollout import Canary, Rollouts, canary_name

    canary = canary_name(MODEL)
    assert all(
        r is None
        for r in service.edge.reload(ModelSpec(canary, str(tiny_model_dir), allow_unsigned=True)).values()
    )
    try:
        limits = AccountRateLimits(lambda account: Limits(rpm=2, tpm=None))
        rolled = AIService(service.edge, rate_limits=limits)
        rolled.rollouts = Rollouts()
        rolled.rollouts.canaries[MODEL] = Canary(MODEL, str(tiny_model_dir), 100.0)
        assert canary in service.edge.models() and canary not in rolled.names()
        inputs = {"prompt": "def f(x):", "max_tokens": 2}
        with pytest.raises(AIError, match="^5007"):
            rolled.prepare(canary, inputs, "client")
        req, _ = rolled.prepare(MODEL, inputs, "client", session="s-1")
        assert req.model == canary  # the whole share: every session key goes to the new version
        assert rolled.prepare(MODEL, inputs, "client")[0].model == MODEL  # no key: the serving version
        with pytest.raises(AIError, match="^3036"):  # both calls counted under the model: the third waits
            rolled.prepare(MODEL, inputs, "client", session="s-2")
    finally:
        service.edge.unload(canary)


# --- the one door: a call's mode decided once, its tokens counted once, engine bugs answered once ---


def _call(service, inputs, queue=False, account="local"):
    from runtime.ai.call import AICall

    ingress, rtt = service.edge.ingress(service.edge.locate("Seoul"))
    return AICall(MODEL, inputs, account, None, ingress, rtt, queue=queue)


def test_a_call_s_mode_is_told_from_its_inputs_and_options(service):
    assert _call(service, {"prompt": "x"}).mode == "run"
    assert _call(service, {"prompt": "x", "stream": True}).mode == "stream"
    assert _call(service, {"prompt": "x", "stream": "yes"}).mode == "run"  # only true streams
    assert _call(service, {"input": "hi", "instructions": "be brief"}).mode == "responses"
    assert _call(service, {"requests": []}).mode == "batch"
    assert _call(service, {"prompt": "x"}, queue=True).mode == "batch"
    assert _call(service, {"request_id": "abc"}).mode == "poll"
    assert _call(service, ["not", "a", "dict"]).mode == "run"  # refused by the run's validation


class _Tokens:
    """The metrics as the service tells them: one record per call."""

    def __init__(self):
        self.counted = []
        self.speculated = []

    def ai_record(self, record):
        self.counted.append((record.model, record.prompt_tokens, record.completion_tokens))
        self.speculated.append((record.model, record.timing.draft_tokens, record.timing.accepted_tokens))


def test_plain_and_streamed_calls_count_their_tokens_once_under_the_name_called(service, monkeypatch):
    tokens = _Tokens()
    monkeypatch.setattr(service, "metrics", tokens)
    plain = asyncio.run(
        service.answer(_call(service, {"prompt": "def f(", "max_tokens": 4, "temperature": 0}))
    )
    usage = plain.body["usage"]
    assert tokens.counted == [(MODEL, usage["prompt_tokens"], usage["completion_tokens"])]
    assert plain.result is not None and plain.result.completion_tokens == usage["completion_tokens"]

    async def streamed():
        answer = await service.answer(_call(service, {"prompt": "def f(", "max_tokens": 4, "stream": True}))
        return [chunk async for chunk in answer.stream]

    chunks = asyncio.run(streamed())
    assert chunks[-1] == b"data: [DONE]\n\n"
    assert len(tokens.counted) == 2 and tokens.counted[1][0] == MODEL and tokens.counted[1][2] > 0
    # each call's draft tokens counted once too, under the same name (none here: speculation is off)
    assert [(m, d, a) for m, d, a in tokens.speculated] == [(MODEL, 0, 0), (MODEL, 0, 0)]


def test_an_engine_bug_becomes_3007_in_the_service_not_in_each_door(service, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("a bug in the engine")

    monkeypatch.setattr(service.edge, "run", broken)
    with pytest.raises(AIError) as exc:
        asyncio.run(service.answer(_call(service, {"prompt": "x", "max_tokens": 2})))
    assert exc.value.code == 3007 and "RuntimeError" in exc.value.detail


def test_a_batch_or_poll_without_a_batch_queue_is_refused_by_its_field(service):
    with pytest.raises(AIError, match="queueRequest"):
        asyncio.run(service.answer(_call(service, {"requests": [{"prompt": "x"}]}, queue=True)))
    with pytest.raises(AIError, match="request_id"):
        asyncio.run(service.answer(_call(service, {"request_id": "abc"})))
    with pytest.raises(AIError, match="send it with queueRequest"):
        asyncio.run(service.answer(_call(service, {"requests": [{"prompt": "x"}]})))


def test_a_plain_run_never_polls_or_queues_whatever_its_inputs_hold(service):
    """service.run (a batch's items run this way): a `request_id` or `requests` key is refused
    as an input, never taken as a poll or a batch of its own."""
    for extra in ({"request_id": "abc"}, {"requests": [{"prompt": "x"}]}):
        with pytest.raises(AIError) as exc:
            call(service, {"prompt": "x", "max_tokens": 2, **extra})
        assert exc.value.code == 5004 and next(iter(extra)) in exc.value.detail


def test_the_x_edge_priority_header_sets_a_calls_priority_and_is_checked(service):
    from runtime.ai.run_options import parse_run_options
    from runtime.ai.service import priority_of

    assert priority_of(None) is None and priority_of("-3") == -3 and priority_of(" 7 ") == 7
    for bad in ("high", "1.5", "+-1", "²", "9" * 11, ""):
        with pytest.raises(AIError, match="^5004: x-edge-priority: expected an integer"):
            priority_of(bad)
    req, _ = service.prepare(MODEL, {"prompt": "a", "priority": 4}, "acct")
    assert req.params.priority == 4  # the body's own
    req, _ = service.prepare(MODEL, {"prompt": "a", "priority": 4}, "acct", priority="-2")
    assert req.params.priority == -2  # the header wins
    with pytest.raises(AIError, match="^5004: priority: must be an integer in"):
        service.prepare(MODEL, {"prompt": "a"}, "acct", priority="9999999999")  # the body's range holds
    # env.AI.run(model, inputs, {"extraHeaders": {"x-edge-priority": "1"}}), as a worker sends it
    assert parse_run_options({"extraHeaders": {"x-edge-priority": 1}}).priority == "1"
    with pytest.raises(AIError, match="^5004: env.AI.run options: extraHeaders.x-edge-priority: expected"):
        parse_run_options({"extraHeaders": {"x-edge-priority": True}})
