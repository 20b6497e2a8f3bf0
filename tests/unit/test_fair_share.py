"""Fair shares between tenants in the one scheduling policy (engine.sched.fair_queue): virtual token
counters decide who is admitted, idleness banks no credit, weights buy proportional service, and a
tenant over its KV share is the first preempted. Counted in admissions, never timed."""

from __future__ import annotations

import itertools

import pytest

from engine.sched.block_counts import BlockCounts
from engine.sched.policy import SchedulerConfig, SchedulingPolicy, SeqStatus
from engine.sched.policy_types import CONTENDED_PREFILL_TOKENS


class Seq:
    def __init__(self, name: str, tenant: str, prompt: int, output: int, blocks: BlockCounts):
        self.name, self.tenant, self.prompt, self.output = name, tenant, prompt, output
        self.generated = self.num_computed = self.preemptions = self.order = self.priority = 0
        self.status = SeqStatus.WAITING
        self.decode_base = None
        self.kv = blocks.new_sequence()

    @property
    def remaining(self) -> int:
        return self.prompt + self.generated - self.num_computed


def policy(num_blocks=1000, seats=1, budget=256):
    blocks = BlockCounts(num_blocks, max_slots=64)
    events: list[tuple[str, str]] = []
    p = SchedulingPolicy(
        blocks, SchedulerConfig(budget, seats), lambda kind, seq: events.append((kind, seq.name))
    )
    return p, blocks, events


def step(p: SchedulingPolicy):
    """What the engine does with a plan: run it, sample where a sequence's tokens are all in.
    Returns the plan's chunks by sequence name."""
    plan = p.schedule()
    chunks = {seq.name: n for seq, n in plan.chunks}
    complete(p, plan)
    return chunks


def complete(p: SchedulingPolicy, plan) -> None:
    """step()'s second half, for a plan a test has looked at."""
    entries = plan.entries()
    p.completed(plan)
    for seq, _ in entries:
        if seq.status is SeqStatus.RUNNING and p.computed(seq) == seq.prompt + seq.generated:
            seq.generated += 1
            if seq.generated >= seq.output:
                seq.status = SeqStatus.FINISHED
                p.finish(seq)


def run(p: SchedulingPolicy, steps: int = 10_000) -> None:
    for _ in range(steps):
        if not p.has_work():
            return
        step(p)
    raise AssertionError("the workload did not finish")


def admitted(events):
    return [name for kind, name in events if kind == "admit"]


def test_a_light_tenant_is_not_queued_behind_a_heavy_one():
    p, blocks, events = policy()
    for i in range(10):
        p.add(Seq(f"heavy{i}", "heavy", 32, 8, blocks))
    step(p)  # heavy0 admitted
    p.add(Seq("light", "light", 32, 8, blocks))
    run(p)
    order = admitted(events)
    # arrival order would admit it eleventh; its counter (lifted to the heavy's) is lower at once
    assert order.index("light") == 1, order


def test_one_tenant_is_served_in_arrival_order():
    p, blocks, events = policy(seats=2)
    for i in range(6):
        p.add(Seq(f"r{i}", "only", 20 + i, 5, blocks))
    run(p)
    assert admitted(events) == [f"r{i}" for i in range(6)]
    assert not p.waiting.fair  # nothing counted for a single tenant


def test_an_idle_tenant_banks_no_credit():
    p, blocks, events = policy()
    for i in range(5):
        p.add(Seq(f"a{i}", "a", 64, 16, blocks))
    p.add(Seq("b-early", "b", 16, 1, blocks))
    run(p)  # a is served a lot while b is idle
    events.clear()
    for i in range(5):
        p.add(Seq(f"a-late{i}", "a", 64, 16, blocks))
        p.add(Seq(f"b-late{i}", "b", 64, 16, blocks))
    run(p)
    order = admitted(events)
    # b was idle, not owed: it does not take five turns in a row, the two alternate
    assert order[:4] != [f"b-late{i}" for i in range(4)], order
    streaks = [len(list(group)) for _, group in itertools.groupby(name[0] for name in order)]
    assert max(streaks) <= 2, order


@pytest.mark.parametrize("weight", [2.0, 3.0])
def test_weights_buy_proportional_service(weight):
    p, blocks, events = policy()
    p.configure_tenant("gold", weight=weight)
    for i in range(40):
        p.add(Seq(f"g{i}", "gold", 48, 8, blocks))
        p.add(Seq(f"s{i}", "silver", 48, 8, blocks))
    for _ in range(400):  # both stay backlogged throughout
        step(p)
    order = admitted(events)
    gold, silver = sum(n.startswith("g") for n in order), sum(n.startswith("s") for n in order)
    assert silver > 0 and gold / silver == pytest.approx(weight, rel=0.25), (gold, silver)


