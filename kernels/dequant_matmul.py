"""Dequantizing matmul: y = x @ dequant(W)^T (+ b) for fp8 (128x128 blocks), int8 (per channel)
and int4 (group 32, packed) weights, accumulating in fp32.

Reference: kernels.quant.linear_ref (dequantize, then a dense matmul).
Triton: dequantizes in registers; a split-K variant covers decode shapes (few rows, wide weights),
where one program per output tile would leave most of the GPU idle.
"""

from __future__ import annotations

import torch

from kernels.dispatch import KernelShapeError
from kernels.formats import COMPRESSED_WEIGHT_FORMATS, WEIGHT
from kernels.quant import QuantizedWeight, linear_ref

_FORMATS = {n: WEIGHT[n].triton_code for n in COMPRESSED_WEIGHT_FORMATS}


def dequant_matmul_ref(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    return linear_ref(x, w, bias)


def pick_split_k(
    m: int, n: int, k: int, block_n: int = 64, block_k: int = 64, target_programs: int = 132
) -> int:
    """Split K when the output tiles alone cannot fill the GPU (decode: m is small)."""
    tiles = -(-m // 16) * -(-n // block_n)
    if tiles >= target_programs:
        return 1
    return max(1, min(-(-target_programs // tiles), k // (4 * block_k)))


def dequant_matmul_triton(
    x: torch.Tensor,
    w: QuantizedWeight,
    bias: torch.Tensor | None = None,
    split_k: int | None = None,
    block_m: int = 16,
    block_n: int = 64,
    block_k: int = 64,
) -> torch.Tensor:
    from kernels._triton_dequant import weight_operand
    from kernels._triton_dequant_matmul import dequant_matmul_kernel

    if w.format not in _FORMATS or len(w.shape) != 2:
        raise KernelShapeError(f"dequant_matmul: a 2-D {'/'.join(_FORMATS)} weight, got {w.format} {w.shape}")
    n, k = w.shape
    if x.shape[-1] != k or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise KernelShapeError(f"dequant_matmul: x {tuple(x.shape)} {x.dtype} does not fit W {w.shape}")
    group = WEIGHT[w.format].cols_multiple  # a scale group must not straddle K blocks
    if k % group or block_k % group:
        raise KernelShapeError(
            f"dequant_matmul: {w.format} needs K and BLOCK_K divisible by {group}, got K={k}"
        )
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    split = split_k or pick_split_k(m, n, k, block_n, block_k)
    per_split = -(-k // split)
    per_split = -(-per_split // block_k) * block_k  # whole K blocks (and whole int4 groups) per split
    split = -(-k // per_split)
    partial = torch.full((split, m, n), float("nan"), dtype=torch.float32, device=x.device)
    operand, code = weight_operand(w)
    grid = (-(-m // block_m), -(-n // block_n), split)
    dequant_matmul_kernel[grid](
        x2,
        operand,
        partial,
        m,
        n,
        k,
        x2.stride(),
        partial.stride(),
        per_split,
        FMT=code,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    y = partial.sum(0) if split > 1 else partial[0]
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype).reshape(*x.shape[:-1], n)
