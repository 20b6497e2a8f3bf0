"""Which KV blocks each sequence holds: block ids, reference counts and content hashes, no tensors.

The split nano-vllm's `block_manager.py` and vLLM v1's `kv_cache_manager.py` make: this pool only
counts (the tensors live in engine.kv_store, one store per layer), so the scheduling policy and the
capacity simulator can run it without a model. A block is allocated with one reference; `share`
adds one (a prefix another sequence already computed), `free` drops one and returns the block at
zero. A full block may carry a hash of its contents, for the prefix cache to find it; the hash is
forgotten when the block is freed, since its contents are then overwritten.

Formats that stage the block being filled (kernels.formats: fp8, int4's keys) give each running
sequence a staging slot; its bytes are charged as `staging_blocks` reserved blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kernels.formats import KV_BLOCK

BLOCK_SIZE = KV_BLOCK


@dataclass
class SeqBlocks:
    """One sequence's hold on the pool: its block table and staging slot (the handle the pool's
    `new_sequence` returns and `grow`/`release` take)."""

    block_table: list[int] = field(default_factory=list)
    slot: int | None = None
    length: int = 0  # tokens committed (visible to every layer)

    @property
    def capacity(self) -> int:
        return len(self.block_table) * BLOCK_SIZE


class BlockPool:
    def __init__(self, num_blocks: int, max_seqs: int, staging_blocks: int = 0):
        self.num_blocks, self.max_seqs, self.staging_blocks = num_blocks, max_seqs, staging_blocks
        # popped from the end: block 0 first, and the block freed last is reused first
        self._free = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}  # block id -> content hash
        self._by_hash: dict[int, int] = {}  # content hash -> block id
        self._free_slots = list(range(max_seqs - 1, -1, -1))
        self._reserved = 0  # blocks held back for staging slots

    # --- blocks -------------------------------------------------------------------------------

    def allocate(self) -> int:
        """A free block with one reference (IndexError when none is free)."""
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def share(self, block: int) -> int:
        """One more reference to an allocated block (a prefix another sequence reuses)."""
        if self._refs[block] < 1:
            raise ValueError(f"block {block} is free; only an allocated block can be shared")
        self._refs[block] += 1
        return block

    def free(self, block: int) -> None:
        """Drop one reference; at zero the block returns to the free list and loses its hash."""
        if self._refs[block] < 1:
            raise ValueError(f"block {block} is already free")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            digest = self._hash_of.pop(block, None)
            if digest is not None:
                del self._by_hash[digest]
            self._free.append(block)

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def set_hash(self, block: int, digest: int) -> None:
        """Record the contents of a full, allocated block; a hash names at most one block."""
        if self._refs[block] < 1:
            raise ValueError(f"block {block} is free; only an allocated block can carry a hash")
        old = self._hash_of.pop(block, None)
        if old is not None:
            del self._by_hash[old]
        other = self._by_hash.pop(digest, None)
        if other is not None:
            del self._hash_of[other]
        self._hash_of[block], self._by_hash[digest] = digest, block

    def lookup(self, digest: int) -> int | None:
        """The allocated block holding these contents, if any."""
        return self._by_hash.get(digest)

    # --- sequences (what the scheduling policy calls) ---------------------------------------------

    @property
    def free_blocks(self) -> int:
        return len(self._free) - self._reserved

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // BLOCK_SIZE)

    def new_sequence(self) -> SeqBlocks:
        return SeqBlocks()

    def held(self, seq: SeqBlocks) -> int:
        return len(seq.block_table)

    def blocks_needed(self, seq: SeqBlocks, tokens: int) -> int:
        """Free blocks grow(seq, tokens) takes; more than the pool holds without a staging slot."""
        need = max(0, self.blocks_for(tokens) - len(seq.block_table))
        if seq.slot is None:
            if not self._free_slots:
                return self.num_blocks + 1
            need += self.staging_blocks
        return need

    def can_grow(self, seq: SeqBlocks, tokens: int) -> bool:
        return self.blocks_needed(seq, tokens) <= self.free_blocks

    def grow(self, seq: SeqBlocks, tokens: int) -> bool:
        """Make room for `tokens` tokens in total; False (and no change) when blocks run out."""
        if not self.can_grow(seq, tokens):
            return False
        if seq.slot is None:
            seq.slot = self._free_slots.pop()
            self._reserved += self.staging_blocks
        while len(seq.block_table) < self.blocks_for(tokens):
            seq.block_table.append(self.allocate())
        return True

    def cached_prefix(self, seq: SeqBlocks) -> int:
        return 0  # no prefix cache yet

    def grow_decoders(self, targets: Callable[[], Iterable[tuple[SeqBlocks, int]]], blocks: int) -> None:
        """Grow each (sequence, tokens) of `targets()` in turn: block ids are handed out in that order."""
        for seq, tokens in targets():
            if not self.grow(seq, tokens):
                raise RuntimeError(f"the policy's decode growth ({blocks} blocks) did not fit")

    def settle(self, seq: SeqBlocks, tokens: int) -> None:
        """Nothing to settle: grow_decoders keeps every block table up to date."""

    def release(self, seq: SeqBlocks) -> None:
        """Drop the sequence's references (last block first) and its staging slot."""
        for block in reversed(seq.block_table):
            self.free(block)
        seq.block_table = []
        if seq.slot is not None:
            self._free_slots.append(seq.slot)
            self._reserved -= self.staging_blocks
            seq.slot = None
        seq.length = 0
