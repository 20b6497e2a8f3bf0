"""The KV tensors of one layer, written and read through a sequence's block table.

What a token stores per layer is the model's choice of components (engine.arch.architecture.KVComponent):
for MLA the normalised latent and the shared roped key, for GQA K and V per KV head. Each component
lives in one kernels.paged_kv.KVStore whose shapes and dtypes come from the format table
(kernels.formats). Attention always reads keys and values back through the store ("write, then
read"), so prefill, chunked prefill and decode all see exactly what a later decode step will see.
Formats that quantize a whole block at once keep the block being filled in full precision in the
sequence's staging slot until it is complete (KIVI's recent-token window).
"""

from __future__ import annotations

import torch

from engine.arch.architecture import KVComponent
from engine.errors import InvalidRequestError
from engine.kv.block_pool import BLOCK_SIZE, SeqBlocks
from kernels import paged_kv
from kernels.formats import KV, KV_DTYPES
from kernels.paged_kv import KVStore


def check_kv_dtype(kv_dtype: str) -> None:
    if kv_dtype not in KV_DTYPES:
        raise InvalidRequestError(
            "kv_cache_dtype", f"{kv_dtype!r} is unknown; use one of {', '.join(KV_DTYPES)}"
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


def layout_bytes(
    components: list[KVComponent], num_layers: int, kv_dtype: str, dense: torch.dtype
) -> tuple[int, int]:
    """(bytes of one block across all layers, bytes of one sequence's staging slot)."""
    check_kv_dtype(kv_dtype)
    probe = [ComponentStore(c, kv_dtype, 1, dense, "meta") for c in components]
    elem = torch.tensor([], dtype=dense).element_size()
    staging = sum(BLOCK_SIZE * c.width * elem for c, s in zip(components, probe, strict=True) if s.staged)
    return num_layers * sum(s.block_bytes() for s in probe), num_layers * staging


class LayerKV:
    """One layer's cache: a store per component, over the block ids the pool hands out."""

    def __init__(
        self,
        components: list[KVComponent],
        kv_dtype: str,
        num_blocks: int,
        dense: torch.dtype,
        device: torch.device,
        max_seqs: int,
    ):
        self.components, self.device = components, device
        self.stores = [ComponentStore(c, kv_dtype, num_blocks, dense, device, max_seqs) for c in components]

    def store(self, component: int) -> KVStore:
        return self.stores[component].store

    def write_read(
        self, seq: SeqBlocks, start: int, parts: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, ...]:
        """Store parts (each [n, width]) at positions start..start+n; dense views of 0..start+n."""
        n = parts[0].shape[0]
        end = start + n
        if end > seq.capacity:
            raise RuntimeError(f"sequence holds {seq.capacity} tokens of cache, asked to write up to {end}")
        table = torch.tensor(seq.block_table, device=self.device)
        positions = torch.arange(start, end, device=self.device)
        nb = -(-end // BLOCK_SIZE)
        out = []
        for comp, cs, x in zip(self.components, self.stores, parts, strict=True):
            x = x.reshape(n, comp.heads, comp.dim)
            if cs.staged:
                self._write_staged(cs.store, seq, start, x)
            else:
                paged_kv.write_tokens_ref(cs.store, table[positions // BLOCK_SIZE], positions % BLOCK_SIZE, x)
            dense = paged_kv.read_blocks_ref(cs.store, table[:nb])  # [nb, BLOCK, H, D]
            if cs.staged and end % BLOCK_SIZE:
                dense[nb - 1] = cs.store.staging[seq.slot]
            out.append(dense.reshape(nb * BLOCK_SIZE, comp.width)[:end])
        return tuple(out)

    def _write_staged(self, store: KVStore, seq: SeqBlocks, start: int, x: torch.Tensor) -> None:
        stage = store.staging[seq.slot]
        first = start - start % BLOCK_SIZE  # the tail block's first position
        tokens = torch.cat([stage[: start - first], x]) if start > first else x
        full = tokens.shape[0] // BLOCK_SIZE
        if full:
            blocks = torch.tensor(
                seq.block_table[first // BLOCK_SIZE : first // BLOCK_SIZE + full], device=self.device
            )
            paged_kv.write_blocks_ref(
                store, blocks, tokens[: full * BLOCK_SIZE].reshape(full, BLOCK_SIZE, *tokens.shape[1:])
            )
        rest = tokens[full * BLOCK_SIZE :]
        stage[: rest.shape[0]] = rest

    def decode_write(self, meta, parts: tuple[torch.Tensor, ...]) -> None:
        """Batched decode (engine.kv.batch.DecodeMeta): one new token per sequence at meta.pos,
        written through kernels.paged_kv (Triton on a GPU, flat slot indices on a CPU)."""
        b = meta.index.batch
        for comp, cs, x in zip(self.components, self.stores, parts, strict=True):
            paged_kv.decode_write(cs.store, meta.index, x.reshape(b, comp.heads, comp.dim))
