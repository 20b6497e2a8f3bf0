"""The compiled decode step (engine.step.compiled_step) against the eager step, its reference.

- kernels.paged_kv_static writes the same bytes and reads the same values as kernels.paged_kv_flat
  for every KV format, with padding rows and blocks, over steps that fill and seal blocks;
- a compiled engine's greedy tokens are the eager engine's, token for token, on both models, a
  quantized KV cache that stages its partial block, compressed expert weights, across block
  boundaries and with more sequences than rows of the first bucket; logits within 1e-4 (float32:
  inductor fuses and reorders the reductions of norms and attention, so not bit-equal);
- a compile failure leaves the engine serving eagerly and says why.

One bucket per case keeps the compile cost inside the suite's budget; `pytest -m compiled_matrix`
runs every KV format and weight format at three buckets on both models.
"""

from __future__ import annotations

import copy

import pytest
import torch

from engine.kv.batch import SeqSlice, StepBatch
from engine.llm import LLM
from engine.sampling import SamplingParams
from engine.step.compiled_step import CompiledDecode, row_bucket
from kernels import paged_kv_flat, paged_kv_static
from tests.unit.test_paged_kv_flat import GQA, KV_DTYPES, MLA, filled, step_meta
from tests.unit.test_simulator import SHIPPED_KIMI

SHIPPED_GLM = SHIPPED_KIMI.parent / "glm-4.5-mini"
PROMPTS = ["def add(a, b):\n    return", "The capital of France is", "import os\nimport sys\n", "Once upon"]


