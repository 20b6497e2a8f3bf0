"""Compressed weights: quantize / dequantize by format name, stacking, and the reference matmul.

Every format's layout and torch reference is an entry of the format table (kernels.formats.WEIGHT;
the tensor math is in kernels.weight_quant), so this module only looks a name up.

Error bounds (per element, tested on fresh random data):
  int8 <= row_amax / 254; int4 <= group_amax / 14 x (1 + 2^-8) (the scale is rounded to bf16);
  fp8 <= |w| / 16 + block_amax / 448 x 2^-9 (3 mantissa bits, then the subnormal step).
"""

from __future__ import annotations

import torch

from kernels.formats import COMPRESSED_WEIGHT_FORMATS, WEIGHT, WEIGHT_FORMATS, QuantizedWeight
from kernels.weight_quant import FP8_BLOCK, FP8_MAX, INT4_GROUP, QuantizationError

__all__ = [
    "FP8_BLOCK",
    "FP8_MAX",
    "INT4_GROUP",
    "WEIGHT_FORMATS",
    "QuantizationError",
    "QuantizedWeight",
    "dequantize",
    "linear_ref",
    "quantize",
    "concat_out",
    "stack",
]

ROW_SCALED = ("int8", "int4")  # scales per output row (or per group within a row): rows concatenate


def quantize(w: torch.Tensor, fmt: str, name: str = "weight") -> QuantizedWeight:
    """Compress a float [out, in] (or [E, out, in]) weight; raises QuantizationError naming `name`."""
    if fmt not in COMPRESSED_WEIGHT_FORMATS:
        raise QuantizationError(
            f"{name}: unknown weight format {fmt!r}; use one of {', '.join(WEIGHT_FORMATS)}"
        )
    return WEIGHT[fmt].quantize(w, name)


def dequantize(qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if qw.format not in COMPRESSED_WEIGHT_FORMATS:
        raise QuantizationError(f"unknown weight format {qw.format!r}")
    return WEIGHT[qw.format].dequantize(qw, dtype)


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


def concat_out(weights: list[QuantizedWeight]) -> QuantizedWeight | None:
    """Weights of one row-scaled format (int8, int4) with the same input width, concatenated along
    the output rows ([.., sum out, in]: gate and up as one matmul); None where the format's scales
    span rows (fp8's 128x128 blocks) or the weights differ in format or leading shape."""
    first = weights[0]
    if first.format not in ROW_SCALED or any(
        w.format != first.format or w.shape[:-2] != first.shape[:-2] or w.shape[-1] != first.shape[-1]
        for w in weights
    ):
        return None
    dim = len(first.shape) - 2  # the output-row dimension of data and scale alike
    rows = sum(w.shape[-2] for w in weights)
    return QuantizedWeight(
        first.format,
        torch.cat([w.data for w in weights], dim=dim),
        torch.cat([w.scale for w in weights], dim=dim),
        (*first.shape[:-2], rows, first.shape[-1]),
    )


def rows_of(w: QuantizedWeight, start: int, stop: int) -> QuantizedWeight:
    """Output rows [start, stop) of a row-scaled weight (views, no copy)."""
    dim = len(w.shape) - 2
    return QuantizedWeight(
        w.format,
        w.data.narrow(dim, start, stop - start),
        w.scale.narrow(dim, start, stop - start),
        (*w.shape[:-2], stop - start, w.shape[-1]),
    )


def linear_ref(
    x: torch.Tensor, w: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ W^T (+ b); a compressed W is dequantized to x's dtype first (the reference path)."""
    if isinstance(w, QuantizedWeight):
        w = dequantize(w, x.dtype)
    return torch.nn.functional.linear(x, w, bias)
