"""One tenant's request never harms another's in a shared batch: hostile sampling parameters are
refused (or made safe) before any work, a row that goes wrong inside the sampler ends alone, and a
stop-string check costs O(new text) whatever the output length."""

import random

import pytest
import torch

from engine import LLM, InvalidRequestError, SamplingParams
from engine.sampling import MAX_STOP_CHARS, MAX_STOP_STRINGS, Sampler, SamplingError
from engine.sequence import Sequence, _stop_prefix_tail


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, device="cpu", allow_unsigned=True)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(repetition_penalty=1e-300), "repetition_penalty"),  # divided a logit into inf
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(repetition_penalty=3.0), "repetition_penalty"),
        (dict(temperature=6.0), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(seed=2**70), "seed"),
        (dict(stop=["x"] * (MAX_STOP_STRINGS + 1)), "stop"),
        (dict(stop=["z" * (MAX_STOP_CHARS + 1)]), "stop"),
        (dict(stop=["z" * 1_000_000] * 2), "stop"),  # held an engine for 35 s
        (dict(stop_token_ids=list(range(65))), "stop_token_ids"),
    ],
)
def test_hostile_parameters_are_refused_before_any_work(llm, kwargs, param):
    with pytest.raises(InvalidRequestError) as err:
        llm.engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, **kwargs))
    assert err.value.param == param and param in str(err.value)
    assert not llm.engine.has_unfinished()


def test_a_vanishing_temperature_samples_as_greedy_does(llm):
    """temperature 1e-320 overflowed every logit to inf and made the batch's probabilities NaN."""
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    tiny = SamplingParams(max_tokens=8, temperature=1e-320, seed=3, ignore_eos=True)
    want = llm.generate("def f(x):", greedy)[0]
    got = llm.generate("def f(x):", tiny)[0]
    assert got.finish_reason == "length" and got.token_ids == want.token_ids


def test_the_sampler_refuses_probabilities_that_are_not_a_distribution():
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0), 4, [], torch.device("cpu"))
    with pytest.raises(SamplingError, match="not finite"):
        sampler(torch.tensor([1.0, float("nan"), 0.0, 2.0]))
    assert sampler(torch.tensor([1.0, 0.0, 0.0, 2.0])) in range(4)  # the same sampler goes on


def _run(engine, requests):
    """Add every (prompt, params, tamper) at once and step until all finish; tamper(seq) may break
    a sequence after it is queued. Returns the last event of each, by request id."""
    ids = []
    for prompt, params, tamper in requests:
        rid = engine.add_request(prompt, params)
        if tamper is not None:
            tamper(engine.sequences(rid)[0])
        ids.append(rid)
    tokens = {rid: [] for rid in ids}
    last = {}
    while engine.has_unfinished():
        for event in engine.step():
            if event.token_id is not None:
                tokens[event.request_id].append(event.token_id)
            if event.finish_reason:
                last[event.request_id] = event
    return [(last[rid], tokens[rid]) for rid in ids]


def _nan_counts(seq):
    """Inject NaN into this row inside the sampler: its penalty counts turn every logit NaN."""
    seq.sampler._counts.fill_(float("nan"))


def _raising_sampler(seq):
    def boom(logits):
        raise RuntimeError("a bug in one row's sampling")

    seq.sampler = type("Broken", (), {"__call__": staticmethod(boom), "observe": lambda self, t: None})()


def test_hostile_neighbours_leave_a_normal_request_exact(llm):
    normal_prompt = llm.encode("import os\nimport sys")
    normal = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    [(solo, solo_tokens)] = _run(llm.engine, [(normal_prompt, normal, None)])
    assert solo.finish_reason == "length" and len(solo_tokens) == 24

    hostile = [
        # NaN probabilities in one row (sampled, penalised: its counts are NaN)
        (llm.encode("x"), SamplingParams(max_tokens=24, temperature=1.0, frequency_penalty=1.0), _nan_counts),
        # a sampler that raises
        (llm.encode("y"), SamplingParams(max_tokens=24, temperature=0.7, seed=1), _raising_sampler),
        # the largest stop list allowed, and a vanishing temperature
        (
            llm.encode("z"),
            SamplingParams(
                max_tokens=24,
                temperature=1e-320,
                stop=["q" * MAX_STOP_CHARS] * MAX_STOP_STRINGS,
                ignore_eos=True,
            ),
            None,
        ),
    ]
    results = _run(llm.engine, [hostile[0], (normal_prompt, normal, None), *hostile[1:]])
    (nan_row, _), (beside, beside_tokens), (raised, _), (long_stops, _) = results
    assert nan_row.finish_reason == "error" and "not finite" in nan_row.error
    assert raised.finish_reason == "error" and "sampling failed" in raised.error
    assert long_stops.finish_reason == "length"
    assert beside.finish_reason == "length" and beside_tokens == solo_tokens
    assert not llm.engine.has_unfinished() and llm.engine.cache.used_blocks == 0