def _static(cache, meta, rows: int, blocks: int) -> paged_kv_static.StaticDecodeIndex:
    tables = [list(t[: -(-(int(p) + 1) // 16)]) for t, p in zip(meta.tables.tolist(), meta.pos, strict=True)]
    slots = [
        cache.scratch_slot if s is None else int(s)
        for s in (meta.slots if meta.slots is not None else [None] * len(tables))
    ]
    return paged_kv_static.static_index(
        tables,
        [int(p) for p in meta.pos],
        slots,
        rows,
        blocks,
        cache.scratch_block,
        cache.scratch_slot,
        torch.device("cpu"),
    )


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("components", [GQA, MLA], ids=["gqa", "mla"])
def test_static_writes_and_reads_match_the_flat_path_exactly(kv, components):
    seed = torch.seed() % 2**31
    flat, seqs = filled(components, kv, seed)
    static = copy.deepcopy(flat)
    gen = torch.Generator().manual_seed(seed + 1)
    rows = row_bucket(len(seqs) + 1)  # at least one padding row
    for step in range(18):  # every sequence crosses a block boundary; staged blocks get sealed
        meta = step_meta(seqs)
        blocks = meta.tables.shape[1] + 1  # at least one padding block
        index = _static(static, meta, rows, blocks)
        for i, c in enumerate(components):
            x = torch.randn(len(seqs), c.heads, c.dim, generator=gen) * 3
            padded = torch.cat([x, torch.randn(rows - len(seqs), c.heads, c.dim, generator=gen)])
            paged_kv_flat.write(flat.store(0, i), meta.index, x)
            paged_kv_static.write(static.store(0, i), index, padded)
            a, b = flat.store(0, i), static.store(0, i)
            n = flat.scratch_block  # the pool's blocks: the scratch block past them is padding's
            assert torch.equal(a.data[:n].view(torch.uint8), b.data[:n].view(torch.uint8)), (
                f"{kv} {step} {seed}"
            )
            if a.scale is not None:
                assert torch.equal(a.scale[:n], b.scale[:n]), f"{kv} {c.name} step {step} seed {seed}"
            if a.staging is not None:
                k = flat.scratch_slot
                assert torch.equal(a.staging[:k], b.staging[:k]), f"{kv} {c.name} step {step} seed {seed}"
            want = paged_kv_flat.read(a, meta.index)
            got = paged_kv_static.read(b, index)[: len(seqs), : want.shape[1]]
            visible = ~meta.hidden
            assert torch.equal(got[visible], want[visible]), f"{kv} {c.name} step {step} seed {seed}"
        for s in seqs:
            s.length += 1


def _tokens(llm: LLM, prompts: list[str], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [g.token_ids for g in llm.generate(prompts, params)]


def _pair(model, kv: str, weights: str, rows: int):
    eager = LLM(model, device="cpu", kv_cache_dtype=kv, weights=weights, speculative=None, compile=False)
    compiled = LLM(model, device="cpu", kv_cache_dtype=kv, weights=weights, speculative=None, compile=True)
    decode = compiled.engine.compiled_decode
    decode.warm_up([rows])
    assert decode.failed is None and decode.ready == {rows}
    return eager, compiled, decode


CASES = [  # (model, kv, weights, sequences at once): one bucket each
    (SHIPPED_KIMI, "auto", "auto", 1),
    (SHIPPED_KIMI, "int4", "int4", 3),
    (SHIPPED_GLM, "fp8", "auto", 2),
    (SHIPPED_GLM, "int8", "int8", 1),
]
MATRIX = [
    (model, kv, weights, n)
    for model in (SHIPPED_KIMI, SHIPPED_GLM)
    for kv in KV_DTYPES
    for weights in ("auto", "int8", "int4")
    for n in (1, 3, 7)
]


def _same_tokens(model, kv, weights, n):
    eager, compiled, decode = _pair(model, kv, weights, row_bucket(n))
    prompts = PROMPTS[:n] if n <= len(PROMPTS) else [f"{PROMPTS[i % 4]} {i}" for i in range(n)]
    want = _tokens(eager, prompts, 40)  # 40 tokens: every sequence crosses a block boundary
    before = decode.steps
    assert _tokens(compiled, prompts, 40) == want
    assert decode.steps - before >= 30  # the decode steps really ran compiled
    stats = compiled.stats()  # what a PoP's status reports
    assert stats.compiled_steps == decode.steps and stats.compiled_buckets == [row_bucket(n)]
    assert eager.stats().compiled_steps == 0 and eager.stats().compiled_buckets == []


@pytest.mark.parametrize(("model", "kv", "weights", "n"), CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_compiled_greedy_tokens_are_the_eager_tokens(model, kv, weights, n):
    _same_tokens(model, kv, weights, n)


@pytest.mark.compiled_matrix
@pytest.mark.parametrize(("model", "kv", "weights", "n"), MATRIX, ids=lambda v: getattr(v, "name", str(v)))
def test_compiled_matrix(model, kv, weights, n):
    _same_tokens(model, kv, weights, n)


def test_warm_up_beside_serving_and_compiled_logits_within_1e4_of_eager():
    llm = LLM(SHIPPED_KIMI, device="cpu", speculative=None, compile=True)
    assert llm.model.dtype == torch.float32
    decode = llm.engine.compiled_decode
    warming = decode.warm_up_in_background([2])  # writes the scratch block while steps run eagerly
    while_warming = _tokens(llm, PROMPTS[:2], 24)
    warming.join()
    before = decode.steps
    assert _tokens(llm, PROMPTS[:2], 24) == while_warming and decode.steps > before
    engine = llm.engine
    for p in PROMPTS[:2]:
        engine.add_request(llm.tokenizer.encode(p), SamplingParams(temperature=0, max_tokens=8))
    engine.step()  # both prompts prefilled (eagerly: the compiled step only decodes)
    seqs = [seq for group in engine._seqs.values() for seq in group]
    slices = [SeqSlice(seq.kv, i, 1, seq.num_computed) for i, seq in enumerate(seqs)]
    ids = [seq.tokens[seq.num_computed] for seq in seqs]
    with torch.inference_mode():
        compiled = llm.model.logits(decode.decode(ids, slices))
        eager = llm.model.logits(  # the same token written again, then read: the eager reference
            llm.model.forward(
                torch.tensor(ids),
                torch.tensor([s.past for s in slices]),
                StepBatch(slices, torch.device("cpu"), engine.cache.layers),
            )
        )
    assert (compiled - eager).abs().max().item() < 1e-4


def test_a_compile_failure_serves_eagerly_and_says_why(monkeypatch):
    llm = LLM(SHIPPED_KIMI, device="cpu", speculative=None, compile=True)
    decode = llm.engine.compiled_decode

    def broken(*args):
        raise RuntimeError("inductor: no C++ compiler")

    monkeypatch.setattr(decode, "_call", broken)
    decode.warm_up([1])
    assert decode.ready == set() and "no C++ compiler" in decode.failed
    assert not decode.accepts(1)
    assert _tokens(llm, PROMPTS[:1], 8) == _tokens(
        LLM(SHIPPED_KIMI, device="cpu", compile=False), PROMPTS[:1], 8
    )
    assert decode.steps == 0


def test_the_structure_key_tells_apart_what_a_guard_would():
    """Graphs run guard-free (engine.step.graph_key): two loads of one model share a key (and graphs); a
    different model, weight format or KV format gets its own."""

    def key(model, **kw):
        return LLM(model, device="cpu", speculative=None, compile=True, **kw).engine.compiled_decode.key

    kimi = key(SHIPPED_KIMI)
    assert key(SHIPPED_KIMI) == kimi
    assert (
        len(
            {
                kimi,
                key(SHIPPED_GLM),
                key(SHIPPED_KIMI, weights="int4"),
                key(SHIPPED_KIMI, kv_cache_dtype="int8"),
            }
        )
        == 4
    )


def test_buckets_are_bounded():
    assert [row_bucket(n) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert row_bucket(65) is None
    llm = LLM(SHIPPED_KIMI, device="cpu", speculative=None, compile=True)
    assert isinstance(llm.engine.compiled_decode, CompiledDecode)
    assert not llm.engine.compiled_decode.accepts(1)  # nothing compiled until warm_up
    assert LLM(SHIPPED_KIMI, device="cpu", compile=False).engine.compiled_decode is None


def test_a_second_load_of_a_model_reuses_the_first_ones_graphs():
    from torch._dynamo.utils import counters

    first = LLM(SHIPPED_KIMI, device="cpu", speculative=None, compile=True)
    first.engine.compiled_decode.warm_up([1])
    graphs = counters["stats"]["unique_graphs"]
    second = LLM(SHIPPED_KIMI, device="cpu", speculative=None, compile=True)  # another PoP's engine
    second.engine.compiled_decode.warm_up([1])
    assert counters["stats"]["unique_graphs"] == graphs  # its eager parts are numbered alike
    eager = LLM(SHIPPED_KIMI, device="cpu", speculative=None, compile=False)
    assert _tokens(second, PROMPTS[:1], 20) == _tokens(eager, PROMPTS[:1], 20)
    assert second.stats().compiled_steps >= 15  # its own weights and cache, through the shared graph
