"""Preemption for a tenant's share on the live engine: the heavy tenant's sequence preempted for a
light one is recomputed later, or paused with its KV blocks kept and resumed where it stopped, and
its greedy output is token for token the one it gives when nobody preempts it; nothing is lost or
failed, and every block comes back."""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(29)
    return [[rng.randrange(10, 4000) for _ in range(rng.randrange(20, 60))] for _ in range(5)]


def drive(llm, adds):
    """`adds`: {step: [(request_id, prompt, max_tokens, tenant)]}; every request's tokens and ends."""
    out: dict[str, list[int]] = {}
    ends: dict[str, str] = {}
    s = 0
    while adds or llm.engine.has_unfinished():
        for rid, prompt, n, tenant in adds.pop(s, []):
            params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
            llm.engine.add_request(prompt, params, request_id=rid, tenant=tenant)
            out[rid] = []
        for e in llm.engine.step():
            if e.token_id is not None:
                out[e.request_id].append(e.token_id)
            if e.finish_reason:
                ends[e.request_id] = e.finish_reason
        s += 1
    return out, ends


@pytest.mark.parametrize(
    "preemption, kv", [("recompute", "auto"), ("pause", "auto"), ("pause", "int4"), ("recompute", "int4")]
)
def test_a_preempted_request_gives_the_same_greedy_tokens(tiny_model_dir, prompts, preemption, kv):
    heavy = [(f"h{i}", prompts[i], 40, "heavy") for i in range(3)]
    light = [(f"l{i}", prompts[3 + i], 12, "light") for i in range(2)]

    alone = LLM(tiny_model_dir, device="cpu", allow_unsigned=True, max_num_seqs=4, kv_cache_dtype=kv)
    want = {}
    for rid, prompt, n, tenant in heavy + light:  # each request by itself: nobody preempts it
        got, ends = drive(alone, {0: [(rid, prompt, n, tenant)]})
        assert ends[rid] == "length"
        want[rid] = got[rid]

    llm = LLM(
        tiny_model_dir,
        device="cpu",
        allow_unsigned=True,
        max_num_seqs=3,
        kv_cache_dtype=kv,
        preemption=preemption,
    )
    kinds: list[str] = []
    preempted: list[str] = []

    def hear(kind, seq):
        kinds.append(kind)
        if kind in ("preempt", "pause"):
            preempted.append(seq.request_id)

    llm.engine.scheduler.on_event = hear
    # the heavy tenant holds all three seats; the light one arrives while they decode
    got, ends = drive(llm, {0: heavy, 8: light})
    assert preempted, "the light tenant was meant to take seats back"
    assert set(preempted) <= {"h0", "h1", "h2"}
    assert llm.engine.scheduler.tenant_preemptions == {"heavy": len(preempted)}
    assert ends == {rid: "length" for rid in want}  # nobody lost or failed
    assert got == want  # token for token, the preempted ones too
    assert llm.engine.cache.used_blocks == 0
    if preemption == "pause":  # kept, not recomputed: resumed where they stopped
        assert "preempt" not in kinds and kinds.count("pause") == kinds.count("resume") == len(preempted)
        assert llm.engine.scheduler.pauses == len(preempted)
    else:
        assert "pause" not in kinds
