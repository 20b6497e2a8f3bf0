"""Step time under contention in the one scheduling policy (engine.sched.policy): beside another tenant's
full batch, a light tenant's new prompt runs in a step without the decoders (never two such steps in
a row), and a tenant over its seat share prefills at most CONTENDED_PREFILL_TOKENS a step, so the
step a light request waits for stays short. A tenant alone is never held back. Counted in plans and
tokens, never timed."""

from __future__ import annotations

from engine.sched.block_counts import BlockCounts
from engine.sched.policy import SchedulerConfig, SchedulingPolicy, SeqStatus
from engine.sched.policy_types import CONTENDED_PREFILL_TOKENS, PRESENCE_STEPS
from tests.unit.test_fair_share import Seq, complete, step


def policy(seats=8, budget=512, alone=True):
    blocks = BlockCounts(4000, max_slots=64)
    return SchedulingPolicy(blocks, SchedulerConfig(budget, seats, prefill_alone=alone)), blocks


def heavy_batch(p: SchedulingPolicy, blocks: BlockCounts, n: int = 12) -> list[Seq]:
    """A heavy tenant decoding in every seat, with more of its requests waiting, and a light tenant
    known to the policy (one short request, done)."""
    light = Seq("l-first", "light", 8, 1, blocks)
    p.add(light)
    step(p)
    assert light.status is SeqStatus.FINISHED
    heavy = [Seq(f"h{i}", "heavy", 32, 400, blocks) for i in range(n)]
    for seq in heavy:
        p.add(seq)
    for _ in range(4):
        step(p)
    assert p.decode_count == p.config.seat_limit
    return heavy


def test_a_light_prompt_beside_a_full_batch_runs_in_a_step_of_its_own():
    p, blocks = policy()
    heavy_batch(p, blocks)
    clock = p.clock
    p.add(Seq("l0", "light", 40, 5, blocks))
    plan = p.schedule()
    assert [(seq.name, n) for seq, n in plan.chunks] == [("l0", 40)]
    assert plan.decode_count == 0 and plan.decoders() == [] and plan.decode_context == 0
    p.completed(plan)
    assert p.clock == clock  # the decoders did not advance: they sat the step out
    plan = p.schedule()  # and run in the next one, the light request among them
    assert plan.decode_count == p.config.seat_limit and not plan.chunks
    assert "l0" in {seq.name for seq in plan.decoders()}


def test_never_two_steps_without_the_decoders_in_a_row():
    p, blocks = policy(seats=16)
    heavy_batch(p, blocks, n=20)
    # a light tenant of a large weight: the fair head each time (its counter hardly moves), so only
    # the bound keeps the decoders from sitting out step after step
    p.configure_tenant("light", weight=50.0)
    light = []
    plans = []
    for i in range(10):
        if i < 6:  # a new light request before each of the first six steps
            light.append(Seq(f"l{i}", "light", 24, 50, blocks))
            p.add(light[-1])
        plan = p.schedule()
        plans.append(plan.decode_count)
        complete(p, plan)
    alone = [count == 0 for count in plans]
    assert sum(alone) >= 3
    assert all(not (a and b) for a, b in zip(alone, alone[1:], strict=False)), plans
    # fair shares still decide when (a light tenant that just prefilled has the more service for a
    # step or two), and every light request is in by the end
    assert all(seq.status is SeqStatus.RUNNING and seq.num_computed >= 24 for seq in light)


def test_with_it_off_the_light_prompt_runs_beside_the_decoders():
    p, blocks = policy(alone=False)
    heavy_batch(p, blocks)
    p.add(Seq("l0", "light", 40, 5, blocks))
    plan = p.schedule()
    assert ("l0", 40) in [(seq.name, n) for seq, n in plan.chunks]
    assert plan.decode_count > 0


def test_one_tenant_alone_is_never_held_back():
    """No second tenant: no step without the decoders, and its prompts take the whole budget."""
    p, blocks = policy()
    for i in range(8):
        p.add(Seq(f"a{i}", "a", 16, 300, blocks))
    for _ in range(3):
        step(p)
    p.add(Seq("big", "a", 400, 5, blocks))
    for _ in range(300):  # until a seat frees
        plan = p.schedule()
        names = {seq.name: n for seq, n in plan.chunks}
        assert plan.decode_count > 0 or not p.decode_count
        complete(p, plan)
        if "big" in names:
            assert names["big"] == min(400, p.config.max_num_batched_tokens - plan.decode_count)
            return
    raise AssertionError("the long prompt was never admitted")


