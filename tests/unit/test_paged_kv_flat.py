"""The CPU decode path from flat indices (kernels.paged_kv_flat) against the torch references of
kernels.paged_kv: the same bytes written, the same values read back, attention within 1e-5, for
every KV format and both architectures' components, over steps that cross block boundaries."""

import copy

import pytest
import torch

from engine.kv.batch import SeqSlice, StepBatch
from engine.kv.kv_cache import KVComponent, PagedKVCache
from kernels import paged_kv, paged_kv_flat

GQA = [KVComponent("k", 2, 64, "key"), KVComponent("v", 2, 64, "value")]
MLA = [KVComponent("latent", 1, 64, "value"), KVComponent("rope", 1, 32, "key")]
LENGTHS = (1, 14, 15, 16, 17, 40)  # one token, around a block boundary, several blocks
KV_DTYPES = ["auto", "bf16", "fp8", "int8", "int4"]


def filled(components, kv, seed):
    gen = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(components, 1, kv, 1 << 22, torch.float32, torch.device("cpu"), max_seqs=8)
    seqs = []
    for n in LENGTHS:
        seq = cache.new_sequence()
        cache.pool.grow(seq, n + 24)
        cache.write(seq, 0, 0, *[torch.randn(n, c.width, generator=gen) * 2 for c in components])
        seq.length = n
        seqs.append(seq)
    return cache, seqs


def step_meta(seqs):
    return StepBatch([SeqSlice(s, i, 1, s.length) for i, s in enumerate(seqs)], torch.device("cpu")).decode


def same_store(a: paged_kv.KVStore, b: paged_kv.KVStore) -> bool:
    pairs = [(a.data, b.data), (a.scale, b.scale), (a.staging, b.staging)]
    return all(x is None or torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in pairs)


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("components", [GQA, MLA], ids=["gqa", "mla"])
def test_writes_and_reads_match_the_reference_exactly(kv, components):
    seed = torch.seed() % 2**31
    ref, seqs = filled(components, kv, seed)
    flat = copy.deepcopy(ref)
    gen = torch.Generator().manual_seed(seed + 1)
    for step in range(18):  # every sequence crosses a block boundary at least once
        meta = step_meta(seqs)
        for i, c in enumerate(components):
            x = torch.randn(len(seqs), c.heads, c.dim, generator=gen) * 3
            paged_kv.decode_write_ref(ref.store(0, i), meta.tables, meta.pos, meta.slots, x)
            paged_kv_flat.write(flat.store(0, i), meta.index, x)
            assert same_store(ref.store(0, i), flat.store(0, i)), f"{kv} {c.name} step {step} seed {seed}"
            want = paged_kv.read_sequences_ref(ref.store(0, i), meta.tables, meta.lengths, meta.slots)
            got = paged_kv_flat.read(flat.store(0, i), meta.index)
            visible = ~meta.hidden
            assert torch.equal(got[visible], want[visible]), f"{kv} {c.name} step {step} seed {seed}"
        for s in seqs:
            s.length += 1


@pytest.mark.parametrize("kv", KV_DTYPES)
def test_gqa_attention_matches_the_reference(kv):
    seed = torch.seed() % 2**31
    cache, seqs = filled(GQA, kv, seed)
    meta = step_meta(seqs)
    q = torch.randn(len(seqs), 4, 64, generator=torch.Generator().manual_seed(seed))
    k, v = cache.store(0, 0), cache.store(0, 1)
    want = paged_kv.gqa_decode_ref(q, k, v, meta.tables, meta.lengths, meta.slots, 0.125)
    got = paged_kv_flat.gqa_decode(q, k, v, meta.index, 0.125)
    # float32 rounding relative to the outputs' size (they reach |7| or so): a wrong op is off by O(1)
    assert (got - want).abs().max().item() < 1e-5 * max(1.0, want.abs().max().item()), f"seed {seed}"


@pytest.mark.parametrize("kv", KV_DTYPES)
def test_mla_attention_matches_the_reference(kv):
    seed = torch.seed() % 2**31
    cache, seqs = filled(MLA, kv, seed)
    meta = step_meta(seqs)
    gen = torch.Generator().manual_seed(seed)
    q_lat, q_rot = torch.randn(len(seqs), 4, 64, generator=gen), torch.randn(len(seqs), 4, 32, generator=gen)
    lat, rope = cache.store(0, 0), cache.store(0, 1)
    want = paged_kv.mla_decode_ref(q_lat, q_rot, lat, rope, meta.tables, meta.lengths, meta.slots, 0.13)
    got = paged_kv_flat.mla_decode(q_lat, q_rot, lat, rope, meta.index, 0.13)
    # float32 rounding relative to the outputs' size (they reach |7| or so): a wrong op is off by O(1)
    assert (got - want).abs().max().item() < 1e-5 * max(1.0, want.abs().max().item()), f"seed {seed}"


def test_the_index_is_one_set_of_tensors_per_step():
    cache, seqs = filled(GQA, "int4", 0)
    meta = step_meta(seqs)
    index = meta.index
    assert index.tables.shape == (len(seqs), 3) and index.blocks.shape == (len(seqs) * 3,)
    assert index.lengths.tolist() == [n + 1 for n in LENGTHS]
    # 15 fills its block this step: it alone is quantized, the others read their tail from staging
    assert index.full_slots.tolist() == [seqs[2].slot]
    assert len(index.tail_blocks) == len(seqs) - 1
    assert torch.equal(index.mask[:, 0] != 0, meta.hidden)
