"""The scheduling policy: continuous batching with chunked prefill and preemption by recompute.

One policy object serves both the live engine (engine.engine.LLMEngine, which runs the model on
what the policy plans) and the capacity simulator (capacity.replica, which charges modelled step
times instead), so a scheduling change is made once and the simulator cannot drift from the engine.
It decides on sequence and block counts only: it never sees tensors, tokens or clocks.

Each step: running sequences that are decoding go first (one token each), then sequences still
prefilling continue their prompt in chunks, then waiting sequences are admitted first come, first
served, all under a per-step token budget and a cap on sequences. When the cache runs out of blocks
the newest running sequence is preempted: its blocks are freed and it goes back to the front of
the queue to be recomputed later, so no request starves and the oldest always make progress.

What the policy needs of a sequence (`SeqLike`) and of the block accounting (`BlockAccounting`) is
declared in engine.policy_types; the engine's KV block pool and the simulator's `BlockCounts`
(engine.block_counts) both provide it.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, NamedTuple

from engine.block_counts import BlockCounts
from engine.policy_types import (
    BLOCK_TOKENS,
    RUNNING,
    BlockAccounting,
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


class Plan:
    """One step: every decoding sequence runs one token, then `chunks` run (sequence, tokens)."""

    __slots__ = ("policy", "decode_count", "decode_context", "chunks")

    def __init__(self, policy: SchedulingPolicy, chunks: list[tuple[SeqLike, int]]):
        self.policy = policy
        self.decode_count = policy.decode_count
        # the tokens the decoders attend to, their new ones included
        self.decode_context = policy.decode_context()
        self.chunks = chunks

    def __bool__(self) -> bool:
        return bool(self.decode_count or self.chunks)

    def decoders(self) -> list[SeqLike]:
        """The decoding sequences in arrival order, their `num_computed` brought up to date."""
        return self.policy.decoders()

    def entries(self) -> list[tuple[SeqLike, int]]:
        return [(seq, 1) for seq in self.decoders()] + self.chunks


class SchedulingPolicy:
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
        self.waiting: deque[SeqLike] = deque()
        self.running: list[SeqLike] = []  # in arrival order
        self.prefilling: list[SeqLike] = []  # the running ones not decoding, in arrival order
        self.preemptions = 0
        self.on_event = on_event
        self.clock = 0  # steps the decode group has taken
        # decoders' blocks hold their tokens at this clock: the clock, or one ahead once a step's
        # full-block decoders have grown together (until the step completes)
        self._held_clock = 0
        # decoders by (decode_base % BLOCK_TOKENS): the ones whose last block is full at clock c are
        # in phase[-c % BLOCK_TOKENS]
        self.phase: list[dict[int, SeqLike]] = [{} for _ in range(BLOCK_TOKENS)]
        self._phase_sizes = [0] * BLOCK_TOKENS
        self._seats = config.seat_limit
        self.decode_count = 0
        self._base_sum = 0
        self._order = itertools.count()

    # --- membership -------------------------------------------------------------------------------

    def add(self, seq: SeqLike) -> None:
        seq.order = next(self._order)
        seq.decode_base = None
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def computed(self, seq: SeqLike) -> int:
        """Tokens of `seq` in the cache now."""
        base = seq.decode_base
        return seq.num_computed if base is None else base + self.clock

    def decode_context(self) -> int:
        """Sum over decoders of the tokens they attend to in their next step (the new one included)."""
        return self._base_sum + self.decode_count * (self.clock + 1)

    def decoders(self) -> list[SeqLike]:
        clock = self.clock
        out = []
        for seq in self.running:
            if seq.decode_base is not None:
                seq.num_computed = seq.decode_base + clock
                out.append(seq)
        return out

    def _join(self, seq: SeqLike) -> None:
        base = seq.num_computed - self.clock
        seq.decode_base = base
        self.phase[base % BLOCK_TOKENS][seq.order] = seq
        self._phase_sizes[base % BLOCK_TOKENS] += 1
        self.decode_count += 1
        self._base_sum += base

    def _leave(self, seq: SeqLike) -> None:
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

    def _preempt(self, seq: SeqLike) -> None:
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

    def finish(self, seq: SeqLike) -> None:
        self._leave(seq)
        if not self._remove_running(seq):  # not running: still waiting (or finished already)
            if seq in self.waiting:
                self.waiting.remove(seq)
        self.blocks.release(seq.kv)
        if self.on_event is not None:
            self.on_event("finish", seq)

    def _remove_running(self, seq: SeqLike) -> bool:
        """Take `seq` out of `running` (kept in arrival order, so found by bisection: a batch holds
        hundreds); False when it is not there."""
        running = self.running
        i = bisect.bisect_left(running, seq.order, key=_ORDER)
        if i < len(running) and running[i] is seq:
            del running[i]
            return True
        return False

    # --- one step ---------------------------------------------------------------------------------

    def schedule(self) -> Plan:
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
                    if seq.status is RUNNING:  # not preempted earlier in this loop
                        blocks.settle(seq.kv, seq.decode_base + clock)
                        self._grow_or_preempt(seq, seq.decode_base + clock + 1)
        budget = limit - self.decode_count
        chunks: list[tuple[SeqLike, int]] = []
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
        readmitted = False
        while waiting and budget > 0 and len(running) < self._seats:
            seq = waiting[0]
            # a prompt prefix whose blocks the cache already holds is not run again
            cached = blocks.cached_prefix(seq.kv) if not seq.num_computed else 0
            want = min(seq.remaining - cached, budget)
            if not blocks.grow(seq.kv, cached + want):
                break  # first come, first served: nobody overtakes the head of the queue
            if cached:
                seq.num_computed = cached
            waiting.popleft()
            seq.status = RUNNING
            readmitted = readmitted or seq.preemptions > 0
            running.append(seq)
            prefilling.append(seq)
            chunks.append((seq, want))
            budget -= want
            if self.on_event is not None:
                self.on_event("admit", seq)
        if readmitted:  # keep arrival order, so a re-admitted sequence is not the next victim
            running.sort(key=_ORDER)
            prefilling.sort(key=_ORDER)
        return Plan(self, chunks)

    def _grow_or_preempt(self, seq: SeqLike, tokens: int) -> bool:
        """Room for `tokens` tokens of `seq`, preempting the newest running sequences as needed;
        False when `seq` itself was preempted."""
        while not self.blocks.grow(seq.kv, tokens):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def completed(self, plan: Plan) -> None:
        """The executor ran `plan`: the decoders' clock and the chunks' tokens advance, and a chunk
        that completes its prompt (it samples now) decodes from the next step on."""
        if plan.decode_count:
            self.clock += 1
        self._held_clock = self.clock
        for seq, n in plan.chunks:
            seq.num_computed += n
            if seq.remaining == 0 and seq.status is RUNNING:
                self.prefilling.remove(seq)
                self._join(seq)

    # --- steady runs (the simulator advances each as one event) -----------------------------------

    def _rooms(self) -> list[int]:
        """How many decoders have r free token slots in their last block, for r in 0..15."""
        full = -self.clock % BLOCK_TOKENS  # the phase whose decoders have 0 free slots, then 1, ...
        sizes = self._phase_sizes
        return sizes[full::-1] + sizes[:full:-1]

    def steady_run(self, limit: int) -> SteadyRun | None:
        """The next steps (at most `limit`) that are certain to repeat one plan, with nothing
        arriving and nothing finishing: every running sequence decodes one token, beside at most one
        that prefills a full chunk of the budget; nobody admitted, nobody preempted. None when the
        next step is not such a step.

        Exact, not an estimate: free blocks only shrink during such a run, so a waiting head that
        cannot be admitted at the run's first step cannot be admitted later in it."""
        if not self.running or limit < 1:
            return None
        prefilling = self.prefilling
        if prefilling:
            if len(prefilling) > 1:
                return None  # two prefill chunks share this step (or one joins the decoders)
            prefill = prefilling[0]
            if prefill.remaining == 1:
                return None  # a prefill with one prompt token left joins the decoders at schedule()
            return self._prefill_run(prefill, limit)
        blocks, n = self.blocks, self.decode_count
        free = blocks.free_blocks
        sizes, f = self._phase_sizes, -self.clock % BLOCK_TOKENS
        full = sizes[f]  # the step-1 blocks: decoders with 0 free slots
        if full > free:
            return None
        waiting = self.waiting
        if waiting and len(self.running) < self._seats:
            head = waiting[0]
            want = min(head.remaining, self.config.max_num_batched_tokens - n)
            # admitted at the next step if it fits beside the decoders' step-1 blocks
            if want > 0 and blocks.blocks_needed(head.kv, head.num_computed + want) <= free - full:
                return None
        # every decoder takes one block per 16 steps, so k steps take at most ceil(k / 16) * n
        if ((limit + BLOCK_TOKENS - 1) // BLOCK_TOKENS) * n <= free:
            return _new_run(SteadyRun, (limit, None, 0))
        # the blocks run out first: q whole rounds of 16 steps, then s more steps, where step j + 1
        # of a round takes a block for each decoder with j free slots (phase f - j)
        q = free // n
        left = free - q * n
        s = 0
        while s < BLOCK_TOKENS - 1:
            left -= sizes[(f - s) % BLOCK_TOKENS]
            if left < 0:
                break
            s += 1
        steps = q * BLOCK_TOKENS + s
        return _new_run(SteadyRun, (steps if steps < limit else limit, None, 0))

    def _prefill_run(self, prefill: SeqLike, limit: int) -> SteadyRun | None:
        """The steady run of the decoders beside one prefill taking a full chunk each step."""
        blocks, budget, n = self.blocks, self.config.max_num_batched_tokens, self.decode_count
        free = blocks.free_blocks
        below_room = list(itertools.accumulate(self._rooms(), initial=0))

        def decode_need(k: int) -> int:
            q, s = divmod(k, BLOCK_TOKENS)
            return q * n + below_room[s]

        chunk = budget - n
        if chunk <= 0:
            return None
        limit = min(limit, (prefill.remaining - 1) // chunk)  # full chunks, none sampling
        if limit < 1:
            return None
        p_start, p_held = prefill.num_computed, blocks.held(prefill.kv)

        def need(k: int) -> int:  # new blocks the run takes over k steps
            return decode_need(k) + max(0, blocks.blocks_for(p_start + k * chunk) - p_held)

        if need(1) > free:
            return None  # no admission is possible: the chunk takes the whole budget
        lo, hi = 1, limit
        while lo < hi:  # the largest k with need(k) <= free
            mid = (lo + hi + 1) // 2
            if need(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return SteadyRun(lo, prefill, chunk)

    def advance(self, run: SteadyRun, steps: int) -> None:
        """Take `steps` steps of `run` (at most `run.steps`) as that many schedule() + completed()
        calls would; the caller advances the sequences' sampled tokens."""
        clock, n = self.clock, self.decode_count
        end = clock + steps
        if n:
            # each decoder takes a block in every round of 16 steps, and in the s steps left over
            # those with fewer than s free slots: the phases of steps 1..s (see steady_run)
            rounds, s = divmod(steps, BLOCK_TOKENS)
            sizes, f = self._phase_sizes, -clock % BLOCK_TOKENS
            new = rounds * n
            for j in range(s):
                new += sizes[(f - j) % BLOCK_TOKENS]
            self.blocks.grow_decoders(partial(_run_targets, self.phase, clock, steps), new)
        self.clock = self._held_clock = end
        if run.prefill is not None:
            seq = run.prefill
            self.blocks.grow(seq.kv, seq.num_computed + run.chunk * steps)
            seq.num_computed += run.chunk * steps


class SteadyRun(NamedTuple):
    """`steps` steps of one plan: every running sequence decodes, but `prefill` takes `chunk` tokens."""

    steps: int
    prefill: Any  # the sequence prefilling a full chunk each step, or None
    chunk: int


def _run_targets(phase: list[dict[int, SeqLike]], clock: int, steps: int) -> Iterator[tuple[Any, int]]:
    """`_targets` of the decoders whose last block fills in a run of `steps` steps from `clock`."""
    groups = [phase[-(clock + j) % BLOCK_TOKENS] for j in range(min(steps, BLOCK_TOKENS))]
    return _targets(groups, clock + steps)


def _targets(groups: list[dict[int, SeqLike]], clock: int) -> Iterator[tuple[Any, int]]:
    """The decoders of `groups` in arrival order within each, with their tokens at `clock` (handed
    to grow_decoders unevaluated: an accounting that takes only the total never walks the batch)."""
    for group in groups:
        for _, seq in sorted(group.items()):
            yield seq.kv, seq.decode_base + clock


_ORDER = operator.attrgetter("order")
_new_run = tuple.__new__  # SteadyRun without its Python-level __new__ (the simulator's hot path)
