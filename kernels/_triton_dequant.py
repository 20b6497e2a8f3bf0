"""Dequantize a weight tile in registers (shared by the dequantizing matmul and the fused MoE)."""

import triton
import triton.language as tl

from kernels.formats import FMT_FP8, FMT_INT4, FMT_INT8  # the format table's codes


@triton.jit
def weight_tile(
    w_ptr,
    s_ptr,
    rn,
    k0,
    N,
    K,
    stride_wn,
    stride_wk,
    stride_sn,
    stride_sk,
    FMT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """W[rn, k0:k0+BLOCK_K] as float32 [BLOCK_N, BLOCK_K], zero outside [N, K]. Formats (kernels.quant):
    dense; int8 with a per-row scale; int4 two per byte (low nibble first) with a scale per group
    of 32 along K; fp8 with one scale per 128x128 block."""
    in_n = rn[:, None] < N
    rk = k0 + tl.arange(0, BLOCK_K)
    if FMT == FMT_INT4:
        rb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        packed = tl.load(
            w_ptr + rn[:, None] * stride_wn + rb[None, :] * stride_wk,
            mask=in_n & (rb[None, :] < K // 2),
            other=0,
        ).to(tl.int32)
        q = tl.reshape(tl.join((packed & 0xF) - 8, (packed >> 4) - 8), (BLOCK_N, BLOCK_K)).to(tl.float32)
        groups = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        s = tl.load(
            s_ptr + rn[:, None] * stride_sn + groups[None, :] * stride_sk,
            mask=in_n & (groups[None, :] < K // 32),
            other=0.0,
        ).to(tl.float32)
        return tl.reshape(tl.reshape(q, (BLOCK_N, BLOCK_K // 32, 32)) * s[:, :, None], (BLOCK_N, BLOCK_K))
    w = tl.load(
        w_ptr + rn[:, None] * stride_wn + rk[None, :] * stride_wk, mask=in_n & (rk[None, :] < K), other=0.0
    ).to(tl.float32)
    if FMT == FMT_INT8:
        w = w * tl.load(s_ptr + rn * stride_sn, mask=rn < N, other=0.0)[:, None]
    elif FMT == FMT_FP8:
        w = w * tl.load(
            s_ptr + (rn[:, None] // 128) * stride_sn + (rk[None, :] // 128) * stride_sk,
            mask=in_n & (rk[None, :] < K),
            other=0.0,
        )
    return w
