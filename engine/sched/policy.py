"""The scheduling policy: continuous batching with chunked prefill, and preemption by pause or recompute.

One policy object serves both the live engine (engine.engine.LLMEngine, which runs the model on
what the policy plans) and the capacity simulator (capacity.replica, which charges modelled step
times instead), so a scheduling change is made once and the simulator cannot drift from the engine.
It decides on sequence and block counts only: it never sees tensors, tokens or clocks.

Each step: running sequences that are decoding go first (one token each), then sequences still
prefilling continue their prompt in chunks, then waiting sequences are admitted in fair-share
order (engine.sched.fair_queue: virtual token counters between tenants; arrival order with one tenant),
all under a per-step token budget and a cap on sequences. When the cache runs out of blocks
the newest running sequence (of the tenant furthest over its KV share, if one is) is preempted:
its blocks are freed and it goes back to the front of its tenant's queue to be recomputed later,
so no request starves and the oldest always make progress. A prompt prefix the cache holds
(`cached_prefix`) is attached at admission instead of being run again.

Shares under contention (once a second tenant is seen): while another tenant has work waiting, a
tenant is admitted only up to its weighted share (engine.sched.fair_queue.share) of the decode seats and
of the KV blocks; a tenant alone uses everything (work-conserving), and if every waiting tenant is
at its share the fair head is admitted anyway. When the fair head (the waiting tenant with the
least service) is under its share and there is no seat or no blocks for it, running sequences of
the tenant furthest over its share, with no less service than the head's, are preempted. By pause
(SchedulerConfig.preemption, the default) when a seat is all the head lacks: the victim goes back to
waiting with its KV blocks and staging slot kept (counted against its tenant's block share) and,
readmitted, rejoins the decoders where it stopped, with no token run again; on a CPU the cache is
host memory already, so keeping it costs blocks, not a copy. By recompute (as vLLM v1 does) when the
head needs blocks, or with preemption = "recompute": its blocks are freed and its prefill, run
again, is charged to its own tenant. Short of blocks or staging slots, a paused sequence's go
before any running one's ("drop": it is recomputed when readmitted). Preemption is bounded: a
victim's tenant keeps at least its share after it (so the two never trade a seat back and forth),
and a sequence so preempted is not preempted so again within PREEMPT_COOLDOWN_STEPS steps.

Step time under contention: what a light tenant's new request waits for is the step in flight and
then the step its prompt runs in, and beside another tenant's full batch both are as long as that
batch's steps, and beside another tenant's prompt chunks both are as long as a full token budget's
prefill. So while another tenant has work, a tenant running more sequences than it (by weight), or
more than its share of the seats, prefills at most CONTENDED_PREFILL_TOKENS tokens a step
(FairQueue.contended: the step in flight stays a decode step plus a bounded chunk, and so does the
step the other's prompt runs in), and a new prompt of a tenant short of its seat share runs in a
step without the decoders (`prefill_alone`; never two such steps in a row, so the decoders lose at
most every other step).

What the policy needs of a sequence (`SeqLike`) and of the block accounting (`BlockAccounting`) is
declared in engine.sched.policy_types; the engine's KV block pool and the simulator's `BlockCounts`
(engine.sched.block_counts) both provide it.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable
from functools import partial
from typing import Any, Generic

from engine.sched.block_counts import BlockCounts
from engine.sched.fair_queue import FairQueue
from engine.sched.policy_runs import SteadyRun, SteadyRuns, _targets
from engine.sched.policy_types import (
    BLOCK_TOKENS,
    CONTENDED_PREFILL_TOKENS,
    PREEMPT_COOLDOWN_STEPS,
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
    "PREEMPT_COOLDOWN_STEPS",
    "SchedulerConfig",
    "SchedulingPolicy",
    "SeqLike",
    "SeqStatus",
    "SteadyRun",
]


class Plan(Generic[S]):
    """One step: every decoding sequence runs one token, then `chunks` run (sequence, tokens)."""

    __slots__ = ("policy", "decode_count", "decode_context", "chunks")

    def __init__(self, policy: SchedulingPolicy[S], chunks: list[tuple[S, int]], decoding: bool = True):
        """`decoding=False`: the decoders sit this step out (only `chunks` run)."""
        self.policy = policy
        self.decode_count = policy.decode_count if decoding else 0
        # the tokens the decoders attend to, their new ones included
        self.decode_context = policy.decode_context() if decoding else 0
        self.chunks = chunks

    def __bool__(self) -> bool:
        return bool(self.decode_count or self.chunks)

    def decoders(self) -> list[S]:
        """The decoding sequences in arrival order, their `num_computed` brought up to date."""
        return self.policy.decoders() if self.decode_count else []

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
        # by tenant, fair shares once there are two (engine.sched.fair_queue); it counts the running
        # sequences per tenant from then on, and reads them here when it starts
        self.waiting = FairQueue(config.fair_share, lambda: self.running)
        self.running: list[S] = []  # in arrival order
        self.prefilling: list[S] = []  # the running ones not decoding, in arrival order
        self.preemptions = 0  # pauses included
        self.pauses = 0  # of those, preempted with their blocks kept
        # waiting sequences preempted by pause, holding their blocks, by order (SchedulerConfig.preemption)
        self.paused: dict[int, S] = {}
        self._pause = config.preemption == "pause"
        self.fair_preemptions = 0  # of those, made for another tenant's share (not for lack of blocks)
        self.tenant_preemptions: dict[str, int] = {}  # preemptions by the preempted sequence's tenant
        self.steps = 0  # steps completed (the preemption bound counts them)
        self._preempted_at: dict[int, int] = {}  # by order: the step a sequence was last preempted
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
        self._alone_at = -2  # the step (by `steps`) of the last prefill without the decoders
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
        to be preempted (engine.sched.fair_queue)."""
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

    def advance_decoder(self, seq: S, tokens: int) -> None:
        """A decoder's step computed `tokens` more of its tokens than the group's one (accepted
        draft tokens of speculative decoding, written within a block it holds): it moves ahead of
        the clock by that many, and its tenant is charged for them."""
        base = seq.decode_base
        if base is None or tokens <= 0:
            return
        del self.phase[base % BLOCK_TOKENS][seq.order]
        self._phase_sizes[base % BLOCK_TOKENS] -= 1
        base += tokens
        seq.decode_base = base
        self.phase[base % BLOCK_TOKENS][seq.order] = seq
        self._phase_sizes[base % BLOCK_TOKENS] += 1
        self._base_sum += tokens
        if self.waiting.fair:
            self.waiting.charge_prefill(seq.tenant, tokens)

    def _preempt(self, seq: S, keep: bool = False) -> None:
        """Take `seq` out of the batch and queue it first. Its blocks are freed, to be recomputed
        (`on_event("preempt")` hears it before its tokens in the cache are reset to 0, with
        `num_computed` up to date), or with `keep` they stay its own while it waits (a pause:
        `on_event("pause")`), and it resumes where it stopped."""
        self._leave(seq)
        self._remove_running(seq)
        seq.status = SeqStatus.WAITING
        if keep:
            self.paused[seq.order] = seq
            self.pauses += 1
            if self.on_event is not None:
                self.on_event("pause", seq)
        else:
            self._discard(seq, "preempt")
        self.preemptions += 1
        self.tenant_preemptions[seq.tenant] = self.tenant_preemptions.get(seq.tenant, 0) + 1
        self._preempted_at[seq.order] = self.steps
        self.waiting.appendleft(seq)

    def _drop_paused(self, keep: Any = None, held: dict[str, int] | None = None) -> bool:
        """Free the blocks of the newest paused sequence (not `keep`; `held`, blocks by tenant, kept
        up to date): it stays first in its tenant's queue and is recomputed when readmitted
        (`on_event("drop")`, heard before its tokens in the cache are reset). False when no other
        sequence is paused."""
        paused = self.paused
        for order in sorted(paused, reverse=True):
            seq = paused[order]
            if seq is keep:
                continue
            del paused[order]
            if held is not None:
                held[seq.tenant] = held.get(seq.tenant, 0) - self.blocks.held(seq.kv)
            self._discard(seq, "drop")
            return True
        return False

    def _discard(self, seq: S, kind: str) -> None:
        """Free `seq`'s blocks: it is recomputed when readmitted. `on_event(kind)` hears it before its
        tokens in the cache are reset to 0 (`num_computed` is up to date then)."""
        self.blocks.release(seq.kv)
        if self.on_event is not None:
            self.on_event(kind, seq)
        seq.num_computed = 0
        seq.preemptions += 1

    def finish(self, seq: S) -> None:
        self._preempted_at.pop(seq.order, None)
        if self.paused:
            self.paused.pop(seq.order, None)
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
        prefilling, waiting = self.prefilling, self.waiting
        preempted_before = self.preemptions
        if waiting.fair:
            waiting.note(self.steps)
        if waiting and self.decode_count and waiting.fair and self.config.prefill_alone:
            alone = self._prefill_alone()
            if alone is not None:
                return alone
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
        reserve = 0
        if waiting and prefilling and waiting.fair:
            # the next tenant to admit, with no prompt in flight, keeps up to half of this step's
            # budget: its prefill starts in this step, not behind every chunk of another tenant's
            # long prompt (unused, the budget goes to the running prompts next step)
            head = waiting.head(clock)
            if head is not None and all(s.tenant != head.tenant for s in prefilling):
                reserve = min(head.remaining, budget // 2)
        # prompt tokens this step of each tenant that runs more than another one present, or over
        # its seat share (CONTENDED_PREFILL_TOKENS each: the steps the others wait for stay short)
        hogs: dict[str, int] = (
            dict.fromkeys(waiting.contended(self._seats, self.steps), 0) if waiting.fair else {}
        )
        for seq in list(prefilling) if prefilling else ():
            if budget - reserve <= 0:
                break
            if seq.status is not RUNNING:
                continue
            want = min(seq.remaining, budget - reserve)
            if hogs and seq.tenant in hogs:
                want = min(want, CONTENDED_PREFILL_TOKENS - hogs[seq.tenant])
                if want <= 0:
                    continue
            tokens = seq.num_computed + want
            if blocks.grow(seq.kv, tokens) or self._grow_or_preempt(seq, tokens):
                chunks.append((seq, want))
                budget -= want
                if hogs and seq.tenant in hogs:
                    hogs[seq.tenant] += want
        if self.preemptions != preempted_before:  # drop the chunks of sequences preempted since
            chunks = [(s, n) for s, n in chunks if s.status is RUNNING]
            budget = limit - self.decode_count - sum(n for _, n in chunks)
        if waiting and budget > 0:
            chunks = self._admit(chunks, hogs=hogs)
        return Plan(self, chunks)

    def _admit(
        self,
        chunks: list[tuple[S, int]],
        decoding: bool = True,
        only: frozenset[str] | None = None,
        hogs: dict[str, int] | None = None,
    ):
        """Admit waiting sequences in fair-share order into a step whose prefill chunks are `chunks`
        (preempting for a share where it must), within the step's token budget (less the decoders',
        when they run in it); the step's chunks with theirs. `only`: admit of these tenants only.
        `hogs`: the prompt tokens in this step so far of each tenant held to CONTENDED_PREFILL_TOKENS
        a step (FairQueue.contended; updated here)."""
        running, waiting, blocks = self.running, self.waiting, self.blocks
        clock, limit = self.clock, self.config.max_num_batched_tokens

        def room() -> int:  # (a preemption may take a decoder out of the step)
            return limit - (self.decode_count if decoding else 0) - sum(n for _, n in chunks)

        budget = room()
        fair = waiting.fair
        over = self._over_share() if fair and waiting.quotas else frozenset()
        # with fair shares: blocks held by tenant (kept up to date below) and the sequences admitted
        # in this step (never the victims of a preemption in it)
        held: dict[str, int] = self._held_by_tenant() if fair and waiting else {}
        admitted: set[int] = set()
        others = frozenset(waiting.waiting_tenants()) - only if only is not None else frozenset()
        if hogs is None:
            hogs = {}
        while waiting and budget > 0:
            if len(running) >= self._seats and not fair:
                break
            capped = self._capped(held) if fair else frozenset()
            skip = over | capped | others
            if hogs:
                skip |= frozenset(name for name, n in hogs.items() if n >= CONTENDED_PREFILL_TOKENS)
            head = waiting.head(clock, skip) if skip else waiting.head(clock)
            if head is None:  # every waiting tenant is at its share: admit anyway (work-conserving)
                if only is not None:
                    break
                head = waiting.head(clock, capped) if over else None
                if head is None:
                    head = waiting.head(clock)
            assert head is not None  # someone waits
            seq = head
            # a paused decoder resumes as one (its one token to run is no prompt); blocks it holds
            # are counted in `held` already
            paused = self.paused
            resume = decoding and bool(paused) and seq.order in paused and seq.remaining == 1
            had = blocks.held(seq.kv) if fair else 0
            # a prompt prefix whose blocks the cache already holds is not run again
            cached = blocks.cached_prefix(seq.kv) if not seq.num_computed else 0
            want = 1 if resume else _capped_want(seq, min(seq.remaining - cached, budget), hogs)
            if want <= 0:  # only tenants at their prompt tokens for this step wait
                break
            start = seq.num_computed or cached  # (a paused sequence holds its computed tokens)
            if len(running) >= self._seats or not self._grow_dropping(seq, start + want, held):
                # the chosen head waits for room, and nobody overtakes it; under its share, it may
                # take room from the tenant furthest over its own
                if not fair or seq.tenant in capped or not self._make_room(seq, start + want, held, admitted):
                    break
                chunks = [(s, n) for s, n in chunks if s.status is RUNNING]
                budget = room()
                cached = blocks.cached_prefix(seq.kv) if not seq.num_computed else 0
                if not resume:
                    want = _capped_want(seq, min(seq.remaining - cached, budget), hogs)
                start = seq.num_computed or cached
                if want <= 0 or budget < want or not blocks.grow(seq.kv, start + want):
                    break
            if fair:
                held[seq.tenant] = held.get(seq.tenant, 0) + blocks.held(seq.kv) - had
                admitted.add(seq.order)
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
            was_paused = bool(paused) and paused.pop(seq.order, None) is not None
            if resume:  # it decodes in this step, as it would have had it not been paused
                self._join(seq)
                budget -= 1
                if self.on_event is not None:
                    self.on_event("resume", seq)
                continue
            prefilling = self.prefilling
            if prefilling and prefilling[-1].order > seq.order:
                bisect.insort(prefilling, seq, key=_ORDER)
            else:
                prefilling.append(seq)
            chunks.append((seq, want))
            budget -= want
            if seq.tenant in hogs:
                hogs[seq.tenant] += want
            if self.on_event is not None:
                self.on_event("resume" if was_paused else "admit", seq)
        return chunks

    def _prefill_alone(self) -> Plan[S] | None:
        """A step without the decoders for the new prompts of tenants short of their seat share
        while another tenant runs more than its own, or running at most half as many sequences as
        another (FairQueue.short_of_seats); None when no such prompt is admitted now. Beside
        another's batch, a light tenant's prefill would take a step as long as the whole batch's;
        alone it takes what it takes alone, and the decoders lose one step of their time. Never
        two such steps in a row, so the decoders keep at least every other step whoever keeps
        arriving."""
        if self.steps <= self._alone_at + 1:
            return None
        names = self.waiting.short_of_seats(self._seats)
        if not names:
            return None
        chunks = self._admit([], decoding=False, only=frozenset(names))
        chunks = [(s, n) for s, n in chunks if s.status is RUNNING]
        if not chunks:
            return None
        self._alone_at = self.steps
        return Plan(self, chunks, decoding=False)

    def _grow_dropping(self, seq: S, tokens: int, held: dict[str, int]) -> bool:
        """Room for `tokens` tokens of `seq`, freeing paused sequences' blocks (never its own) as
        needed (`held`: blocks by tenant, kept up to date); False (and nothing changed for `seq`)
        when even that leaves too few."""
        while not self.blocks.grow(seq.kv, tokens):
            if not (self.paused and self._drop_paused(seq, held)):
                return False
        return True

    def _grow_or_preempt(self, seq: S, tokens: int) -> bool:
        """Room for `tokens` tokens of `seq`, preempting the newest running sequences as needed;
        False when `seq` itself was preempted."""
        while not self.blocks.grow(seq.kv, tokens):
            if self.paused and self._drop_paused():  # a paused sequence's blocks go before a running one
                continue
            victim = self._victim()
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def completed(self, plan: Plan[S]) -> None:
        """The executor ran `plan`: the decoders' clock and the chunks' tokens advance, and a chunk
        that completes its prompt (it samples now) decodes from the next step on."""
        self.steps += 1
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
        for seq in self.paused.values():  # a paused sequence's blocks are still its tenant's
            held[seq.tenant] = held.get(seq.tenant, 0) + blocks.held(seq.kv)
        return held

    def _blocks_of(self, seq: S) -> int:
        base = seq.decode_base
        return self.blocks.held(seq.kv) if base is None else self.blocks.blocks_for(base + self._held_clock)

    def _capped(self, held: dict[str, int]) -> frozenset[str]:
        """Waiting tenants at their share of the seats or of the blocks while another tenant has work
        waiting: not admitted before the others (a tenant holding nothing never is capped)."""
        waiting = self.waiting
        names = waiting.waiting_tenants()
        if len(names) < 2:
            return frozenset()
        busy = waiting.busy_weight()
        seats, num_blocks = self._seats, self.blocks.num_blocks
        capped = []
        for name in names:
            running = waiting.running_of(name)
            if not running or not waiting.others_wait(name):
                continue
            if running + 1 > waiting.share(name, seats, busy) or held.get(name, 0) >= waiting.share(
                name, num_blocks, busy
            ):
                capped.append(name)
        return frozenset(capped)

    def _make_room(self, head: S, tokens: int, held: dict[str, int], admitted: set[int]) -> bool:
        """Preempt running sequences of tenants over their share until `head` (the fair head, under
        its share) has a seat and room for `tokens` tokens; False when no sequence may be preempted
        for it (then nothing more is)."""
        waiting, blocks = self.waiting, self.blocks
        busy = waiting.busy_weight()
        name = head.tenant
        running = waiting.running_of(name)
        if running and (
            running + 1 > waiting.share(name, self._seats, busy)
            or held.get(name, 0) >= waiting.share(name, blocks.num_blocks, busy)
        ):
            return False  # at its share already: it waits for room like anyone
        tenant = waiting.tenant(name)
        assert tenant is not None  # it waits
        ahead = waiting.counter(tenant, self.clock)
        while len(self.running) >= self._seats or not blocks.can_grow(head.kv, tokens):
            roomy = blocks.can_grow(head.kv, tokens)
            if not roomy and self.paused and self._drop_paused(head, held):
                continue  # short of blocks: a paused sequence's go before a running one's
            victim = self._fair_victim(name, ahead, held, busy, admitted)
            if victim is None:
                return False
            # short of a seat only: the victim may keep its blocks (pause); else they are needed
            keep = self._pause and roomy
            if not keep:
                held[victim.tenant] = held.get(victim.tenant, 0) - self._blocks_of(victim)
            self.fair_preemptions += 1
            self._preempt(victim, keep)
        return True

    def _fair_victim(
        self, name: str, counter: float, held: dict[str, int], busy: float, admitted: set[int]
    ) -> S | None:
        """The sequence to preempt for tenant `name` (whose counter is `counter`): of the tenant
        furthest over its share (seats or blocks) with no less service, the one of the lowest priority,
        newest first, that leaves its tenant at least its share, was not admitted in this step and
        was not preempted in the last PREEMPT_COOLDOWN_STEPS steps; None when there is none."""
        waiting, clock = self.waiting, self.clock
        seats, num_blocks = self._seats, self.blocks.num_blocks
        ranked: list[tuple[float, str]] = []
        for tenant_name, blocks_held in held.items():
            running = waiting.running_of(tenant_name)
            tenant = waiting.tenant(tenant_name)
            if (
                tenant_name == name
                or not running
                or tenant is None
                or waiting.counter(tenant, clock) < counter
            ):
                continue
            seat_share = waiting.share(tenant_name, seats, busy)
            block_share = waiting.share(tenant_name, num_blocks, busy)
            over = max(running / seat_share, blocks_held / block_share) if seat_share and block_share else 0.0
            if over > 1.0:
                ranked.append((over, tenant_name))
        ranked.sort(reverse=True)
        cooled = self.steps - PREEMPT_COOLDOWN_STEPS
        for _, tenant_name in ranked:
            running = waiting.running_of(tenant_name)
            seat_over = running - 1 >= waiting.share(tenant_name, seats, busy)
            block_share = waiting.share(tenant_name, num_blocks, busy)
            blocks_held = held.get(tenant_name, 0)
            best: S | None = None
            for seq in self.running:
                if seq.tenant != tenant_name or seq.order in admitted:
                    continue
                if self._preempted_at.get(seq.order, cooled) > cooled:
                    continue  # preempted too recently
                if not seat_over and blocks_held - self._blocks_of(seq) < block_share:
                    continue  # its tenant would drop below its share
                if best is None or (seq.priority, seq.order) > (best.priority, best.order):
                    best = seq
            if best is not None:
                return best
        return None

    def fair_preemption_horizon(self, limit: int, prefill: bool) -> int:
        """Steps (at most `limit`) over which no preemption for a share can become possible while
        nothing is admitted or finishes: 0 when one may happen now. Conservative (counters are not
        compared, and blocks are counted as the decoders could take them at most; with a prefill in
        the run, 0 whenever a tenant under its share waits beside another's running sequences), so
        that a steady run never covers a step in which schedule() would preempt for a share."""
        waiting = self.waiting
        if not waiting.fair or not waiting or not self.running:
            return limit
        held = self._held_by_tenant()
        capped = self._capped(held)
        under = [name for name in waiting.waiting_tenants() if name not in capped]
        if not under:
            return limit  # caps only tighten while blocks grow: no waiting tenant comes under its share
        busy = waiting.busy_weight()
        seats, num_blocks = self._seats, self.blocks.num_blocks
        for name, blocks_held in held.items():
            running = waiting.running_of(name)
            if not running or (len(under) == 1 and under[0] == name):
                continue
            if prefill or running - 1 >= waiting.share(name, seats, busy):
                return 0
            # its blocks after k steps are at most blocks_held + running * ceil(k / 16); a victim
            # holds at least one, so no victim is possible while that stays below share + 1
            room = waiting.share(name, num_blocks, busy) + 1 - blocks_held
            rounds = -(-room // running) - 1 if room > 0 else 0
            if rounds <= 0:
                return 0
            limit = min(limit, int(rounds) * BLOCK_TOKENS)
        return limit

    def tenant_stats(self) -> dict[str, tuple[int, int, int, int]]:
        """By tenant: (running sequences, KV blocks held, sequences waiting, preemptions so far)."""
        out: dict[str, list[int]] = {}
        for seq in list(self.running):  # (copies: a metrics reader may call this between steps' changes)
            row = out.setdefault(seq.tenant, [0, 0, 0, 0])
            row[0] += 1
            row[1] += self._blocks_of(seq)
        for seq in list(self.paused.values()):
            out.setdefault(seq.tenant, [0, 0, 0, 0])[1] += self.blocks.held(seq.kv)
        for name, n in self.waiting.waiting_counts().items():
            out.setdefault(name, [0, 0, 0, 0])[2] = n
        for name, n in list(self.tenant_preemptions.items()):
            out.setdefault(name, [0, 0, 0, 0])[3] = n
        return {name: (r[0], r[1], r[2], r[3]) for name, r in out.items()}

    def _over_share(self) -> frozenset[str]:
        return frozenset(self.waiting.over_share(self._held_by_tenant(), self.blocks.num_blocks))

    def _victim(self) -> S:
        """The sequence to preempt when blocks run out: the newest of the tenant furthest over its
        KV share (its quota, else its weighted share of the blocks), if any tenant is over, else
        the newest running."""
        waiting = self.waiting
        if waiting.fair:
            held = self._held_by_tenant()
            worst = ""
            if waiting.quotas:
                over = waiting.over_share(held, self.blocks.num_blocks)
                if over:
                    worst = over[0]
            if not worst and len(held) > 1:
                busy, most = waiting.busy_weight(), 1.0
                for name, n in held.items():
                    share = waiting.share(name, self.blocks.num_blocks, busy)
                    if share > 0 and n / share > most:
                        worst, most = name, n / share
            if worst:
                best: S | None = None
                for seq in self.running:
                    if seq.tenant == worst and (
                        best is None or (seq.priority, seq.order) > (best.priority, best.order)
                    ):
                        best = seq
                if best is not None:
                    return best
        return self.running[-1]


_ORDER = operator.attrgetter("order")


def _capped_want(seq: Any, want: int, hogs: dict[str, int]) -> int:
    """`want` prompt tokens of `seq`, at most what its tenant has left of CONTENDED_PREFILL_TOKENS
    this step when it is held to them (in `hogs`)."""
    taken = hogs.get(seq.tenant)
    return want if taken is None else min(want, CONTENDED_PREFILL_TOKENS - taken)
