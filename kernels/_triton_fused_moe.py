"""Triton body of kernels.moe: grouped GEMMs over token slots sorted and padded per expert.

Kernel 1, per (block of BLOCK_M slots of one expert, tile of the intermediate size):
h = silu(x @ Wg^T) * (x @ Wu^T). Kernel 2, per (block, tile of the hidden size):
y[slot] = routing_weight[slot] * (h @ Wd^T). Padding slots are masked; experts with no tokens have
no blocks, so they cost nothing.
"""

import triton
import triton.language as tl

from kernels._triton_dequant import weight_tile


@triton.jit
def moe_gate_up_kernel(
    x_ptr,
    slots_ptr,
    block_expert_ptr,
    h_ptr,
    wg_ptr,
    sg_ptr,
    wu_ptr,
    su_ptr,
    num_slots,
    top_k,
    H,
    INTER,
    sx_t,
    sh_p,
    swg_e,
    swg_n,
    swg_k,
    ssg_e,
    ssg_n,
    ssg_k,
    swu_e,
    swu_n,
    swu_k,
    ssu_e,
    ssu_n,
    ssu_k,
    FMT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    blk = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + blk)
    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(slots_ptr + rows)
    valid = slot < num_slots
    token = tl.where(valid, slot // top_k, 0)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    gate = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, H, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + token[:, None] * sx_t + rk[None, :], mask=valid[:, None] & (rk[None, :] < H), other=0.0
        ).to(tl.float32)
        wg = weight_tile(
            wg_ptr + e * swg_e,
            sg_ptr + e * ssg_e,
            rn,
            k0,
            INTER,
            H,
            swg_n,
            swg_k,
            ssg_n,
            ssg_k,
            FMT,
            BLOCK_N,
            BLOCK_K,
        )
        wu = weight_tile(
            wu_ptr + e * swu_e,
            su_ptr + e * ssu_e,
            rn,
            k0,
            INTER,
            H,
            swu_n,
            swu_k,
            ssu_n,
            ssu_k,
            FMT,
            BLOCK_N,
            BLOCK_K,
        )
        gate += tl.dot(x, tl.trans(wg), input_precision="ieee")
        up += tl.dot(x, tl.trans(wu), input_precision="ieee")
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + rows[:, None] * sh_p + rn[None, :], h, mask=valid[:, None] & (rn[None, :] < INTER))


@triton.jit
def moe_down_kernel(
    h_ptr,
    slots_ptr,
    block_expert_ptr,
    weights_ptr,
    y_ptr,
    wd_ptr,
    sd_ptr,
    num_slots,
    H,
    INTER,
    sh_p,
    sy_s,
    swd_e,
    swd_n,
    swd_k,
    ssd_e,
    ssd_n,
    ssd_k,
    FMT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    blk = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + blk)
    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(slots_ptr + rows)
    valid = slot < num_slots
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        h = tl.load(
            h_ptr + rows[:, None] * sh_p + rk[None, :], mask=valid[:, None] & (rk[None, :] < INTER), other=0.0
        )
        wd = weight_tile(
            wd_ptr + e * swd_e,
            sd_ptr + e * ssd_e,
            rn,
            k0,
            H,
            INTER,
            swd_n,
            swd_k,
            ssd_n,
            ssd_k,
            FMT,
            BLOCK_N,
            BLOCK_K,
        )
        acc += tl.dot(h, tl.trans(wd), input_precision="ieee")
    w = tl.load(weights_ptr + tl.where(valid, slot, 0), mask=valid, other=0.0)
    acc = acc * w[:, None]  # the routing weight, applied in the kernel
    tl.store(y_ptr + slot[:, None] * sy_s + rn[None, :], acc, mask=valid[:, None] & (rn[None, :] < H))
