"""The CPU kernels of compressed weights (kernels.cpu_qlinear) against the reference
(dequantize, then multiply in float64) on fresh random inputs, on both of their paths (AVX2 + FMA
where the CPU has it, and the portable one), at shapes off every vector and tile width.

Tolerance: a float32 dot product of length K is within gamma_K = K * 2^-24 (times a small constant)
of the exact one, relative to sum |x_i w_i| (Higham's bound); the test allows 2 K 2^-24 of it."""

import pytest
import torch

import kernels
from kernels import cpu_qlinear
from kernels.quant import dequantize, quantize

pytestmark = pytest.mark.skipif(not cpu_qlinear.available(), reason=f"not built: {cpu_qlinear.problem()}")


def _check(fmt: str, m: int, k: int, n: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen) * 3
    x = torch.randn(m, k, generator=gen)
    qw = quantize(w, fmt)
    dense = dequantize(qw, torch.float64)
    exact = x.double() @ dense.T
    bound = 2 * k * 2.0**-24 * (x.double().abs() @ dense.abs().T) + 1e-30
    got = cpu_qlinear.qlinear(x, qw)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    assert ((got.double() - exact).abs() <= bound).all(), (got.double() - exact).abs().max()


SHAPES = [(1, 256, 512), (2, 96, 7), (5, 512, 1001), (33, 64, 130), (1, 4096, 64)]


@pytest.mark.parametrize("scalar", [False, True], ids=["native", "portable"])
@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_matches_the_dequantized_product(fmt, m, k, n, scalar):
    cpu_qlinear.force_scalar(scalar)
    try:
        _check(fmt, m, k, n, seed=hash((fmt, m, k, n, scalar)) % 2**31)
    finally:
        cpu_qlinear.force_scalar(False)


def test_an_int8_width_off_the_vector_width_is_served_too():
    _check("int8", 3, 77, 9, seed=1)  # K not a multiple of 8: the portable loops take it
    _check("int8", 1, 40, 5, seed=2)  # one row, K not a multiple of 16: the dot's scalar tail


def test_kernels_linear_uses_it_on_the_cpu_keeping_dtype_leading_dims_and_bias(monkeypatch):
    qw = quantize(torch.randn(48, 64), "int4")
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    bias = torch.randn(48)

    def no_reference(*args, **kwargs):
        raise AssertionError("the dense reference ran")

    monkeypatch.setattr(kernels, "linear_ref", no_reference)
    y = kernels.linear(x, qw, bias)
    assert y.shape == (2, 3, 48) and y.dtype == torch.bfloat16
    want = x.float() @ dequantize(qw).T + bias
    torch.testing.assert_close(y.float(), want, rtol=1e-2, atol=1e-2)  # bf16 output rounding


def test_fp8_and_gpu_shapes_keep_the_reference():
    assert not cpu_qlinear.supports(torch.randn(1, 64), quantize(torch.randn(8, 64), "fp8"))
    stacked = quantize(torch.randn(2, 8, 64), "int4")  # [E, out, in]: one expert at a time
    assert not cpu_qlinear.supports(torch.randn(1, 64), stacked)
    assert cpu_qlinear.supports(torch.randn(1, 64), stacked[1])


def test_stored_tensors_off_their_shape_never_reach_the_c_code():
    """The C code trusts its sizes: a weight whose bytes or scales are not what its shape says (a
    malformed checkpoint) is refused by qlinear and left to the reference by kernels.linear."""
    from kernels.formats import QuantizedWeight

    good = quantize(torch.randn(16, 64), "int4")
    short = QuantizedWeight("int4", good.data[:, :16], good.scale, good.shape)
    wrong_scale = QuantizedWeight("int4", good.data, good.scale.float(), good.shape)
    x = torch.randn(1, 64)
    for bad in (short, wrong_scale):
        assert not cpu_qlinear.supports(x, bad)
        with pytest.raises(ValueError, match="does not take"):
            cpu_qlinear.qlinear(x, bad)
    assert not cpu_qlinear.supports(torch.randn(1, 32), good)  # x's width is not W's
