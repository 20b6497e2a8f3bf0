"""RMSNorm: y = weight * (x / sqrt(mean(x^2) + eps)), normalised in float32.

The torch reference rounds the normalised value to the input dtype before the weight multiply,
exactly as the HF DeepSeek-V3 / GLM-4.5 modules do, so parity holds in half precision too.
"""

from __future__ import annotations

import torch

from kernels.dispatch import KernelShapeError


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    if dtype == torch.float32:  # no rounding step exists: five ops (torch's fused CPU op is slower here)
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


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
