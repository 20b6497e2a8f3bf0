"""Triton body of kernels.moe: grouped GEMMs over token slots sorted and padded per expert.

Kernel 1, per (block of BLOCK_M slots of one expert, tile of the intermediate size):
h = silu(x @ Wg^T) * (x @ Wu^T). Kernel 2, per (block, tile of the hidden size):
y[slot] = routing_weight[slot] * (h @ Wd^T). Padding slots are masked; experts with no tokens have
no blocks, so they cost nothing. Weights are weight tuples of kernels._triton_dequant.
"""

import triton
import triton.language as tl

from kernels._triton_dequant import weight_tile


@triton.jit
def _expert_block(slots_ptr, block_expert_ptr, num_slots, BLOCK_M: tl.constexpr):
    """This program's expert, its slot rows, their slots and which of them are real (not padding)."""
    blk = tl.program_id(0)
    e = tl.load(block_expert_ptr + blk)
    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(slots_ptr + rows)
    return e, rows, slot, slot < num_slots


@triton.jit
def moe_gate_up_kernel(
    x_ptr,
    slots_ptr,
    block_expert_ptr,
    h_ptr,
    wg,
    wu,
    num_slots,
    top_k,
    H,
    INTER,
    sx_t,
    sh_p,
    FMT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    e, rows, slot, valid = _expert_block(slots_ptr, block_expert_ptr, num_slots, BLOCK_M)
    token = tl.where(valid, slot // top_k, 0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    gate = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, H, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + token[:, None] * sx_t + rk[None, :], mask=valid[:, None] & (rk[None, :] < H), other=0.0
        ).to(tl.float32)
        g = weight_tile(wg, e, rn, k0, INTER, H, FMT, BLOCK_N, BLOCK_K)
        gate += tl.dot(x, tl.trans(g), input_precision="ieee")
        u = weight_tile(wu, e, rn, k0, INTER, H, FMT, BLOCK_N, BLOCK_K)
        up += tl.dot(x, tl.trans(u), input_precision="ieee")
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + rows[:, None] * sh_p + rn[None, :], h, mask=valid[:, None] & (rn[None, :] < INTER))


@triton.jit
def moe_down_kernel(
    h_ptr,
    slots_ptr,
    block_expert_ptr,
    weights_ptr,
    y_ptr,
    wd,
    num_slots,
    H,
    INTER,
    sh_p,
    sy_s,
    FMT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    e, rows, slot, valid = _expert_block(slots_ptr, block_expert_ptr, num_slots, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        h = tl.load(
            h_ptr + rows[:, None] * sh_p + rk[None, :], mask=valid[:, None] & (rk[None, :] < INTER), other=0.0
        )
        d = weight_tile(wd, e, rn, k0, H, INTER, FMT, BLOCK_N, BLOCK_K)
        acc += tl.dot(h, tl.trans(d), input_precision="ieee")
    w = tl.load(weights_ptr + tl.where(valid, slot, 0), mask=valid, other=0.0)
    acc = acc * w[:, None]  # the routing weight, applied in the kernel
    tl.store(y_ptr + slot[:, None] * sy_s + rn[None, :], acc, mask=valid[:, None] & (rn[None, :] < H))
