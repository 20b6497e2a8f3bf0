"""Triton kernels of kernels.paged_kv_triton: the KV write and paged decode attention (GQA and
absorbed MLA) over a cache in any KV format, read and written through kernels._triton_kv_format.

Decode attention is split along the sequence: each program covers a run of blocks of one
sequence with an online softmax and writes a partial result and its log-sum-exp, which the
launcher merges. Tuples the launchers build: `pages` = (block tables, lengths, staging slots,
the tables' row stride); `partials` = (out [B, H, splits, width], lse [B, H, splits], out's
strides, lse's strides); a KV component per store (kernels._triton_kv_format).
"""

import triton
import triton.language as tl

from kernels._triton_kv_format import load_block, stage_token, staged_tile, store_block, store_token


@triton.jit
def _split_blocks(pages, b, blocks_per_split, BLK: tl.constexpr):
    """Sequence b's length, staging slot, and the run of its blocks [first, last) this program covers."""
    length = tl.load(pages[1] + b)
    slot = tl.load(pages[2] + b)  # the launcher passes a valid tensor even for unstaged formats
    first = tl.program_id(2) * blocks_per_split
    return length, slot, first, tl.minimum(first + blocks_per_split, (length + BLK - 1) // BLK)


@triton.jit
def _block_id(pages, b, blk):
    return tl.load(pages[0] + b * pages[3] + blk)


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
def _store_partial(partials, b, heads, ok, cols, acc, m, l_sum):
    out_ptr, lse_ptr, so, sl = partials
    empty = l_sum == 0.0
    out = acc / tl.where(empty, 1.0, l_sum)[:, None]
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, l_sum)))
    split = tl.program_id(2)
    tl.store(
        out_ptr + b * so[0] + heads[:, None] * so[1] + split * so[2] + cols[None, :], out, mask=ok[:, None]
    )
    tl.store(lse_ptr + b * sl[0] + heads * sl[1] + split, lse, mask=ok)


@triton.jit
def _load_rows(ptr, strides, b, rows, ok, cols):
    """x[b, rows, cols] as float32 (rows past `ok` read as zero)."""
    x = tl.load(
        ptr + b * strides[0] + rows[:, None] * strides[1] + cols[None, :], mask=ok[:, None], other=0.0
    )
    return x.to(tl.float32)


@triton.jit
def gqa_decode_kernel(
    q_ptr,
    sq,  # q's strides (batch, head)
    pages,
    k,
    v,
    partials,
    scale,
    blocks_per_split,
    group,
    G: tl.constexpr,
    D: tl.constexpr,
    BLK: tl.constexpr,
    K_FMT: tl.constexpr,
    K_STAGED: tl.constexpr,
    V_FMT: tl.constexpr,
    V_STAGED: tl.constexpr,
):
    """Per (sequence, KV head, split): the group of query heads that read that KV head."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    length, slot, first, last = _split_blocks(pages, b, blocks_per_split, BLK)
    g = tl.arange(0, G)
    heads = kvh * group + g
    d = tl.arange(0, D)
    q = _load_rows(q_ptr, sq, b, heads, g < group, d)
    m = tl.full((G,), float("-inf"), tl.float32)
    l_sum = tl.zeros((G,), tl.float32)
    acc = tl.zeros((G, D), tl.float32)
    for blk in range(first, last):
        block = _block_id(pages, b, blk)
        kt = load_block(k, block, blk, length, slot, kvh, D, BLK, K_FMT, True, K_STAGED)
        s = tl.sum(q[:, None, :] * kt[None, :, :], axis=2) * scale  # [G, BLK]
        p, alpha, m, l_sum = _online_softmax(s, blk, length, m, l_sum, BLK)
        vt = load_block(v, block, blk, length, slot, kvh, D, BLK, V_FMT, False, V_STAGED)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * vt[None, :, :], axis=1)
    _store_partial(partials, b, heads, g < group, d, acc, m, l_sum)


@triton.jit
def mla_decode_kernel(
    ql_ptr,
    sql,  # q_lat's strides (batch, head)
    qr_ptr,
    sqr,
    pages,
    latent,  # the cached latent (value-like) and rope part (key-like)
    rope,
    partials,
    scale,
    blocks_per_split,
    heads,
    HB: tl.constexpr,
    R: tl.constexpr,
    RD: tl.constexpr,
    BLK: tl.constexpr,
    L_FMT: tl.constexpr,
    L_STAGED: tl.constexpr,
    R_FMT: tl.constexpr,
    R_STAGED: tl.constexpr,
):
    """Per (sequence, block of HB query heads, split): scores q_lat . latent + q_rot . rope, and
    the latent as the values (absorbed MLA, one KV head)."""
    b = tl.program_id(0)
    length, slot, first, last = _split_blocks(pages, b, blocks_per_split, BLK)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    r = tl.arange(0, R)
    ql = _load_rows(ql_ptr, sql, b, h, h < heads, r)
    qr = _load_rows(qr_ptr, sqr, b, h, h < heads, tl.arange(0, RD))
    m = tl.full((HB,), float("-inf"), tl.float32)
    l_sum = tl.zeros((HB,), tl.float32)
    acc = tl.zeros((HB, R), tl.float32)
    for blk in range(first, last):
        block = _block_id(pages, b, blk)
        lat = load_block(latent, block, blk, length, slot, 0, R, BLK, L_FMT, False, L_STAGED)
        rot = load_block(rope, block, blk, length, slot, 0, RD, BLK, R_FMT, True, R_STAGED)
        s = tl.dot(ql, tl.trans(lat), input_precision="ieee") + tl.dot(
            qr, tl.trans(rot), input_precision="ieee"
        )
        p, alpha, m, l_sum = _online_softmax(s * scale, blk, length, m, l_sum, BLK)
        acc = acc * alpha[:, None] + tl.dot(p, lat, input_precision="ieee")
    _store_partial(partials, b, h, h < heads, r, acc, m, l_sum)


@triton.jit
def decode_write_kernel(
    x_ptr,
    sx,  # x's strides (batch, head)
    tables_ptr,
    st_b,
    pos_ptr,
    slots_ptr,
    kv,
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
    x = tl.load(x_ptr + b * sx[0] + h * sx[1] + tl.arange(0, D)).to(tl.float32)
    if STAGED:
        slot = tl.load(slots_ptr + b)
        stage_token(kv, slot, off, h, x, D)
        if off == BLK - 1:
            store_block(kv, block, h, staged_tile(kv, slot, off, h, x, D, BLK), D, BLK, FORMAT, EXACT_FP8)
    else:
        store_token(kv, block, off, h, x, D, FORMAT)
