"""Weight formats: round trips within their stated bounds on fresh random data, exact byte counts."""

import pytest
import torch

from kernels.quant import INT4_GROUP, QuantizationError, dequantize, linear_ref, quantize


def fresh(*shape):
    # heavy-tailed, varied-scale rows: the case scales exist for
    return torch.randn(*shape) * torch.rand(*shape[:-1], 1) * 3 + torch.randn(*shape) ** 3 * 0.05


@pytest.mark.parametrize("shape", [(64, 96), (3, 200, 130), (1, 32)])
def test_int8_per_channel_bound(shape):
    w = fresh(*shape)
    q = quantize(w, "int8")
    assert q.data.dtype == torch.int8 and q.scale.shape == shape[:-1]
    err = (dequantize(q) - w).abs()
    # half a step of the row's scale, plus float32 rounding of q * scale (a few ulps of the row's
    # largest value: an absolute 1e-7 failed about 1 run in 5 on rows near 8)
    amax = w.abs().amax(-1, keepdim=True)
    assert (err <= amax / 254 + amax * 4 * torch.finfo(torch.float32).eps).all()


@pytest.mark.parametrize("shape", [(64, 96), (2, 40, 256)])
def test_int4_group_bound_and_packing(shape):
    w = fresh(*shape)
    q = quantize(w, "int4")
    assert q.data.dtype == torch.uint8 and q.data.shape == (*shape[:-1], shape[-1] // 2)
    assert q.scale.shape == (*shape[:-1], shape[-1] // INT4_GROUP) and q.scale.dtype == torch.bfloat16
    groups = w.unflatten(-1, (-1, INT4_GROUP))
    bound = groups.abs().amax(-1, keepdim=True) / 14 * (1 + 2**-8)
    err = (dequantize(q) - w).unflatten(-1, (-1, INT4_GROUP)).abs()
    assert (err <= bound + 1e-7).all()
    # bytes: half a byte per weight plus a bf16 scale per 32 -> 0.28x of bf16
    assert q.nbytes() / (w.numel() * 2) == pytest.approx(0.28125)


def test_int4_refuses_a_dimension_the_group_does_not_divide():
    with pytest.raises(
        QuantizationError, match="experts.0.up_proj.weight: input dimension 40 is not a multiple"
    ):
        quantize(torch.randn(8, 40), "int4", name="experts.0.up_proj.weight")


@pytest.mark.parametrize("shape", [(256, 384), (130, 200), (2, 129, 64)])
def test_fp8_block_bound_and_scale_layout(shape):
    w = fresh(*shape)
    q = quantize(w, "fp8")
    rows, cols = shape[-2:]
    assert q.data.dtype == torch.float8_e4m3fn and q.data.shape == shape
    assert q.scale.shape == (*shape[:-2], -(-rows // 128), -(-cols // 128)) and q.scale.dtype == torch.float32
    deq = dequantize(q)
    block_amax = (
        q.scale.repeat_interleave(128, -2)[..., :rows, :].repeat_interleave(128, -1)[..., :cols] * 448
    )
    bound = w.abs() / 16 + block_amax / 448 * 2**-9
    assert ((deq - w).abs() <= bound + 1e-7).all()


def test_fp8_scale_comes_from_the_data_not_a_constant():
    w = torch.randn(128, 128) * 1e-3
    q = quantize(w, "fp8")
    assert q.scale.item() == pytest.approx(w.abs().max().item() / 448, rel=1e-6)
    # with a fixed scale of 1.0 these would fall among fp8 subnormals and lose ~30% of their size
    assert (dequantize(q) - w).abs().max() / w.abs().max() < 1 / 16


@pytest.mark.parametrize("fmt, tol", [("int8", 0.02), ("int4", 0.25), ("fp8", 0.1)])
def test_dequantizing_matmul_matches_dense_within_format_error(fmt, tol):
    w, x = fresh(48, 64), torch.randn(5, 64)
    q = quantize(w, fmt)
    got = linear_ref(x, q)
    assert torch.allclose(got, x @ dequantize(q).T, atol=1e-5)
    rel = (got - x @ w.T).norm() / (x @ w.T).norm()
    assert rel < tol, rel


def test_stacked_experts_index_per_expert():
    w = fresh(4, 16, 64)
    q = quantize(w, "int4")
    torch.testing.assert_close(q[2].dequantize(), dequantize(q)[2])
