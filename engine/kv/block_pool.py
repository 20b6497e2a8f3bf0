"""Which KV blocks each sequence holds: block ids, reference counts and content hashes, no tensors.

The split nano-vllm's `block_manager.py` and vLLM v1's `kv_cache_manager.py` make: this pool only
counts (the tensors live in engine.kv.kv_store, one store per layer), so the scheduling policy and the
capacity simulator can run it without a model. A block is allocated with one reference; `share`
adds one, `free` drops one.

The prefix cache: a full block, once computed, is registered under the chained hash of its tokens
(engine.kv.prefix_hash, salted per tenant). At its last reference a hashed block is not forgotten but
becomes evictable: still free, kept in least-recently-used order, and found again by a sequence
that starts with the same tokens. Allocation takes a never-hashed free block first, else evicts the
least recently used evictable one (dropping its hash). A sequence admitted with hits attaches those
blocks (one more reference each) and starts computing after them in a block of its own, so a shared
block is never written.

Formats that stage the block being filled (kernels.formats: fp8, int4's keys) give each running
sequence a staging slot; its bytes are charged as `staging_blocks` reserved blocks. Only full blocks
are cached, so they are shared in their quantized form.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from engine.kv.prefix_hash import extend_hashes
from kernels.formats import KV_BLOCK

BLOCK_SIZE = KV_BLOCK


@dataclass
class SeqBlocks:
    """One sequence's hold on the pool: its block table and staging slot (the handle the pool's
    `new_sequence` returns and `grow`/`release` take) and, once `track`ed, its prefix-cache hashes."""

    block_table: list[int] = field(default_factory=list)
    slot: int | None = None
    length: int = 0  # tokens committed (visible to every layer)
    tokens: list[int] | None = None  # its token ids, prompt then output; None: not in the prefix cache
    salt: bytes = b""
    hashes: list[bytes] = field(default_factory=list)  # chained hashes of its full blocks known so far
    registered: int = 0  # leading blocks of block_table the cache has seen (computed, or hits)

    @property
    def capacity(self) -> int:
        return len(self.block_table) * BLOCK_SIZE


class BlockPool:
    def __init__(self, num_blocks: int, max_seqs: int, staging_blocks: int = 0):
        self.num_blocks, self.max_seqs, self.staging_blocks = num_blocks, max_seqs, staging_blocks
        # free blocks with no hash, popped from the end: block 0 first, the block freed last reused first
        self._free = list(range(num_blocks - 1, -1, -1))
        # free blocks that keep a hash, least recently used first (taken only when _free is empty)
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, Hashable] = {}  # block id -> content hash
        self._by_hash: dict[Hashable, int] = {}  # content hash -> block id
        self._free_slots = list(range(max_seqs - 1, -1, -1))
        self._reserved = 0  # blocks held back for staging slots

    # --- blocks -------------------------------------------------------------------------------

    def allocate(self) -> int:
        """A free block with one reference: a never-hashed one, else the least recently used
        evictable one, whose hash is dropped (IndexError when none is free)."""
        if self._free:
            block = self._free.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._forget(block)
        else:
            raise IndexError("no free KV block")
        self._refs[block] = 1
        return block

    def share(self, block: int) -> int:
        """One more reference to an allocated block (a prefix another sequence reuses)."""
        if self._refs[block] < 1:
            raise ValueError(f"block {block} is free; only an allocated block can be shared")
        self._refs[block] += 1
        return block

    def free(self, block: int) -> None:
        """Drop one reference; at zero a hashed block becomes evictable (the most recently used),
        any other returns to the free list."""
        if self._refs[block] < 1:
            raise ValueError(f"block {block} is already free")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if block in self._hash_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def set_hash(self, block: int, digest: Hashable) -> None:
        """Record the contents of a full, allocated block; a hash names at most one block (the
        newest: a block that loses its hash while evictable becomes plainly free)."""
        if self._refs[block] < 1:
            raise ValueError(f"block {block} is free; only an allocated block can carry a hash")
        self._forget(block)
        other = self._by_hash.pop(digest, None)
        if other is not None:
            del self._hash_of[other]
            if self._refs[other] == 0:
                del self._evictable[other]
                self._free.append(other)
        self._hash_of[block], self._by_hash[digest] = digest, block

    def lookup(self, digest: Hashable) -> int | None:
        """The block holding these contents, in use or evictable, if any."""
        return self._by_hash.get(digest)

    def hash_of(self, block: int) -> Hashable | None:
        return self._hash_of.get(block)

    def evictable(self) -> list[int]:
        """The free blocks that keep their contents, least recently used first."""
        return list(self._evictable)

    def _forget(self, block: int) -> None:
        digest = self._hash_of.pop(block, None)
        if digest is not None:
            del self._by_hash[digest]

    def _attach(self, block: int) -> None:
        """One more reference to a cached block; an evictable one leaves the eviction order."""
        if self._refs[block] == 0:
            del self._evictable[block]
        self._refs[block] += 1

    # --- sequences (what the scheduling policy calls) ---------------------------------------------

    @property
    def free_blocks(self) -> int:
        return len(self._free) + len(self._evictable) - self._reserved

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free) - len(self._evictable)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // BLOCK_SIZE)

    def new_sequence(self) -> SeqBlocks:
        return SeqBlocks()

    def track(self, seq: SeqBlocks, tokens: list[int], salt: bytes) -> None:
        """Enter `seq` in the prefix cache: `tokens` is its token list (the caller's, which grows as it
        generates), `salt` its tenant's (engine.kv.prefix_hash.tenant_salt). Its full blocks are
        hashed now."""
        seq.tokens, seq.salt = tokens, salt
        extend_hashes(seq.hashes, tokens, salt)

    def commit(self, seq: SeqBlocks, computed: int) -> None:
        """After a step: `computed` tokens of `seq` are in the cache. Blocks its tokens have filled
        since are hashed, and every full computed block is registered under its hash (one that is
        registered already keeps its block; this copy stays private)."""
        if seq.tokens is None:
            return
        if len(seq.tokens) >= (len(seq.hashes) + 1) * BLOCK_SIZE:
            extend_hashes(seq.hashes, seq.tokens, seq.salt)
        done = min(computed // BLOCK_SIZE, len(seq.block_table), len(seq.hashes))
        for i in range(seq.registered, done):
            digest = seq.hashes[i]
            if digest not in self._by_hash:
                block = seq.block_table[i]
                self._hash_of[block], self._by_hash[digest] = digest, block
        seq.registered = max(seq.registered, done)

    def _hits(self, seq: SeqBlocks) -> list[int]:
        """The cached blocks `seq` would start with: the longest chain of its hashes the pool holds,
        leaving at least one token to run. None once it holds blocks: a hit only starts a sequence."""
        if seq.tokens is None or seq.block_table:
            return []
        hits, by_hash = [], self._by_hash
        for i in range(min(len(seq.hashes), (len(seq.tokens) - 1) // BLOCK_SIZE)):
            block = by_hash.get(seq.hashes[i])
            if block is None:
                break
            hits.append(block)
        return hits

    def _attachable(self, seq: SeqBlocks, tokens: int) -> list[int]:
        """The hits grow(seq, tokens) attaches: all of them when it grows to at least the cached
        prefix, else none (a caller that starts the sequence at 0 must not write a shared block)."""
        hits = self._hits(seq)
        return hits if tokens >= len(hits) * BLOCK_SIZE else []

    def cached_prefix(self, seq: SeqBlocks) -> int:
        """Tokens at the start of `seq` the cache holds (block-aligned, at least one left to run);
        no side effects. `grow` from an empty table attaches them."""
        return len(self._hits(seq)) * BLOCK_SIZE

    def held(self, seq: SeqBlocks) -> int:
        return len(seq.block_table)

    def blocks_needed(self, seq: SeqBlocks, tokens: int) -> int:
        """Free blocks grow(seq, tokens) takes; more than the pool holds without a staging slot. A hit
        on an evictable block takes one (it stops being free), a hit on a block in use none."""
        want = self.blocks_for(tokens)
        need = max(0, want - len(seq.block_table))
        if need and seq.tokens is not None and not seq.block_table:
            need -= sum(1 for block in self._attachable(seq, tokens) if self._refs[block])
        if seq.slot is None:
            if not self._free_slots:
                return self.num_blocks + 1
            need += self.staging_blocks
        return need

    def can_grow(self, seq: SeqBlocks, tokens: int) -> bool:
        return self.blocks_needed(seq, tokens) <= self.free_blocks

    def grow(self, seq: SeqBlocks, tokens: int) -> bool:
        """Make room for `tokens` tokens in total; False (and no change) when blocks run out. From
        an empty table to at least `cached_prefix` tokens, the cached blocks are attached first."""
        if not self.can_grow(seq, tokens):
            return False
        if seq.slot is None:
            seq.slot = self._free_slots.pop()
            self._reserved += self.staging_blocks
        want = self.blocks_for(tokens)
        if not seq.block_table and seq.tokens is not None:
            for block in self._attachable(seq, tokens):  # before allocating, which may evict them
                self._attach(block)
                seq.block_table.append(block)
            seq.registered = len(seq.block_table)
        while len(seq.block_table) < want:
            seq.block_table.append(self.allocate())
        return True

    def grow_decoders(self, targets: Callable[[], Iterable[tuple[SeqBlocks, int]]], blocks: int) -> None:
        """Grow each (sequence, tokens) of `targets()` in turn: block ids are handed out in that order."""
        for seq, tokens in targets():
            if not self.grow(seq, tokens):
                raise RuntimeError(f"the policy's decode growth ({blocks} blocks) did not fit")

    def settle(self, seq: SeqBlocks, tokens: int) -> None:
        """Nothing to settle: grow_decoders keeps every block table up to date."""

    def release(self, seq: SeqBlocks) -> None:
        """Drop the sequence's references, last block first (so a cached chain is evicted from its
        tail), and its staging slot; its hashes stay, for a hit when it is admitted again."""
        for block in reversed(seq.block_table):
            self.free(block)
        seq.block_table = []
        seq.registered = 0
        if seq.slot is not None:
            self._free_slots.append(seq.slot)
            self._reserved -= self.staging_blocks
            seq.slot = None
        seq.length = 0
