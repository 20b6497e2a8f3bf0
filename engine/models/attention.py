"""The attention scaffold both architectures share: write, then read, through the layer's store.

An architecture's attention projects its input into queries and the parts it caches, then calls
`attend`. Decoding rows (one new token each) run together in one paged-decode kernel call over
their block tables; each prefilling slice writes its tokens, reads its whole past back dense and
runs causally masked attention, with the architecture's own `scores` and `mix`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.arch.config import ModelConfig
from engine.kv.batch import StepBatch
from engine.kv.kv_store import LayerKV

Parts = tuple[torch.Tensor, ...]


def causal_probs(scores: torch.Tensor, past: int, length: int) -> torch.Tensor:
    """Softmax (in float32) of scores [..., length, past + length], each query seeing only itself
    and what precedes it."""
    q_pos = torch.arange(past, past + length, device=scores.device)[:, None]
    visible = torch.arange(past + length, device=scores.device)[None, :] <= q_pos
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)


class PagedAttention:
    """Base of MLAttention and GQAttention. A subclass sets `layer`, `heads`, `out_dim` (width
    of one head's output) and `scale`, names its paged-decode kernel (kernels.paged_kv) and
    implements `scores` and `mix`."""

    layer: int
    heads: int
    out_dim: int
    scale: float
    # (*queries, *component stores, kernels.paged_kv_flat.DecodeIndex, scale) -> [B, heads, out_dim]
    decode_kernel: Callable[..., torch.Tensor]

    @staticmethod
    def tensors(c: ModelConfig, prefix: str) -> dict[str, tuple[int, ...]]:
        """The checkpoint tensors of one layer's attention, with their shapes."""
        raise NotImplementedError

    @staticmethod
    def rotary_spec(c: ModelConfig) -> tuple[int, bool]:
        """(rotary dims per head, whether pairs are interleaved) of this architecture's RoPE."""
        raise NotImplementedError

    def scores(self, queries: Parts, cached: Parts) -> torch.Tensor:
        """Unscaled scores [..., l, t] of l queries against t cached tokens."""
        raise NotImplementedError

    def mix(self, probs: torch.Tensor, cached: Parts) -> torch.Tensor:
        """Probabilities [..., l, t] times cached values: [l, heads, out_dim]."""
        raise NotImplementedError

    def _decode(self, kv: LayerKV, meta, queries: Parts, parts: Parts) -> torch.Tensor:
        kv.decode_write(meta, parts)
        stores = [kv.store(i) for i in range(len(parts))]
        return self.decode_kernel(*queries, *stores, meta.index, self.scale)

    def attend(self, batch: StepBatch, queries: Parts, parts: Parts) -> torch.Tensor:
        """Attention output [n, heads, out_dim] for the step's n rows; `parts` are written to the
        cache (each [n, width] in the component order of the layer's store)."""
        kv, meta = batch.kv(self.layer), batch.decode
        if batch.decode_only:  # the common case: no rows to gather or scatter
            return self._decode(kv, meta, queries, parts)
        q0 = queries[0]
        out = torch.empty(q0.shape[0], self.heads, self.out_dim, dtype=q0.dtype, device=q0.device)
        if meta is not None:  # one new token each: a single batched pass over the block tables
            rows = meta.rows
            out[rows] = self._decode(kv, meta, tuple(q[rows] for q in queries), tuple(p[rows] for p in parts))
        for s in batch.prefilling:
            rows = slice(s.start, s.stop)
            cached = kv.write_read(s.blocks, s.past, tuple(p[rows] for p in parts))
            scores = self.scores(tuple(q[rows] for q in queries), cached) * self.scale
            out[rows] = self.mix(causal_probs(scores, s.past, s.length), cached)
        return out
