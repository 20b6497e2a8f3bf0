"""One simulated engine replica: the engine's own scheduling policy with modelled step times.

The replica holds an `engine.sched.policy.SchedulingPolicy` over `BlockCounts` (the engine's block
accounting without tensors) and plays the executor's part: where the engine would run the model on
the policy's plan, the replica charges the cost model's step time and advances the sequences'
token counts. Because the decisions are the policy's, the simulator admits, preempts and finishes
the same requests in the same order as the engine would (tests/unit/test_one_policy.py).

Speed: a run of pure-decode steps that the policy certifies unchanged (`decode_horizon`: nobody
admitted, nobody preempted) is one event, cut short when an admissible request arrives; its step
times are interpolated linearly in the growing context (exact for the profiled model, which is
linear; for the roofline's max(compute, memory), exact on either side of the crossover).

The prefix cache: a request whose sample carries block identities (`track`) is entered in the
replica's BlockCounts, and the replica commits computed blocks where the engine does, after each
step (every running sequence with identities, at the tokens it has computed). A steady run commits
once at its end; that gives the engine's hits because nothing looks the cache up during a run (no
admission, no preemption, no finish: the run certifies it), and a run's prefill chunk and its
decoders compute different identities (a prompt's blocks, and replies of sessions that have one
turn in flight). steady_run checks a waiting head's admission after its cached prefix, as
schedule() admits it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from capacity.costmodel import BLOCK_TOKENS, ReplicaPlan
from edge_sim.load import FinishRate, PopLoad, pop_load
from engine.sched.block_counts import BlockCounts, BlockIds, CountHandle
from engine.sched.policy import Plan, SchedulerConfig, SchedulingPolicy, SeqStatus, SteadyRun
from engine.sched.policy_types import preemption_from_env

IDLE, STEP, RUN = 0, 1, 2
MERGE_RUNS = True  # advance steady runs as one event (tests compare with step by step)


class SimSeq:
    """One request at its replica: what the policy reads, and the times the report needs."""

    __slots__ = (
        "rid", "prompt", "output", "generated", "num_computed", "status", "preemptions", "order", "kv",
        "decode_base", "decoding", "epoch", "pend", "at", "ts", "tf", "td", "tenant", "cached", "priority",
    )  # fmt: skip

    def __init__(self, rid: int, prompt: int, output: int, at: float, kv: CountHandle, tenant: str = ""):
        self.rid, self.prompt, self.output = rid, prompt, output
        self.generated = 0  # sampled tokens (not kept up to date while decoding: see Replica)
        self.num_computed = 0
        self.status = SeqStatus.WAITING
        self.preemptions = 0
        self.order = 0
        self.kv = kv
        self.decode_base: int | None = None
        self.decoding = False  # has a finish entry in its replica's heap
        self.epoch = 0  # bumped on preemption: invalidates that entry
        self.pend = prompt  # prompt tokens still to prefill (what the router counts as queued)
        self.at = at  # reached the PoP
        self.ts = self.tf = self.td = -1.0  # first scheduled, first token, done
        self.tenant = tenant  # whose request (the policy's fair shares)
        self.priority = 0  # within its tenant: lower is admitted first (engine.sched.fair_queue)
        self.cached = 0  # prompt tokens the prefix cache held at its first admission

    @property
    def remaining(self) -> int:
        return self.prompt + self.generated - self.num_computed


class Replica:
    """A replica's policy, clock and counters (plain attributes: the event loop reads them).

    Decoding sequences advance on the policy's group clock without being touched; the replica
    keeps a heap of the clock values at which each will have sampled its last token, so a step
    or a run costs time in what changes (finishes, admissions, prefill chunks), not in the batch."""

    def __init__(
        self,
        idx: int,
        pop: int,
        plan: ReplicaPlan,
        on_event: Callable[[str, int, float], None] | None = None,
    ):
        """`on_event(kind, rid, t)` hears the policy's decisions: "admit", "preempt", "pause", "resume",
        "drop", "finish"."""
        self.idx, self.pop = idx, pop
        self.nb, self.staging = plan.num_blocks, plan.staging_blocks
        # the engine's preemption ($EDGE_PREEMPTION), and its staging slots for paused sequences
        limits = SchedulerConfig(plan.max_batched_tokens, plan.max_num_seqs, preemption=preemption_from_env())
        self.blocks = BlockCounts(plan.num_blocks, plan.staging_blocks, max_slots=limits.kv_slots)
        self.policy: SchedulingPolicy[SimSeq] = SchedulingPolicy(self.blocks, limits, self._hear)
        self.on_event = on_event
        self.max_seqs, self.budget = limits.seat_limit, plan.max_batched_tokens
        if plan.step_ms is None or plan.decode_ms is None:
            raise ValueError(f"{plan!r} has no step times (a cost model's plan has them)")
        self.step_fn: Callable[[float, float, float, float, float], float] = plan.step_ms
        self.dec_fn: Callable[[float, float], float] = plan.decode_ms
        # the longest request (prompt + output) the model's window and this cache hold alone
        self.fit_tokens = min(plan.max_context, (self.nb - self.staging) * BLOCK_TOKENS)
        chunk = min(plan.max_batched_tokens, 2048)
        self.pf_tok = self.step_fn(chunk, chunk * (chunk + 1) / 2, chunk, 0, 0) / chunk
        self.kind, self.ver, self.t0, self.t_end = IDLE, 0, 0.0, 0.0
        self.now = 0.0  # when the policy last decided
        self.plan: Plan | None = None  # the step in progress (STEP) and the prefills that sample their first
        self.joining: list[SimSeq] = []  # token in it as decoders
        # arrived since the last step boundary: the policy hears of them there, as the engine
        # adds a request before the first step that starts after it arrives
        self.arrived: list[SimSeq] = []
        self.run = _NO_RUN  # the steady run in progress (RUN), and its step times:
        self.run_k, self.run_d0, self.run_g = 0, 0.0, 0.0  # steps, first step, growth per step
        # (group clock at the last token, order, epoch, seq)
        self.finishes: list[tuple[int, int, int, SimSeq]] = []
        self.pending = 0  # prompt tokens still to prefill, waiting and prefilling
        self.busy_ms = self.kv_int = self.run_int = 0.0
        self.kv_peak = 0  # blocks
        self.steps = self.preempts = self.served = self.max_run = 0
        self.finish_rate = FinishRate()
        self.step_est = 0.0  # duration of the step in progress (0 when idle)
        self.caching = False  # some request here carries block identities (the prefix cache)

    def track(self, seq: SimSeq, ids: BlockIds) -> None:
        """Enter `seq` (queued here next) in the prefix cache under its block identities."""
        self.blocks.track(seq.kv, ids, seq)
        self.caching = True

    def _hear(self, kind: str, seq: SimSeq) -> None:
        if kind == "admit" and seq.num_computed:  # admitted after a cached prefix: not prefilled
            cached = seq.num_computed
            if not seq.preemptions:
                seq.cached = cached
            seq.pend -= cached
            self.pending -= cached
        elif kind == "preempt" or kind == "pause":  # (a preempt is heard before its cache is reset)
            self.preempts += 1
            if seq.decoding:
                seq.generated = seq.num_computed + 1 - seq.prompt
                seq.decoding = False
                seq.epoch += 1
            # recomputed: every token again; paused: what it had left (a decoder: its last token)
            redo = seq.prompt + seq.generated - (seq.num_computed if kind == "pause" else 0)
            self.pending += redo - seq.pend
            seq.pend = redo
        elif kind == "drop":  # a paused sequence's blocks freed: it is recomputed
            redo = seq.prompt + seq.generated
            self.pending += redo - seq.pend
            seq.pend = redo
        elif kind == "resume" and seq.decode_base is not None:  # a paused decoder rejoined the group:
            self.joining.append(seq)  # it samples in this step, as a prefill that joins does
        if self.on_event is not None:
            self.on_event(kind, seq.rid, self.now)

    # --- what the router sees ---------------------------------------------------------------------

    def load(self) -> PopLoad:
        free = self.blocks.free_blocks
        policy = self.policy
        waiting = len(policy.waiting) + len(self.arrived)
        # positional: the router's hot path (pop_load's parameters, in order)
        return pop_load(
            self.step_est, self.pending, self.pf_tok, waiting, len(policy.running),
            self.max_seqs, free, self.nb - free, self.finish_rate.rate,
        )  # fmt: skip

    def used_blocks(self) -> int:
        return self.nb - self.blocks.free_blocks

    # --- arrivals ---------------------------------------------------------------------------------

    def arrive(self, seq: SimSeq, t: float) -> float | None:
        """Queue `seq`; the time of a new step-end event to push, if the replica's plans changed."""
        policy = self.policy
        was_empty = not policy.waiting and not self.arrived
        self.arrived.append(seq)
        self.pending += seq.prompt
        if self.kind == IDLE:
            return self.compose(t)
        if self.kind == RUN and (
            # with fair shares a newcomer may go first, and its tenant's counter is lifted at the
            # step boundary: stop after the step in progress
            policy.waiting.fair_with(seq.tenant)
            or (self.run.prefill is None and was_empty and len(policy.running) < self.max_seqs)
        ):
            return self.cut_run(t)  # it may be admitted: stop after the step in progress
        return None

    # --- steps ------------------------------------------------------------------------------------

    def compose(self, t: float) -> float | None:
        """Start the next step (or run of steps) at t; its end time, or None when idle."""
        policy = self.policy
        self.now = t
        if self.arrived:
            for new in self.arrived:
                policy.add(new)
            self.arrived = []
        if MERGE_RUNS and policy.running:
            heap = self.finishes
            while heap and heap[0][2] != heap[0][3].epoch:
                heapq.heappop(heap)
            limit = heap[0][0] - policy.clock if heap else 1 << 30
            run = policy.steady_run(limit)
            if run is not None:
                return self._start_run(t, run)
        # prefills with one prompt token left: they join the decoders and sample in this step
        prefilling = policy.prefilling
        self.joining = [s for s in prefilling if s.remaining == 1 and not s.decoding] if prefilling else []
        plan = policy.schedule()
        if not plan:
            self.kind, self.step_est = IDLE, 0.0
            return None
        prefill = pairs = pkv = 0.0
        for seq, n in plan.chunks:
            if seq.ts < 0:
                seq.ts = t
            s0 = seq.num_computed
            prefill += n
            pairs += n * (s0 + (n + 1) * 0.5)
            pkv += s0 + n
        for seq in self.joining:
            if seq.ts < 0:
                seq.ts = t
        dur = self.step_fn(prefill, pairs, pkv, plan.decode_count, plan.decode_context)
        self.plan = plan
        used = self.nb - self.blocks.free_blocks
        self._account(dur, used, used, 1)
        self.kind, self.t0, self.t_end, self.step_est = STEP, t, t + dur, dur
        self.ver += 1
        return self.t_end

    def _commit(self) -> None:
        """What the engine does after each step: computed full blocks enter the prefix cache."""
        policy, commit = self.policy, self.blocks.commit
        for seq in policy.running:
            if seq.kv.ids is not None:
                commit(seq.kv, policy.computed(seq))

    def _start_run(self, t: float, run: SteadyRun) -> float:
        policy, k, p = self.policy, run.steps, run.prefill
        b, c = policy.decode_count, policy.decode_context() - policy.decode_count
        if p is None:  # pure decode: step times are linear in the context, so interpolate
            d0 = self.dec_fn(b, c + b)
            d1 = self.dec_fn(b, c + k * b) if k > 1 else d0
            g = (d1 - d0) / (k - 1) if k > 1 else 0.0
            total = k * (d0 + d1) * 0.5
        else:  # a full prefill chunk beside the decoders, step by step
            n, s0, total = run.chunk, p.num_computed, 0.0
            for j in range(k):
                start = s0 + j * n
                total += self.step_fn(n, n * (start + (n + 1) * 0.5), start + n, b, c + b * (j + 1))
            d0, g = total / k, 0.0
        self.run, self.run_k, self.run_d0, self.run_g = run, k, d0, g
        self.kind, self.t0, self.t_end, self.step_est = RUN, t, t + total, d0
        self.ver += 1
        return self.t_end

    def cut_run(self, t: float) -> float | None:
        """End the run after the step in progress at t (an arrival may change the next plan)."""
        e = t - self.t0
        d0, g = self.run_d0, self.run_g

        def elapsed(j: int) -> float:  # time of the run's first j steps
            return j * d0 + g * j * (j - 1) * 0.5

        if g > 1e-12:
            b = d0 - g * 0.5
            j = int((-b + math.sqrt(b * b + 2.0 * g * e)) / g)
        else:
            j = int(e / d0) if d0 > 0 else self.run_k
        while j > 0 and elapsed(j) > e:  # guard the closed form against rounding
            j -= 1
        while elapsed(j + 1) <= e:
            j += 1
        k = j if j and elapsed(j) == e else j + 1  # a step that ends just now is done
        if k >= self.run_k:
            return None
        self.run_k = k
        self.t_end = self.t0 + elapsed(k)
        self.ver += 1
        return self.t_end

    def end(self, t: float) -> None:
        """The step or run in progress ended at t: advance the sequences, finish the done ones."""
        policy = self.policy
        self.now = t
        if self.kind == RUN:
            run, k, blocks = self.run, self.run_k, self.blocks
            u0 = self.nb - blocks.free_blocks
            policy.advance(run, k)
            if self.caching:
                self._commit()
            self._account(t - self.t0, u0, self.nb - blocks.free_blocks, k)
            if run.prefill is not None:
                run.prefill.pend -= k * run.chunk
                self.pending -= k * run.chunk
            heap = self.finishes
            if heap and heap[0][0] <= policy.clock:
                self._finish_decoders(t, [])
            return
        plan = self.plan
        assert plan is not None  # a step was in progress
        self.plan = None
        policy.completed(plan)
        if self.caching:
            self._commit()
        sampled: list[SimSeq] = []  # decoders that sampled their first token in this step
        for seq in self.joining:
            if seq.decode_base is not None:  # not preempted while the step was planned
                self.pending -= seq.pend
                seq.pend = 0
                sampled.append(seq)
        self.joining = []
        self._finish_decoders(t, sampled)
        done: list[SimSeq] = []
        for seq, n in plan.chunks:
            if seq.pend:
                seq.pend -= n
                self.pending -= n
            if seq.num_computed == seq.prompt + seq.generated:  # its prompt is in: it sampled a token
                self._sampled(seq, t, done)
        for seq in done:
            self._finish(seq, t)

    def _sampled(self, seq: SimSeq, t: float, done: list[SimSeq]) -> None:
        """`seq` sampled a token at t, its prompt (or its recomputed tokens) all in: done, or decoding."""
        seq.generated += 1
        if seq.tf < 0:
            seq.tf = t
        if seq.generated >= seq.output:
            done.append(seq)
        else:
            self._expect_finish(seq)

    def _expect_finish(self, seq: SimSeq) -> None:
        """`seq` decodes from now on: it samples its last token `output - generated` group steps on."""
        seq.decoding = True
        heapq.heappush(
            self.finishes, (self.policy.clock + seq.output - seq.generated, seq.order, seq.epoch, seq)
        )

    def _finish_decoders(self, t: float, sampled: list[SimSeq]) -> None:
        """Decoders done by the group clock now, and `sampled` first tokens, in arrival order."""
        clock, heap = self.policy.clock, self.finishes
        done: list[SimSeq] = []
        while heap and heap[0][0] <= clock:
            _, _, epoch, seq = heapq.heappop(heap)
            if epoch == seq.epoch and seq.decoding:
                done.append(seq)
        for seq in sampled:
            self._sampled(seq, t, done)
        if len(done) > 1:
            done.sort(key=_order)
        for seq in done:
            seq.generated = seq.output
            seq.decoding = False
            self._finish(seq, t)

    def _finish(self, seq: SimSeq, t: float) -> None:
        seq.td = t
        if seq.tf < 0:
            seq.tf = t
        self.policy.finish(seq)
        self.served += 1
        self.finish_rate.tick(t)

    def _account(self, dur: float, used0: int, used1: int, steps: int) -> None:
        running = len(self.policy.running)
        self.kv_int += (used0 + used1) * 0.5 * dur
        if used1 > self.kv_peak:
            self.kv_peak = used1
        self.run_int += running * dur
        if running > self.max_run:
            self.max_run = running
        self.busy_ms += dur
        self.steps += steps


_NO_RUN = SteadyRun(0, None, 0)  # Replica.run while no run is in progress


def _order(seq: SimSeq) -> int:
    return seq.order
