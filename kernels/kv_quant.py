"""KV-cache quantization formats: torch references for writing and reading cached keys/values.

Shapes use the paged layout: a block holds BLOCK tokens, each with `heads` x `dim` values.

- fp8  (e4m3): one float32 scale per head per block, computed from the block's data when it is full.
- int8: symmetric, one float32 scale per token per head.
- int4 (KIVI-style, symmetric): key-like parts per channel (one fp16 scale per channel per block,
  over its 16 tokens); value-like parts per token in groups of 32 channels (one fp16 scale each).
  Two values per byte, low nibble first, offset 8 (kernels.packing).

Formats that need a whole block (fp8, int4 keys) keep the block being filled in full precision
until it is complete; the cache does that, these functions only convert.
"""

from __future__ import annotations

import torch

from kernels.packing import dequantize_int4_groups, pack_int4, quantize_int4_groups, unpack_int4

FP8_MAX = 448.0
GROUP = 32
_TINY = 1e-8


def fp8_quantize_block(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., T, H, D] -> (fp8 [..., T, H, D], scale [..., H]) with one scale per head over the block."""
    scale = x.abs().amax(dim=(-3, -1)).to(torch.float32).clamp(min=_TINY) / FP8_MAX
    q = (x.to(torch.float32) / scale[..., None, :, None]).to(torch.float8_e4m3fn)
    return q, scale


def fp8_dequantize_block(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.to(torch.float32) * scale[..., None, :, None]).to(dtype)


def int8_quantize_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., H, D] -> (int8 [..., H, D], scale [..., H]) with one scale per token per head."""
    scale = x.abs().amax(dim=-1).to(torch.float32).clamp(min=_TINY) / 127.0
    q = torch.round(x.to(torch.float32) / scale[..., None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def int8_dequantize_token(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.to(torch.float32) * scale[..., None]).to(dtype)


def int4_quantize_channel(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Key-like: x [..., T, H, D] -> (packed [..., T, H, D/2], fp16 scale [..., H, D]) per channel over T."""
    scale = (x.abs().amax(dim=-3).to(torch.float32).clamp(min=_TINY) / 7.0).to(torch.float16)
    q = torch.round(x.to(torch.float32) / scale.to(torch.float32)[..., None, :, :]).clamp(-8, 7)
    return pack_int4(q), scale


def int4_dequantize_channel(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (unpack_int4(packed) * scale.to(torch.float32)[..., None, :, :]).to(dtype)


def int4_quantize_group(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Value-like: x [..., H, D] -> (packed [..., H, D/2], fp16 scale [..., H, D/32]), per token in 32s."""
    d = x.shape[-1]
    if d % GROUP:
        raise ValueError(f"int4 KV needs a head dimension divisible by {GROUP}, got {d}")
    return quantize_int4_groups(x, GROUP, torch.float16, _TINY)


def int4_dequantize_group(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return dequantize_int4_groups(packed, scale, GROUP, dtype)
