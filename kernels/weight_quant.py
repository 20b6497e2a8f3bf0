"""Weight compression formats: torch references for compressing and expanding one weight.

Each format is a pair of functions on plain tensors, read through the format table
(kernels.formats.WEIGHT[name].encode / .decode): encode(w float32 [.., out, in]) -> (data, scale)
and decode(data, scale, dtype) -> [.., out, in]. All are symmetric and computed from the data:

- fp8:  float8 e4m3 with one float32 scale per 128x128 block, stored as its inverse
        (`weight_scale_inv`), exactly DeepSeek-V3 / Kimi K2's released FP8 checkpoints.
- int8: int8 with one float32 scale per output channel (row).
- int4: int4 in [-8, 7] with one bfloat16 scale per group of 32 along the input dimension, two
        values per byte (kernels.packing), the scheme Kimi-K2-Thinking ships for routed experts.
"""

from __future__ import annotations

import torch

from kernels.packing import dequantize_int4_groups, quantize_int4_groups

FP8_BLOCK = 128
FP8_MAX = 448.0  # largest finite float8 e4m3fn
INT4_GROUP = 32


class QuantizationError(ValueError):
    """A tensor cannot be stored in the format asked for (names the tensor and the reason)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def fp8_encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    *lead, rows, cols = w.shape
    br, bc = _ceil_div(rows, FP8_BLOCK), _ceil_div(cols, FP8_BLOCK)
    padded = torch.zeros(*lead, br * FP8_BLOCK, bc * FP8_BLOCK, dtype=torch.float32, device=w.device)
    padded[..., :rows, :cols] = w
    blocks = padded.unflatten(-2, (br, FP8_BLOCK)).unflatten(-1, (bc, FP8_BLOCK))  # [.., br, 128, bc, 128]
    scale_inv = blocks.abs().amax(dim=(-3, -1)).clamp(min=1e-12) / FP8_MAX  # [.., br, bc]
    q = (blocks / scale_inv[..., :, None, :, None]).to(torch.float8_e4m3fn)
    return q.flatten(-2).flatten(-3, -2)[..., :rows, :cols].contiguous(), scale_inv


def fp8_decode(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    rows, cols = data.shape[-2:]
    scale = scale.repeat_interleave(FP8_BLOCK, dim=-2)[..., :rows, :]
    scale = scale.repeat_interleave(FP8_BLOCK, dim=-1)[..., :cols]
    return (data.to(torch.float32) * scale).to(dtype)


def int8_encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(dim=-1).clamp(min=1e-12) / 127.0
    return torch.round(w / scale[..., None]).clamp(-127, 127).to(torch.int8), scale


def int8_decode(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (data.to(torch.float32) * scale[..., None]).to(dtype)


def int4_encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # bf16 scales (as compressed-tensors ships them): 2 bytes per 32 weights keeps int4 at 0.28x of bf16.
    return quantize_int4_groups(w, INT4_GROUP, torch.bfloat16, 1e-12)


def int4_decode(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return dequantize_int4_groups(data, scale, INT4_GROUP, dtype)
