"""What one forward step runs: a flat batch of tokens from one or more sequences.

Decode metadata (block tables, positions, flat slot indices, the mask) is built once per step, in
one host-to-tensor copy, and shared by every layer: per-layer rebuilding of small tensors is what
dominates a decode step on a CPU. The batch
also carries the cache's per-layer tensor stores: a layer takes its own with `batch.kv(layer)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from engine.kv.block_pool import BLOCK_SIZE, SeqBlocks
from engine.kv.kv_store import LayerKV
from kernels.paged_kv_flat import DecodeIndex, decode_index


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
    """Sequences decoding one token each, gathered for batched reads of the paged cache: their
    block tables, positions and flat slot indices as one kernels.paged_kv_flat.DecodeIndex."""

    seqs: list[SeqBlocks]
    rows: torch.Tensor  # their rows in the flat batch
    index: DecodeIndex

    @property
    def tables(self) -> torch.Tensor:  # [B, max_blocks] block tables, padded with block 0
        return self.index.tables

    @property
    def pos(self) -> torch.Tensor:  # position of the new token (= tokens already cached)
        return self.index.pos

    @property
    def lengths(self) -> torch.Tensor:  # pos + 1
        return self.index.lengths

    @property
    def slots(self) -> torch.Tensor | None:  # staging slots (formats that stage the block being filled)
        return self.index.slots

    @property
    def hidden(self) -> torch.Tensor:  # [B, max_blocks * BLOCK_SIZE]: positions a sequence must not see
        return self.index.mask[:, 0] != 0


class StepBatch:
    def __init__(self, slices: list[SeqSlice], device: torch.device, layers: Sequence[LayerKV] = ()):
        self.slices = slices
        self.device = device
        self.layers = layers
        self.decoding = [s for s in slices if s.length == 1]
        self.prefilling = [s for s in slices if s.length > 1]
        # every row is one decoding sequence, in order: layers skip gathering and scattering rows
        self.decode_only = not self.prefilling and all(s.start == i for i, s in enumerate(slices))
        self.real_rows: torch.Tensor | None = None  # every row is real (a compiled step pads its batch)

    def kv(self, layer: int) -> LayerKV:
        """The tensor store layer `layer` writes this step's keys and values to and reads from."""
        return self.layers[layer]

    @cached_property
    def decode(self) -> DecodeMeta | None:
        if not self.decoding:
            return None
        seqs = [s.blocks for s in self.decoding]
        pos = [s.past for s in self.decoding]
        max_blocks = -(-(max(pos) + 1) // BLOCK_SIZE)
        padded = [
            kv.block_table[:max_blocks] + [0] * (max_blocks - min(len(kv.block_table), max_blocks))
            for kv in seqs
        ]
        index = decode_index(padded, pos, [kv.slot for kv in seqs], self.device)
        rows = index.pos.new_tensor([s.start for s in self.decoding])
        return DecodeMeta(seqs=seqs, rows=rows, index=index)
