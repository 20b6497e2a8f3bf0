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