def test_a_tenant_over_its_kv_share_is_preempted_first():
    # 20 blocks; "big" may hold a quarter of them before it is the first to go
    p, blocks, events = policy(num_blocks=20, seats=4, budget=512)
    p.configure_tenant("big", kv_share=0.25)
    p.add(Seq("big0", "big", 100, 200, blocks))  # 7 blocks at once, then growing
    step(p)
    p.add(Seq("small0", "small", 40, 200, blocks))
    step(p)
    p.add(Seq("small1", "small", 40, 200, blocks))  # the newest running: the victim by age
    for _ in range(200):
        step(p)
        if any(kind == "preempt" for kind, _ in events):
            break
    preempted = [name for kind, name in events if kind == "preempt"]
    assert preempted and preempted[0] == "big0", events


def test_without_fair_shares_every_tenant_waits_in_arrival_order():
    blocks = BlockCounts(1000, max_slots=64)
    events: list[tuple[str, str]] = []
    p = SchedulingPolicy(
        blocks, SchedulerConfig(256, 1, fair_share=False), lambda kind, seq: events.append((kind, seq.name))
    )
    for i in range(10):
        p.add(Seq(f"heavy{i}", "heavy", 32, 8, blocks))
    step(p)
    p.add(Seq("light", "light", 32, 8, blocks))
    run(p)
    assert admitted(events).index("light") == 10 and not p.waiting.fair


def test_sequences_admitted_out_of_arrival_order_finish_and_free_their_seats():
    """A fair share admits a newer request before older ones; running stays in arrival order, so
    finishing finds every sequence (a sequence left behind would hold its seat forever)."""
    p, blocks, events = policy(num_blocks=5000, seats=4, budget=512)
    for i in range(30):
        p.add(Seq(f"h{i}", "heavy", 60, 30, blocks))
    for s in range(400):
        if s % 20 == 0:
            p.add(Seq(f"l{s}", "light", 60, 30, blocks))
        step(p)
    run(p)
    order = admitted(events)
    assert order != sorted(order, key=lambda n: (n[0] == "l", int(n[1:])))  # reordered somewhere
    assert not p.running and not p.waiting and blocks.free_blocks == blocks.num_blocks
    # (a heavy sequence preempted for the light one's share is admitted again: once more in order)
    assert sum(kind == "finish" for kind, _ in events) == len(set(order))
    assert len(order) - len(set(order)) == sum(kind == "preempt" for kind, _ in events)


def test_a_second_tenant_configured_late_starts_everyone_level_at_that_step():
    """Counting starts when the second tenant appears, from that step: the first tenant's earlier
    decoding is not charged (else a newcomer would be owed everything served before it came)."""
    p, blocks, events = policy(seats=4)
    for i in range(4):
        p.add(Seq(f"a{i}", "a", 16, 400, blocks))
    for _ in range(100):
        step(p)
    p.configure_tenant("b", weight=1.0)  # as the engine does when a request carries its share
    a = p.waiting.tenant("a")
    assert p.waiting.fair and p.waiting.counter(a, p.clock) == 0.0
    step(p)
    assert p.waiting.counter(a, p.clock) == pytest.approx(4 * 2.0)  # one step of 4 decoders


@pytest.mark.parametrize("fair", [True, False])
def test_a_light_tenants_prompt_starts_in_the_next_step_beside_a_heavy_tenants_long_prefill(fair):
    """With fair shares, a tenant with no prompt in flight keeps up to half of a step's token budget
    while another tenant's long prompt is being prefilled in chunks: its prefill lands in the very
    next step, beside a chunk of the other's of at most CONTENDED_PREFILL_TOKENS (the tenant running
    more while another has work); arrival order keeps the whole budget for the prompt in flight."""
    blocks = BlockCounts(1000, max_slots=64)
    p = SchedulingPolicy(blocks, SchedulerConfig(256, 8, fair_share=fair))
    heavy = Seq("heavy", "heavy", 2000, 4, blocks)
    p.add(heavy)
    step(p)  # the long prompt's first chunk
    light = Seq("light", "light", 40, 4, blocks)
    p.add(light)
    chunks = step(p)
    if fair:
        assert chunks == {"heavy": CONTENDED_PREFILL_TOKENS, "light": 40}  # the whole light prompt
    else:
        assert chunks == {"heavy": 256}
    run(p)
    assert heavy.status is light.status is SeqStatus.FINISHED
