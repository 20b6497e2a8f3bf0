"""Triton twins of kernels.paged_kv: the KV write and paged decode attention over a quantized cache.

Decode attention is split along the sequence (each program covers a run of blocks, with an online
softmax) and the partial results are merged with a log-sum-exp reduction, so long contexts use the
whole GPU. Every KV format is read directly (dequantized in registers): dense, fp8 (scale per head
per block), int8 (per token per head) and int4 (KIVI: keys per channel per block, values per token
in groups of 32), with a staged format's block being filled read from its full-precision slot.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.dispatch import KernelShapeError
from kernels.formats import FMT_DENSE, FMT_FP8, FMT_INT4, FMT_INT8, KV
from kernels.paged_kv import BLOCK, KVStore

FMT = {name: f.triton_code for name, f in KV.items()}  # the format table's codes


@triton.jit
def _round_half_even(x):
    f = tl.floor(x + 0.5)
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where(((f - x) == 0.5) & odd, f - 1.0, f)


@triton.jit
def _to_e4m3_grid(x):
    """x rounded (half to even) to the nearest float8 e4m3 value, saturating at +-448. Used only
    under TRITON_INTERPRET, whose fp8 emulation mis-rounds values that round up to the next
    power of two; on a GPU the hardware conversion does this."""
    a = tl.minimum(tl.abs(x), 448.0)
    e = tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), -6.0)
    step = tl.exp2(e - 3.0)
    r = _round_half_even(a / step) * step
    return tl.where(x < 0, -r, r)


@triton.jit
def _load_block(
    data_ptr,
    scale_ptr,
    staging_ptr,
    block,
    slot,
    from_staging,
    head,
    sd_b,
    sd_t,
    sd_h,
    ss_0,
    ss_1,
    ss_2,
    sg_s,
    sg_t,
    sg_h,
    D: tl.constexpr,
    BLK: tl.constexpr,
    FORMAT: tl.constexpr,
    KEY_STYLE: tl.constexpr,
    STAGED: tl.constexpr,
):
    """One block of one head as [BLK, D] float32. A staged format's block being filled comes from
    its full-precision slot (selected, not branched: both addresses are always valid)."""
    t = tl.arange(0, BLK)
    d = tl.arange(0, D)
    base = data_ptr + block * sd_b + head * sd_h
    if FORMAT == FMT_INT4:  # int4, two values per byte, low nibble first
        db = tl.arange(0, D // 2)
        packed = tl.load(base + t[:, None] * sd_t + db[None, :]).to(tl.int32)
        q = tl.reshape(tl.join((packed & 0xF) - 8, (packed >> 4) - 8), (BLK, D)).to(tl.float32)
        if KEY_STYLE:  # scale [blocks, H, D]: per channel over the block
            s = tl.load(scale_ptr + block * ss_0 + head * ss_1 + d * ss_2).to(tl.float32)
            x = q * s[None, :]
        else:  # scale [blocks, BLK, H, D/32]: per token, groups of 32
            g = tl.arange(0, D // 32)
            s = tl.load(scale_ptr + block * ss_0 + t[:, None] * ss_1 + head * ss_2 + g[None, :]).to(
                tl.float32
            )
            x = tl.reshape(tl.reshape(q, (BLK, D // 32, 32)) * s[:, :, None], (BLK, D))
    else:
        x = tl.load(base + t[:, None] * sd_t + d[None, :]).to(tl.float32)
        if FORMAT == FMT_FP8:  # fp8, scale [blocks, H]
            x = x * tl.load(scale_ptr + block * ss_0 + head * ss_1)
        elif FORMAT == FMT_INT8:  # int8, scale [blocks, BLK, H]
            x = x * tl.load(scale_ptr + block * ss_0 + t * ss_1 + head * ss_2)[:, None]
    if STAGED:
        st = tl.load(staging_ptr + slot * sg_s + t[:, None] * sg_t + head * sg_h + d[None, :]).to(tl.float32)
        x = tl.where(from_staging != 0, st, x)
    return x


@triton.jit
def _tail_from_staging(blk, length, STAGED: tl.constexpr, BLK: tl.constexpr):
    last = (length - 1) // BLK
    if STAGED:
        return ((blk == last) & ((length - 1) % BLK != BLK - 1)).to(tl.int32)
    return 0


@triton.jit
def gqa_decode_kernel(
    q_ptr,
    out_ptr,
    lse_ptr,
    tables_ptr,
    lengths_ptr,
    slots_ptr,
    k_data,
    k_scale,
    k_stage,
    v_data,
    v_scale,
    v_stage,
    sq_b,
    sq_h,
    so_b,
    so_h,
    so_s,
    sl_b,
    sl_h,
    st_b,
    kd_b,
    kd_t,
    kd_h,
    ks_0,
    ks_1,
    ks_2,
    kg_s,
    kg_t,
    kg_h,
    vd_b,
    vd_t,
    vd_h,
    vs_0,
    vs_1,
    vs_2,
    vg_s,
    vg_t,
    vg_h,
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
    split = tl.program_id(2)
    length = tl.load(lengths_ptr + b)
    slot = tl.load(slots_ptr + b)  # the caller passes a valid tensor even for unstaged formats
    g = tl.arange(0, G)
    d = tl.arange(0, D)
    heads = kvh * group + g
    q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :], mask=(g < group)[:, None], other=0.0)
    q = q.to(tl.float32)
    m = tl.full((G,), float("-inf"), tl.float32)
    l_sum = tl.zeros((G,), tl.float32)
    acc = tl.zeros((G, D), tl.float32)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, (length + BLK - 1) // BLK)
    for blk in range(first, last):
        block = tl.load(tables_ptr + b * st_b + blk)
        k = _load_block(
            k_data,
            k_scale,
            k_stage,
            block,
            slot,
            _tail_from_staging(blk, length, K_STAGED, BLK),
            kvh,
            kd_b,
            kd_t,
            kd_h,
            ks_0,
            ks_1,
            ks_2,
            kg_s,
            kg_t,
            kg_h,
            D,
            BLK,
            K_FMT,
            True,
            K_STAGED,
        )
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [G, BLK]
        pos = blk * BLK + tl.arange(0, BLK)
        s = tl.where((pos < length)[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        v = _load_block(
            v_data,
            v_scale,
            v_stage,
            block,
            slot,
            _tail_from_staging(blk, length, V_STAGED, BLK),
            kvh,
            vd_b,
            vd_t,
            vd_h,
            vs_0,
            vs_1,
            vs_2,
            vg_s,
            vg_t,
            vg_h,
            D,
            BLK,
            V_FMT,
            False,
            V_STAGED,
        )
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        m = m_new
    empty = l_sum == 0.0
    out = acc / tl.where(empty, 1.0, l_sum)[:, None]
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, l_sum)))
    ok = g < group
    tl.store(out_ptr + b * so_b + heads[:, None] * so_h + split * so_s + d[None, :], out, mask=ok[:, None])
    tl.store(lse_ptr + b * sl_b + heads * sl_h + split, lse, mask=ok)


@triton.jit
def mla_decode_kernel(
    ql_ptr,
    qr_ptr,
    out_ptr,
    lse_ptr,
    tables_ptr,
    lengths_ptr,
    slots_ptr,
    l_data,
    l_scale,
    l_stage,
    r_data,
    r_scale,
    r_stage,
    sql_b,
    sql_h,
    sqr_b,
    sqr_h,
    so_b,
    so_h,
    so_s,
    sl_b,
    sl_h,
    st_b,
    ld_b,
    ld_t,
    ld_h,
    ls_0,
    ls_1,
    ls_2,
    lg_s,
    lg_t,
    lg_h,
    rd_b,
    rd_t,
    rd_h,
    rs_0,
    rs_1,
    rs_2,
    rg_s,
    rg_t,
    rg_h,
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
    hb = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(lengths_ptr + b)
    slot = tl.load(slots_ptr + b)
    h = hb * HB + tl.arange(0, HB)
    ok = h < heads
    r = tl.arange(0, R)
    rd = tl.arange(0, RD)
    ql = tl.load(ql_ptr + b * sql_b + h[:, None] * sql_h + r[None, :], mask=ok[:, None], other=0.0).to(
        tl.float32
    )
    qr = tl.load(qr_ptr + b * sqr_b + h[:, None] * sqr_h + rd[None, :], mask=ok[:, None], other=0.0).to(
        tl.float32
    )
    m = tl.full((HB,), float("-inf"), tl.float32)
    l_sum = tl.zeros((HB,), tl.float32)
    acc = tl.zeros((HB, R), tl.float32)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, (length + BLK - 1) // BLK)
    for blk in range(first, last):
        block = tl.load(tables_ptr + b * st_b + blk)
        lat = _load_block(
            l_data,
            l_scale,
            l_stage,
            block,
            slot,
            _tail_from_staging(blk, length, L_STAGED, BLK),
            0,
            ld_b,
            ld_t,
            ld_h,
            ls_0,
            ls_1,
            ls_2,
            lg_s,
            lg_t,
            lg_h,
            R,
            BLK,
            L_FMT,
            False,
            L_STAGED,
        )
        rot = _load_block(
            r_data,
            r_scale,
            r_stage,
            block,
            slot,
            _tail_from_staging(blk, length, R_STAGED, BLK),
            0,
            rd_b,
            rd_t,
            rd_h,
            rs_0,
            rs_1,
            rs_2,
            rg_s,
            rg_t,
            rg_h,
            RD,
            BLK,
            R_FMT,
            True,
            R_STAGED,
        )
        s = tl.dot(ql, tl.trans(lat), input_precision="ieee") + tl.dot(
            qr, tl.trans(rot), input_precision="ieee"
        )
        s = s * scale
        pos = blk * BLK + tl.arange(0, BLK)
        s = tl.where((pos < length)[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        acc = acc * alpha[:, None] + tl.dot(p, lat, input_precision="ieee")
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        m = m_new
    empty = l_sum == 0.0
    out = acc / tl.where(empty, 1.0, l_sum)[:, None]
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, l_sum)))
    tl.store(out_ptr + b * so_b + h[:, None] * so_h + split * so_s + r[None, :], out, mask=ok[:, None])
    tl.store(lse_ptr + b * sl_b + h * sl_h + split, lse, mask=ok)


@triton.jit
def decode_write_kernel(
    x_ptr,
    tables_ptr,
    pos_ptr,
    slots_ptr,
    data_ptr,
    scale_ptr,
    stage_ptr,
    sx_b,
    sx_h,
    st_b,
    sd_b,
    sd_t,
    sd_h,
    ss_0,
    ss_1,
    ss_2,
    sg_s,
    sg_t,
    sg_h,
    D: tl.constexpr,
    BLK: tl.constexpr,
    FORMAT: tl.constexpr,
    KEY_STYLE: tl.constexpr,
    STAGED: tl.constexpr,
    EXACT_FP8: tl.constexpr,
):
    """One token of one head per program: quantize and store it (scales included); a staged format
    writes the token to its slot and, when that completes the block, quantizes the whole block."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + b)
    block = tl.load(tables_ptr + b * st_b + pos // BLK)
    off = pos % BLK
    d = tl.arange(0, D)
    x = tl.load(x_ptr + b * sx_b + h * sx_h + d).to(tl.float32)
    if STAGED:
        slot = tl.load(slots_ptr + b)
        tl.store(stage_ptr + slot * sg_s + off * sg_t + h * sg_h + d, x.to(stage_ptr.dtype.element_ty))
        if off == BLK - 1:
            t = tl.arange(0, BLK)
            tile = tl.load(stage_ptr + slot * sg_s + t[:, None] * sg_t + h * sg_h + d[None, :]).to(tl.float32)
            tile = tl.where(t[:, None] == off, x[None, :], tile)  # this token, exactly as written
            if FORMAT == FMT_FP8:  # fp8: one scale per head over the block
                sc = tl.maximum(tl.max(tl.max(tl.abs(tile), axis=1), axis=0), 1e-8) / 448.0
                y = tile / sc
                if EXACT_FP8:
                    y = _to_e4m3_grid(y)
                q = y.to(data_ptr.dtype.element_ty)
                tl.store(data_ptr + block * sd_b + t[:, None] * sd_t + h * sd_h + d[None, :], q)
                tl.store(scale_ptr + block * ss_0 + h * ss_1, sc)
            else:  # int4 keys: one fp16 scale per channel over the block
                sc = (tl.maximum(tl.max(tl.abs(tile), axis=0), 1e-8) / 7.0).to(tl.float16).to(tl.float32)
                q = tl.minimum(tl.maximum(_round_half_even(tile / sc[None, :]), -8.0), 7.0).to(tl.int32) + 8
                low, high = tl.split(tl.reshape(q, (BLK, D // 2, 2)))
                db = tl.arange(0, D // 2)
                tl.store(
                    data_ptr + block * sd_b + t[:, None] * sd_t + h * sd_h + db[None, :],
                    (low | (high << 4)).to(tl.uint8),
                )
                tl.store(scale_ptr + block * ss_0 + h * ss_1 + d * ss_2, sc.to(tl.float16))
        return
    base = data_ptr + block * sd_b + off * sd_t + h * sd_h
    if FORMAT == FMT_DENSE:
        tl.store(base + d, x.to(data_ptr.dtype.element_ty))
    elif FORMAT == FMT_INT8:  # int8 per token per head
        sc = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-8) / 127.0
        q = tl.minimum(tl.maximum(_round_half_even(x / sc), -127.0), 127.0)
        tl.store(base + d, q.to(tl.int8))
        tl.store(scale_ptr + block * ss_0 + off * ss_1 + h * ss_2, sc)
    else:  # int4 values: per token, groups of 32, fp16 scales
        grp = tl.reshape(x, (D // 32, 32))
        sc = (tl.maximum(tl.max(tl.abs(grp), axis=1), 1e-8) / 7.0).to(tl.float16).to(tl.float32)
        q = tl.minimum(tl.maximum(_round_half_even(grp / sc[:, None]), -8.0), 7.0).to(tl.int32) + 8
        low, high = tl.split(tl.reshape(q, (D // 2, 2)))
        tl.store(base + tl.arange(0, D // 2), (low | (high << 4)).to(tl.uint8))
        g = tl.arange(0, D // 32)
        tl.store(scale_ptr + block * ss_0 + off * ss_1 + h * ss_2 + g, sc.to(tl.float16))


# --- launchers ---------------------------------------------------------------------------------------


def _strides(store: KVStore):
    data = store.data
    s = store.scale
    scale_strides = [s.stride(i) for i in range(min(3, s.dim()))] if s is not None else []
    scale_strides += [0] * (3 - len(scale_strides))
    g = store.staging
    stage_strides = [g.stride(0), g.stride(1), g.stride(2)] if g is not None else [0, 0, 0]
    dummy = data  # a pointer argument the kernel never reads
    return (data, s if s is not None else dummy, g if g is not None else dummy), (
        data.stride(0),
        data.stride(1),
        data.stride(2),
        *scale_strides,
        *stage_strides,
    )


def _check(store: KVStore, dim: int, what: str) -> None:
    if dim & (dim - 1) or dim < 32 or store.data.shape[1] != BLOCK:
        raise KernelShapeError(
            f"paged decode ({what}): head dim {dim} must be a power of two >= 32, block {BLOCK}"
        )


def _merge(out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Combine per-split results: weights softmax(lse) over splits (empty splits weigh zero)."""
    w = torch.softmax(lse, dim=-1).nan_to_num(0.0)
    return (out * w[..., None]).sum(dim=2)


def _splits(tables: torch.Tensor, splits: int | None) -> tuple[int, int]:
    max_blocks = tables.shape[1]
    n = splits or max(1, min(16, max_blocks // 8))  # roughly 8+ blocks (128 tokens) per split
    per = -(-max_blocks // n)
    return -(-max_blocks // per), per


def gqa_decode_triton(
    q, k: KVStore, v: KVStore, tables, lengths, slots, scale: float, splits: int | None = None
):
    b, h, d = q.shape
    kvh = k.data.shape[2]
    _check(k, d, "gqa")
    group = h // kvh
    n_split, per = _splits(tables, splits)
    out = torch.full((b, h, n_split, d), float("nan"), dtype=torch.float32, device=q.device)
    lse = torch.full((b, h, n_split), float("nan"), dtype=torch.float32, device=q.device)
    (kd, ks, kg), kstr = _strides(k)
    (vd, vs, vg), vstr = _strides(v)
    slots_t = slots if slots is not None else lengths
    gqa_decode_kernel[(b, kvh, n_split)](
        q,
        out,
        lse,
        tables,
        lengths,
        slots_t,
        kd,
        ks,
        kg,
        vd,
        vs,
        vg,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        lse.stride(0),
        lse.stride(1),
        tables.stride(0),
        *kstr,
        *vstr,
        scale,
        per,
        group,
        G=triton.next_power_of_2(group),
        D=d,
        BLK=BLOCK,
        K_FMT=FMT[k.fmt],
        V_FMT=FMT[v.fmt],
        K_STAGED=k.staged,
        V_STAGED=v.staged,
    )
    return _merge(out, lse).to(q.dtype)


def mla_decode_triton(
    q_lat,
    q_rot,
    latent: KVStore,
    rope: KVStore,
    tables,
    lengths,
    slots,
    scale: float,
    splits: int | None = None,
):
    b, h, r = q_lat.shape
    rd = q_rot.shape[-1]
    _check(latent, r, "mla latent")
    _check(rope, rd, "mla rope")
    n_split, per = _splits(tables, splits)
    out = torch.full((b, h, n_split, r), float("nan"), dtype=torch.float32, device=q_lat.device)
    lse = torch.full((b, h, n_split), float("nan"), dtype=torch.float32, device=q_lat.device)
    (ld, ls, lg), lstr = _strides(latent)
    (rdd, rs, rg), rstr = _strides(rope)
    slots_t = slots if slots is not None else lengths
    hb = 16  # tl.dot needs 16 rows; fewer heads are masked
    mla_decode_kernel[(b, -(-h // hb), n_split)](
        q_lat,
        q_rot,
        out,
        lse,
        tables,
        lengths,
        slots_t,
        ld,
        ls,
        lg,
        rdd,
        rs,
        rg,
        q_lat.stride(0),
        q_lat.stride(1),
        q_rot.stride(0),
        q_rot.stride(1),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        lse.stride(0),
        lse.stride(1),
        tables.stride(0),
        *lstr,
        *rstr,
        scale,
        per,
        h,
        HB=hb,
        R=r,
        RD=rd,
        BLK=BLOCK,
        L_FMT=FMT[latent.fmt],
        R_FMT=FMT[rope.fmt],
        L_STAGED=latent.staged,
        R_STAGED=rope.staged,
    )
    return _merge(out, lse).to(q_lat.dtype)


def decode_write_triton(store: KVStore, tables, pos, slots, x) -> None:
    b, h, d = x.shape
    _check(store, d, "kv write")
    (data, scale, stage), strides = _strides(store)
    slots_t = slots if slots is not None else pos
    decode_write_kernel[(b, h)](
        x,
        tables,
        pos,
        slots_t,
        data,
        scale,
        stage,
        x.stride(0),
        x.stride(1),
        tables.stride(0),
        *strides,
        D=d,
        BLK=BLOCK,
        FORMAT=FMT[store.fmt],
        KEY_STYLE=store.style == "key",
        STAGED=store.staged,
        EXACT_FP8=os.environ.get("TRITON_INTERPRET") == "1",
    )
