"""Per-sequence KV cache (contiguous, grown by doubling).

For MLA the cached entry per token is the normalised latent plus the roped shared key
(kv_lora_rank + qk_rope_head_dim values), not per-head keys and values: that is the point of MLA.
The paged, quantized cache of the serving issue replaces this behind the same `write` call.
"""

from __future__ import annotations

import torch


class SequenceKVCache:
    def __init__(
        self,
        num_layers: int,
        widths: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        capacity: int = 64,
    ):
        self.widths = widths
        self.length = 0  # tokens committed (visible to every layer)
        self._layers = [
            torch.empty(capacity, sum(widths), dtype=dtype, device=device) for _ in range(num_layers)
        ]

    @property
    def capacity(self) -> int:
        return self._layers[0].shape[0]

    def bytes_per_token(self) -> int:
        return sum(self.widths) * self._layers[0].element_size() * len(self._layers)

    def write(self, layer: int, start: int, *parts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Store `parts` (each [n, width]) at positions start..start+n; return views of 0..start+n."""
        n = parts[0].shape[0]
        end = start + n
        buf = self._layers[layer]
        if end > buf.shape[0]:
            grown = torch.empty(max(end, 2 * buf.shape[0]), buf.shape[1], dtype=buf.dtype, device=buf.device)
            grown[:start] = buf[:start]
            self._layers[layer] = buf = grown
        buf[start:end] = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
        return tuple(buf[:end].split(self.widths, dim=-1))

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)
