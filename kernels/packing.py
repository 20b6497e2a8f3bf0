"""Two int4 values per byte, low nibble first, offset 8: the one packing of int4 weights
(kernels.weight_quant) and of the int4 KV cache (kernels.kv_quant); the Triton kernels unpack
the same way (kernels._triton_codecs)."""

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
