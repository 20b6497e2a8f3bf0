"""The engine's block accounting without block ids or tensors, for the capacity simulator."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from engine.policy_types import BLOCK_TOKENS


class CountHandle:
    """One sequence's blocks in `BlockCounts`: how many, and whether it holds a staging slot."""

    __slots__ = ("blocks", "slot")

    def __init__(self) -> None:
        self.blocks = 0
        self.slot = False


class BlockCounts:
    """The engine's block accounting without block ids or tensors, for the simulator: the same
    number of blocks, the same staging reservation and slot limit, so grow/release succeed and fail
    exactly when the engine's do. A decoding sequence's count is lazy between `grow_decoders` and
    `settle` (the policy settles it before it grows alone or leaves the decode group)."""

    __slots__ = ("num_blocks", "staging_blocks", "max_slots", "free_blocks", "_slots", "_reserved")

    def __init__(self, num_blocks: int, staging_blocks: int = 0, max_slots: int = 256):
        self.num_blocks, self.staging_blocks, self.max_slots = num_blocks, staging_blocks, max_slots
        # blocks neither in a block table nor reserved for staging: a plain attribute, since the
        # policy and the router read it on every step
        self.free_blocks = num_blocks
        self._slots = max_slots
        self._reserved = 0  # blocks held back for staging slots

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks - self._reserved

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // BLOCK_TOKENS)

    def new_sequence(self) -> CountHandle:
        return CountHandle()

    def held(self, handle: CountHandle) -> int:
        return handle.blocks

    def blocks_needed(self, handle: CountHandle, tokens: int) -> int:
        need = -(-tokens // BLOCK_TOKENS) - handle.blocks
        if need < 0:
            need = 0
        if not handle.slot:
            if not self._slots:
                return self.num_blocks + 1
            need += self.staging_blocks
        return need

    def can_grow(self, handle: CountHandle, tokens: int) -> bool:
        return self.blocks_needed(handle, tokens) <= self.free_blocks

    def grow(self, handle: CountHandle, tokens: int) -> bool:
        want = -(-tokens // BLOCK_TOKENS)
        more = want - handle.blocks if want > handle.blocks else 0
        if handle.slot:  # the common case, kept short
            if more > self.free_blocks:
                return False
        else:
            staging = self.staging_blocks
            if not self._slots or more + staging > self.free_blocks:
                return False
            handle.slot = True
            self._slots -= 1
            self._reserved += staging
            self.free_blocks -= staging
        if more:
            self.free_blocks -= more
            handle.blocks = want
        return True

    def cached_prefix(self, handle: CountHandle) -> int:
        return 0  # the simulator models no prefix cache yet

    def grow_decoders(self, targets: Callable[[], Iterable[tuple[Any, int]]], blocks: int) -> None:
        self.free_blocks -= blocks  # the handles' counts follow at settle(): O(1), not O(batch)

    def settle(self, handle: CountHandle, tokens: int) -> None:
        want = -(-tokens // BLOCK_TOKENS)
        if want > handle.blocks:
            handle.blocks = want

    def release(self, handle: CountHandle) -> None:
        self.free_blocks += handle.blocks
        handle.blocks = 0
        if handle.slot:
            handle.slot = False
            self._slots += 1
            self._reserved -= self.staging_blocks
            self.free_blocks += self.staging_blocks
