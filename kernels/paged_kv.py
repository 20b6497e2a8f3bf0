"""Paged KV-cache operations on raw tensors: read, write, and batched decode attention.

A store (kernels.paged_kv_store.KVStore, re-exported here) is one component (keys, values, or MLA's
latent / rope part) of one layer.

The torch functions here are the references; kernels.paged_kv_triton holds the Triton twins,
kernels.paged_kv_flat the CPU path of a decode step (flat indices built once per step), and the
public functions pick one through kernels.dispatch. The Triton twins import only the store's module,
never this one: the import goes one way (here, when a GPU runs them).
"""

from __future__ import annotations

import torch

from kernels import paged_kv_flat
from kernels.dispatch import use_triton
from kernels.formats import KV
from kernels.paged_kv_flat import DecodeIndex
from kernels.paged_kv_store import BLOCK, KVStore

# --- references ------------------------------------------------------------------------------------


def read_blocks_ref(store: KVStore, blocks: torch.Tensor) -> torch.Tensor:
    """Dense values of `blocks` (any index shape) -> [..., BLOCK, H, D]."""
    data = store.data[blocks]
    dequantize = KV[store.fmt].layout(store.style).dequantize
    if dequantize is None:  # dense
        return data.to(store.dense)
    return dequantize(data, store.scale[blocks], store.dense)


def write_tokens_ref(store: KVStore, blocks: torch.Tensor, offsets: torch.Tensor, x: torch.Tensor) -> None:
    """Formats that quantize token by token: store x [n, H, D] at (block, offset)."""
    quantize = KV[store.fmt].layout(store.style).quantize
    if quantize is None:  # dense
        store.data[blocks, offsets] = x.to(store.data.dtype)
        return
    q, s = quantize(x)
    store.data[blocks, offsets], store.scale[blocks, offsets] = q, s


def write_blocks_ref(store: KVStore, blocks: torch.Tensor, x: torch.Tensor) -> None:
    """Formats that quantize whole blocks: x [m, BLOCK, H, D]."""
    q, s = KV[store.fmt].layout(store.style).quantize(x)
    store.data[blocks], store.scale[blocks] = q, s


def decode_write_ref(
    store: KVStore, tables: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor | None, x: torch.Tensor
) -> None:
    """One new token per sequence (x [B, H, D]) at position pos[b] of the sequence whose block
    table is tables[b]; a staged format fills the staging slot and quantizes completed blocks."""
    rows = torch.arange(x.shape[0], device=x.device)
    tail, offset = pos // BLOCK, pos % BLOCK
    if not store.staged:
        write_tokens_ref(store, tables[rows, tail], offset, x)
        return
    store.staging[slots, offset] = x.to(store.staging.dtype)
    done = offset == BLOCK - 1
    if bool(done.any()):
        write_blocks_ref(store, tables[rows[done], tail[done]], store.staging[slots[done]])


def read_sequences_ref(
    store: KVStore, tables: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor | None
) -> torch.Tensor:
    """Dense [B, nb*BLOCK, H, D] for each table; a staged partial tail block comes from staging.
    Positions at or beyond a sequence's length hold garbage; callers mask them."""
    dense = read_blocks_ref(store, tables)
    if store.staged:
        rows = torch.arange(tables.shape[0], device=tables.device)
        pos = lengths - 1
        partial = pos % BLOCK != BLOCK - 1
        if bool(partial.any()):
            dense[rows[partial], (pos // BLOCK)[partial]] = store.staging[slots[partial]].to(dense.dtype)
    return dense.reshape(tables.shape[0], -1, *dense.shape[-2:])


def _hidden(lengths: torch.Tensor, t: int) -> torch.Tensor:
    return torch.arange(t, device=lengths.device)[None, :] >= lengths[:, None]


def gqa_decode_ref(
    q: torch.Tensor,
    k: KVStore,
    v: KVStore,
    tables: torch.Tensor,
    lengths: torch.Tensor,
    slots: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """q [B, H, D] against each sequence's cached K/V [T, KVH, D]; -> [B, H, D]."""
    k_all = read_sequences_ref(k, tables, lengths, slots)
    v_all = read_sequences_ref(v, tables, lengths, slots)
    b, t, kvh, d = k_all.shape
    q_g = q.view(b, kvh, -1, d)  # each group of query heads reads its KV head
    scores = torch.matmul(q_g, k_all.permute(0, 2, 3, 1)) * scale
    scores = scores.masked_fill(_hidden(lengths, t)[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if probs.dtype != v_all.dtype:
        probs = probs.to(v_all.dtype)
    return torch.matmul(probs, v_all.transpose(1, 2)).reshape(b, -1, d)


def mla_decode_ref(
    q_lat: torch.Tensor,
    q_rot: torch.Tensor,
    latent: KVStore,
    rope: KVStore,
    tables: torch.Tensor,
    lengths: torch.Tensor,
    slots: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Absorbed MLA: scores = q_lat . latent + q_rot . rope over the cached latent; -> [B, H, R]."""
    lat = read_sequences_ref(latent, tables, lengths, slots)[:, :, 0]
    rot = read_sequences_ref(rope, tables, lengths, slots)[:, :, 0]
    scores = torch.matmul(q_lat, lat.transpose(1, 2)) + torch.matmul(q_rot, rot.transpose(1, 2))
    scores = (scores * scale).masked_fill(_hidden(lengths, lat.shape[1])[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if probs.dtype != lat.dtype:
        probs = probs.to(lat.dtype)
    return torch.matmul(probs, lat)


# --- dispatch: Triton on a GPU, the flat-index path (kernels.paged_kv_flat) on a CPU ------------------


def decode_write(store: KVStore, index: DecodeIndex, x: torch.Tensor) -> None:
    """One new token per sequence of a decode step (x [B, H, D]) into `store`."""
    if use_triton(x):
        from kernels.paged_kv_triton import decode_write_triton

        return decode_write_triton(store, index.tables, index.pos, index.slots, x)
    return index.write(store, x)


def gqa_decode(q, k: KVStore, v: KVStore, index: DecodeIndex, scale: float) -> torch.Tensor:
    if use_triton(q):
        from kernels.paged_kv_triton import gqa_decode_triton

        return gqa_decode_triton(q, k, v, index.tables, index.lengths, index.slots, scale)
    return paged_kv_flat.gqa_decode(q, k, v, index, scale)


def mla_decode(
    q_lat, q_rot, latent: KVStore, rope: KVStore, index: DecodeIndex, scale: float
) -> torch.Tensor:
    if use_triton(q_lat):
        from kernels.paged_kv_triton import mla_decode_triton

        return mla_decode_triton(q_lat, q_rot, latent, rope, index.tables, index.lengths, index.slots, scale)
    return paged_kv_flat.mla_decode(q_lat, q_rot, latent, rope, index, scale)
