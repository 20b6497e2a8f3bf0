"""Dequantize a weight tile in registers (shared by the dequantizing matmul and the fused MoE).

A weight operand is one tuple (data, scale, data strides, scale strides), the strides over
(expert, row, column), 0 where a dimension is absent; `weight_operand` builds it from a tensor or
a QuantizedWeight, with the format's Triton code from the format table.
"""

import torch
import triton
import triton.language as tl

from kernels._triton_codecs import scale_groups, unpack_int4
from kernels.formats import FMT_DENSE, FMT_FP8, FMT_INT4, FMT_INT8, WEIGHT, QuantizedWeight


def _strides3(t: torch.Tensor, has_experts: bool) -> tuple[int, int, int]:
    """t's strides as (expert, row, column), 0 for an expert or column dimension it lacks."""
    s = list(t.stride()) if has_experts else [0, *t.stride()]
    return tuple(s + [0] * (3 - len(s)))


def weight_operand(w: torch.Tensor | QuantizedWeight) -> tuple[tuple, int]:
    """(the kernel's weight tuple, its format code) for a [N, K] or [E, N, K] weight."""
    if not isinstance(w, QuantizedWeight):  # dense: the scale is a pointer the kernel never reads
        return (w, w, _strides3(w, w.dim() == 3), (0, 0, 0)), FMT_DENSE
    stacked = w.data.dim() == 3
    operand = (w.data, w.scale, _strides3(w.data, stacked), _strides3(w.scale, stacked))
    return operand, WEIGHT[w.format].triton_code


@triton.jit
def weight_tile(w, e, rn, k0, N, K, FMT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W[e, rn, k0:k0+BLOCK_K] as float32 [BLOCK_N, BLOCK_K], zero outside [N, K]. Formats
    (kernels.weight_quant): dense; int8 with a per-row scale; int4 two per byte with a scale per
    group of 32 along K; fp8 with one scale per 128x128 block."""
    data, scale, sw, ss = w
    w_ptr = data + e * sw[0]
    s_ptr = scale + e * ss[0]
    in_n = rn[:, None] < N
    rk = k0 + tl.arange(0, BLOCK_K)
    if FMT == FMT_INT4:
        rb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        packed = tl.load(
            w_ptr + rn[:, None] * sw[1] + rb[None, :] * sw[2], mask=in_n & (rb[None, :] < K // 2), other=0
        )
        groups = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        s = tl.load(
            s_ptr + rn[:, None] * ss[1] + groups[None, :] * ss[2],
            mask=in_n & (groups[None, :] < K // 32),
            other=0.0,
        ).to(tl.float32)
        return scale_groups(unpack_int4(packed, BLOCK_N, BLOCK_K), s, BLOCK_N, BLOCK_K, 32)
    x = tl.load(w_ptr + rn[:, None] * sw[1] + rk[None, :] * sw[2], mask=in_n & (rk[None, :] < K), other=0.0)
    x = x.to(tl.float32)
    if FMT == FMT_INT8:
        x = x * tl.load(s_ptr + rn * ss[1], mask=rn < N, other=0.0)[:, None]
    elif FMT == FMT_FP8:
        x = x * tl.load(
            s_ptr + (rn[:, None] // 128) * ss[1] + (rk[None, :] // 128) * ss[2],
            mask=in_n & (rk[None, :] < K),
            other=0.0,
        )
    return x
