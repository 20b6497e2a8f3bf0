"""Triton kernels of kernels.paged_kv_triton: the KV write and paged decode attention (GQA and
absorbed MLA) over a cache in any KV format, read and written through kernels._triton_kv_format.

Decode attention is split along the sequence: each program covers a run of blocks of one
sequence with an online softmax and writes a partial result and its log-sum-exp, which the
launcher merges. Stride tuples: sq / so / sl are the query's (batch, head), the partial output's
(batch, head, split) and the log-sum-exp's (batch, head).
"""

import triton
import triton.language as tl

from kernels._triton_kv_format import (
    load_block,
    stage_token,
    staged_tile,
    store_block,
    store_token,
    tail_from_staging,
)


@triton.jit
def _split_blocks(lengths_ptr, b, blocks_per_split, BLK: tl.constexpr):
    """The sequence's length and the run of its blocks [first, last) this program covers."""
    length = tl.load(lengths_ptr + b)
    first = tl.program_id(2) * blocks_per_split
    return length, first, tl.minimum(first + blocks_per_split, (length + BLK - 1) // BLK)


@triton.jit
def _online_softmax(s, blk, length, m, l_sum, BLK: tl.constexpr):
    """Fold scores s [rows, BLK] of block `blk` in: (probabilities, rescale of the old sums, new max,
    new sum); positions at or past the length weigh nothing."""
    pos = blk * BLK + tl.arange(0, BLK)
    s = tl.where((pos < length)[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m - m_new)
    return p, alpha, m_new, l_sum * alpha + tl.sum(p, axis=1)


@triton.jit
def _store_partial(out_ptr, lse_ptr, so, sl, b, heads, ok, cols, acc, m, l_sum):
    empty = l_sum == 0.0
    out = acc / tl.where(empty, 1.0, l_sum)[:, None]
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, l_sum)))
    split = tl.program_id(2)
    tl.store(
        out_ptr + b * so[0] + heads[:, None] * so[1] + split * so[2] + cols[None, :], out, mask=ok[:, None]
    )
    tl.store(lse_ptr + b * sl[0] + heads * sl[1] + split, lse, mask=ok)


@triton.jit
def gqa_decode_kernel(
    q_ptr,
    out_ptr,
    lse_ptr,
    tables_ptr,
    lengths_ptr,
    slots_ptr,
    k,  # KV component tuples (kernels._triton_kv_format)
    v,
    sq,
    so,
    sl,
    st_b,
    scale,
    blocks_per_split,
    group,
    G: tl.constexpr,
    D: tl.constexpr,
    BLK: tl.constexpr,
    K_FMT: tl.constexpr,
    V_FMT: tl.constexpr,
    K_STAGED: tl.constexpr,
    V_STAGED: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    length, first, last = _split_blocks(lengths_ptr, b, blocks_per_split, BLK)
    slot = tl.load(slots_ptr + b)  # the caller passes a valid tensor even for unstaged formats
    g = tl.arange(0, G)
    d = tl.arange(0, D)
    heads = kvh * group + g
    ok = g < group
    q = tl.load(q_ptr + b * sq[0] + heads[:, None] * sq[1] + d[None, :], mask=ok[:, None], other=0.0)
    q = q.to(tl.float32)
    m = tl.full((G,), float("-inf"), tl.float32)
    l_sum = tl.zeros((G,), tl.float32)
    acc = tl.zeros((G, D), tl.float32)
    for blk in range(first, last):
        block = tl.load(tables_ptr + b * st_b + blk)
        k_staged = tail_from_staging(blk, length, K_STAGED, BLK)
        kt = load_block(k, block, k_staged, slot, kvh, D, BLK, K_FMT, True, K_STAGED)
        s = tl.sum(q[:, None, :] * kt[None, :, :], axis=2) * scale  # [G, BLK]
        p, alpha, m, l_sum = _online_softmax(s, blk, length, m, l_sum, BLK)
        v_staged = tail_from_staging(blk, length, V_STAGED, BLK)
        vt = load_block(v, block, v_staged, slot, kvh, D, BLK, V_FMT, False, V_STAGED)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * vt[None, :, :], axis=1)
    _store_partial(out_ptr, lse_ptr, so, sl, b, heads, ok, d, acc, m, l_sum)


