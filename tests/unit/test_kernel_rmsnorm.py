"""RMSNorm: the Triton kernel (interpreted on CPU) and the CPU path (torch's rms_norm) against the
torch reference, fresh inputs each run.

Tolerance: 1e-5 absolute in float32 (the CPU path: 1e-6); one bf16 ulp-scale (2e-2) in bfloat16.
"""

import pytest
import torch

import kernels
from kernels.rmsnorm import rms_norm_cpu, rms_norm_ref, rms_norm_triton


@pytest.mark.parametrize("rows, cols", [(1, 32), (5, 96), (3, 256)])
def test_triton_matches_reference_float32(rows, cols):
    x = torch.randn(rows, cols) * 3
    w = torch.randn(cols)
    got = rms_norm_triton(x, w, 1e-6)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, rms_norm_ref(x, w, 1e-6), atol=1e-5, rtol=1e-5)


def test_triton_matches_reference_bfloat16_and_3d():
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    w = torch.randn(64).to(torch.bfloat16)
    got = rms_norm_triton(x, w, 1e-6)
    assert got.shape == x.shape and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), rms_norm_ref(x, w, 1e-6).float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("shape", [(1, 256), (32, 256), (7, 4, 64), (64,)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_cpu_path_matches_reference_float32(shape, eps):
    x, w = torch.randn(*shape) * 4, torch.randn(shape[-1])
    got = rms_norm_cpu(x, w, eps)
    assert got.shape == x.shape and got.dtype == torch.float32
    assert (got - rms_norm_ref(x, w, eps)).abs().max().item() < 1e-6


def test_cpu_path_keeps_the_reference_rounding_in_half_precision():
    x, w = torch.randn(3, 64).to(torch.bfloat16), torch.randn(64).to(torch.bfloat16)
    assert torch.equal(rms_norm_cpu(x, w, 1e-6), rms_norm_ref(x, w, 1e-6))


def test_dispatch_follows_the_environment(monkeypatch):
    x, w = torch.randn(2, 32), torch.ones(32)
    monkeypatch.setenv("EDGE_KERNELS", "triton")
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), atol=1e-5, rtol=1e-5)
    monkeypatch.setenv("EDGE_KERNELS", "bogus")
    with pytest.raises(ValueError, match="EDGE_KERNELS='bogus'"):
        kernels.rms_norm(x, w, 1e-6)


def test_unsupported_shape_raises_with_the_shape():
    with pytest.raises(kernels.KernelShapeError, match=r"\(2, 32\)"):
        rms_norm_triton(torch.randn(2, 32), torch.ones(16), 1e-6)
