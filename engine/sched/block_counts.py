"""The engine's block accounting without block ids or tensors, for the capacity simulator.

The prefix cache (engine.kv.block_pool's semantics over synthetic block identities): a sequence may
carry `BlockIds`, the identity of each of its full blocks, where an identity stands for the whole
prefix up to that block as the pool's chained hash does (say ("acme", "system", i) for a tenant's
shared system prompt, then (("acme", session), i) for a conversation's later blocks). Blocks are
counted, not numbered: a registered identity has a reference count, and at zero it is evictable,
still counted free and kept in least-recently-used order until an allocation that finds no plain
free block evicts it. A sequence without identities costs what it did before the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, NamedTuple

from engine.sched.policy_types import BLOCK_TOKENS


class BlockIds(NamedTuple):
    """A sequence's block identities: `ids[i]` for its first len(ids) full blocks, then (chain, i)
    for each later one (its own generated blocks, say); chain None: no identities past `ids`."""

    ids: Sequence[Hashable]
    chain: Hashable | None = None

    def at(self, i: int) -> Hashable:
        ids = self.ids
        return ids[i] if i < len(ids) else (self.chain, i)

    def known(self, blocks: int) -> int:
        """How many of the first `blocks` blocks have an identity."""
        return blocks if self.chain is not None else min(blocks, len(self.ids))


class CountHandle:
    """One sequence's blocks in `BlockCounts`: how many, whether it holds a staging slot, and for
    the prefix cache its identities, its owner (whose token count caps a hit) and, per leading
    block the cache has seen, the identity that block holds for the cache (None: a private copy)."""

    __slots__ = ("blocks", "slot", "ids", "owner", "owned")

    def __init__(self) -> None:
        self.blocks = 0
        self.slot = False
        self.ids: BlockIds | None = None  # None: not in the prefix cache (see BlockCounts.track)
        self.owner: Any = None  # its SeqLike: num_computed + remaining are its tokens
        self.owned: list[Hashable | None] = []


class BlockCounts:
    """The engine's block accounting without block ids or tensors, for the simulator: the same
    number of blocks, the same staging reservation and slot limit, so grow/release succeed and fail
    exactly when the engine's do. A decoding sequence's count is lazy between `grow_decoders` and
    `settle` (the policy settles it before it grows alone or leaves the decode group)."""

    __slots__ = (
        "num_blocks", "staging_blocks", "max_slots", "free_blocks", "_slots", "_reserved", "_refs",
        "_evictable", "evictions",
    )  # fmt: skip

    def __init__(self, num_blocks: int, staging_blocks: int = 0, max_slots: int = 256):
        self.num_blocks, self.staging_blocks, self.max_slots = num_blocks, staging_blocks, max_slots
        # blocks neither in a block table nor reserved for staging: a plain attribute, since the
        # policy and the router read it on every step
        self.free_blocks = num_blocks
        self._slots = max_slots
        self._reserved = 0  # blocks held back for staging slots
        # the prefix cache: references per registered identity, and those at zero (evictable,
        # counted in free_blocks), least recently used first
        self._refs: dict[Hashable, int] = {}
        self._evictable: OrderedDict[Hashable, None] = OrderedDict()
        self.evictions = 0

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks - self._reserved

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // BLOCK_TOKENS)

    def new_sequence(self) -> CountHandle:
        return CountHandle()

    def track(self, handle: CountHandle, ids: BlockIds, owner: Any) -> None:
        """Enter the handle's sequence in the prefix cache: `ids` its block identities, `owner` the
        sequence (SeqLike), whose tokens (num_computed + remaining) cap a hit."""
        handle.ids, handle.owner, handle.owned = ids, owner, []

    def held(self, handle: CountHandle) -> int:
        return handle.blocks

    def blocks_needed(self, handle: CountHandle, tokens: int) -> int:
        need = -(-tokens // BLOCK_TOKENS) - handle.blocks
        if need < 0:
            need = 0
        elif need and handle.ids is not None and not handle.blocks:
            # a hit on a block in use takes no free block; one on an evictable block takes one
            refs = self._refs
            need -= sum(1 for key in self._attachable(handle, tokens) if refs[key])
        if not handle.slot:
            if not self._slots:
                return self.num_blocks + 1
            need += self.staging_blocks
        return need

    def can_grow(self, handle: CountHandle, tokens: int) -> bool:
        return self.blocks_needed(handle, tokens) <= self.free_blocks

    def grow(self, handle: CountHandle, tokens: int) -> bool:
        if handle.ids is not None and not handle.blocks:
            return self._grow_cached(handle, tokens)
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
            if self._evictable:
                self._evict_for(more)
            self.free_blocks -= more
            handle.blocks = want
        return True

    def grow_decoders(self, targets: Callable[[], Iterable[tuple[Any, int]]], blocks: int) -> None:
        if self._evictable:
            self._evict_for(blocks)
        self.free_blocks -= blocks  # the handles' counts follow at settle(): O(1), not O(batch)

    def settle(self, handle: CountHandle, tokens: int) -> None:
        want = -(-tokens // BLOCK_TOKENS)
        if want > handle.blocks:
            handle.blocks = want

    def release(self, handle: CountHandle) -> None:
        if handle.owned:
            self.free_blocks -= self._release_owned(handle)
        self.free_blocks += handle.blocks
        handle.blocks = 0
        if handle.slot:
            handle.slot = False
            self._slots += 1
            self._reserved -= self.staging_blocks
            self.free_blocks += self.staging_blocks

    # --- the prefix cache -----------------------------------------------------------------------

    def _hits(self, handle: CountHandle) -> list[Hashable]:
        """The identities `handle` would start with: the longest run of them the cache holds,
        leaving at least one of its tokens to run; none once it holds blocks."""
        ids = handle.ids
        if ids is None or handle.blocks:
            return []
        owner = handle.owner
        cap = ids.known((owner.num_computed + owner.remaining - 1) // BLOCK_TOKENS)
        refs, explicit = self._refs, ids.ids
        given = min(cap, len(explicit))
        n = 0  # the explicit identities first, without a call per block (a system prompt has hundreds)
        while n < given and explicit[n] in refs:
            n += 1
        hits = list(explicit[:n])
        if n == given:
            chain = ids.chain
            for i in range(n, cap):
                key = (chain, i)
                if key not in refs:
                    break
                hits.append(key)
        return hits

    def _attachable(self, handle: CountHandle, tokens: int) -> list[Hashable]:
        """The hits grow(handle, tokens) attaches: all when it grows to at least the cached prefix."""
        hits = self._hits(handle)
        return hits if tokens >= len(hits) * BLOCK_TOKENS else []

    def cached_prefix(self, handle: CountHandle) -> int:
        """Tokens at the start of the handle's sequence the cache holds; no side effects."""
        return len(self._hits(handle)) * BLOCK_TOKENS

    def _grow_cached(self, handle: CountHandle, tokens: int) -> bool:
        """grow() from an empty table for a sequence with identities: attach the hits, then allocate."""
        if not self.can_grow(handle, tokens):
            return False
        if not handle.slot:
            handle.slot = True
            self._slots -= 1
            self._reserved += self.staging_blocks
            self.free_blocks -= self.staging_blocks
        hits = self._attachable(handle, tokens)
        refs, evictable = self._refs, self._evictable
        for key in hits:  # before allocating, which may evict them
            if not refs[key]:
                del evictable[key]
                self.free_blocks -= 1
            refs[key] += 1
        handle.owned = hits
        want = -(-tokens // BLOCK_TOKENS)
        more = want - len(hits)
        if more > 0:
            if evictable:
                self._evict_for(more)
            self.free_blocks -= more
        handle.blocks = want
        return True

    def _evict_for(self, new: int) -> None:
        """`new` blocks are about to be allocated: plain free blocks go first, then the least
        recently used evictable ones, whose identities are dropped."""
        evictable = self._evictable
        plain = self.free_blocks + self._reserved - len(evictable)
        refs = self._refs
        for _ in range(min(new - plain, len(evictable))):
            key, _ = evictable.popitem(last=False)
            del refs[key]
            self.evictions += 1

    def commit(self, handle: CountHandle, computed: int) -> None:
        """After a step: `computed` tokens of the handle's sequence are in the cache (at most the
        tokens it has grown to). Its full computed blocks not seen yet are registered under their
        identities; one registered already keeps its block, and this copy stays private."""
        ids = handle.ids
        if ids is None:
            return
        owned = handle.owned
        done = ids.known(computed // BLOCK_TOKENS)
        if done <= len(owned):
            return
        refs = self._refs
        for i in range(len(owned), done):
            key = ids.at(i)
            if key in refs:
                owned.append(None)
            else:
                refs[key] = 1
                owned.append(key)

    def _release_owned(self, handle: CountHandle) -> int:
        """Drop the references of the handle's registered blocks, last block first (so a cached
        chain is evicted from its tail); how many of them others still hold (not freed)."""
        refs, evictable, owned = self._refs, self._evictable, handle.owned
        shared = 0
        for i in range(len(owned) - 1, -1, -1):
            key = owned[i]
            if key is not None:
                refs[key] -= 1
                if refs[key]:
                    shared += 1
                else:
                    evictable[key] = None
        handle.owned = []
        return shared
