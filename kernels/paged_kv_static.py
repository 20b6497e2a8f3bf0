"""Paged decode on the CPU with every shape fixed by a (batch, blocks) bucket: the KV side of a
compiled decode step (engine.step.compiled_step).

kernels.paged_kv_flat builds its index from the step's sequences, so its shapes and even which
tensors exist (sequences whose block fills up this step, sequences with a partial tail) change
from step to step. A compiled graph is specialised on shapes and on which inputs are None, so
here every field is a tensor of a shape the bucket fixes:

- the batch is padded to `rows` with rows that write to a scratch block and staging slot the
  block pool never hands out (engine.kv.kv_cache), and read that block: their output is discarded;
- block tables are padded to `blocks` with that scratch block, hidden by the mask;
- a staged format quantizes every row's staging slot each step and keeps the result only where
  the row's block filled up (a `where` against the stored block), and every row's tail block is
  read from staging where it is still partial: no branch on data.

The values written and read are those of kernels.paged_kv_flat (tests/unit/test_paged_kv_static.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.formats import KV, KV_BLOCK
from kernels.paged_kv_flat import _copy_into, _rows, read_blocks, write_tokens

BLOCK = KV_BLOCK


@dataclass
class StaticDecodeIndex:
    """A decode step's KV addressing for `batch` rows (real ones first, then padding) over
    `tables.shape[1]` blocks each."""

    tables: torch.Tensor  # [R, nb] block tables; padding: the scratch block
    pos: torch.Tensor  # [R] position of the new token
    write_rows: torch.Tensor  # [R] flat token row of each new token
    blocks: torch.Tensor  # [R * nb] the tables flattened
    mask: torch.Tensor  # [R, 1, T] additive: 0 where a row sees a position, -inf elsewhere
    slots: torch.Tensor  # [R] staging slot of each row (padding: the scratch slot)
    staging_rows: torch.Tensor  # [R] the new token's row in the flat staging tensor
    tail_blocks: torch.Tensor  # [R] block id the new token lands in
    tail_flat: torch.Tensor  # [R] that block's index in `blocks`
    full: torch.Tensor  # [R] bool: the new token fills its block (a staged format seals it)
    real_rows: torch.Tensor  # [1] how many leading rows are real (the rest padding)

    @property
    def batch(self) -> int:
        return self.tables.shape[0]

    def write(self, store, x: torch.Tensor) -> None:
        write(store, self, x)

    def read(self, store) -> torch.Tensor:
        return read(store, self)


def static_index(
    tables: list[list[int]],
    pos: list[int],
    slots: list[int],
    rows: int,
    blocks: int,
    scratch_block: int,
    scratch_slot: int,
    device: torch.device,
) -> StaticDecodeIndex:
    """The index of len(tables) real rows padded to `rows` rows of `blocks` blocks each. A padding
    row sits at position 0 of the scratch block and slot."""
    pad = rows - len(tables)
    if pad < 0 or any(len(t) > blocks for t in tables):
        raise ValueError(f"{len(tables)} rows of up to {max(map(len, tables))} blocks exceed the bucket")
    table_rows = [t + [scratch_block] * (blocks - len(t)) for t in tables] + [[scratch_block] * blocks] * pad
    pos = pos + [0] * pad
    slots = slots + [scratch_slot] * pad
    tail = [p // BLOCK for p in pos]
    ints: list[int] = [v for row in table_rows for v in row]
    ints += pos
    ints += [row[t] * BLOCK + p % BLOCK for row, t, p in zip(table_rows, tail, pos, strict=True)]
    ints += slots
    ints += [s * BLOCK + p % BLOCK for s, p in zip(slots, pos, strict=True)]
    ints += [row[t] for row, t in zip(table_rows, tail, strict=True)]
    ints += [i * blocks + t for i, t in enumerate(tail)]
    ints += [int(p % BLOCK == BLOCK - 1) for p in pos]
    ints.append(rows - pad)
    flat = torch.tensor(ints, dtype=torch.long, device=device)
    flat_blocks, pos_t, write_rows, slots_t, staging_rows, tail_blocks, tail_flat, full, real = flat.split(
        [rows * blocks, rows, rows, rows, rows, rows, rows, rows, 1]
    )
    t = blocks * BLOCK
    hidden = torch.arange(t, device=device)[None, :] > pos_t[:, None]
    mask = torch.zeros(rows, 1, t, device=device).masked_fill_(hidden[:, None, :], float("-inf"))
    return StaticDecodeIndex(
        tables=flat_blocks.view(rows, blocks),
        pos=pos_t,
        write_rows=write_rows,
        blocks=flat_blocks,
        mask=mask,
        slots=slots_t,
        staging_rows=staging_rows,
        tail_blocks=tail_blocks,
        tail_flat=tail_flat,
        full=full.bool(),
        real_rows=real,
    )


def _where_rows(keep: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """new where keep[row] else old, for [R, ...] tensors of any dtype (float8 through its bytes)."""
    if new.element_size() == 1 and new.dtype not in (torch.uint8, torch.int8):
        return torch.where(
            keep.view(-1, *[1] * (new.dim() - 1)), new.view(torch.uint8), old.view(torch.uint8)
        ).view(new.dtype)
    return torch.where(keep.view(-1, *[1] * (new.dim() - 1)), new, old)


def write(store, index: StaticDecodeIndex, x: torch.Tensor) -> None:
    """One new token per row (x [R, H, D]) into a kernels.paged_kv.KVStore, as
    kernels.paged_kv_flat.write stores it."""
    layout = KV[store.fmt].layout(store.style)
    if store.staging is None:
        write_tokens(store, layout, index.write_rows, x)
        return
    _rows(store.staging).index_copy_(0, index.staging_rows, x.to(store.staging.dtype))
    q, s = layout.quantize(store.staging.index_select(0, index.slots))
    old_q = store.data.index_select(0, index.tail_blocks)
    old_s = store.scale.index_select(0, index.tail_blocks)
    _copy_into(store.data, index.tail_blocks, _where_rows(index.full, q, old_q))
    store.scale.index_copy_(0, index.tail_blocks, _where_rows(index.full, s, old_s))


def read(store, index: StaticDecodeIndex) -> torch.Tensor:
    """Dense [R, nb * BLOCK, H, D] of every row's blocks, a staged format's partial tail block
    from staging (positions past a row's length: garbage, masked by index.mask)."""
    dense = read_blocks(store, index.blocks)
    if store.staging is not None:
        staged = store.staging.index_select(0, index.slots).to(dense.dtype)
        tails = dense.index_select(0, index.tail_flat)
        dense = dense.index_copy(0, index.tail_flat, _where_rows(~index.full, staged, tails))
    return dense.view(index.batch, -1, *dense.shape[2:])
