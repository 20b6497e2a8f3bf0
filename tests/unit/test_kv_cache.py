"""The paged KV cache: exact byte accounting, round trips within each format's bound, the same
values whether written in chunks, one token at a time or in a batched decode."""

import pytest
import torch

from engine.errors import InvalidRequestError
from engine.kv.batch import SeqSlice, StepBatch
from engine.kv.kv_cache import BLOCK_SIZE, KVComponent, PagedKVCache
from kernels import paged_kv

MLA = [KVComponent("latent", 1, 64, "value"), KVComponent("rope", 1, 32, "key")]
GQA = [KVComponent("k", 2, 64, "key"), KVComponent("v", 2, 64, "value")]

# bytes per token per layer, scales included, for the miniature shapes above
EXPECTED_MLA = {
    "auto": 96 * 4,
    "bf16": 96 * 2,
    "fp8": 96 + (4 + 4) / 16,
    "int8": 96 + 4 + 4,
    "int4": (32 + 2 * 2) + (16 + 32 * 2 / 16),
}
EXPECTED_GQA = {
    "auto": 256 * 4,
    "bf16": 256 * 2,
    "fp8": 256 + (2 * 4 * 2) / 16,
    "int8": 256 + 2 * 4 * 2,
    "int4": (64 + 2 * 64 * 2 / 16) + (64 + 2 * 2 * 2),
}


