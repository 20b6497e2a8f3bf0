"""Steady runs: the scheduling policy's certificate that its next steps repeat one plan.

The capacity simulator advances a replica by a whole run of identical steps as one event, so that
simulated time costs what changes (admissions, finishes, prefill chunks), not the batch size. These
methods belong to engine.sched.policy.SchedulingPolicy (a mixin over its state: the decode group's clock
and phases, the block accounting, the waiting queue); the live engine never calls them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any, Generic, NamedTuple

from engine.sched.fair_queue import FairQueue
from engine.sched.policy_types import (
    BLOCK_TOKENS,
    CONTENDED_PREFILL_TOKENS,
    BlockAccounting,
    S,
    SchedulerConfig,
)


class SteadyRuns(Generic[S]):
    """steady_run() and advance(), over a SchedulingPolicy's attributes (declared here, set there)."""

    blocks: BlockAccounting
    config: SchedulerConfig
    waiting: FairQueue
    running: list[S]
    prefilling: list[S]
    clock: int
    _held_clock: int
    phase: list[dict[int, S]]
    _phase_sizes: list[int]
    _seats: int
    decode_count: int
    steps: int
    paused: dict[int, S]

    def fair_preemption_horizon(self, limit: int, prefill: bool) -> int:
        """Steps over which no preemption for a tenant's share can become possible (the policy's)."""
        return limit

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
        if self.waiting.fair:  # no steady run past a step that may preempt for a share
            limit = self.fair_preemption_horizon(limit, bool(self.prefilling))
            if limit < 1:
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
            if self.paused:
                return None  # a head may be admitted on blocks a paused sequence gives up
            # with fair shares the next head may change as the counters move: any may be admitted
            heads: Iterable[Any] = waiting.heads() if waiting.fair else (waiting.head(self.clock),)
            budget = self.config.max_num_batched_tokens - n
            for head in heads:
                # as schedule() admits it: after the prefix the cache holds of it
                cached = blocks.cached_prefix(head.kv) if not head.num_computed else 0
                want = min(head.remaining - cached, budget)
                start = head.num_computed or cached
                # admitted at the next step if it fits beside the decoders' step-1 blocks
                if want > 0 and blocks.blocks_needed(head.kv, start + want) <= free - full:
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

    def _prefill_run(self, prefill: S, limit: int) -> SteadyRun | None:
        """The steady run of the decoders beside one prefill taking a full chunk each step."""
        blocks, budget, n = self.blocks, self.config.max_num_batched_tokens, self.decode_count
        free = blocks.free_blocks
        below_room = list(itertools.accumulate(self._rooms(), initial=0))

        def decode_need(k: int) -> int:
            q, s = divmod(k, BLOCK_TOKENS)
            return q * n + below_room[s]

        chunk = budget - n
        if self.waiting.fair:
            if prefill.tenant in self.waiting.contended(self._seats, self.steps):
                chunk = min(chunk, CONTENDED_PREFILL_TOKENS)  # as schedule() caps it
            limit = min(limit, self.waiting.presence_horizon(self.steps))  # the cap holds throughout
        if chunk <= 0:
            return None
        if chunk < budget - n and self.waiting and len(self.running) < self._seats:
            return None  # a capped chunk leaves budget: a waiting head may be admitted beside it
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
        self.steps += steps
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
            self.waiting.charge_prefill(seq.tenant, run.chunk * steps)
        if self.waiting.fair:  # the tenants with work were present at every step of the run
            self.waiting.note(self.steps - 1)


class SteadyRun(NamedTuple):
    """`steps` steps of one plan: every running sequence decodes, but `prefill` takes `chunk` tokens."""

    steps: int
    prefill: Any  # the sequence prefilling a full chunk each step, or None
    chunk: int


def _run_targets(phase: list[dict[int, S]], clock: int, steps: int) -> Iterator[tuple[Any, int]]:
    """`_targets` of the decoders whose last block fills in a run of `steps` steps from `clock`."""
    groups = [phase[-(clock + j) % BLOCK_TOKENS] for j in range(min(steps, BLOCK_TOKENS))]
    return _targets(groups, clock + steps)


def _targets(groups: list[dict[int, S]], clock: int) -> Iterator[tuple[Any, int]]:
    """The decoders of `groups` in arrival order within each, with their tokens at `clock` (handed
    to grow_decoders unevaluated: an accounting that takes only the total never walks the batch)."""
    for group in groups:
        for _, seq in sorted(group.items()):
            base = seq.decode_base
            assert base is not None  # a decoder
            yield seq.kv, base + clock


_new_run = tuple.__new__  # SteadyRun without its Python-level __new__ (the simulator's hot path)
