"""Paged, optionally quantized KV cache.

Blocks of BLOCK_SIZE tokens live in one pool per layer and component; each sequence has a block
table. Capacity comes from a byte budget, so a smaller KV dtype admits proportionally more
sequences. What a token stores per layer is the model's choice of components: for MLA the
normalised latent and the shared roped key (not per-head keys and values); for GQA, K and V per
KV head.

Attention always reads keys and values back through the cache ("write, then read"), so prefill,
chunked prefill and decode all see exactly the values a later decode step will see.
Formats that quantize a whole block at once (fp8; int4's key-like parts) keep the block being
filled in full precision in a per-sequence staging slot until it is complete (KIVI's recent-token
window); the slot's bytes are charged to the same budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from engine.errors import InvalidRequestError
from kernels import paged_kv
from kernels.formats import KV, KV_BLOCK, KV_DTYPES
from kernels.paged_kv import KVStore

BLOCK_SIZE = KV_BLOCK
KV_CACHE_DTYPES = KV_DTYPES  # the format table's KV entries


@dataclass(frozen=True)
class KVComponent:
    """One thing a token caches per layer: `heads` x `dim` values, key-like or value-like."""

    name: str
    heads: int
    dim: int
    style: Literal["key", "value"]

    @property
    def width(self) -> int:
        return self.heads * self.dim


def check_kv_dtype(kv_dtype: str) -> None:
    if kv_dtype not in KV_CACHE_DTYPES:
        raise InvalidRequestError(
            "kv_cache_dtype", f"{kv_dtype!r} is unknown; use one of {', '.join(KV_CACHE_DTYPES)}"
        )


class ComponentStore:
    """All blocks of one component in one layer, in one storage format (a kernels.paged_kv.KVStore)."""

    def __init__(
        self, comp: KVComponent, kv_dtype: str, num_blocks: int, dense: torch.dtype, device, max_seqs: int = 0
    ):
        self.comp, self.kv_dtype, self.dense = comp, kv_dtype, dense
        h, d, b = comp.heads, comp.dim, BLOCK_SIZE
        fmt = KV[kv_dtype]  # shapes and dtypes from the format table
        if d % fmt.dim_multiple:
            raise InvalidRequestError(
                "kv_cache_dtype",
                f"{kv_dtype} needs {comp.name} dims divisible by {fmt.dim_multiple}, got {d}",
            )
        self.staged = fmt.layout(comp.style).staged
        data = torch.zeros(fmt.data_shape(num_blocks, h, d), dtype=fmt.storage_dtype(dense), device=device)
        shape = fmt.scale_shape(comp.style, num_blocks, h, d)
        scale = torch.ones(shape, dtype=fmt.scale_dtype, device=device) if shape is not None else None
        staging = torch.zeros(max_seqs, b, h, d, dtype=dense, device=device) if self.staged else None
        self.store = KVStore(kv_dtype, comp.style, dense, data, scale, staging)

    def block_bytes(self) -> int:
        """Exact bytes of one block of this component, scales included."""
        data, scale = self.store.data, self.store.scale
        per = data[0].numel() * data.element_size()
        if scale is not None:
            per += scale[0].numel() * scale.element_size()
        return per

    def write_tokens(self, blocks: torch.Tensor, offsets: torch.Tensor, x: torch.Tensor) -> None:
        paged_kv.write_tokens_ref(self.store, blocks, offsets, x)

    def write_blocks(self, blocks: torch.Tensor, x: torch.Tensor) -> None:
        paged_kv.write_blocks_ref(self.store, blocks, x)

    def read_blocks(self, blocks: torch.Tensor) -> torch.Tensor:
        return paged_kv.read_blocks_ref(self.store, blocks)


@dataclass
class SeqKV:
    """One sequence's view of the cache: its block table and staging slot."""

    cache: PagedKVCache
    block_table: list[int] = field(default_factory=list)
    slot: int | None = None
    length: int = 0  # tokens committed (visible to every layer)

    @property
    def capacity(self) -> int:
        return len(self.block_table) * BLOCK_SIZE

    def write(self, layer: int, start: int, *parts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Store parts (each [n, width]) at positions start..start+n; dense views of 0..start+n."""
        return self.cache.write_read(self, layer, start, parts)


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
        self.dense, self.device = dense, device
        self.block_bytes, self.staging_bytes = self.layout_bytes(components, num_layers, kv_dtype, dense)
        # A running sequence holds its staging slot's bytes as reserved blocks.
        self.staging_blocks = math.ceil(self.staging_bytes / self.block_bytes) if self.staging_bytes else 0
        self.num_blocks = int(budget_bytes // self.block_bytes)
        if self.num_blocks < 1 + self.staging_blocks:
            raise InvalidRequestError(
                "kv_cache_bytes",
                f"{budget_bytes} bytes hold no complete block; one block takes {self.block_bytes}",
            )
        self.stores = [
            [ComponentStore(c, kv_dtype, self.num_blocks, dense, device, max_seqs) for c in components]
            for _ in range(num_layers)
        ]

        self.max_seqs = max_seqs
        self._free_blocks = list(range(self.num_blocks - 1, -1, -1))
        self._free_slots = list(range(max_seqs - 1, -1, -1))
        self._reserved = 0  # blocks held back for staging slots

    @staticmethod
    def layout_bytes(components: list[KVComponent], num_layers: int, kv_dtype: str, dense: torch.dtype):
        """(bytes of one block across all layers, bytes of one sequence's staging slot)."""
        check_kv_dtype(kv_dtype)
        probe = [ComponentStore(c, kv_dtype, 1, dense, "meta") for c in components]
        elem = torch.tensor([], dtype=dense).element_size()
        staging = sum(BLOCK_SIZE * c.width * elem for c, s in zip(components, probe, strict=True) if s.staged)
        return num_layers * sum(s.block_bytes() for s in probe), num_layers * staging

    # --- accounting -----------------------------------------------------------------------------

    def bytes_per_token(self) -> float:
        """Bytes one token costs across all layers, scales included (staging excluded)."""
        return self.block_bytes / BLOCK_SIZE

    def bytes_per_token_per_layer(self) -> float:
        return self.bytes_per_token() / self.num_layers

    @property
    def free_blocks(self) -> int:
        return len(self._free_blocks) - self._reserved

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free_blocks)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // BLOCK_SIZE)

    def new_sequence(self) -> SeqKV:
        return SeqKV(self)

    def held(self, seq: SeqKV) -> int:
        return len(seq.block_table)

    def blocks_needed(self, seq: SeqKV, tokens: int) -> int:
        """Free blocks grow(seq, tokens) takes; more than the cache holds without a staging slot."""
        need = max(0, self.blocks_for(tokens) - len(seq.block_table))
        if seq.slot is None:
            if not self._free_slots:
                return self.num_blocks + 1
            need += self.staging_blocks
        return need

    def can_grow(self, seq: SeqKV, tokens: int) -> bool:
        return self.blocks_needed(seq, tokens) <= self.free_blocks

    def grow(self, seq: SeqKV, tokens: int) -> bool:
        """Make room for `tokens` tokens in total; False (and no change) when blocks run out."""
        if not self.can_grow(seq, tokens):
            return False
        if seq.slot is None:
            seq.slot = self._free_slots.pop()
            self._reserved += self.staging_blocks
        while len(seq.block_table) < self.blocks_for(tokens):
            seq.block_table.append(self._free_blocks.pop())
        return True

    def release(self, seq: SeqKV) -> None:
        self._free_blocks.extend(reversed(seq.block_table))
        seq.block_table = []
        if seq.slot is not None:
            self._free_slots.append(seq.slot)
            self._reserved -= self.staging_blocks
            seq.slot = None
        seq.length = 0

    # --- data path --------------------------------------------------------------------------------

    def write_read(
        self, seq: SeqKV, layer: int, start: int, parts: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, ...]:
        n = parts[0].shape[0]
        end = start + n
        if end > seq.capacity:
            raise RuntimeError(f"sequence holds {seq.capacity} tokens of cache, asked to write up to {end}")
        table = torch.tensor(seq.block_table, device=self.device)
        positions = torch.arange(start, end, device=self.device)
        out = []
        for i, (store, x) in enumerate(zip(self.stores[layer], parts, strict=True)):
            comp = self.components[i]
            x = x.reshape(n, comp.heads, comp.dim)
            if store.staged:
                self._write_staged(layer, i, store, seq, start, x)
            else:
                store.write_tokens(table[positions // BLOCK_SIZE], positions % BLOCK_SIZE, x)
            nb = self.blocks_for(end)
            dense = store.read_blocks(table[:nb])  # [nb, BLOCK, H, D]
            if store.staged and end % BLOCK_SIZE:
                dense[nb - 1] = store.store.staging[seq.slot]
            out.append(dense.reshape(nb * BLOCK_SIZE, comp.width)[:end])
        return tuple(out)

    def _write_staged(
        self, layer: int, i: int, store: ComponentStore, seq: SeqKV, start: int, x: torch.Tensor
    ):
        stage = store.store.staging[seq.slot]
        first = start - start % BLOCK_SIZE  # the tail block's first position
        tokens = torch.cat([stage[: start - first], x]) if start > first else x
        full = tokens.shape[0] // BLOCK_SIZE
        if full:
            blocks = torch.tensor(
                seq.block_table[first // BLOCK_SIZE : first // BLOCK_SIZE + full], device=self.device
            )
            store.write_blocks(
                blocks, tokens[: full * BLOCK_SIZE].reshape(full, BLOCK_SIZE, *tokens.shape[1:])
            )
        rest = tokens[full * BLOCK_SIZE :]
        stage[: rest.shape[0]] = rest

    def store(self, layer: int, component: int) -> KVStore:
        return self.stores[layer][component].store

    def decode_write(self, meta, layer: int, parts: tuple[torch.Tensor, ...]) -> None:
        """Batched decode (engine.batch.DecodeMeta): one new token per sequence at meta.pos,
        written through kernels.paged_kv (Triton on a GPU, the torch reference on a CPU)."""
        b = meta.tables.shape[0]
        for comp, store, x in zip(self.components, self.stores[layer], parts, strict=True):
            paged_kv.decode_write(
                store.store, meta.tables, meta.pos, meta.slots, x.reshape(b, comp.heads, comp.dim)
            )
