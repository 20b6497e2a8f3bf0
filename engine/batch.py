"""What one forward step runs: a flat batch of tokens from one or more sequences.

Decode metadata (block tables, positions, masks) is built once per step and shared by every
layer: per-layer rebuilding of small tensors is what dominates a decode step on a CPU. The batch
also carries the cache's per-layer tensor stores: a layer takes its own with `batch.kv(layer)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from engine.block_pool import BLOCK_SIZE, SeqBlocks
from engine.kv_store import LayerKV


@dataclass
class SeqSlice:
    """One sequence's share of a step: tokens [start, start+length) of the flat batch."""

    blocks: SeqBlocks  # its block table and staging slot
    start: int
    length: int
    past: int  # tokens of this sequence already in the cache (position of the first new token)

    @property
    def stop(self) -> int:
        return self.start + self.length


@dataclass
class DecodeMeta:
    """Sequences decoding one token each, gathered for batched reads of the paged cache."""

    seqs: list[SeqBlocks]
    rows: torch.Tensor  # their rows in the flat batch
    pos: torch.Tensor  # position of the new token (= tokens already cached)
    lengths: torch.Tensor  # pos + 1
    tables: torch.Tensor  # [B, max_blocks] block tables, padded with block 0
    tail: torch.Tensor  # block index of the new token
    offset: torch.Tensor  # its offset in that block
    slots: torch.Tensor | None  # staging slots (formats that stage the block being filled)
    hidden: torch.Tensor  # [B, max_blocks * BLOCK_SIZE]: positions a sequence must not see


class StepBatch:
    def __init__(self, slices: list[SeqSlice], device: torch.device, layers: Sequence[LayerKV] = ()):
        self.slices = slices
        self.device = device
        self.layers = layers
        self.decoding = [s for s in slices if s.length == 1]
        self.prefilling = [s for s in slices if s.length > 1]
        # every row is one decoding sequence, in order: layers skip gathering and scattering rows
        self.decode_only = not self.prefilling and all(s.start == i for i, s in enumerate(slices))

    def kv(self, layer: int) -> LayerKV:
        """The tensor store layer `layer` writes this step's keys and values to and reads from."""
        return self.layers[layer]

    @cached_property
    def decode(self) -> DecodeMeta | None:
        if not self.decoding:
            return None
        seqs = [s.blocks for s in self.decoding]
        dev = self.device
        pos_list = [s.past for s in self.decoding]
        max_blocks = -(-(max(pos_list) + 1) // BLOCK_SIZE)
        padded = [
            kv.block_table[:max_blocks] + [0] * (max_blocks - min(len(kv.block_table), max_blocks))
            for kv in seqs
        ]
        pos = torch.tensor(pos_list, device=dev)
        lengths = pos + 1
        slots = [kv.slot for kv in seqs]
        return DecodeMeta(
            seqs=seqs,
            rows=torch.tensor([s.start for s in self.decoding], device=dev),
            pos=pos,
            lengths=lengths,
            tables=torch.tensor(padded, dtype=torch.long, device=dev),
            tail=pos // BLOCK_SIZE,
            offset=pos % BLOCK_SIZE,
            slots=torch.tensor(slots, device=dev) if None not in slots else None,
            hidden=torch.arange(max_blocks * BLOCK_SIZE, device=dev)[None, :] >= lengths[:, None],
        )
