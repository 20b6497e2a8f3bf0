"""Logprobs (engine.logprobs) against LLM.logits, and n sequences sharing one prompt's KV."""

import math
import threading
from pathlib import Path

import pytest
import torch

from engine.errors import InvalidRequestError
from engine.kv.kv_cache import BLOCK_SIZE
from engine.llm import LLM
from engine.sampling import SamplingParams
from engine.serving import EngineLoop

REPO = Path(__file__).resolve().parents[2]
PROMPT = list(range(10, 75))  # 65 tokens: four full blocks and a one-token tail


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(REPO / "models" / "kimi-k2-mini", device="cpu")


def drain(eng) -> list:
    events = []
    while eng.has_unfinished():
        events.extend(eng.step())
    return events


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logprobs_match_the_reference_logits(llm, temperature):
    prompt = llm.encode("def add(a, b):")
    params = SamplingParams(max_tokens=6, temperature=temperature, logprobs=5, ignore_eos=True)
    eng = llm.engine
    rid = eng.add_request(prompt, params)
    eng.add_request(llm.encode("a neighbour without logprobs"), SamplingParams(max_tokens=6, temperature=0))
    mine = [e for e in drain(eng) if e.request_id == rid and e.token_id is not None]
    assert len(mine) == 6
    output = [e.token_id for e in mine]
    reference = torch.log_softmax(llm.logits(prompt + output)[len(prompt) - 1 : -1], dim=-1)
    for step, event in enumerate(mine):
        lp = event.logprobs
        assert lp.chosen.logprob == pytest.approx(reference[step, event.token_id].item(), abs=1e-4)
        values = [t.logprob for t in lp.top]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert values[0] == pytest.approx(reference[step].max().item(), abs=1e-4)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-6
        if event.token_id == int(reference[step].argmax()):
            assert lp.chosen.token in [t.token for t in lp.top]
        assert bytes(lp.chosen.bytes).decode("utf-8", errors="replace") == lp.chosen.token
    if temperature == 0:  # greedy: the chosen is the likeliest every time
        assert all(e.logprobs.chosen == e.logprobs.top[0] for e in mine)


def test_logprobs_zero_gives_the_chosen_only_and_none_gives_nothing(llm):
    (zero,) = llm.generate(["x = "], SamplingParams(max_tokens=3, temperature=0, logprobs=0, ignore_eos=True))
    assert len(zero.logprobs) == 3 and all(lp.top == [] for lp in zero.logprobs)
    (none,) = llm.generate(["x = "], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert none.logprobs is None


def test_logprob_bytes_of_a_multibyte_character(llm):
    tok = llm.engine.guide_compiler().tokenizer
    pieces = tok.tokenize_str("é€")
    spelled = [llm.engine.speller()(t, 0.0) for t in pieces]
    assert b"".join(bytes(s.bytes) for s in spelled) == "é€".encode()


def test_n4_samples_four_sequences_from_one_prompt_computation(llm):
    eng = llm.engine
    before = eng.total_prompt_tokens
    rid = eng.add_request(PROMPT, SamplingParams(max_tokens=8, temperature=1.0, n=4, ignore_eos=True))
    events = drain(eng)
    ends = [e for e in events if e.finish_reason is not None]
    assert sorted(e.index for e in ends) == [0, 1, 2, 3]
    assert all(e.request_id == rid and e.finish_reason == "length" for e in ends)
    assert all(e.metrics.completion_tokens == 8 for e in ends)
    computed = eng.total_prompt_tokens - before
    tail = len(PROMPT) - (len(PROMPT) - 1) // BLOCK_SIZE * BLOCK_SIZE  # what each child runs again
    assert computed == len(PROMPT) + 3 * tail  # 68: the prompt once, not 4 x 65
    assert computed < 1.1 * len(PROMPT)
    assert eng.cache.used_blocks == 0  # nothing leaked


STORY = "Once upon a time, in a land far away, there lived a king who had three daughters and a dog. " * 2


def _choices(llm, seed, prefix_caching=True, prompt="Once upon"):
    eng = llm.engine
    eng.prefix_caching = prefix_caching
    try:
        params = SamplingParams(max_tokens=10, temperature=1.0, n=4, seed=seed)
        gens = llm.generate_choices([prompt], params)
    finally:
        eng.prefix_caching = True
    return [g.token_ids for g in gens[0]]


def test_seeded_n_is_reproducible_and_each_index_has_its_own_seed(llm):
    first = _choices(llm, seed=1234)
    assert _choices(llm, seed=1234) == first
    assert len({tuple(c) for c in first}) > 1
    single = llm.generate(["Once upon"], SamplingParams(max_tokens=10, temperature=1.0, seed=1234 + 2))
    assert single[0].token_ids == first[2]  # choice i samples as seed s + i would


def test_n_shares_the_prompt_without_prefix_caching(llm):
    eng = llm.engine
    length = len(llm.encode(STORY))
    assert length > 2 * BLOCK_SIZE
    before = eng.total_prompt_tokens
    unshared = _choices(llm, seed=7, prefix_caching=False, prompt=STORY)
    tail = length - (length - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert eng.total_prompt_tokens - before == length + 3 * tail  # the children forked the parent's blocks
    assert unshared == _choices(llm, seed=7, prompt=STORY)
    assert eng.cache.used_blocks == 0


@pytest.mark.parametrize("steps_first", [0, 1, 3])
def test_abort_ends_all_n_and_frees_their_blocks(llm, steps_first):
    eng = llm.engine
    rid = eng.add_request(PROMPT, SamplingParams(max_tokens=50, temperature=1.0, n=4, ignore_eos=True))
    for _ in range(steps_first):
        eng.step()
    events = eng.abort_all(rid)
    assert sorted(e.index for e in events) == [0, 1, 2, 3]
    assert all(e.finish_reason == "abort" for e in events)
    assert not eng.has_unfinished() and eng.cache.used_blocks == 0
    assert eng.abort_all(rid) == []


def test_generate_refuses_n_and_points_to_generate_choices(llm):
    with pytest.raises(InvalidRequestError, match="generate_choices"):
        llm.generate(["x"], SamplingParams(n=2))


def test_the_loop_keeps_the_callback_until_all_n_have_ended(llm):
    loop = EngineLoop(llm.engine, name="test-n")
    ends, done = [], threading.Event()

    def on_event(event):
        if event.finish_reason is not None:
            ends.append(event.index)
            if len(ends) == 3:
                done.set()

    try:
        loop.submit(
            "n3", PROMPT, SamplingParams(max_tokens=5, temperature=1.0, n=3, ignore_eos=True), on_event
        )
        assert done.wait(120)
    finally:
        loop.stop()
    assert sorted(ends) == [0, 1, 2]
