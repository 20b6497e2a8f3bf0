"""Batched paged decode on the CPU from flat indices computed once per step.

A store's blocks viewed flat are one array of token rows (data [num_blocks * BLOCK, H, D]), and a
staging tensor one array of [slots * BLOCK] rows. A decode step knows on the host where every new
token goes and which blocks every sequence reads, so `DecodeIndex` holds those as index tensors,
built once per step and shared by every layer. Each layer then writes a component with one
`index_copy_` (plus its scales'), reads it with one `index_select` over whole blocks, and runs
attention as a few batched ops over all sequences: no per-layer index arithmetic, no host syncs,
no per-sequence gathers. The references in kernels.paged_kv stay the definition these are checked
against (tests/unit/test_paged_kv_flat.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.formats import KV, KV_BLOCK

BLOCK = KV_BLOCK


@dataclass
class DecodeIndex:
    """Where B decoding sequences' new tokens go and what they read, as tensors."""

    tables: torch.Tensor  # [B, nb] block tables, padded with block 0
    pos: torch.Tensor  # [B] position of the new token (= tokens already cached)
    lengths: torch.Tensor  # [B] pos + 1
    slots: torch.Tensor | None  # [B] staging slots (None when a sequence has none)
    write_rows: torch.Tensor  # [B] flat token row of each new token: block * BLOCK + offset
    blocks: torch.Tensor  # [B * nb] the tables flattened, the blocks one read gathers
    mask: torch.Tensor  # [B, 1, T] additive: 0 where a sequence sees a position, -inf past its end
    # staged formats (slots set): the new token's row in the flat staging tensor ...
    staging_rows: torch.Tensor | None
    # ... the sequences whose block fills up this step (its block id, its staging slot) ...
    full_blocks: torch.Tensor | None
    full_slots: torch.Tensor | None
    # ... and the others, whose tail block a read takes from staging (index into [B * nb] blocks)
    tail_blocks: torch.Tensor | None
    tail_slots: torch.Tensor | None

    @property
    def batch(self) -> int:
        return self.tables.shape[0]

    # the attention functions below write and read through their index: this one's, or a
    # compiled step's kernels.paged_kv_static.StaticDecodeIndex
    def write(self, store, x: torch.Tensor) -> None:
        write(store, self, x)

    def read(self, store) -> torch.Tensor:
        return read(store, self)


