"""kernels.formats: each entry agrees with what its quantize produces, and every layer reads it."""

import pytest
import torch

from edge_sim.roofline import matrix_bytes
from engine.kv.kv_cache import KVComponent, PagedKVCache
from engine.load.checkpoint import format_nbytes
from kernels import formats, paged_kv_triton
from kernels.dequant_matmul import _FORMATS
from kernels.formats import KV, WEIGHT
from kernels.paged_kv import BLOCK

SHAPES = [(64, 96), (130, 256), (256, 160), (3, 200, 128)]  # fp8 padding, odd rows, a stack


@pytest.mark.parametrize("name", formats.COMPRESSED_WEIGHT_FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_weight_entry_matches_what_quantize_produces(name, shape):
    spec = WEIGHT[name]
    w = torch.randn(shape) * torch.rand(()) * 4  # fresh random data, fresh range each run
    qw = spec.quantize(w, name)
    assert qw.format == name and qw.data.dtype == spec.storage and qw.scale.dtype == spec.scale_dtype
    assert tuple(qw.data.shape) == spec.data_shape(shape)
    assert tuple(qw.scale.shape) == spec.full_scale_shape(shape)
    assert qw.nbytes() == spec.nbytes(shape)
    assert qw.data.numel() * qw.data.element_size() == spec.bytes_per_element * w.numel()
    assert spec.scale_bytes == qw.scale.element_size()
    back = spec.dequantize(qw, torch.float32)
    assert back.shape == w.shape and torch.allclose(back, w, atol=float(w.abs().max()) / 6)


def test_dense_weight_entry():
    bf16 = WEIGHT["bf16"]
    assert not bf16.compressed and bf16.bytes_per_element == 2 and bf16.nbytes((48, 64)) == 48 * 64 * 2


@pytest.mark.parametrize("name", formats.WEIGHT_FORMATS)
@pytest.mark.parametrize("rows,cols", [(7168, 2048), (2048, 7168), (576, 7168), (130, 256)])
def test_planner_bytes_equal_checkpoint_bytes(name, rows, cols):
    assert (
        matrix_bytes(name, cols, rows)
        == format_nbytes(name, (rows, cols))
        == WEIGHT[name].nbytes((rows, cols))
    )


def test_triton_codes_are_unique_and_shared_by_both_kernel_families():
    weight_codes = {n: f.triton_code for n, f in WEIGHT.items() if f.compressed}
    assert len(set(weight_codes.values())) == len(weight_codes)
    assert formats.FMT_DENSE not in weight_codes.values()
    assert _FORMATS == weight_codes  # the dequantizing matmul and the fused MoE
    for name, f in KV.items():
        assert paged_kv_triton.FMT[name] == f.triton_code  # the paged-KV kernels
        if name in weight_codes:  # one coding: a format has the same code in both families
            assert f.triton_code == weight_codes[name]
        if f.storage is None or f.scale_dtype is None:
            assert f.triton_code == formats.FMT_DENSE
    quantized = [f.triton_code for f in KV.values() if f.scale_dtype is not None]
    assert len(set(quantized)) == len(quantized)


def test_old_names_are_aliases_of_the_table():
    from edge_sim import roofline
    from engine.kv import kv_cache
    from kernels import quant

    assert quant.WEIGHT_FORMATS == roofline.WEIGHT_FORMATS == tuple(WEIGHT)
    assert kv_cache.KV_CACHE_DTYPES == roofline.KV_DTYPES == tuple(KV)


@pytest.mark.parametrize("name", [n for n, f in KV.items() if f.scale_dtype is not None])
@pytest.mark.parametrize("style", ["key", "value"])
@pytest.mark.parametrize("heads,dim", [(1, 64), (2, 32), (4, 128)])
def test_kv_entry_matches_what_quantize_produces(name, style, heads, dim):
    spec, layout = KV[name], KV[name].layout(style)
    blocks = 3
    if layout.staged:
        x = torch.randn(blocks, BLOCK, heads, dim) * torch.rand(()) * 4
        q, s = layout.quantize(x)
        assert tuple(s.shape) == spec.scale_shape(style, blocks, heads, dim)
    else:  # token by token: [n, H, D] -> scale [n, ...]; the store holds [blocks, BLOCK, ...]
        x = torch.randn(blocks * BLOCK, heads, dim) * torch.rand(()) * 4
        q, s = layout.quantize(x)
        q, s = q.reshape(blocks, BLOCK, *q.shape[1:]), s.reshape(blocks, BLOCK, *s.shape[1:])
        assert tuple(s.shape) == spec.scale_shape(style, blocks, heads, dim)
    assert q.dtype == spec.storage and s.dtype == spec.scale_dtype
    assert tuple(q.shape) == spec.data_shape(blocks, heads, dim)
    assert q[0].numel() * q.element_size() == spec.bytes_per_element(torch.bfloat16) * BLOCK * heads * dim
    back = layout.dequantize(q, s, torch.float32)
    assert torch.allclose(back.reshape(x.shape), x, atol=float(x.abs().max()) / 6)


@pytest.mark.parametrize("kv", formats.KV_DTYPES)
@pytest.mark.parametrize("dense", [torch.float32, torch.bfloat16])
def test_kv_cache_allocates_the_tables_block_bytes(kv, dense):
    comps = [KVComponent("latent", 1, 64, "value"), KVComponent("rope", 1, 32, "key")]
    block, staging = PagedKVCache.layout_bytes(comps, 2, kv, dense)
    assert block == 2 * sum(KV[kv].block_bytes(c.style, c.heads, c.dim, dense) for c in comps)
    staged = [c for c in comps if KV[kv].layout(c.style).staged]
    assert staging == 2 * sum(BLOCK * c.width * dense.itemsize for c in staged)