def test_the_held_tail_is_the_longest_stop_prefix():
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    for _ in range(2000):
        text = "".join(rng.choice("abc") for _ in range(rng.randrange(0, 12)))
        count = rng.randrange(1, 4)
        stops = ["".join(rng.choice("abc") for _ in range(rng.randrange(1, 6))) for _ in range(count)]
        want = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        assert _stop_prefix_tail(text, stops) == want, (seed, text, stops)


class _Pieces:
    """A detokenizer stand-in: token i decodes to pieces[i]."""

    def __init__(self, pieces):
        self.pieces = pieces

    def push(self, token):
        return self.pieces[token]

    def flush(self):
        return ""


def test_stop_strings_split_across_tokens_end_the_text_where_the_first_complete_one_starts():
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    no_sampler = type("S", (), {"observe": lambda self, t: None})()
    for _ in range(300):
        pieces = ["".join(rng.choice("ab") for _ in range(rng.randrange(1, 4))) for _ in range(40)]
        stops = ["".join(rng.choice("ab") for _ in range(rng.randrange(2, 7))) for _ in range(2)]
        params = SamplingParams(max_tokens=40, stop=stops)
        seq = Sequence("r", [1], params, no_sampler, None, _Pieces(pieces), frozenset())
        shown = ""
        for token in range(40):
            shown += seq.append(token)
            assert not any(s in shown for s in stops), seed
            if seq.finish_reason:
                break
        # the reference: after each token, the first stop string complete in the whole text ends it
        # where it starts (a longer one still forming does not count yet)
        want, reason = "".join(pieces), "length"
        for j in range(1, 41):
            text = "".join(pieces[:j])
            hits = [i for i in (text.find(s) for s in stops) if i >= 0]
            if hits:
                want, reason = text[: min(hits)], "stop"
                break
        assert shown == want and seq.finish_reason == reason, seed


@pytest.mark.parametrize("prompt", ["z" * 1_000_000, "word " * 200_000, "word " * 20_000])
def test_a_prompt_far_over_the_window_is_refused_after_bounded_work(llm, monkeypatch, prompt):
    """A megabyte prompt held the PoP's event loop for a second while it was tokenized whole."""
    from engine import RequestTooLargeError

    seen: list[int] = []
    real = llm.tokenizer.encode
    monkeypatch.setattr(llm.tokenizer, "encode", lambda text: seen.append(len(text)) or real(text))
    with pytest.raises(RequestTooLargeError) as err:
        llm.encode_prompt(prompt)
    assert err.value.param == "prompt" and f"{llm.context_window}" in str(err.value)
    assert max(seen, default=0) <= 8 * llm.context_window  # never the whole text


def test_a_hostile_account_beside_a_normal_one_through_the_ai_service(icn_edge):
    """The reproductions of the issue, sent by one account while another's request is in flight on
    the same PoP engine: the normal request's tokens are those of its solo run."""
    import asyncio

    from runtime.ai.service import AIService
    from tests.conftest import TINY_MODEL as model
    from workers import AIError

    service = AIService(icn_edge)
    ingress, rtt = icn_edge.ingress(icn_edge.locate("Seoul"))
    normal = {"prompt": "def fib(n):", "max_tokens": 48, "temperature": 0}
    hostile = [
        {"prompt": "x", "max_tokens": 4, "temperature": 1e-320},  # now greedy: served
        {"prompt": "x", "max_tokens": 4, "repetition_penalty": 1e-300},
        {"prompt": "x", "max_tokens": 4, "stop": ["z" * 1_000_000] * 2},
        {"prompt": "z" * 1_000_000, "max_tokens": 4},
        {"prompt": "x", "max_tokens": 4, "seed": 2**70},
    ]

    async def run(inputs, account):
        try:
            result, _ = await service.run(model, inputs, ingress=ingress, client_rtt_ms=rtt, account=account)
            return result
        except AIError as exc:
            return exc.code

    async def together():
        calls = [run(normal, "normal")] + [run(h, "hostile") for h in hostile for _ in range(3)]
        return await asyncio.gather(*calls)

    solo = asyncio.run(run(normal, "normal"))
    beside, *refused = asyncio.run(together())
    assert beside["response"] == solo["response"]
    assert beside["usage"]["completion_tokens"] == solo["usage"]["completion_tokens"] == 48
    assert sorted(set(r if isinstance(r, int) else 200 for r in refused)) == [200, 3006, 5004]
