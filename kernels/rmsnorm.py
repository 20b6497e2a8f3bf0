"""RMSNorm: y = weight * (x / sqrt(mean(x^2) + eps)), normalised in float32.

The torch reference rounds the normalised value to the input dtype before the weight multiply,
exactly as the HF DeepSeek-V3 / GLM-4.5 modules do, so parity holds in half precision too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.dispatch import KernelShapeError


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    if dtype == torch.float32:  # no rounding step exists
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The CPU path: torch's rms_norm, one call from Python (its CPU kernel is composite, but its
    ops run without a Python frame each). Half precision keeps the reference's rounding step."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        return rms_norm_ref(x, weight, eps)
    return F.rms_norm(x, weight.shape, weight, eps)


_MAX_COLS = 1 << 16


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    import triton

    from kernels._triton_rmsnorm import rms_norm_kernel

    cols = x.shape[-1]
    if cols > _MAX_COLS or weight.shape != (cols,):
        raise KernelShapeError(
            f"rms_norm: x {tuple(x.shape)} with weight {tuple(weight.shape)} not supported"
        )
    x2 = x.reshape(-1, cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(cols)
        rms_norm_kernel[(x2.shape[0],)](x2, weight, out, x2.stride(0), out.stride(0), cols, eps, BLOCK=block)
    return out.reshape(*x.shape[:-1], cols)
