"""RMSNorm: the Triton kernel (interpreted on CPU) against the torch reference, fresh inputs each run.

Tolerance: 1e-5 absolute in float32; one bf16 ulp-scale (2e-2) in bfloat16.
"""

import pytest
import torch

import kernels
from kernels.rmsnorm import rms_norm_ref, rms_norm_triton


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
