"""Triton body of kernels.dequant_matmul: y = x @ dequant(W)^T, dequantizing in registers.

W is [N, K] in one of the format table's weight formats (a weight tuple of
kernels._triton_dequant); x is [M, K] (bf16, fp16 or fp32); accumulation is fp32. With SPLIT_K > 1
each program covers one slice of K and writes a partial sum; the caller adds the partials
(deterministic, no atomics).
"""

import triton
import triton.language as tl

from kernels._triton_dequant import weight_tile


@triton.jit
def dequant_matmul_kernel(
    x_ptr,
    w,  # (data, scale, data strides, scale strides): kernels._triton_dequant.weight_operand
    out_ptr,
    M,
    N,
    K,
    sx,  # x strides (row, column)
    so,  # out strides (split, row, column): out is [SPLIT_K, M, N]
    k_per_split,
    FMT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + rm[:, None] * sx[0] + rk[None, :] * sx[1],
            mask=(rm[:, None] < M) & (rk[None, :] < k_end),
            other=0.0,
        ).to(tl.float32)
        wt = weight_tile(w, 0, rn, k0, N, k_end, FMT, BLOCK_N, BLOCK_K)
        acc += tl.dot(x, tl.trans(wt), input_precision="ieee")
    tl.store(
        out_ptr + pid_k * so[0] + rm[:, None] * so[1] + rn[None, :] * so[2],
        acc,
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )
