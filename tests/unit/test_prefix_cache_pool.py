"""The block pool's prefix cache: hits attach a tenant's own computed blocks, never another's;
freed cached blocks are evicted least recently used first; the counts the policy asks stay exact."""

import random

import pytest

from engine.kv.block_pool import BLOCK_SIZE, BlockPool
from engine.kv.prefix_hash import extend_hashes, new_salt_key, tenant_salt

KEY = new_salt_key()
A, B = tenant_salt(KEY, "alice"), tenant_salt(KEY, "bob")


def tracked(pool: BlockPool, tokens: list[int], salt: bytes = A):
    seq = pool.new_sequence()
    pool.track(seq, list(tokens), salt)
    return seq


def admit(pool: BlockPool, seq, run: int) -> int:
    """What the policy does at admission: start after the cached prefix; returns where it starts."""
    cached = pool.cached_prefix(seq)
    assert pool.grow(seq, cached + run)
    return cached


def test_salts_are_keyed_per_tenant_and_per_engine():
    assert A != B and tenant_salt(KEY, "alice") == A
    assert tenant_salt(new_salt_key(), "alice") != A  # another engine process: other salts
    a, b = [], []
    extend_hashes(a, list(range(40)), A)
    extend_hashes(b, list(range(40)), B)
    assert len(a) == 2 and not set(a) & set(b)  # full blocks only; no chain meets another tenant's


def test_a_tenant_hits_its_own_prefix_and_never_anothers():
    pool = BlockPool(32, max_seqs=4)
    prompt = list(range(100, 100 + 5 * BLOCK_SIZE + 3))
    first = tracked(pool, prompt)
    assert admit(pool, first, len(prompt)) == 0
    pool.commit(first, len(prompt))
    same = tracked(pool, prompt[: 4 * BLOCK_SIZE] + [7] * 20)
    assert pool.cached_prefix(same) == 4 * BLOCK_SIZE
    assert pool.cached_prefix(same) == 4 * BLOCK_SIZE  # asking again changes nothing
    free = pool.free_blocks
    need = pool.blocks_needed(same, 4 * BLOCK_SIZE + 20)
    assert admit(pool, same, 20) == 4 * BLOCK_SIZE
    assert free - pool.free_blocks == need == 2  # the hits are in use: only the new blocks count
    assert same.block_table[:4] == first.block_table[:4] and same.block_table[4] not in first.block_table
    assert all(pool.ref_count(b) == 2 for b in first.block_table[:4])
    other = tracked(pool, prompt, B)
    assert pool.cached_prefix(other) == 0 and admit(pool, other, len(prompt)) == 0
    assert not set(other.block_table) & set(first.block_table)


def test_a_fully_cached_prompt_runs_its_last_block_again():
    pool = BlockPool(16, max_seqs=2)
    prompt = list(range(3 * BLOCK_SIZE))
    first = tracked(pool, prompt)
    admit(pool, first, len(prompt))
    pool.commit(first, len(prompt))
    held = list(first.block_table)
    pool.release(first)
    again = tracked(pool, prompt)
    assert pool.cached_prefix(again) == 2 * BLOCK_SIZE  # one token at least is left to run
    admit(pool, again, BLOCK_SIZE)
    pool.commit(again, len(prompt))  # its recomputed last block duplicates a cached one: kept private
    assert again.block_table[:2] == held[:2] and again.block_table[2] != held[2]
    assert pool.hash_of(again.block_table[2]) is None and pool.lookup(again.hashes[2]) == held[2]


def test_eviction_takes_never_hashed_blocks_first_then_least_recently_used():
    pool = BlockPool(6, max_seqs=3)
    a, b = tracked(pool, list(range(32)) + [1]), tracked(pool, list(range(50, 82)) + [1])
    for seq in (a, b):
        admit(pool, seq, 33)
        pool.commit(seq, 32)
    a_blocks, b_blocks = a.block_table[:2], b.block_table[:2]
    pool.release(a)
    pool.release(b)
    # released last block first, so a chain's tail is evicted before its head
    assert pool.evictable() == [a_blocks[1], a_blocks[0], b_blocks[1], b_blocks[0]]
    assert pool.free_blocks == 6
    hit = tracked(pool, list(range(32)) + [2, 3])
    assert admit(pool, hit, 2) == 32  # a hit on a's blocks takes them out of the eviction order
    assert pool.evictable() == [b_blocks[1], b_blocks[0]]
    pool.release(hit)  # and puts them back as the most recently used
    assert pool.evictable() == [b_blocks[1], b_blocks[0], a_blocks[1], a_blocks[0]]
    fresh = pool.new_sequence()
    assert pool.grow(fresh, 3 * BLOCK_SIZE)  # two never-hashed blocks, then b's tail
    assert b_blocks[1] in fresh.block_table and pool.lookup(b.hashes[1]) is None
    assert pool.lookup(b.hashes[0]) == b_blocks[0] and pool.lookup(a.hashes[0]) == a_blocks[0]


