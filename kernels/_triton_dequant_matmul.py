"""Triton body of kernels.dequant_matmul: y = x @ dequant(W)^T, dequantizing in registers.

W is [N, K] in one of kernels.quant's formats; x is [M, K] (bf16, fp16 or fp32); accumulation is
fp32. With SPLIT_K > 1 each program covers one slice of K and writes a partial sum; the caller adds
the partials (deterministic, no atomics).
"""

import triton
import triton.language as tl

from kernels._triton_dequant import weight_tile


@triton.jit
def dequant_matmul_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,  # of the stored data (int4: bytes along K, two values each)
    stride_sn,
    stride_sk,  # of the scales
    stride_os,
    stride_om,
    stride_on,  # out: [SPLIT_K, M, N]
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
            x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
            mask=(rm[:, None] < M) & (rk[None, :] < k_end),
            other=0.0,
        ).to(tl.float32)
        w = weight_tile(
            w_ptr, s_ptr, rn, k0, N, k_end, stride_wn, stride_wk, stride_sn, stride_sk, FMT, BLOCK_N, BLOCK_K
        )
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    tl.store(
        out_ptr + pid_k * stride_os + rm[:, None] * stride_om + rn[None, :] * stride_on,
        acc,
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )
