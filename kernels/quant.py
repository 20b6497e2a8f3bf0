"""Weight compression formats and their torch reference quantize / dequantize / matmul.

Formats (all symmetric, computed from the data):
- fp8:  float8 e4m3 with one float32 scale per 128x128 block, stored as its inverse
        (`weight_scale_inv`), exactly DeepSeek-V3 / Kimi K2's released FP8 checkpoints.
- int8: int8 with one float32 scale per output channel (row).
- int4: int4 in [-8, 7] with one bfloat16 scale per group of 32 along the input dimension, two values per
        byte (low nibble = even column), the scheme Kimi-K2-Thinking ships for routed experts.

Error bounds (per element, tested on fresh random data):
  int8 <= row_amax / 254; int4 <= group_amax / 14 x (1 + 2^-8) (the scale is rounded to bf16);
  fp8 <= |w| / 16 + block_amax / 448 x 2^-9 (3 mantissa bits, then the subnormal step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_BLOCK = 128
FP8_MAX = 448.0  # largest finite float8 e4m3fn
INT4_GROUP = 32


def __getattr__(name: str):
    # WEIGHT_FORMATS comes from the format table, which imports this module's references.
    if name == "WEIGHT_FORMATS":
        from kernels.formats import WEIGHT_FORMATS

        return WEIGHT_FORMATS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class QuantizationError(ValueError):
    """A tensor cannot be stored in the format asked for (names the tensor and the reason)."""


@dataclass
class QuantizedWeight:
    """A compressed [out, in] weight (or a stack [E, out, in] of them, one per expert)."""

    format: str  # "fp8" | "int8" | "int4"
    data: torch.Tensor  # fp8 [.., out, in] | int8 [.., out, in] | uint8 [.., out, in/2]
    scale: (
        torch.Tensor
    )  # fp8: scale_inv [.., ceil(out/128), ceil(in/128)]; int8: [.., out]; int4: [.., out, in/32]
    shape: tuple[int, ...]  # logical shape

    def __getitem__(self, index: int) -> QuantizedWeight:
        """One expert of a stacked weight."""
        return QuantizedWeight(self.format, self.data[index], self.scale[index], self.shape[1:])

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self, dtype)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def quantize(w: torch.Tensor, fmt: str, name: str = "weight") -> QuantizedWeight:
    """Compress a float [out, in] (or [E, out, in]) weight; raises QuantizationError naming `name`."""
    if w.dim() not in (2, 3):
        raise QuantizationError(f"{name}: only 2-D weights (or stacks of them) compress, got {list(w.shape)}")
    w = w.to(torch.float32)
    if fmt == "fp8":
        return _quantize_fp8(w)
    if fmt == "int8":
        amax = w.abs().amax(dim=-1).clamp(min=1e-12)
        scale = amax / 127.0
        q = torch.round(w / scale[..., None]).clamp(-127, 127).to(torch.int8)
        return QuantizedWeight("int8", q, scale, tuple(w.shape))
    if fmt == "int4":
        cols = w.shape[-1]
        if cols % INT4_GROUP:
            raise QuantizationError(
                f"{name}: input dimension {cols} is not a multiple of the int4 group size {INT4_GROUP}"
            )
        groups = w.unflatten(-1, (cols // INT4_GROUP, INT4_GROUP))
        # bf16 scales (as compressed-tensors ships them): 2 bytes per 32 weights keeps int4 at 0.28x of bf16.
        scale = (groups.abs().amax(dim=-1).clamp(min=1e-12) / 7.0).to(torch.bfloat16)
        q = (
            torch.round(groups / scale.to(torch.float32)[..., None]).clamp(-8, 7).flatten(-2).to(torch.int16)
            + 8
        )
        packed = (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8)
        return QuantizedWeight("int4", packed, scale, tuple(w.shape))
    from kernels.formats import WEIGHT_FORMATS

    raise QuantizationError(f"{name}: unknown weight format {fmt!r}; use one of {', '.join(WEIGHT_FORMATS)}")


def _quantize_fp8(w: torch.Tensor) -> QuantizedWeight:
    *lead, rows, cols = w.shape
    br, bc = _ceil_div(rows, FP8_BLOCK), _ceil_div(cols, FP8_BLOCK)
    padded = torch.zeros(*lead, br * FP8_BLOCK, bc * FP8_BLOCK, dtype=torch.float32, device=w.device)
    padded[..., :rows, :cols] = w
    blocks = padded.unflatten(-2, (br, FP8_BLOCK)).unflatten(-1, (bc, FP8_BLOCK))  # [.., br, 128, bc, 128]
    scale_inv = blocks.abs().amax(dim=(-3, -1)).clamp(min=1e-12) / FP8_MAX  # [.., br, bc]
    q = (blocks / scale_inv[..., :, None, :, None]).to(torch.float8_e4m3fn)
    q = q.flatten(-2).flatten(-3, -2)[..., :rows, :cols].contiguous()
    return QuantizedWeight("fp8", q, scale_inv, tuple(w.shape))


def dequantize(qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if qw.format == "int8":
        return (qw.data.to(torch.float32) * qw.scale[..., None]).to(dtype)
    if qw.format == "int4":
        low = (qw.data & 0x0F).to(torch.int16) - 8
        high = (qw.data >> 4).to(torch.int16) - 8
        q = torch.stack([low, high], dim=-1).flatten(-2).to(torch.float32)
        groups = (
            q.unflatten(-1, (q.shape[-1] // INT4_GROUP, INT4_GROUP)) * qw.scale.to(torch.float32)[..., None]
        )
        return groups.flatten(-2).to(dtype)
    if qw.format == "fp8":
        rows, cols = qw.data.shape[-2:]
        scale = qw.scale.repeat_interleave(FP8_BLOCK, dim=-2)[..., :rows, :]
        scale = scale.repeat_interleave(FP8_BLOCK, dim=-1)[..., :cols]
        return (qw.data.to(torch.float32) * scale).to(dtype)
    raise QuantizationError(f"unknown weight format {qw.format!r}")


def stack(weights: list[QuantizedWeight]) -> QuantizedWeight:
    """Stack per-expert weights of one format into one [E, out, in] weight."""
    formats = {w.format for w in weights}
    if len(formats) != 1:
        raise QuantizationError(f"cannot stack weights of different formats {sorted(formats)}")
    first = weights[0]
    return QuantizedWeight(
        first.format,
        torch.stack([w.data for w in weights]),
        torch.stack([w.scale for w in weights]),
        (len(weights), *first.shape),
    )


def linear_ref(
    x: torch.Tensor, w: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ W^T (+ b); a compressed W is dequantized to x's dtype first (the reference path)."""
    if isinstance(w, QuantizedWeight):
        w = dequantize(w, x.dtype)
    return torch.nn.functional.linear(x, w, bias)
