"""Continuous batching with chunked prefill and preemption by recompute.

Each step: running sequences that are decoding go first (one token each), then sequences still
prefilling continue their prompt in chunks, then waiting sequences are admitted first come, first
served, all under a per-step token budget and a cap on sequences. When the cache runs out of blocks
the newest running sequence is preempted: its blocks are freed and it goes back to the front of
the queue to be recomputed later, so no request starves and the oldest always make progress.
"""

from __future__ import annotations

from collections import deque

import msgspec

from engine.kv_cache import PagedKVCache
from engine.sequence import SeqStatus, Sequence


class SchedulerConfig(msgspec.Struct):
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64


class Scheduler:
    def __init__(self, cache: PagedKVCache, config: SchedulerConfig):
        self.cache = cache
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # oldest first
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.cache.release(seq.kv)
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The sequences to run this step and how many of their tokens each."""
        budget = self.config.max_num_batched_tokens
        plan: list[tuple[Sequence, int]] = []
        decoding = [s for s in self.running if s.remaining == 1]
        prefilling = [s for s in self.running if s.remaining > 1]
        for seq in decoding + prefilling:
            if budget == 0:
                break
            if seq.status != SeqStatus.RUNNING:
                continue  # preempted earlier in this loop
            want = min(seq.remaining, budget)
            while not self.cache.grow(seq.kv, seq.num_computed + want):
                victim = self.running[-1]
                self._preempt(victim)
                plan = [(s, n) for s, n in plan if s is not victim]
                if victim is seq:
                    break
            if seq.status == SeqStatus.RUNNING:
                plan.append((seq, want))
                budget -= want
        budget = self.config.max_num_batched_tokens - sum(n for _, n in plan)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            want = min(seq.remaining, budget)
            if not self.cache.grow(seq.kv, seq.num_computed + want):
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            plan.append((seq, want))
            budget -= want
        # Keep arrival order, so a re-admitted (once preempted) sequence is not the next victim.
        self.running.sort(key=lambda s: s.arrival)
        return plan

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.cache.release(seq.kv)
