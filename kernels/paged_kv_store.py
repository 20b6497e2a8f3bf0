"""One component of one layer's paged KV cache as raw tensors: the type kernels.paged_kv's
references and kernels.paged_kv_triton's kernels both take (its own module, so neither imports
the other for it).

`data` has shape [num_blocks, BLOCK, heads, dim] (int4: dim/2 bytes), `scale` its scales (layout
per format, see kernels.kv_quant), and for formats that quantize whole blocks `staging`
[slots, BLOCK, heads, dim] in the dense dtype holds each sequence's block being filled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.formats import KV_BLOCK

BLOCK = KV_BLOCK  # tokens per block


@dataclass
class KVStore:
    fmt: str  # "auto" | "bf16" | "fp8" | "int8" | "int4"
    style: str  # "key" (int4: per channel per block) | "value" (int4: per token, groups of 32)
    dense: torch.dtype  # dtype attention computes in
    data: torch.Tensor
    scale: torch.Tensor | None
    staging: torch.Tensor | None  # set when the format stages the block being filled

    @property
    def staged(self) -> bool:
        return self.staging is not None
