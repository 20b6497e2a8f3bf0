"""Triton twins of kernels.paged_kv: the KV write and paged decode attention over a quantized cache.

Decode attention is split along the sequence (each program covers a run of blocks, with an online
softmax) and the partial results are merged with a log-sum-exp reduction, so long contexts use the
whole GPU. Every KV format is read directly (dequantized in registers): dense, fp8 (scale per head
per block), int8 (per token per head) and int4 (KIVI: keys per channel per block, values per token
in groups of 32), with a staged format's block being filled read from its full-precision slot.
The kernels are in kernels._triton_paged_decode, each format's reads and writes in
kernels._triton_kv_format; these launchers hand them one tuple per KV component.
"""

from __future__ import annotations

import os

import torch
import triton

from kernels._triton_paged_decode import decode_write_kernel, gqa_decode_kernel, mla_decode_kernel
from kernels.dispatch import KernelShapeError
from kernels.formats import KV
from kernels.paged_kv_store import BLOCK, KVStore

FMT = {name: f.triton_code for name, f in KV.items()}  # the format table's codes


def _padded_strides(t: torch.Tensor | None) -> tuple[int, int, int]:
    """The first three strides of t, 0 for dimensions it lacks (or for no tensor)."""
    s = list(t.stride()[:3]) if t is not None else []
    return tuple(s + [0] * (3 - len(s)))


def _component(store: KVStore) -> tuple:
    """The kernels' view of a store: (data, scale, staging, and their strides); a missing scale or
    staging is replaced by data, a pointer the kernel never reads."""
    data = store.data
    scale = store.scale if store.scale is not None else data
    stage = store.staging if store.staging is not None else data
    return (
        data,
        scale,
        stage,
        _padded_strides(data),
        _padded_strides(store.scale),
        _padded_strides(store.staging),
    )


def _check(store: KVStore, dim: int, what: str) -> None:
    if dim & (dim - 1) or dim < 32 or store.data.shape[1] != BLOCK:
        raise KernelShapeError(
            f"paged decode ({what}): head dim {dim} must be a power of two >= 32, block {BLOCK}"
        )


def _splits(tables: torch.Tensor, splits: int | None) -> tuple[int, int]:
    max_blocks = tables.shape[1]
    n = splits or max(1, min(16, max_blocks // 8))  # roughly 8+ blocks (128 tokens) per split
    per = -(-max_blocks // n)
    return -(-max_blocks // per), per


def _pages(tables: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor | None) -> tuple:
    """The kernels' `pages` tuple; without staging slots, lengths stand in (never read)."""
    return (tables, lengths, slots if slots is not None else lengths, tables.stride(0))


def _partials(b: int, h: int, n_split: int, width: int, device: torch.device) -> tuple:
    """The kernels' `partials` tuple: per-split outputs [B, H, splits, width], their log-sum-exps
    [B, H, splits], and the strides of both."""
    out = torch.full((b, h, n_split, width), float("nan"), dtype=torch.float32, device=device)
    lse = torch.full((b, h, n_split), float("nan"), dtype=torch.float32, device=device)
    return out, lse, out.stride()[:3], lse.stride()[:2]


def _merge(partials: tuple) -> torch.Tensor:
    """Combine per-split results: weights softmax(lse) over splits (empty splits weigh zero)."""
    out, lse = partials[:2]
    w = torch.softmax(lse, dim=-1).nan_to_num(0.0)
    return (out * w[..., None]).sum(dim=2)


def _formats(**stores: KVStore) -> dict[str, int | bool]:
    """The constexprs NAME_FMT (the format table's code) and NAME_STAGED of each named store."""
    return {
        key: value
        for name, store in stores.items()
        for key, value in ((f"{name}_FMT", FMT[store.fmt]), (f"{name}_STAGED", store.staged))
    }


def gqa_decode_triton(
    q, k: KVStore, v: KVStore, tables, lengths, slots, scale: float, splits: int | None = None
):
    b, h, d = q.shape
    kvh = k.data.shape[2]
    _check(k, d, "gqa")
    group = h // kvh
    n_split, per = _splits(tables, splits)
    partials = _partials(b, h, n_split, d, q.device)
    gqa_decode_kernel[(b, kvh, n_split)](
        q,
        q.stride()[:2],
        _pages(tables, lengths, slots),
        _component(k),
        _component(v),
        partials,
        scale,
        per,
        group,
        G=triton.next_power_of_2(group),
        D=d,
        BLK=BLOCK,
        **_formats(K=k, V=v),
    )
    return _merge(partials).to(q.dtype)


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
    partials = _partials(b, h, n_split, r, q_lat.device)
    hb = 16  # tl.dot needs 16 rows; fewer heads are masked
    mla_decode_kernel[(b, -(-h // hb), n_split)](
        q_lat,
        q_lat.stride()[:2],
        q_rot,
        q_rot.stride()[:2],
        _pages(tables, lengths, slots),
        _component(latent),
        _component(rope),
        partials,
        scale,
        per,
        h,
        HB=hb,
        R=r,
        RD=rd,
        BLK=BLOCK,
        **_formats(L=latent, R=rope),
    )
    return _merge(partials).to(q_lat.dtype)


def decode_write_triton(store: KVStore, tables, pos, slots, x) -> None:
    b, h, d = x.shape
    _check(store, d, "kv write")
    decode_write_kernel[(b, h)](
        x,
        x.stride()[:2],
        tables,
        tables.stride(0),
        pos,
        slots if slots is not None else pos,
        _component(store),
        D=d,
        BLK=BLOCK,
        FORMAT=FMT[store.fmt],
        STAGED=store.staged,
        EXACT_FP8=os.environ.get("TRITON_INTERPRET") == "1",
    )
