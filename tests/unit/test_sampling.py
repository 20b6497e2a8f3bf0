"""Sampling parameters as a user relies on them."""

import pytest
import torch

from engine import LLM, InvalidRequestError, SamplingParams
from engine.sampling import Sampler


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, device="cpu", allow_unsigned=True)


def greedy_text(llm, prompt, n=12):
    return llm.generate(prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))[0].text


def test_stop_strings_end_the_text_and_are_not_returned(llm):
    full = greedy_text(llm, "def f(x):", 16)
    assert len(full) > 6
    stop = full[3:6]
    out = llm.generate(
        "def f(x):", SamplingParams(max_tokens=16, temperature=0, stop=[stop], ignore_eos=True)
    )[0]
    assert out.finish_reason == "stop"
    assert out.text == full[: full.find(stop)] and stop not in out.text


def test_streamed_text_never_shows_a_stop_string_being_formed(llm):
    full = greedy_text(llm, "class A:", 16)
    stop = full[4:9]
    params = SamplingParams(max_tokens=16, temperature=0, stop=[stop], ignore_eos=True)
    deltas = [e.text for e in llm.stream(llm.encode("class A:"), params)]
    assert "".join(deltas) == full[: full.find(stop)]
    shown = ""
    for d in deltas:
        shown += d
        assert stop not in shown


def test_seed_repeats_and_penalties_change_choices(llm):
    base = SamplingParams(max_tokens=20, temperature=0.9, seed=7, ignore_eos=True)
    a = llm.generate("import os", base)[0].token_ids
    assert a == llm.generate("import os", base)[0].token_ids
    greedy = llm.generate("x", SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0].token_ids
    penalised = llm.generate(
        "x",
        SamplingParams(
            max_tokens=20, temperature=0, frequency_penalty=2.0, presence_penalty=2.0, ignore_eos=True
        ),
    )[0].token_ids
    # a random tiny model repeats itself greedily; the penalties must break that
    assert len(set(penalised)) > len(set(greedy)) or greedy != penalised


def test_sampler_filters():
    logits = torch.tensor([5.0, 4.0, 0.0, -1.0])
    # min_p: tokens under min_p x p(top) never come out
    s = Sampler(SamplingParams(temperature=1.0, min_p=0.3, seed=0), 4, [], torch.device("cpu"))
    assert {s(logits) for _ in range(200)} <= {0, 1}
    s = Sampler(SamplingParams(temperature=1.0, top_k=1, seed=0), 4, [], torch.device("cpu"))
    assert {s(logits) for _ in range(50)} == {0}
    # repetition penalty divides a seen token's positive logit
    s = Sampler(SamplingParams(temperature=0, repetition_penalty=10.0), 4, [0], torch.device("cpu"))
    assert s(logits) == 1


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(min_p=1.5), "min_p"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(frequency_penalty=3), "frequency_penalty"),
        (dict(presence_penalty=-2.5), "presence_penalty"),
        (dict(stop=[""]), "stop"),
        (dict(temperature=float("nan")), "temperature"),
    ],
)
def test_bad_parameters_are_named_before_any_work(llm, kwargs, param):
    before = llm.engine.has_unfinished()
    with pytest.raises(InvalidRequestError) as err:
        llm.generate("x", SamplingParams(**kwargs))
    assert err.value.param == param
    assert llm.engine.has_unfinished() == before


def _tokens_of(llm, requests):
    """Run (prompt, params) pairs in one batch through the engine: each request's generated ids."""
    ids = [llm.engine.add_request(llm.encode(prompt), params) for prompt, params in requests]
    out = {rid: [] for rid in ids}
    finished = set()
    while len(finished) < len(ids):
        for event in llm.engine.step():
            if event.token_id is not None:
                out[event.request_id].append(event.token_id)
            if event.finish_reason is not None:
                finished.add(event.request_id)
    return [out[rid] for rid in ids]


def test_logit_bias_bans_and_forces_tokens_for_its_own_row_only(llm):
    plain = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    (alone,) = _tokens_of(llm, [("def f(x):", plain)])
    banned = {t: -100.0 for t in set(alone)}
    forced = {1234: 100.0}
    ban = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logit_bias=banned)
    force = SamplingParams(max_tokens=12, temperature=0.8, seed=3, ignore_eos=True, logit_bias=forced)
    same, without, only = _tokens_of(llm, [("def f(x):", plain), ("def f(x):", ban), ("import os", force)])
    assert same == alone  # a neighbour's bias in the same batch changes nothing for this row
    assert len(without) == 12 and not set(without) & set(alone)  # -100 bans, greedy or not
    assert only == [1234] * 12  # +100 all but forces a token, sampled at temperature 0.8


def test_logit_bias_shows_the_models_own_logprobs(llm):
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=1, logit_bias={77: 100.0})
    out = llm.generate("x", params)[0]
    assert out.token_ids == [77] * 4
    # the raw distribution's logprob of a token the model itself would not pick (vLLM's default):
    # under the bias it would be ~0 and the likeliest token
    for step in out.logprobs:
        assert step.chosen.logprob < -1.0 and step.top[0].logprob > step.chosen.logprob


@pytest.mark.parametrize(
    "bias, words",
    [
        ({i: 1.0 for i in range(301)}, "at most 300"),
        ({5: 100.5}, "[-100, 100]"),
        ({5: float("nan")}, "[-100, 100]"),
        ({-1: 1.0}, ">= 0"),
        ({99_999: 1.0}, "token 99999 is not in this model's vocabulary of"),
    ],
)
def test_bad_logit_bias_is_refused_before_any_work(llm, bias, words):
    with pytest.raises(InvalidRequestError) as err:
        llm.generate("x", SamplingParams(logit_bias=bias))
    assert err.value.param == "logit_bias" and words in str(err.value)
