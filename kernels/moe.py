"""Fused MoE: the routed experts of a layer in two grouped-GEMM launches.

Token slots (token, k) are sorted by expert and each expert's run padded to BLOCK_M; one launch
computes silu(gate) * up for every block of every active expert, a second the down projection
with the routing weight applied; the k slots of a token are then summed. Weights may be dense or
compressed (kernels.quant formats), dequantized in registers.

Reference: the per-expert loop (fused_moe_ref), as the engine runs it on a CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.dispatch import KernelShapeError
from kernels.quant import QuantizedWeight, dequantize

Weight = torch.Tensor | QuantizedWeight  # logical [E, out, in]


def _dense(w: Weight, e: int, dtype: torch.dtype) -> torch.Tensor:
    return dequantize(w[e], dtype) if isinstance(w, QuantizedWeight) else w[e].to(dtype)


def fused_moe_ref(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w_gate: Weight, w_up: Weight, w_down: Weight
) -> torch.Tensor:
    """sum_j weights[t, j] * down(silu(gate(x_t)) * up(x_t)) over each token's experts ids[t, j]."""
    out = torch.zeros_like(x, dtype=torch.float32)
    for e in ids.unique().tolist():
        token, j = torch.nonzero(ids == e, as_tuple=True)
        h = x[token].float()
        h = F.silu(h @ _dense(w_gate, e, torch.float32).T) * (h @ _dense(w_up, e, torch.float32).T)
        y = (h @ _dense(w_down, e, torch.float32).T) * weights[token, j].float()[:, None]
        out.index_add_(0, token, y)
    return out.to(x.dtype)


def align_slots(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots sorted by expert, each expert padded to a multiple of block_m (padding = num_slots);
    and the expert of every block. Experts without tokens get no block."""
    flat = ids.reshape(-1)
    n = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    total = int(padded.sum())
    slots = torch.full((total,), n, dtype=torch.long, device=ids.device)
    rank = torch.arange(n, device=ids.device) - (torch.cumsum(counts, 0) - counts)[flat[order]]
    slots[starts[flat[order]] + rank] = order
    block_expert = torch.repeat_interleave(torch.arange(num_experts, device=ids.device), padded // block_m)
    return slots, block_expert


def fused_moe_triton(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w_gate: Weight,
    w_up: Weight,
    w_down: Weight,
    block_m: int = 16,
    block_n: int = 32,
    block_k: int = 32,
) -> torch.Tensor:
    from kernels._triton_dequant import weight_operand
    from kernels._triton_fused_moe import moe_down_kernel, moe_gate_up_kernel

    t, h = x.shape
    e_count, i_size = w_gate.shape[0], w_gate.shape[1]
    (wg, gate_fmt), (wu, up_fmt), (wd, down_fmt) = (weight_operand(w) for w in (w_gate, w_up, w_down))
    fmts = {gate_fmt, up_fmt, down_fmt}
    if len(fmts) != 1 or h % block_k or i_size % block_k:
        raise KernelShapeError(
            f"fused_moe: weights of one format and sizes divisible by {block_k}; "
            f"got hidden {h}, intermediate {i_size}, formats {sorted(fmts)}"
        )
    fmt = fmts.pop()
    k = ids.shape[1]
    slots, block_expert = align_slots(ids, e_count, block_m)
    n_blocks = block_expert.numel()
    inter = torch.full((slots.numel(), i_size), float("nan"), dtype=torch.float32, device=x.device)
    y = torch.full((t * k, h), float("nan"), dtype=torch.float32, device=x.device)
    if n_blocks:
        blocks = dict(FMT=fmt, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
        moe_gate_up_kernel[(n_blocks, -(-i_size // block_n))](
            x, slots, block_expert, inter, wg, wu, t * k, k, h, i_size, x.stride(0), inter.stride(0), **blocks
        )
        routing = weights.reshape(-1).float().contiguous()
        moe_down_kernel[(n_blocks, -(-h // block_n))](
            inter,
            slots,
            block_expert,
            routing,
            y,
            wd,
            t * k,
            h,
            i_size,
            inter.stride(0),
            y.stride(0),
            **blocks,
        )
    return y.view(t, k, h).sum(1).to(x.dtype)
