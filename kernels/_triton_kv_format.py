"""How each KV format is read and written inside a Triton kernel: one paged block of one head.

A KV component is one tuple (data, scale, staging, data strides, scale strides, staging strides),
built by kernels.paged_kv_triton from a KVStore: data [blocks, BLK, heads, D or D/2], scale in the
format's layout (kernels.formats.KV), staging [slots, BLK, heads, D] for a staged format (else a
pointer never read). FORMAT is the format table's Triton code; KEY_STYLE picks int4's key layout
(per channel over the block) over its value layout (per token, groups of 32).
"""

import triton
import triton.language as tl

from kernels._triton_codecs import pack_int4, round_clamp, scale_groups, to_e4m3_grid, unpack_int4
from kernels.formats import FMT_DENSE, FMT_FP8, FMT_INT4, FMT_INT8


@triton.jit
def load_block(
    kv,
    block,
    blk,
    length,
    slot,
    head,
    D: tl.constexpr,
    BLK: tl.constexpr,
    FORMAT: tl.constexpr,
    KEY_STYLE: tl.constexpr,
    STAGED: tl.constexpr,
):
    """Block `block` (the sequence's `blk`-th, of `length` tokens) of one head as [BLK, D] float32.
    A staged format's block being filled comes from its full-precision slot (selected, not
    branched: both addresses are always valid)."""
    data, scale, stage, sd, ss, sg = kv
    t = tl.arange(0, BLK)
    d = tl.arange(0, D)
    base = data + block * sd[0] + head * sd[2]
    if FORMAT == FMT_INT4:
        q = unpack_int4(tl.load(base + t[:, None] * sd[1] + tl.arange(0, D // 2)[None, :]), BLK, D)
        if KEY_STYLE:  # scale [blocks, H, D]: per channel over the block
            x = q * tl.load(scale + block * ss[0] + head * ss[1] + d * ss[2]).to(tl.float32)[None, :]
        else:  # scale [blocks, BLK, H, D/32]: per token, groups of 32
            g = tl.arange(0, D // 32)
            s = tl.load(scale + block * ss[0] + t[:, None] * ss[1] + head * ss[2] + g[None, :])
            x = scale_groups(q, s.to(tl.float32), BLK, D, 32)
    else:
        x = tl.load(base + t[:, None] * sd[1] + d[None, :]).to(tl.float32)
        if FORMAT == FMT_FP8:  # scale [blocks, H]
            x = x * tl.load(scale + block * ss[0] + head * ss[1])
        elif FORMAT == FMT_INT8:  # scale [blocks, BLK, H]
            x = x * tl.load(scale + block * ss[0] + t * ss[1] + head * ss[2])[:, None]
    if STAGED:
        st = tl.load(stage + slot * sg[0] + t[:, None] * sg[1] + head * sg[2] + d[None, :]).to(tl.float32)
        filling = (blk == (length - 1) // BLK) & ((length - 1) % BLK != BLK - 1)
        x = tl.where(filling, st, x)
    return x


@triton.jit
def stage_token(kv, slot, off, head, x, D: tl.constexpr):
    """Write token `x` [D] at `off` of its staging slot (a staged format's block being filled)."""
    stage, sg = kv[2], kv[5]
    tl.store(
        stage + slot * sg[0] + off * sg[1] + head * sg[2] + tl.arange(0, D), x.to(stage.dtype.element_ty)
    )


@triton.jit
def staged_tile(kv, slot, off, head, x, D: tl.constexpr, BLK: tl.constexpr):
    """The staging slot's whole block [BLK, D] as float32, with token `x` at `off` exactly as written."""
    stage, sg = kv[2], kv[5]
    t = tl.arange(0, BLK)
    d = tl.arange(0, D)
    tile = tl.load(stage + slot * sg[0] + t[:, None] * sg[1] + head * sg[2] + d[None, :]).to(tl.float32)
    return tl.where(t[:, None] == off, x[None, :], tile)


@triton.jit
def store_block(
    kv, block, head, tile, D: tl.constexpr, BLK: tl.constexpr, FORMAT: tl.constexpr, EXACT_FP8: tl.constexpr
):
    """Quantize a completed block [BLK, D] of a staged format and store it, scales included."""
    data, scale, sd, ss = kv[0], kv[1], kv[3], kv[4]
    t = tl.arange(0, BLK)
    d = tl.arange(0, D)
    rows = data + block * sd[0] + t[:, None] * sd[1] + head * sd[2]
    if FORMAT == FMT_FP8:  # one scale per head over the block
        sc = tl.maximum(tl.max(tl.max(tl.abs(tile), axis=1), axis=0), 1e-8) / 448.0
        y = tile / sc
        if EXACT_FP8:
            y = to_e4m3_grid(y)
        tl.store(rows + d[None, :], y.to(data.dtype.element_ty))
        tl.store(scale + block * ss[0] + head * ss[1], sc)
    else:  # int4 keys: one fp16 scale per channel over the block
        sc = (tl.maximum(tl.max(tl.abs(tile), axis=0), 1e-8) / 7.0).to(tl.float16).to(tl.float32)
        tl.store(rows + tl.arange(0, D // 2)[None, :], pack_int4(tile / sc[None, :], BLK, D))
        tl.store(scale + block * ss[0] + head * ss[1] + d * ss[2], sc.to(tl.float16))


@triton.jit
def store_token(kv, block, off, head, x, D: tl.constexpr, FORMAT: tl.constexpr):
    """Quantize one token [D] of a token-by-token format and store it at (block, off)."""
    data, scale, sd, ss = kv[0], kv[1], kv[3], kv[4]
    base = data + block * sd[0] + off * sd[1] + head * sd[2]
    scales = scale + block * ss[0] + off * ss[1] + head * ss[2]
    d = tl.arange(0, D)
    if FORMAT == FMT_DENSE:
        tl.store(base + d, x.to(data.dtype.element_ty))
    elif FORMAT == FMT_INT8:  # per token per head
        sc = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-8) / 127.0
        tl.store(base + d, round_clamp(x / sc, -127.0, 127.0).to(tl.int8))
        tl.store(scales, sc)
    else:  # int4 values: per token, groups of 32, fp16 scales
        grp = tl.reshape(x, (D // 32, 32))
        sc = (tl.maximum(tl.max(tl.abs(grp), axis=1), 1e-8) / 7.0).to(tl.float16).to(tl.float32)
        packed = pack_int4(tl.reshape(grp / sc[:, None], (1, D)), 1, D)
        tl.store(base + tl.arange(0, D // 2)[None, :], packed)
        tl.store(scales + tl.arange(0, D // 32), sc.to(tl.float16))
