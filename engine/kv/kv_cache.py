"""Paged, optionally quantized KV cache: a block pool plus one tensor store per layer.

Blocks of BLOCK_SIZE tokens are handed out by an engine.kv.block_pool.BlockPool (ids, reference
counts, hashes; what the scheduling policy sees); the tensors live in one engine.kv.kv_store.LayerKV
per layer (what attention reads and writes, handed to each layer through the step batch).
Capacity comes from a byte budget, so a smaller KV dtype admits proportionally more sequences;
staging slots (formats that quantize whole blocks) are charged to the same budget.
"""

from __future__ import annotations

import math

import torch

from engine.arch.architecture import KVComponent
from engine.errors import InvalidRequestError
from engine.kv.block_pool import BLOCK_SIZE, BlockPool, SeqBlocks
from engine.kv.kv_store import LayerKV, check_kv_dtype, layout_bytes
from kernels.formats import KV_DTYPES
from kernels.paged_kv import KVStore

KV_CACHE_DTYPES = KV_DTYPES  # the format table's KV entries
SeqKV = SeqBlocks  # the per-sequence handle's former name

__all__ = [
    "BLOCK_SIZE",
    "KV_CACHE_DTYPES",
    "KVComponent",
    "PagedKVCache",
    "SeqKV",
    "check_kv_dtype",
]


class PagedKVCache:
    def __init__(
        self,
        components: list[KVComponent],
        num_layers: int,
        kv_dtype: str,
        budget_bytes: int,
        dense: torch.dtype,
        device: torch.device,
        max_seqs: int = 256,
    ):
        check_kv_dtype(kv_dtype)
        self.components, self.num_layers, self.kv_dtype = components, num_layers, kv_dtype
        self.dense, self.device, self.max_seqs = dense, device, max_seqs
        self.block_bytes, self.staging_bytes = layout_bytes(components, num_layers, kv_dtype, dense)
        # A running sequence holds its staging slot's bytes as reserved blocks.
        staging_blocks = math.ceil(self.staging_bytes / self.block_bytes) if self.staging_bytes else 0
        num_blocks = int(budget_bytes // self.block_bytes)
        if num_blocks < 1 + staging_blocks:
            raise InvalidRequestError(
                "kv_cache_bytes",
                f"{budget_bytes} bytes hold no complete block; one block takes {self.block_bytes}",
            )
        self.pool = BlockPool(num_blocks, max_seqs, staging_blocks)
        # one block and one staging slot past the pool's, never handed out: where the padding rows
        # of a compiled decode step (engine.step.compiled_step) write and read
        self.scratch_block, self.scratch_slot = num_blocks, max_seqs
        self.layers = [
            LayerKV(components, kv_dtype, num_blocks + 1, dense, device, max_seqs + 1)
            for _ in range(num_layers)
        ]

    layout_bytes = staticmethod(layout_bytes)

    # --- accounting (the pool's counts, for callers that hold the cache) ---------------------------

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def staging_blocks(self) -> int:
        return self.pool.staging_blocks

    @property
    def free_blocks(self) -> int:
        return self.pool.free_blocks

    @property
    def used_blocks(self) -> int:
        return self.pool.used_blocks

    def blocks_for(self, tokens: int) -> int:
        return self.pool.blocks_for(tokens)

    def new_sequence(self) -> SeqBlocks:
        return self.pool.new_sequence()

    def bytes_per_token(self) -> float:
        """Bytes one token costs across all layers, scales included (staging excluded)."""
        return self.block_bytes / BLOCK_SIZE

    def bytes_per_token_per_layer(self) -> float:
        return self.bytes_per_token() / self.num_layers

    # --- tensors ----------------------------------------------------------------------------------

    def store(self, layer: int, component: int) -> KVStore:
        return self.layers[layer].store(component)

    def write(self, seq: SeqBlocks, layer: int, start: int, *parts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One layer's LayerKV.write_read (tests and tools; models use the step batch's stores)."""
        return self.layers[layer].write_read(seq, start, parts)
