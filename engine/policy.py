"""The scheduling policy: continuous batching with chunked prefill and preemption by recompute.

One policy object serves both the live engine (engine.engine.LLMEngine, which runs the model on
what the policy plans) and the capacity simulator (capacity.replica, which charges modelled step
times instead), so a scheduling change is made once and the simulator cannot drift from the engine.
It decides on sequence and block counts only: it never sees tensors, tokens or clocks.

Each step: running sequences that are decoding go first (one token each), then sequences still
prefilling continue their prompt in chunks, then waiting sequences are admitted in fair-share
order (engine.fair_queue: virtual token counters between tenants; arrival order with one tenant),
all under a per-step token budget and a cap on sequences. When the cache runs out of blocks
the newest running sequence (of the tenant furthest over its KV share, if one is) is preempted:
its blocks are freed and it goes back to the front of its tenant's queue to be recomputed later,
so no request starves and the oldest always make progress. A prompt prefix the cache holds
(`cached_prefix`) is attached at admission instead of being run again.

What the policy needs of a sequence (`SeqLike`) and of the block accounting (`BlockAccounting`) is
declared in engine.policy_types; the engine's KV block pool and the simulator's `BlockCounts`
(engine.block_counts) both provide it.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable
from functools import partial
from typing import Any, Generic

from engine.block_counts import BlockCounts
from engine.fair_queue import FairQueue
from engine.policy_runs import SteadyRun, SteadyRuns, _targets
from engine.policy_types import (
    BLOCK_TOKENS,
    RUNNING,
    BlockAccounting,
    S,
    SchedulerConfig,
    SeqLike,
    SeqStatus,
)

__all__ = [
    "BlockAccounting",
    "BlockCounts",
    "SchedulerConfig",
    "SchedulingPolicy",
    "SeqLike",
    "SeqStatus",
    "SteadyRun",
]


class Plan(Generic[S]):
    """One step: every decoding sequence runs one token, then `chunks` run (sequence, tokens)."""

    __slots__ = ("policy", "decode_count", "decode_context", "chunks")

    def __init__(self, policy: SchedulingPolicy[S], chunks: list[tuple[S, int]]):
        self.policy = policy
        self.decode_count = policy.decode_count
        # the tokens the decoders attend to, their new ones included
        self.decode_context = policy.decode_context()
        self.chunks = chunks

    def __bool__(self) -> bool:
        return bool(self.decode_count or self.chunks)

    def decoders(self) -> list[S]:
        """The decoding sequences in arrival order, their `num_computed` brought up to date."""
        return self.policy.decoders()

    def entries(self) -> list[tuple[S, int]]:
        return [(seq, 1) for seq in self.decoders()] + self.chunks


class SchedulingPolicy(SteadyRuns[S]):
    """Who runs each step and how many tokens each, over a `BlockAccounting`.

    Decoding sequences (one token to run, then one to sample) advance together, one token a step,
    so the policy keeps them as a group on one clock: a decoder's tokens in the cache are its
    `decode_base` plus the clock, and only the decoders whose last block is full touch the block
    accounting in a step. Their `num_computed` attribute is brought up to date when asked for
    (`Plan.decoders()`, which the engine calls every step; the simulator never needs to). This is
    what lets the simulator advance a replica by a whole run of steps in time independent of its
    batch size.

    `on_event(kind, seq)` (optional) hears every decision: "admit", "preempt", "finish"."""

    def __init__(
        self,
        blocks: BlockAccounting,
        config: SchedulerConfig,
        on_event: Callable[[str, Any], None] | None = None,
    ):
        self.blocks = blocks
        self.config = config
        # by tenant, fair shares once there are two (engine.fair_queue); it counts the running
        # sequences per tenant from then on, and reads them here when it starts
        self.waiting = FairQueue(config.fair_share, lambda: self.running)
        self.running: list[S] = []  # in arrival order
        self.prefilling: list[S] = []  # the running ones not decoding, in arrival order
        self.preemptions = 0
        self.on_event = on_event
        self.clock = 0  # steps the decode group has taken
        # decoders' blocks hold their tokens at this clock: the clock, or one ahead once a step's
        # full-block decoders have grown together (until the step completes)
        self._held_clock = 0
        # decoders by (decode_base % BLOCK_TOKENS): the ones whose last block is full at clock c are
        # in phase[-c % BLOCK_TOKENS]
        self.phase: list[dict[int, S]] = [{} for _ in range(BLOCK_TOKENS)]
        self._phase_sizes = [0] * BLOCK_TOKENS
        self._seats = config.seat_limit
        self.decode_count = 0
        self._base_sum = 0
        self._order = itertools.count()

    # --- membership -------------------------------------------------------------------------------

    def add(self, seq: S) -> None:
        seq.order = next(self._order)
        seq.decode_base = None
        self.waiting.append(seq, self.clock)

    def configure_tenant(self, tenant: str, weight: float = 1.0, kv_share: float = 1.0) -> None:
        """A tenant's fair-share weight and the share of the blocks it holds before it is the first
        to be preempted (engine.fair_queue)."""
        self.waiting.configure(tenant, weight, kv_share, self.clock)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def computed(self, seq: S) -> int:
        """Tokens of `seq` in the cache now."""
        base = seq.decode_base
        return seq.num_computed if base is None else base + self.clock

    def decode_context(self) -> int:
        """Sum over decoders of the tokens they attend to in their next step (the new one included)."""
        return self._base_sum + self.decode_count * (self.clock + 1)

    def decoders(self) -> list[S]:
        clock = self.clock
        out = []
        for seq in self.running:
            if seq.decode_base is not None:
                seq.num_computed = seq.decode_base + clock
                out.append(seq)
        return out

    def _join(self, seq: S) -> None:
        base = seq.num_computed - self.clock
        seq.decode_base = base
        self.phase[base % BLOCK_TOKENS][seq.order] = seq
        self._phase_sizes[base % BLOCK_TOKENS] += 1
        self.decode_count += 1
        self._base_sum += base
        if self.waiting.fair:
            self.waiting.decoding(seq.tenant, self.clock, 1)

    def _leave(self, seq: S) -> None:
        base = seq.decode_base
        if base is None:
            if seq in self.prefilling:
                self.prefilling.remove(seq)
            return
        seq.num_computed = base + self.clock
        self.blocks.settle(seq.kv, base + self._held_clock)
        del self.phase[base % BLOCK_TOKENS][seq.order]
        self._phase_sizes[base % BLOCK_TOKENS] -= 1
        self.decode_count -= 1
        self._base_sum -= base
        seq.decode_base = None
        if self.waiting.fair:
            self.waiting.decoding(seq.tenant, self.clock, -1)

    def _preempt(self, seq: S) -> None:
        """Free `seq`'s blocks and queue it first, to be recomputed. `on_event("preempt")` hears it
        before its tokens in the cache are reset to 0 (`num_computed` is up to date then)."""
        self._leave(seq)
        self._remove_running(seq)
        self.blocks.release(seq.kv)
        if self.on_event is not None:
            self.on_event("preempt", seq)
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: S) -> None:
        self._leave(seq)
        if not self._remove_running(seq):  # not running: still waiting (or finished already)
            if seq in self.waiting:
                self.waiting.remove(seq)
        self.blocks.release(seq.kv)
        if self.on_event is not None:
            self.on_event("finish", seq)

    def _remove_running(self, seq: S) -> bool:
        """Take `seq` out of `running` (kept in arrival order, so found by bisection: a batch holds
        hundreds); False when it is not there."""
        running = self.running
        i = bisect.bisect_left(running, seq.order, key=_ORDER)
        if i < len(running) and running[i] is seq:
            del running[i]
            if self.waiting.fair:
                self.waiting.stopped(seq.tenant)
            return True
        return False

    # --- one step ---------------------------------------------------------------------------------

    def schedule(self) -> Plan[S]:
        """The sequences to run this step and how many of their tokens each."""
        limit = self.config.max_num_batched_tokens
        running, prefilling, waiting = self.running, self.prefilling, self.waiting
        preempted_before = self.preemptions
        # a prefill with one prompt token left runs it as a decoder (and samples)
        if prefilling:
            for seq in [s for s in prefilling if s.remaining == 1]:
                prefilling.remove(seq)
                self._join(seq)
        # decoders first, one token each; only those whose last block is full need a block
        clock = self.clock
        full = self.phase[-clock % BLOCK_TOKENS]
        if full:
            blocks = self.blocks
            if len(full) <= blocks.free_blocks:  # one block each, and there are enough: together
                blocks.grow_decoders(partial(_targets, [full], clock + 1), len(full))
                self._held_clock = clock + 1
            else:
                for _, seq in sorted(full.items()):
                    base = seq.decode_base
                    if base is not None and seq.status is RUNNING:  # not preempted in this loop
                        blocks.settle(seq.kv, base + clock)
                        self._grow_or_preempt(seq, base + clock + 1)
        budget = limit - self.decode_count
        chunks: list[tuple[S, int]] = []
        blocks = self.blocks
        for seq in list(prefilling) if prefilling else ():
            if budget == 0:
                break
            if seq.status is not RUNNING:
                continue
            want = min(seq.remaining, budget)
            tokens = seq.num_computed + want
            if blocks.grow(seq.kv, tokens) or self._grow_or_preempt(seq, tokens):
                chunks.append((seq, want))
                budget -= want
        if self.preemptions != preempted_before:  # drop the chunks of sequences preempted since
            chunks = [(s, n) for s, n in chunks if s.status is RUNNING]
            budget = limit - self.decode_count - sum(n for _, n in chunks)
        skip = self._over_share() if waiting.fair and waiting.quotas else frozenset()
        while waiting and budget > 0 and len(running) < self._seats:
            head = waiting.head(clock, skip)
            if head is None:  # only tenants over their KV share wait: admit them (work-conserving)
                skip = frozenset()
                head = waiting.head(clock)
            assert head is not None  # someone waits
            seq = head
            # a prompt prefix whose blocks the cache already holds is not run again
            cached = blocks.cached_prefix(seq.kv) if not seq.num_computed else 0
            want = min(seq.remaining - cached, budget)
            if not blocks.grow(seq.kv, cached + want):
                break  # the chosen head waits for room: nobody overtakes it
            if cached:
                seq.num_computed = cached
            waiting.pop(seq)
            if waiting.fair:
                waiting.started(seq.tenant)
            seq.status = RUNNING
            # both lists stay in arrival order, which a re-admitted sequence or a fair share's
            # choice breaks: the newest is the next victim, and finish() finds a sequence by order
            if running and running[-1].order > seq.order:
                bisect.insort(running, seq, key=_ORDER)
            else:
                running.append(seq)
            if prefilling and prefilling[-1].order > seq.order:
                bisect.insort(prefilling, seq, key=_ORDER)
            else:
                prefilling.append(seq)
            chunks.append((seq, want))
            budget -= want
            if self.on_event is not None:
                self.on_event("admit", seq)
        return Plan(self, chunks)

    def _grow_or_preempt(self, seq: S, tokens: int) -> bool:
        """Room for `tokens` tokens of `seq`, preempting the newest running sequences as needed;
        False when `seq` itself was preempted."""
        while not self.blocks.grow(seq.kv, tokens):
            victim = self._victim()
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def completed(self, plan: Plan[S]) -> None:
        """The executor ran `plan`: the decoders' clock and the chunks' tokens advance, and a chunk
        that completes its prompt (it samples now) decodes from the next step on."""
        if plan.decode_count:
            self.clock += 1
        self._held_clock = self.clock
        fair = self.waiting.fair
        for seq, n in plan.chunks:
            seq.num_computed += n
            if fair:
                self.waiting.charge_prefill(seq.tenant, n)
            if seq.remaining == 0 and seq.status is RUNNING:
                self.prefilling.remove(seq)
                self._join(seq)

    # --- KV shares ----------------------------------------------------------------------------------

    def _held_by_tenant(self) -> dict[str, int]:
        held: dict[str, int] = {}
        blocks, clock = self.blocks, self._held_clock
        for seq in self.running:
            base = seq.decode_base
            n = blocks.held(seq.kv) if base is None else blocks.blocks_for(base + clock)
            held[seq.tenant] = held.get(seq.tenant, 0) + n
        return held

    def _over_share(self) -> frozenset[str]:
        return frozenset(self.waiting.over_share(self._held_by_tenant(), self.blocks.num_blocks))

    def _victim(self) -> S:
        """The sequence to preempt: the newest of the tenant furthest over its KV share, if any
        tenant is over its share, else the newest running."""
        waiting = self.waiting
        if waiting.fair and waiting.quotas:
            over = waiting.over_share(self._held_by_tenant(), self.blocks.num_blocks)
            if over:
                worst = over[0]
                for seq in reversed(self.running):
                    if seq.tenant == worst:
                        return seq
        return self.running[-1]


_ORDER = operator.attrgetter("order")
