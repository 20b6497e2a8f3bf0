"""What a model architecture caches per token (and, below, the rest of its description).

Torch-free, so the planner and the roofline can describe a model without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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
