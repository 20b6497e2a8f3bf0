"""What one forward step runs: a flat batch of tokens from one or more sequences."""

from __future__ import annotations

from dataclasses import dataclass

from engine.kv_cache import SequenceKVCache


@dataclass
class SeqSlice:
    """One sequence's share of a step: tokens [start, start+length) of the flat batch."""

    cache: SequenceKVCache
    start: int
    length: int
    past: int  # tokens of this sequence already in the cache (position of the first new token)

    @property
    def stop(self) -> int:
        return self.start + self.length
