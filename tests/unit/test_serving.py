"""Continuous batching: preemption, chunked prefill, cancellation, per-request failures, and the
promise that batching never changes a greedy answer."""

import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.kv.kv_cache import BLOCK_SIZE, PagedKVCache


@pytest.fixture(scope="module")
def solo(tiny_model_dir):
    return LLM(tiny_model_dir, device="cpu", allow_unsigned=True)


def solo_greedy(llm, prompt, n):
    """Greedy tokens by full recomputation, with the gap between the top two logits at each step."""
    ids, gaps = list(prompt), []
    for _ in range(n):
        top = llm.logits(ids)[-1].topk(2).values
        gaps.append(float(top[0] - top[1]))
        ids.append(int(llm.logits(ids)[-1].argmax()))
    return ids[len(prompt) :], gaps


def test_fifty_concurrent_requests_under_preemption_match_solo_greedy(tiny_model_dir, solo):
    rng = random.Random(torch.seed())
    requests = [
        ([rng.randrange(10, 4000) for _ in range(rng.randrange(3, 120))], rng.randrange(4, 24))
        for _ in range(50)
    ]
    # room for about four of these sequences at once: the scheduler must preempt and resume
    block, _ = PagedKVCache.layout_bytes(solo.model.kv_components(), 3, "auto", torch.float32)
    llm = LLM(
        tiny_model_dir,
        device="cpu",
        allow_unsigned=True,
        kv_cache_bytes=40 * block,
        max_num_batched_tokens=96,
        max_num_seqs=16,
    )
    ids = [
        llm.engine.add_request(p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
        for p, n in requests
    ]
    out = {r: [] for r in ids}
    finished = {}
    while llm.engine.has_unfinished():
        for e in llm.engine.step():
            out[e.request_id].append(e.token_id)
            if e.finish_reason:
                finished[e.request_id] = e
        assert sum(s.prefill_tokens + s.decode_tokens for s in list(llm.engine.steps)[-1:]) <= 96
    assert llm.engine.scheduler.preemptions > 0, "the budget was meant to force preemption"
    assert all(finished[r].finish_reason == "length" for r in ids)  # nobody starved or failed
    assert llm.engine.cache.used_blocks == 0  # every block came back
    for rid, (prompt, n) in zip(ids, requests, strict=True):
        want, gaps = solo_greedy(solo, prompt, n)
        got = out[rid]
        assert len(got) == n
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if a != b:
                assert gaps[i] < 1e-4, f"{rid} diverged at token {i} with a clear winner (gap {gaps[i]})"
                break


def test_new_requests_join_running_decodes_and_long_prompts_do_not_stall_them(tiny_model_dir):
    llm = LLM(tiny_model_dir, device="cpu", allow_unsigned=True, max_num_batched_tokens=32)
    eng = llm.engine
    first = eng.add_request([5, 6, 7], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    for _ in range(3):
        eng.step()
    long = eng.add_request(list(range(10, 210)), SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    decoded_while_prefilling = 0
    while any(
        s.request_id == long and s.first_token is None
        for s in eng.scheduler.running + list(eng.scheduler.waiting)
    ):
        events = eng.step()
        stats = eng.steps[-1]
        assert stats.prefill_tokens + stats.decode_tokens <= 32  # the chunk budget holds
        decoded_while_prefilling += any(e.request_id == first for e in events)
    assert decoded_while_prefilling >= 200 // 32 - 1  # the running request kept getting tokens


def test_cancellation_frees_blocks_at_once(tiny_model_dir):
    llm = LLM(tiny_model_dir, device="cpu", allow_unsigned=True)
    eng = llm.engine
    rid = eng.add_request(list(range(10, 60)), SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    eng.step()
    assert eng.cache.used_blocks == -(-50 // BLOCK_SIZE)
    event = eng.abort(rid)
    assert event.finish_reason == "abort" and eng.cache.used_blocks == 0 and not eng.has_unfinished()


def test_non_finite_logits_fail_only_that_request(tiny_model_dir):
    llm = LLM(tiny_model_dir, device="cpu", allow_unsigned=True)
    real = llm.model.logits
    victim_row = {"row": 0}

    def poisoned(hidden):
        out = real(hidden)
        out[victim_row["row"]] = float("nan")
        return out

    llm.model.logits = poisoned
    eng = llm.engine
    a = eng.add_request([5, 6, 7], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    b = eng.add_request([8, 9, 10], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    results = {}
    while eng.has_unfinished():
        for e in eng.step():
            if e.finish_reason:
                results[e.request_id] = e
            victim_row["row"] = 10_000 if a in results else 0  # poison only while `a` runs
        if a in results:
            llm.model.logits = real
    assert results[a].finish_reason == "error" and "non-finite" in results[a].error
    assert results[b].finish_reason == "length" and results[b].metrics.completion_tokens == 4


def test_request_metrics_add_up(tiny_model_dir):
    llm = LLM(tiny_model_dir, device="cpu", allow_unsigned=True)
    g = llm.generate("def f(x):", SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
    m = g.metrics
    assert m.prompt_tokens == len(g.prompt_token_ids) and m.completion_tokens == 6
    assert m.ttft_ms == pytest.approx(m.queue_ms + m.prefill_ms, abs=1e-6)
    assert m.tpot_ms == pytest.approx(m.decode_ms / 5)
    assert m.finish_reason == "length" and m.preemptions == 0
    loads = llm.engine.expert_load()
    assert len(loads) == 2 and all(len(layer) == 8 for layer in loads)
    assert sum(loads[0]) == 2 * sum(s.prefill_tokens + s.decode_tokens for s in llm.engine.steps)


def test_kv_requests_that_can_never_fit_are_refused_up_front(tiny_model_dir):
    from engine import InvalidRequestError, ModelLoadError

    block = LLM(tiny_model_dir, device="cpu", allow_unsigned=True).engine.cache.block_bytes
    llm = LLM(tiny_model_dir, device="cpu", allow_unsigned=True, kv_cache_bytes=4 * block)
    with pytest.raises(InvalidRequestError, match="KV blocks"):
        llm.generate("x " * 40, SamplingParams(max_tokens=40))
    with pytest.raises(ModelLoadError, match="kv_cache_dtype='int2' is unknown"):
        LLM(tiny_model_dir, kv_cache_dtype="int2", device="cpu", allow_unsigned=True)


def test_queue_time_starts_when_the_request_reached_the_engine_host(tiny_model_dir):
    """A request that waited in the engine loop's inbox for the step in progress has waited."""
    import time

    llm = LLM(tiny_model_dir, device="cpu", allow_unsigned=True)
    eng = llm.engine
    rid = eng.add_request(
        [5, 6, 7], SamplingParams(max_tokens=2, temperature=0), arrival=time.perf_counter() - 0.25
    )
    done = {}
    while eng.has_unfinished():
        done.update({e.request_id: e for e in eng.step() if e.finish_reason})
    metrics = done[rid].metrics
    assert metrics.queue_ms >= 250 and metrics.ttft_ms >= metrics.queue_ms
