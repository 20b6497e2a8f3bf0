"""The KV block pool: reference counts, content hashes, and growing and releasing sequences without
ever leaking or double-handing a block."""

import random

import pytest

from engine.kv.block_pool import BLOCK_SIZE, BlockPool


def test_allocate_share_free_count_references():
    pool = BlockPool(4, max_seqs=2)
    a = pool.allocate()
    assert pool.ref_count(a) == 1 and pool.used_blocks == 1
    assert pool.share(a) == a and pool.ref_count(a) == 2
    pool.free(a)
    assert pool.ref_count(a) == 1 and pool.used_blocks == 1  # still held by the other reference
    pool.free(a)
    assert pool.ref_count(a) == 0 and pool.used_blocks == 0 and pool.free_blocks == 4
    with pytest.raises(ValueError, match="already free"):
        pool.free(a)
    with pytest.raises(ValueError, match="is free"):
        pool.share(a)


def test_a_hash_outlives_its_last_reference_until_the_block_is_evicted():
    pool = BlockPool(4, max_seqs=2)
    a = pool.allocate()
    pool.set_hash(a, 1234)
    assert pool.lookup(1234) == a
    pool.share(a)
    pool.free(a)
    assert pool.lookup(1234) == a  # one reference left: the contents are still there
    pool.free(a)
    # no reference: free (counted so) but its contents kept, for a later prefix-cache hit
    assert pool.lookup(1234) == a and pool.free_blocks == 4 and pool.used_blocks == 0
    assert pool.evictable() == [a]
    others = [pool.allocate() for _ in range(3)]  # never-hashed blocks are taken first
    assert a not in others and pool.lookup(1234) == a
    assert pool.allocate() == a and pool.lookup(1234) is None  # then it is evicted: no stale hash
    assert pool.evictable() == []
    for b in [*others, a]:
        pool.free(b)
    with pytest.raises(ValueError, match="is free"):
        pool.set_hash(a, 5)


def test_a_hash_names_one_block_and_a_block_one_hash():
    pool = BlockPool(4, max_seqs=2)
    a, b = pool.allocate(), pool.allocate()
    pool.set_hash(a, 1)
    pool.set_hash(b, 1)  # the same contents computed again: the newer block answers
    assert pool.lookup(1) == b
    pool.set_hash(b, 2)
    assert pool.lookup(1) is None and pool.lookup(2) == b
    pool.free(a)
    assert pool.lookup(2) == b


def test_grow_is_all_or_nothing_and_reserves_staging():
    pool = BlockPool(10, max_seqs=2, staging_blocks=2)
    s = pool.new_sequence()
    assert pool.can_grow(s, 3 * BLOCK_SIZE) and pool.grow(s, 3 * BLOCK_SIZE)
    assert len(s.block_table) == 3 and s.slot is not None
    assert pool.free_blocks == 10 - 3 - 2 and pool.used_blocks == 3
    assert not pool.can_grow(s, 9 * BLOCK_SIZE) and not pool.grow(s, 9 * BLOCK_SIZE)
    assert len(s.block_table) == 3  # refused without change
    t = pool.new_sequence()
    assert pool.grow(t, 1)
    u = pool.new_sequence()
    assert not pool.grow(u, 1)  # no staging slot left for a third sequence
    assert u.block_table == [] and u.slot is None
    pool.release(s)
    pool.release(t)
    assert pool.free_blocks == 10 and pool.used_blocks == 0 and s.slot is None and s.length == 0


@pytest.mark.parametrize("seed", range(20))
def test_random_grow_share_release_never_leaks(seed):
    rng = random.Random(seed)
    num_blocks, max_seqs, staging = rng.randint(4, 40), rng.randint(1, 6), rng.randint(0, 2)
    pool = BlockPool(num_blocks, max_seqs, staging)
    live, shared = [], []  # sequences holding blocks; extra references (a prefix cache's)
    for _ in range(300):
        op = rng.random()
        if op < 0.5:
            seq = rng.choice(live) if live and rng.random() < 0.6 else pool.new_sequence()
            before = (list(seq.block_table), seq.slot, pool.free_blocks)
            grown = pool.grow(seq, rng.randint(1, 6 * BLOCK_SIZE))
            if not grown:
                assert (seq.block_table, seq.slot, pool.free_blocks) == before
            elif seq not in live:
                live.append(seq)
        elif op < 0.65 and live:
            seq = rng.choice(live)
            if seq.block_table:
                block = rng.choice(seq.block_table)
                shared.append(pool.share(block))
                pool.set_hash(block, rng.randint(0, 5))
        elif op < 0.85 and live:
            pool.release(live.pop(rng.randrange(len(live))))
        elif shared:
            pool.free(shared.pop(rng.randrange(len(shared))))
        # every block is free or counted once per holder, and none is handed out twice
        held = [b for s in live for b in s.block_table] + shared
        tables = [b for s in live for b in s.block_table]
        assert len(tables) == len(set(tables))
        assert pool.used_blocks == len(set(held))
        for b in set(held):
            assert pool.ref_count(b) == held.count(b)
        slots = [s.slot for s in live if s.slot is not None]
        assert len(slots) == len(set(slots)) <= max_seqs
        assert pool.free_blocks == num_blocks - len(set(held)) - staging * len(slots)
        assert pool.free_blocks >= 0
        for digest in range(6):  # a hash names a block in use, or one kept free for a hit
            block = pool.lookup(digest)
            assert block is None or pool.ref_count(block) > 0 or block in pool.evictable()
        assert all(pool.ref_count(b) == 0 and pool.hash_of(b) is not None for b in pool.evictable())
    for seq in live:
        pool.release(seq)
    for block in shared:
        pool.free(block)
    assert pool.used_blocks == 0 and pool.free_blocks == num_blocks
    cached = {pool.lookup(d) for d in range(6)} - {None}
    assert cached == set(pool.evictable())  # every hashed block is free and kept, none lost
