"""Every Triton kernel against its torch reference under TRITON_INTERPRET=1, on fresh random inputs.

Outputs are poisoned (NaN) before launch by the launchers, so an element a kernel never writes
fails the comparison. Tolerances: float32 paths 1e-5 relative to the output's scale (the kernels
accumulate in float32 in another order); KV writes must be exact (the same rounding rules).
"""

import copy

import pytest
import torch

from engine.kv.batch import SeqSlice, StepBatch
from engine.kv.kv_cache import KVComponent, PagedKVCache
from kernels import paged_kv
from kernels.dequant_matmul import dequant_matmul_ref, dequant_matmul_triton
from kernels.dispatch import KernelShapeError
from kernels.moe import fused_moe_ref, fused_moe_triton
from kernels.paged_kv_triton import decode_write_triton, gqa_decode_triton, mla_decode_triton
from kernels.quant import quantize

pytest.importorskip("triton")
SEED = torch.seed()


def close(got, want, rtol=1e-5):
    assert torch.isfinite(got).all(), f"unwritten or non-finite output (seed {SEED})"
    scale = want.abs().max().clamp(min=1e-6)
    assert ((got.float() - want.float()).abs().max() / scale) < rtol, f"seed {SEED}"


# --- dequantizing matmul ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
@pytest.mark.parametrize(
    "m, n, k, split", [(1, 130, 256, 4), (3, 40, 64, 1), (17, 64, 160, 2), (1, 8, 32, None)]
)
def test_dequant_matmul(fmt, m, n, k, split):
    if fmt == "int4" and k % 32:
        pytest.skip("int4 groups of 32")
    x, w = torch.randn(m, k), quantize(torch.randn(n, k), fmt)
    close(dequant_matmul_triton(x, w, split_k=split), dequant_matmul_ref(x, w))


def test_dequant_matmul_half_precision_activations_and_bias():
    x, w, b = torch.randn(5, 128).to(torch.bfloat16), quantize(torch.randn(48, 128), "int4"), torch.randn(48)
    got = dequant_matmul_triton(x, w, b)
    assert got.dtype == torch.bfloat16
    close(got, dequant_matmul_ref(x.float(), w, b), rtol=2e-2)  # bf16 output rounding


def test_dequant_matmul_refuses_shapes_it_cannot_take():
    with pytest.raises(KernelShapeError, match=r"\(2, 40\)"):
        dequant_matmul_triton(torch.randn(2, 40), quantize(torch.randn(8, 32), "int8"))


# --- KV write and paged decode attention ----------------------------------------------------------------

GQA = [KVComponent("k", 2, 32, "key"), KVComponent("v", 2, 32, "value")]
MLA = [KVComponent("latent", 1, 64, "value"), KVComponent("rope", 1, 32, "key")]
LENGTHS = (1, 15, 16, 17, 40)  # a single token, a block minus one, one block, ragged, several blocks


def filled_cache(components, kv):
    cache = PagedKVCache(components, 1, kv, 1 << 22, torch.float32, torch.device("cpu"), max_seqs=8)
    seqs = []
    for n in LENGTHS:
        seq = cache.new_sequence()
        cache.pool.grow(seq, n + 20)
        scale = torch.rand(1, 1) * 3 + 0.1
        cache.write(seq, 0, 0, *[torch.randn(n, c.width) * scale for c in components])
        seq.length = n
        seqs.append(seq)
    meta = StepBatch([SeqSlice(s, i, 1, s.length) for i, s in enumerate(seqs)], torch.device("cpu")).decode
    return cache, seqs, meta


@pytest.mark.parametrize("kv", ["auto", "fp8", "int8", "int4"])
@pytest.mark.parametrize("components", [GQA, MLA], ids=["gqa", "mla"])
def test_decode_write_matches_the_reference_exactly(kv, components):
    cache, seqs, meta = filled_cache(components, kv)
    other = copy.deepcopy(cache)
    for step in range(2):  # the second step crosses the block boundary for the 15-token sequence
        new = [torch.randn(len(seqs), c.heads, c.dim) * 2 for c in components]
        for i in range(len(components)):
            paged_kv.decode_write_ref(cache.store(0, i), meta.tables, meta.pos, meta.slots, new[i])
            decode_write_triton(other.store(0, i), meta.tables, meta.pos, meta.slots, new[i])
            want = paged_kv.read_sequences_ref(cache.store(0, i), meta.tables, meta.lengths, meta.slots)
            got = paged_kv.read_sequences_ref(other.store(0, i), meta.tables, meta.lengths, meta.slots)
            visible = ~meta.hidden
            assert torch.equal(got[visible], want[visible]), (
                f"{kv} {components[i].name} step {step} seed {SEED}"
            )
        for s in seqs:
            s.length += 1
        meta = StepBatch(
            [SeqSlice(s, i, 1, s.length) for i, s in enumerate(seqs)], torch.device("cpu")
        ).decode


@pytest.mark.parametrize("kv", ["auto", "fp8", "int8", "int4"])
@pytest.mark.parametrize("splits", [1, 2])
def test_gqa_decode_attention(kv, splits):
    cache, seqs, meta = filled_cache(GQA, kv)
    q = torch.randn(len(seqs), 4, 32)
    args = (cache.store(0, 0), cache.store(0, 1), meta.tables, meta.lengths, meta.slots, 0.17)
    close(gqa_decode_triton(q, *args, splits=splits), paged_kv.gqa_decode_ref(q, *args))


@pytest.mark.parametrize("kv", ["auto", "fp8", "int8", "int4"])
@pytest.mark.parametrize("splits", [1, 3])
def test_mla_decode_attention(kv, splits):
    cache, seqs, meta = filled_cache(MLA, kv)
    q_lat, q_rot = torch.randn(len(seqs), 4, 64), torch.randn(len(seqs), 4, 32)
    args = (cache.store(0, 0), cache.store(0, 1), meta.tables, meta.lengths, meta.slots, 0.13)
    close(mla_decode_triton(q_lat, q_rot, *args, splits=splits), paged_kv.mla_decode_ref(q_lat, q_rot, *args))


# --- fused MoE ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["dense", "int8", "int4", "fp8"])
@pytest.mark.parametrize("tokens, skew", [(1, False), (6, False), (9, True)])
def test_fused_moe(fmt, tokens, skew):
    e, h, i, k = 8, 64, 32, 2
    x = torch.randn(tokens, h)
    ids = torch.stack([torch.randperm(e)[:k] for _ in range(tokens)])
    if skew:
        ids[:, 0] = 5  # one expert takes every token; with one token most experts have none
    weights = torch.rand(tokens, k)
    g, u, d = torch.randn(e, i, h), torch.randn(e, i, h), torch.randn(e, h, i)
    if fmt != "dense":
        g, u, d = quantize(g, fmt), quantize(u, fmt), quantize(d, fmt)
    close(fused_moe_triton(x, weights, ids, g, u, d), fused_moe_ref(x, weights, ids, g, u, d))


def test_gpu_check_script_runs_end_to_end_as_a_dry_run(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu" / "check.py"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "OUT": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    import json

    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (
        report["dry_run"] and all(c["ok"] for c in report["correctness"]) and len(report["correctness"]) == 9
    )