def cache(components, kv, tokens=512, layers=2, seqs=4):
    block, staging = PagedKVCache.layout_bytes(components, layers, kv, torch.float32)
    blocks = -(-tokens // BLOCK_SIZE) * seqs + (-(-staging // block) if staging else 0) * seqs
    return PagedKVCache(
        components, layers, kv, blocks * block, torch.float32, torch.device("cpu"), max_seqs=seqs
    )


@pytest.mark.parametrize("components, expected", [(MLA, EXPECTED_MLA), (GQA, EXPECTED_GQA)])
def test_bytes_per_token_are_exact(components, expected):
    for kv, want in expected.items():
        c = cache(components, kv)
        assert c.bytes_per_token_per_layer() == pytest.approx(want), kv


def test_smaller_dtypes_admit_proportionally_more():
    budget = 1 << 22
    blocks = {
        kv: PagedKVCache(GQA, 4, kv, budget, torch.float32, torch.device("cpu")).num_blocks
        for kv in ("bf16", "fp8", "int8", "int4")
    }
    assert blocks["int4"] > blocks["int8"] > blocks["bf16"] and blocks["fp8"] > blocks["bf16"]
    assert blocks["int4"] / blocks["bf16"] > 3.3


def fresh(n, comp):
    scale = torch.rand(1, comp.heads, comp.dim) * 4 + 0.1  # channels of very different size (key outliers)
    return (torch.randn(n, comp.heads, comp.dim) * scale).reshape(n, comp.width)


def bound(kv, comp, x):
    """Per-element error bound of format `kv` for tokens x [n, H*D] (the caller's layout)."""
    x = x.reshape(-1, comp.heads, comp.dim)
    if kv in ("auto",):
        return torch.zeros_like(x)
    if kv == "bf16":
        return x.abs() / 256
    if kv == "int8":
        return x.abs().amax(-1, keepdim=True).expand_as(x) / 254
    if kv == "fp8":  # per head per block
        blocks = x.unflatten(0, (-1, BLOCK_SIZE)) if x.shape[0] % BLOCK_SIZE == 0 else None
        amax = blocks.abs().amax(dim=(1, 3), keepdim=True).expand_as(blocks).reshape_as(x)
        return x.abs() / 16 + amax / 448 * 2**-9
    if comp.style == "value":  # int4 per token, groups of 32
        g = x.unflatten(-1, (-1, 32))
        return (g.abs().amax(-1, keepdim=True).expand_as(g) / 14 * 1.002).reshape_as(x)
    blocks = x.unflatten(0, (-1, BLOCK_SIZE))  # int4 keys per channel per block
    return (blocks.abs().amax(1, keepdim=True).expand_as(blocks) / 14 * 1.002).reshape_as(x)


@pytest.mark.parametrize("kv", ["auto", "bf16", "fp8", "int8", "int4"])
@pytest.mark.parametrize("components", [MLA, GQA], ids=["mla", "gqa"])
def test_round_trip_within_bounds_and_independent_of_chunking(kv, components):
    n = 3 * BLOCK_SIZE + 5  # a partial last block: the staged formats keep it in full precision
    xs = [fresh(n, comp) for comp in components]
    c = cache(components, kv)
    whole = c.new_sequence()
    c.pool.grow(whole, n)
    out_whole = c.write(whole, 0, 0, *xs)
    chunked = c.new_sequence()
    c.pool.grow(chunked, n)
    start = 0
    for size in (1, 7, 16, 9, 20, n):  # ragged chunks straddling block boundaries
        size = min(size, n - start)
        if size <= 0:
            break
        out_chunked = c.write(chunked, 0, start, *(x[start : start + size] for x in xs))
        start += size
    for comp, x, a, b in zip(components, xs, out_whole, out_chunked, strict=True):
        assert a.shape == x.shape
        torch.testing.assert_close(a, b, atol=0, rtol=0)  # chunking never changes what is cached
        full = (n // BLOCK_SIZE) * BLOCK_SIZE
        err = (a - x).abs().reshape(n, comp.heads, comp.dim)
        assert (err[:full] <= bound(kv, comp, x[:full]) + 1e-6).all(), (kv, comp.name)
        if kv in ("fp8", "int4") and (kv == "fp8" or comp.style == "key"):
            assert (err[full:] == 0).all()  # the block being filled stays in full precision


@pytest.mark.parametrize("kv", ["auto", "fp8", "int8", "int4"])
@pytest.mark.parametrize("components", [MLA, GQA], ids=["mla", "gqa"])
def test_batched_decode_reads_what_single_sequence_writes_read(kv, components):
    lengths = [1, 15, 16, 17, 40]  # prompt lengths around block boundaries
    c, ref = cache(components, kv, seqs=5), cache(components, kv, seqs=5)
    seqs, refs = [], []
    for n in lengths:
        xs = [fresh(n, comp) for comp in components]
        for cc, bucket in ((c, seqs), (ref, refs)):
            s = cc.new_sequence()
            cc.pool.grow(s, n + 20)
            cc.write(s, 0, 0, *xs)
            s.length = n
            bucket.append(s)
    for _ in range(20):  # 20 decode steps, crossing block boundaries
        new = [fresh(len(lengths), comp) for comp in components]
        meta = StepBatch(
            [SeqSlice(kv, row, 1, kv.length) for row, kv in enumerate(seqs)], torch.device("cpu")
        ).decode
        c.layers[0].decode_write(meta, tuple(new))
        dense = [
            paged_kv.read_sequences_ref(c.store(0, i), meta.tables, meta.lengths, meta.slots).flatten(2)
            for i in range(len(components))
        ]
        for row, (s, r) in enumerate(zip(seqs, refs, strict=True)):
            want = ref.write(r, 0, r.length, *(x[row : row + 1] for x in new))
            for d, w in zip(dense, want, strict=True):
                torch.testing.assert_close(d[row, : int(meta.lengths[row])], w, atol=0, rtol=0)
                assert (
                    meta.hidden[row, : r.length + 1].logical_not().all()
                    and meta.hidden[row, r.length + 1 :].all()
                )
            s.length += 1
            r.length += 1


def test_allocator_grows_releases_and_reserves_staging():
    c = cache(MLA, "int4", tokens=64, seqs=2)
    total = c.free_blocks
    s = c.new_sequence()
    assert c.pool.grow(s, 20)
    assert len(s.block_table) == 2 and c.free_blocks == total - 2 - c.staging_blocks
    assert not c.pool.grow(s, 10_000)  # refused without change
    assert len(s.block_table) == 2
    c.pool.release(s)
    assert c.free_blocks == total and s.block_table == [] and s.slot is None


def test_bad_kv_settings_name_the_parameter():
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype: 'int3' is unknown"):
        PagedKVCache(MLA, 2, "int3", 1 << 20, torch.float32, torch.device("cpu"))
    with pytest.raises(InvalidRequestError, match="kv_cache_bytes"):
        PagedKVCache(MLA, 2, "auto", 100, torch.float32, torch.device("cpu"))
    with pytest.raises(InvalidRequestError, match="divisible by 32"):
        PagedKVCache(
            [KVComponent("k", 1, 48, "value")], 2, "int4", 1 << 20, torch.float32, torch.device("cpu")
        )
