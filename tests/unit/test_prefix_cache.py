"""The prefix cache in the real engine (tiny model, float32, greedy): a tenant's repeated prefix is
not run again, another tenant's identical prefix is, and a hit changes no token in any KV format."""

import random

import pytest

from engine import LLM, SamplingParams

PREFIX = 512
GREEDY = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def run(llm: LLM, ids: list[int], tenant: str, params: SamplingParams = GREEDY):
    """One request alone on the engine: its tokens, its metrics and the prefill tokens counted."""
    engine = llm.engine
    rid = engine.add_request(ids, params, tenant=tenant)
    tokens, last, prefill = [], None, 0
    while engine.has_unfinished():
        events = engine.step()
        prefill += engine.steps[-1].prefill_tokens  # alone on the engine, every step runs it
        for event in events:
            assert event.request_id == rid and event.finish_reason != "error", event
            tokens.append(event.token_id)
            last = event
    return tokens, last.metrics, prefill


@pytest.fixture(scope="module")
def llm(tiny_long_model_dir):
    return LLM(tiny_long_model_dir, device="cpu", allow_unsigned=True)


def test_paired_same_tenant_hits_and_another_tenant_does_not(llm):
    rng = random.Random(12)
    for _ in range(20):
        prefix = [rng.randrange(10, 4000) for _ in range(PREFIX)]
        first = prefix + [rng.randrange(10, 4000) for _ in range(rng.randint(1, 40))]
        again = prefix + [rng.randrange(10, 4000) for _ in range(rng.randint(1, 40))]
        _, m, prefill = run(llm, first, "alice")
        assert m.cached_tokens == 0 and prefill == len(first)
        _, m, prefill = run(llm, again, "alice")
        assert m.cached_tokens == PREFIX  # the whole shared prefix (block-aligned), nothing after it
        assert prefill == len(again) - m.cached_tokens  # the cached share is not prefill work
        _, m, prefill = run(llm, again, "bob")
        assert m.cached_tokens == 0 and prefill == len(again)  # another tenant computes it all


def test_stats_count_queries_and_hits(llm):
    before = llm.stats()
    ids = [7] * 100
    run(llm, ids, "carol")
    run(llm, ids, "carol")
    after = llm.stats()
    assert after.prefix_cache_queries - before.prefix_cache_queries == 200
    assert after.prefix_cache_hits - before.prefix_cache_hits == 96  # 6 blocks; the last runs again


def test_a_conversation_hits_its_earlier_turns_generated_tokens_included(llm):
    rng = random.Random(3)
    turn1 = [rng.randrange(10, 4000) for _ in range(70)]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    reply, _, _ = run(llm, turn1, "dave", params)
    turn2 = turn1 + reply + [rng.randrange(10, 4000) for _ in range(10)]
    _, m, _ = run(llm, turn2, "dave")
    # every full block computed in turn 1: its prompt and all of its reply but the last token
    assert m.cached_tokens == (len(turn1) + len(reply) - 1) // 16 * 16 > len(turn1)


def test_off_is_off(tiny_long_model_dir):
    plain = LLM(tiny_long_model_dir, device="cpu", allow_unsigned=True, prefix_caching=False)
    ids = [9] * 300
    run(plain, ids, "erin")
    _, m, prefill = run(plain, ids, "erin")
    assert m.cached_tokens == 0 and prefill == 300 and plain.stats().prefix_cache_queries == 0


@pytest.mark.parametrize("kv", ["auto", "fp8", "int8", "int4"])
def test_a_hit_gives_the_tokens_of_a_run_without_the_cache(tiny_long_model_dir, kv):
    rng = random.Random(5)
    prefix = [rng.randrange(10, 4000) for _ in range(200)]
    prompts = [prefix + [rng.randrange(10, 4000) for _ in range(n)] for n in (5, 23)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    runs = {}
    for caching in (True, False):
        llm = LLM(
            tiny_long_model_dir,
            device="cpu",
            allow_unsigned=True,
            kv_cache_dtype=kv,
            prefix_caching=caching,
            max_num_batched_tokens=64,  # chunked: the hit starts mid-prompt in a fresh block
        )
        out = []
        for ids in prompts:
            tokens, m, _ = run(llm, ids, "frank", params)
            out.append((tokens, m.cached_tokens))
        runs[caching] = out
    assert runs[True][1][1] == 192 and runs[False][1][1] == 0  # the second prompt hit the first's blocks
    assert [t for t, _ in runs[True]] == [t for t, _ in runs[False]]