@triton.jit
def mla_decode_kernel(
    ql_ptr,
    qr_ptr,
    out_ptr,
    lse_ptr,
    tables_ptr,
    lengths_ptr,
    slots_ptr,
    lat_kv,  # KV component tuples (kernels._triton_kv_format): the latent and the rope part
    rot_kv,
    sql,
    sqr,
    so,
    sl,
    st_b,
    scale,
    blocks_per_split,
    heads,
    HB: tl.constexpr,
    R: tl.constexpr,
    RD: tl.constexpr,
    BLK: tl.constexpr,
    L_FMT: tl.constexpr,
    R_FMT: tl.constexpr,
    L_STAGED: tl.constexpr,
    R_STAGED: tl.constexpr,
):
    b = tl.program_id(0)
    length, first, last = _split_blocks(lengths_ptr, b, blocks_per_split, BLK)
    slot = tl.load(slots_ptr + b)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    ok = h < heads
    r = tl.arange(0, R)
    rd = tl.arange(0, RD)
    ql = tl.load(ql_ptr + b * sql[0] + h[:, None] * sql[1] + r[None, :], mask=ok[:, None], other=0.0)
    qr = tl.load(qr_ptr + b * sqr[0] + h[:, None] * sqr[1] + rd[None, :], mask=ok[:, None], other=0.0)
    ql, qr = ql.to(tl.float32), qr.to(tl.float32)
    m = tl.full((HB,), float("-inf"), tl.float32)
    l_sum = tl.zeros((HB,), tl.float32)
    acc = tl.zeros((HB, R), tl.float32)
    for blk in range(first, last):
        block = tl.load(tables_ptr + b * st_b + blk)
        l_staged = tail_from_staging(blk, length, L_STAGED, BLK)
        lat = load_block(lat_kv, block, l_staged, slot, 0, R, BLK, L_FMT, False, L_STAGED)
        r_staged = tail_from_staging(blk, length, R_STAGED, BLK)
        rot = load_block(rot_kv, block, r_staged, slot, 0, RD, BLK, R_FMT, True, R_STAGED)
        s = tl.dot(ql, tl.trans(lat), input_precision="ieee") + tl.dot(
            qr, tl.trans(rot), input_precision="ieee"
        )
        p, alpha, m, l_sum = _online_softmax(s * scale, blk, length, m, l_sum, BLK)
        acc = acc * alpha[:, None] + tl.dot(p, lat, input_precision="ieee")
    _store_partial(out_ptr, lse_ptr, so, sl, b, h, ok, r, acc, m, l_sum)


@triton.jit
def decode_write_kernel(
    x_ptr,
    tables_ptr,
    pos_ptr,
    slots_ptr,
    kv,
    sx_b,
    sx_h,
    st_b,
    D: tl.constexpr,
    BLK: tl.constexpr,
    FORMAT: tl.constexpr,
    STAGED: tl.constexpr,  # with the format, says the layout: int4 stages keys, not values
    EXACT_FP8: tl.constexpr,
):
    """One token of one head per program: quantize and store it (scales included); a staged format
    writes the token to its slot and, when that completes the block, quantizes the whole block."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + b)
    block = tl.load(tables_ptr + b * st_b + pos // BLK)
    off = pos % BLK
    x = tl.load(x_ptr + b * sx_b + h * sx_h + tl.arange(0, D)).to(tl.float32)
    if STAGED:
        slot = tl.load(slots_ptr + b)
        stage_token(kv, slot, off, h, x, D)
        if off == BLK - 1:
            store_block(kv, block, h, staged_tile(kv, slot, off, h, x, D, BLK), D, BLK, FORMAT, EXACT_FP8)
    else:
        store_token(kv, block, off, h, x, D, FORMAT)
