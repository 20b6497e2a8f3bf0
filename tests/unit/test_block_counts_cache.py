"""The simulator's BlockCounts models the engine's prefix cache: on the same random operations as the
BlockPool (sequences that share prefixes, grown, committed, released, generating), with the pool's
own chained hashes as block identities, it gives the same hits, free counts and evictions on every
step."""

import random

from engine.kv.block_pool import BlockPool
from engine.kv.prefix_hash import extend_hashes
from engine.sched.block_counts import BlockCounts, BlockIds

SALT = b"tenant"


class Owner:
    """What BlockCounts reads of a sequence: its tokens are num_computed + remaining."""

    num_computed = 0

    def __init__(self, tokens: list[int]):
        self.tokens = tokens

    @property
    def remaining(self) -> int:
        return len(self.tokens)


class Pair:
    """One sequence in both accountings, and how far it has grown and computed."""

    def __init__(self, pool: BlockPool, counts: BlockCounts, tokens: list[int], final: list[int]):
        self.tokens = tokens  # the pool's list (grows as the sequence generates)
        self.final = final  # every token it will have
        self.pool_seq = pool.new_sequence()
        pool.track(self.pool_seq, tokens, SALT)
        hashes: list[bytes] = []
        extend_hashes(hashes, final, SALT)
        self.handle = counts.new_sequence()
        counts.track(self.handle, BlockIds(hashes), Owner(tokens))
        self.grown = self.computed = 0


def check_same(pool: BlockPool, counts: BlockCounts, pairs: list[Pair]) -> None:
    assert counts.free_blocks == pool.free_blocks
    assert counts.used_blocks == pool.used_blocks
    assert list(counts._evictable) == [pool.hash_of(b) for b in pool.evictable()]  # same LRU order
    assert counts._refs == {h: pool.ref_count(b) for h, b in pool._by_hash.items()}
    for p in pairs:
        assert counts.cached_prefix(p.handle) == pool.cached_prefix(p.pool_seq)
        assert counts.held(p.handle) == pool.held(p.pool_seq)


def random_tokens(rng: random.Random, prefixes: list[list[int]]) -> list[int]:
    head = list(rng.choice(prefixes))[: rng.randrange(0, 100)]
    return head + [rng.randrange(1000) for _ in range(rng.randrange(1, 60))]


def run_random(seed: int) -> tuple[int, int]:
    """Random operations on both, compared after each; the hits and evictions they made."""
    rng = random.Random(seed * 7919 + 1)
    staging = rng.choice([0, 0, 1])
    num_blocks, max_seqs = rng.randrange(8, 24), rng.randrange(2, 6)
    pool = BlockPool(num_blocks, max_seqs, staging)
    counts = BlockCounts(num_blocks, staging, max_slots=max_seqs)
    prefixes = [[rng.randrange(1000) for _ in range(100)] for _ in range(3)]
    pairs: list[Pair] = []
    hits_seen = 0
    for _ in range(600):
        op = rng.random()
        if op < 0.15 or not pairs:
            final = random_tokens(rng, prefixes) + [rng.randrange(1000) for _ in range(40)]
            prompt = rng.randrange(1, len(final) - 39)
            pairs.append(Pair(pool, counts, final[:prompt], final))
        elif op < 0.55:  # grow, as the policy does: from the cached prefix when it holds nothing
            p = rng.choice(pairs)
            if not p.grown:
                cached = pool.cached_prefix(p.pool_seq)
                hits_seen += cached > 0
                start = cached if rng.random() < 0.9 else 0
                target = start + rng.randrange(1, len(p.tokens) - start + 1)
            else:
                target = min(len(p.tokens), p.grown + rng.randrange(1, 40))
            assert counts.blocks_needed(p.handle, target) == pool.blocks_needed(p.pool_seq, target)
            assert counts.can_grow(p.handle, target) == pool.can_grow(p.pool_seq, target)
            ok = pool.grow(p.pool_seq, target)
            assert counts.grow(p.handle, target) == ok
            if ok:
                if not p.grown:
                    p.computed = start  # it runs from there (the hits attached when start is cached)
                p.grown = max(p.grown, target)
        elif op < 0.75:  # a step computed some of its tokens
            p = rng.choice(pairs)
            if p.grown > p.computed:
                p.computed = rng.randrange(p.computed + 1, p.grown + 1)
                pool.commit(p.pool_seq, p.computed)
                counts.commit(p.handle, p.computed)
        elif op < 0.85:  # it sampled a token (the caller's token list grows)
            p = rng.choice(pairs)
            if p.computed == len(p.tokens) and len(p.tokens) < len(p.final):
                p.tokens.append(p.final[len(p.tokens)])
        else:  # preempted or finished: released, perhaps admitted again later
            p = rng.choice(pairs)
            before = len(pool.evictable()) + len(pool._free)
            pool.release(p.pool_seq)
            counts.release(p.handle)
            assert len(pool.evictable()) + len(pool._free) >= before
            p.grown = p.computed = 0
            if rng.random() < 0.5:
                pairs.remove(p)
        check_same(pool, counts, pairs)
    return hits_seen, counts.evictions


def test_block_counts_and_block_pool_agree_on_random_operations():
    seeds = random.Random().sample(range(10**6), 24)  # fresh seeds each run, named when one fails
    runs = {}
    for seed in seeds:
        try:
            runs[seed] = run_random(seed)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc
    assert sum(1 for hits, _ in runs.values() if hits) > len(runs) // 2  # the runs exercised the cache
    assert sum(evictions for _, evictions in runs.values())  # and some evicted


def test_sequences_without_identities_never_touch_the_cache():
    counts = BlockCounts(8)
    plain = counts.new_sequence()
    assert counts.cached_prefix(plain) == 0 and counts.grow(plain, 40)
    counts.commit(plain, 40)
    counts.release(plain)
    assert counts.free_blocks == 8 and not counts._refs and not counts._evictable