def test_a_preempted_sequence_readmitted_reuses_its_own_blocks():
    pool = BlockPool(20, max_seqs=2, staging_blocks=1)
    tokens = list(range(200, 240))
    seq = tracked(pool, tokens)
    admit(pool, seq, len(tokens))
    pool.commit(seq, len(tokens))
    seq.tokens.extend([9] * 30)  # it generated 30 more tokens, all computed but the last
    tokens = seq.tokens
    pool.grow(seq, len(tokens))
    pool.commit(seq, len(tokens) - 1)
    held = list(seq.block_table)
    pool.release(seq)  # preempted: back to the queue, its blocks kept in the cache
    assert pool.cached_prefix(seq) == 4 * BLOCK_SIZE
    assert admit(pool, seq, len(tokens) - 4 * BLOCK_SIZE) == 4 * BLOCK_SIZE
    assert seq.block_table[:4] == held[:4]


class Running:
    """A sequence the random test holds: where it started (its cached prefix) and what it computed."""

    def __init__(self, seq, start: int, computed: int):
        self.seq, self.start, self.computed = seq, start, computed


def check_invariants(pool: BlockPool, live: list[Running]) -> None:
    tables = [b for r in live for b in r.seq.block_table]
    for block in set(tables):
        assert pool.ref_count(block) == tables.count(block)
    evictable = pool.evictable()
    assert not set(evictable) & set(tables)  # no block both free and in a table
    assert all(pool.ref_count(b) == 0 and pool.hash_of(b) is not None for b in evictable)
    slots = [r.seq.slot for r in live if r.seq.slot is not None]
    assert len(slots) == len(set(slots))
    assert pool.used_blocks == len(set(tables))
    assert pool.free_blocks == pool.num_blocks - len(set(tables)) - pool.staging_blocks * len(slots) >= 0
    hashes = [pool.hash_of(b) for b in range(pool.num_blocks) if pool.hash_of(b) is not None]
    assert len(hashes) == len(set(hashes))  # one block per hash and one hash per block
    assert all(pool.hash_of(pool.lookup(h)) == h for h in hashes)
    for r in live:
        for i, block in enumerate(r.seq.block_table):
            digest = pool.hash_of(block)
            # a cached block holds exactly these tokens after exactly this prefix (and tenant)
            assert digest is None or digest == r.seq.hashes[i]
            if i >= r.start // BLOCK_SIZE and i >= r.seq.registered:  # still to be written: private
                assert pool.ref_count(block) == 1 and digest is None


@pytest.mark.parametrize("seed", range(20))
def test_random_admit_grow_release_evict_keeps_the_pool_consistent(seed):
    rng = random.Random(seed)
    pool = BlockPool(rng.randint(8, 40), max_seqs=rng.randint(2, 6), staging_blocks=rng.randint(0, 2))
    prefixes = [[rng.randrange(4096) for _ in range(rng.randint(0, 5) * BLOCK_SIZE)] for _ in range(3)]
    live: list[Running] = []
    hits = 0
    for _ in range(300):
        op = rng.random()
        if op < 0.35:  # a new sequence arrives and is admitted
            tokens = rng.choice(prefixes) + [rng.randrange(4096) for _ in range(rng.randint(1, 40))]
            seq = tracked(pool, tokens, rng.choice([A, B]))
            cached = pool.cached_prefix(seq)
            run = rng.randint(1, len(tokens) - cached)
            need, free = pool.blocks_needed(seq, cached + run), pool.free_blocks
            if pool.grow(seq, cached + run):
                assert free - pool.free_blocks == need
                live.append(Running(seq, cached, cached + run))
                hits += cached > 0
            else:
                assert need > free and seq.block_table == [] and seq.slot is None
        elif op < 0.7 and live:  # a running sequence computes what it holds and grows
            r = rng.choice(live)
            pool.commit(r.seq, r.computed)
            if r.computed == len(r.seq.tokens):
                r.seq.tokens.append(rng.randrange(4096))  # sampled one
            more = r.computed + rng.randint(1, 20)
            if more <= len(r.seq.tokens) and pool.grow(r.seq, more):
                r.computed = more
        elif op < 0.9 and live:  # finished or preempted
            r = live.pop(rng.randrange(len(live)))
            pool.commit(r.seq, r.computed)
            pool.release(r.seq)
        check_invariants(pool, live)
    for r in live:
        pool.release(r.seq)
    assert pool.used_blocks == 0 and pool.free_blocks == pool.num_blocks
    assert hits > 0  # the workload did exercise the cache