def test_a_tenant_over_its_seat_share_prefills_a_bounded_chunk_while_another_has_work():
    p, blocks = policy(seats=8)
    light = Seq("l-long", "light", 16, 5000, blocks)  # keeps the light tenant busy
    p.add(light)
    step(p)
    heavy = [Seq(f"h{i}", "heavy", 300, 3 + 7 * i, blocks) for i in range(40)]  # finishing one by one
    for seq in heavy:
        p.add(seq)
    seen_capped = seen_busy = 0
    for _ in range(400):
        over = "heavy" in p.waiting.over_seats(p.config.seat_limit)
        plan = p.schedule()
        tokens = sum(n for seq, n in plan.chunks if seq.tenant == "heavy")
        if over:
            assert tokens <= CONTENDED_PREFILL_TOKENS
            seen_capped += tokens == CONTENDED_PREFILL_TOKENS
        complete(p, plan)
        if light.status is SeqStatus.RUNNING and over and tokens:
            seen_busy += 1
    assert seen_capped > 0 and seen_busy > 0
    # the light tenant gone (and no longer present), the heavy one's prompts take whole chunks again
    p.finish(light)
    for _ in range(PRESENCE_STEPS + 1):
        step(p)
    late = Seq("h-late", "heavy", 300, 5, blocks)
    p.add(late)
    biggest = 0
    for _ in range(400):
        plan = p.schedule()
        biggest = max([biggest] + [n for seq, n in plan.chunks if seq is late])
        complete(p, plan)
    assert biggest > CONTENDED_PREFILL_TOKENS


def test_a_tenant_running_more_than_another_with_work_prefills_a_bounded_chunk():
    """Far under its seat share (3 of 64 seats), a tenant running more sequences than another tenant
    with work still prefills at most CONTENDED_PREFILL_TOKENS a step: the step the light tenant's
    request waits for, and the one its prompt runs in, carry no full budget of the neighbour's
    prompt. Alike, or alone, nobody is held back."""
    p, blocks = policy(seats=64)
    light = Seq("l-long", "light", 16, 5000, blocks)  # one light request, decoding throughout
    p.add(light)
    step(p)
    for i in range(3):
        p.add(Seq(f"h{i}", "heavy", 16, 5000, blocks))
    step(p)
    assert p.waiting.contended(64, p.steps) == {"heavy"}  # 3 running against 1, far under 32 seats each
    big = Seq("h-big", "heavy", 450, 5, blocks)
    p.add(big)
    chunks = []
    while big.remaining > 1:
        plan = p.schedule()
        chunks += [n for seq, n in plan.chunks if seq is big]
        complete(p, plan)
    assert chunks and max(chunks) <= CONTENDED_PREFILL_TOKENS
    # running alike (one each), neither is held back
    q, blocks2 = policy(seats=64)
    for name in ("a", "b"):
        q.add(Seq(f"{name}0", name, 16, 5000, blocks2))
    step(q)
    assert q.waiting.contended(64, q.steps) == frozenset()
    q.add(Seq("a-big", "a", 450, 5, blocks2))
    plan = q.schedule()
    assert [n for seq, n in plan.chunks if seq.name == "a-big"] == [450]


def test_a_light_prompt_beside_a_heavier_tenant_under_its_share_runs_alone():
    """The heavy tenant runs 12 of 64 seats, far under its share, but the light one runs none: the
    light prompt still runs in a step of its own, as the light request's prefill would otherwise
    take a step as long as the heavy batch's. Tenants running alike get no such step."""
    p, blocks = policy(seats=64)
    light = Seq("l-first", "light", 8, 1, blocks)  # the light tenant known, done
    p.add(light)
    step(p)
    for i in range(12):
        p.add(Seq(f"h{i}", "heavy", 32, 400, blocks))
    for _ in range(4):
        step(p)
    assert p.decode_count == 12 and not p.waiting.over_seats(64)
    p.add(Seq("l0", "light", 40, 5, blocks))
    plan = p.schedule()
    assert [(seq.name, n) for seq, n in plan.chunks] == [("l0", 40)] and plan.decode_count == 0
    complete(p, plan)
    # alike: 6 and 6 (and one more of either is more than half the other's): beside the decoders
    q, blocks2 = policy(seats=64)
    for name in ("a", "b"):
        for i in range(6):
            q.add(Seq(f"{name}{i}", name, 16, 400, blocks2))
    for _ in range(3):
        step(q)
    q.add(Seq("a-new", "a", 40, 5, blocks2))
    plan = q.schedule()
    assert ("a-new", 40) in [(seq.name, n) for seq, n in plan.chunks] and plan.decode_count == 12


def test_a_tenant_between_requests_stays_present_for_a_while():
    """A light tenant whose request just ended is about to send its next: for PRESENCE_STEPS steps
    the heavier tenant's prompts stay in bounded chunks (the step in flight when the next light
    request comes stays short); after that, alone, its prompts take the whole budget again."""
    p, blocks = policy(seats=64)
    light = Seq("l0", "light", 16, 3, blocks)
    p.add(light)
    for i in range(3):
        p.add(Seq(f"h{i}", "heavy", 16, 5000, blocks))
    while light.status is not SeqStatus.FINISHED:
        step(p)
    left_at = p.steps
    sizes: dict[str, list[int]] = {}
    for name, at in (("soon", left_at + 10), ("late", left_at + PRESENCE_STEPS + 2)):
        while p.steps < at:
            step(p)
        big = Seq(name, "heavy", 1000, 5, blocks)
        p.add(big)
        while big.remaining > 1:
            plan = p.schedule()
            sizes.setdefault(name, []).extend(n for seq, n in plan.chunks if seq is big)
            complete(p, plan)
    assert sizes["soon"] and max(sizes["soon"]) <= CONTENDED_PREFILL_TOKENS
    assert max(sizes["late"]) > CONTENDED_PREFILL_TOKENS