def decode_index(
    tables: list[list[int]], pos: list[int], slots: list[int | None], device: torch.device
) -> DecodeIndex:
    """The step's index from host lists: `tables` already padded to one length."""
    b, nb = len(tables), len(tables[0])
    staged = None not in slots
    ints: list[int] = [v for row in tables for v in row]  # one host-to-tensor copy for everything
    ints += pos
    ints += [row[p // BLOCK] * BLOCK + p % BLOCK for row, p in zip(tables, pos, strict=True)]
    full: list[int] = []
    tail: list[int] = []
    if staged:
        ints += [s * BLOCK + p % BLOCK for s, p in zip(slots, pos, strict=True)]
        full = [i for i, p in enumerate(pos) if p % BLOCK == BLOCK - 1]
        tail = [i for i, p in enumerate(pos) if p % BLOCK != BLOCK - 1]
        ints += [tables[i][pos[i] // BLOCK] for i in full] + [slots[i] for i in full]
        ints += [i * nb + pos[i] // BLOCK for i in tail] + [slots[i] for i in tail]
        ints += slots
    flat = torch.tensor(ints, dtype=torch.long, device=device)
    parts = [b * nb, b, b]
    if staged:
        parts += [b, len(full), len(full), len(tail), len(tail), b]
    views = list(flat.split(parts))
    blocks, pos_t, write_rows = views[:3]
    lengths = pos_t + 1
    t = nb * BLOCK
    hidden = torch.arange(t, device=device)[None, :] >= lengths[:, None]
    mask = torch.zeros(b, 1, t, device=device).masked_fill_(hidden[:, None, :], float("-inf"))

    def some(x: torch.Tensor) -> torch.Tensor | None:
        return x if x.numel() else None

    staging_rows = full_blocks = full_slots = tail_blocks = tail_slots = slots_t = None
    if staged:
        staging_rows, full_blocks, full_slots, tail_blocks, tail_slots, slots_t = views[3:]
        full_blocks, full_slots = some(full_blocks), some(full_slots)
        tail_blocks, tail_slots = some(tail_blocks), some(tail_slots)
    return DecodeIndex(
        tables=blocks.view(b, nb),
        pos=pos_t,
        lengths=lengths,
        slots=slots_t,
        write_rows=write_rows,
        blocks=blocks,
        mask=mask,
        staging_rows=staging_rows,
        full_blocks=full_blocks,
        full_slots=full_slots,
        tail_blocks=tail_blocks,
        tail_slots=tail_slots,
    )


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[n, BLOCK, ...] viewed as [n * BLOCK, ...]: one row per token."""
    return t.view(-1, *t.shape[2:])


def _copy_into(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> None:
    """dst[index] = src along dim 0 in one op (float8 through its bytes: CPU index_copy_ lacks it)."""
    if dst.element_size() == 1 and dst.dtype not in (torch.uint8, torch.int8):
        dst, src = dst.view(torch.uint8), src.view(torch.uint8)
    dst.index_copy_(0, index, src)


def write_tokens(store, layout, rows: torch.Tensor, x: torch.Tensor) -> None:
    """A format that stores token by token: x [n, H, D] (quantized per token) at flat token rows."""
    if layout.quantize is None:  # dense
        _copy_into(_rows(store.data), rows, x.to(store.data.dtype))
        return
    q, s = layout.quantize(x)
    _copy_into(_rows(store.data), rows, q)
    _rows(store.scale).index_copy_(0, rows, s)


def read_blocks(store, blocks: torch.Tensor) -> torch.Tensor:
    """Dense [len(blocks), BLOCK, H, D] of the stored blocks (staging not consulted)."""
    data = store.data.index_select(0, blocks)
    dequantize = KV[store.fmt].layout(store.style).dequantize
    if dequantize is None:
        return data if data.dtype == store.dense else data.to(store.dense)
    return dequantize(data, store.scale.index_select(0, blocks), store.dense)


def write(store, index: DecodeIndex, x: torch.Tensor) -> None:
    """One new token per sequence (x [B, H, D]) into a kernels.paged_kv.KVStore; a staged format
    fills the staging slot and quantizes the blocks it completes."""
    layout = KV[store.fmt].layout(store.style)
    if store.staging is None:
        write_tokens(store, layout, index.write_rows, x)
        return
    _rows(store.staging).index_copy_(0, index.staging_rows, x.to(store.staging.dtype))
    if index.full_blocks is not None:
        q, s = layout.quantize(store.staging.index_select(0, index.full_slots))
        _copy_into(store.data, index.full_blocks, q)
        store.scale.index_copy_(0, index.full_blocks, s)


def read(store, index: DecodeIndex) -> torch.Tensor:
    """Dense [B, nb * BLOCK, H, D] of every sequence's blocks (positions past its length: garbage,
    masked by index.mask); a staged format's partial tail block comes from staging."""
    dense = read_blocks(store, index.blocks)
    if index.tail_blocks is not None and store.staging is not None:
        dense.index_copy_(0, index.tail_blocks, store.staging.index_select(0, index.tail_slots))
    return dense.view(index.batch, -1, *dense.shape[2:])


def _mask(index, dtype: torch.dtype) -> torch.Tensor:
    return index.mask if index.mask.dtype == dtype else index.mask.to(dtype)


def gqa_decode(q: torch.Tensor, k, v, index, scale: float) -> torch.Tensor:
    """q [B, H, D] against each sequence's cached K/V; -> [B, H, D]. Each KV head's group of query
    heads is one batch row of torch's fused attention (its CPU kernel: no [B, H, T] round trips)."""
    k_all, v_all = index.read(k), index.read(v)  # [B, T, KVH, D]
    b, _, kvh, d = k_all.shape
    out = F.scaled_dot_product_attention(
        q.view(b, kvh, -1, d),
        k_all.transpose(1, 2),
        v_all.transpose(1, 2),
        attn_mask=_mask(index, q.dtype)[:, None],  # [B, 1, 1, T]
        scale=scale,
    )
    return out.reshape(b, -1, d)


def mla_decode(q_lat: torch.Tensor, q_rot: torch.Tensor, latent, rope, index, scale: float) -> torch.Tensor:
    """Absorbed MLA over the cached latent: softmax(scale * (q_lat.latent + q_rot.rope)) . latent;
    -> [B, H, R]. The mask enters as baddbmm's input, so scores take two fused ops."""
    lat = index.read(latent)[:, :, 0]  # [B, T, R]
    rot = index.read(rope)[:, :, 0]
    scores = torch.baddbmm(_mask(index, q_lat.dtype), q_lat, lat.transpose(1, 2), alpha=scale)
    scores = torch.baddbmm(scores, q_rot, rot.transpose(1, 2), alpha=scale)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if probs.dtype != lat.dtype:
        probs = probs.to(lat.dtype)
    return torch.bmm(probs, lat)
