"""int4 codes shared by weights (kernels.weight_quant) and the KV cache (kernels.kv_quant): two
values per byte, low nibble first, offset 8 (the Triton kernels pack the same way, in
kernels._triton_codecs), and symmetric quantization with one scale per group of values."""

from __future__ import annotations

import torch


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Integers in [-8, 7] along the last dim (even length) -> uint8, half as long."""
    q = q.to(torch.int16) + 8
    return (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 -> float32 integers in [-8, 7], twice as long along the last dim."""
    low = (packed & 0x0F).to(torch.int16) - 8
    high = (packed >> 4).to(torch.int16) - 8
    return torch.stack([low, high], dim=-1).flatten(-2).to(torch.float32)


def quantize_int4_groups(
    x: torch.Tensor, group: int, scale_dtype: torch.dtype, tiny: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int4 with one scale per `group` consecutive values along the last dim:
    x [..., n] -> (packed [..., n/2], scale [..., n/group] in `scale_dtype`, amax/7 at least tiny/7)."""
    groups = x.to(torch.float32).unflatten(-1, (x.shape[-1] // group, group))
    scale = (groups.abs().amax(dim=-1).clamp(min=tiny) / 7.0).to(scale_dtype)
    q = torch.round(groups / scale.to(torch.float32)[..., None]).clamp(-8, 7).flatten(-2)
    return pack_int4(q), scale


def dequantize_int4_groups(
    packed: torch.Tensor, scale: torch.Tensor, group: int, dtype: torch.dtype
) -> torch.Tensor:
    q = unpack_int4(packed)
    groups = q.unflatten(-1, (q.shape[-1] // group, group)) * scale.to(torch.float32)[..., None]
    return groups.flatten(-2).to(dtype)
