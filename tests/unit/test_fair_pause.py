"""Preemption by pause in the one scheduling policy (engine.sched.policy, SchedulerConfig.preemption =
"pause"): a sequence preempted for another tenant's seat keeps its KV blocks and staging slot while
it waits, is charged nothing more for them, and rejoins the decoders where it stopped (no token run
again); when blocks or staging slots run short, a paused sequence's go before any running one's
("drop": it is recomputed later). Counted in plans, blocks and events, never timed."""

from __future__ import annotations

from engine.sched.block_counts import BlockCounts
from engine.sched.policy import SchedulerConfig, SchedulingPolicy, SeqStatus
from tests.unit.test_fair_share import Seq, complete, run


def policy(num_blocks=1000, seats=4, budget=512, staging=0, preemption="pause"):
    config = SchedulerConfig(budget, seats, preemption=preemption)
    blocks = BlockCounts(num_blocks, staging, max_slots=config.kv_slots)
    events: list[tuple[str, str]] = []
    p = SchedulingPolicy(blocks, config, lambda kind, seq: events.append((kind, seq.name)))
    return p, blocks, events


def step(p: SchedulingPolicy) -> dict[str, int]:
    """One step; the prompt tokens each sequence ran in it (decoders' single tokens are not counted)."""
    plan = p.schedule()
    chunks = {seq.name: n for seq, n in plan.chunks}
    complete(p, plan)
    return chunks


def heavy_then_light(p, blocks, heavy=8, light=3):
    """The heavy tenant in every seat, decoding; then light requests arrive and take their share."""
    hs = [Seq(f"h{i}", "heavy", 40, 120, blocks) for i in range(heavy)]
    for seq in hs:
        p.add(seq)
    for _ in range(20):
        step(p)
    ls = [Seq(f"l{i}", "light", 24, 20, blocks) for i in range(light)]
    for seq in ls:
        p.add(seq)
    return hs, ls


def test_seats_are_doubled_in_staging_slots_only_when_pausing():
    assert SchedulerConfig(512, 64, preemption="pause").kv_slots == 128
    assert SchedulerConfig(512, 64, preemption="recompute").kv_slots == 64


def test_a_paused_sequence_keeps_its_blocks_and_resumes_where_it_stopped():
    p, blocks, events = policy(seats=4)
    hs, ls = heavy_then_light(p, blocks)
    computed = {s.name: p.computed(s) for s in hs[:4]}
    chunks = step(p)
    paused = [name for kind, name in events if kind == "pause"]
    assert paused == ["h3", "h2"] and not [k for k, _ in events if k in ("preempt", "drop")]
    held = {s.name: s.kv.blocks for s in hs[2:4]}
    for seq in hs[2:4]:
        assert seq.status is SeqStatus.WAITING and seq.order in p.paused
        assert seq.num_computed == computed[seq.name]
        assert held[seq.name] >= blocks.blocks_for(seq.num_computed)
    # their blocks stay their tenant's: counted against its share while it waits
    assert p.tenant_stats()["heavy"][1] == sum(p._blocks_of(s) for s in hs[:2]) + sum(held.values())
    assert set(chunks) == {"l0", "l1"}
    for _ in range(5):
        step(p)
    assert {s.name: s.kv.blocks for s in hs[2:4]} == held and all(s.order in p.paused for s in hs[2:4])
    ran: dict[str, int] = {}
    while any(s.status is not SeqStatus.FINISHED for s in ls):
        for name, n in step(p).items():
            ran[name] = ran.get(name, 0) + n
    while hs[2].status is SeqStatus.WAITING or hs[3].status is SeqStatus.WAITING:
        for name, n in step(p).items():
            ran[name] = ran.get(name, 0) + n
    assert [name for kind, name in events if kind == "resume"] == ["h2", "h3"]
    assert "h2" not in ran and "h3" not in ran  # back among the decoders: not one token run again
    run(p)
    assert {name for kind, name in events if kind == "finish"} == {s.name for s in hs + ls}
    assert p.pauses == 2 and p.tenant_preemptions == {"heavy": 2} and not p.paused
    assert all(s.preemptions == 0 for s in hs)  # a pause is not a recompute
    assert blocks.free_blocks == blocks.num_blocks


def test_the_paused_tenant_is_charged_for_no_recompute():
    """Against recompute on the same arrivals: the heavy tenant's counter grows by the tokens it
    ran again when recomputed, and by none of them when paused."""
    gained = {}
    for mode in ("recompute", "pause"):
        p, blocks, _ = policy(seats=2, preemption=mode)
        hs = [Seq(f"h{i}", "heavy", 64, 100, blocks) for i in range(2)]
        for seq in hs:
            p.add(seq)
        for _ in range(10):
            step(p)
        q = p.waiting
        p.add(Seq("light", "light", 8, 30, blocks))
        before = q.counter(q.tenant("heavy"), p.clock)
        prompts = 0
        for _ in range(60):
            prompts += step(p).get("h1", 0)
        gained[mode] = (q.counter(q.tenant("heavy"), p.clock) - before, prompts)
    assert gained["recompute"][1] >= 64 + 9  # its prompt and the tokens it had, run again
    assert gained["pause"][1] == 0
    assert gained["pause"][0] < gained["recompute"][0] - 64


def test_short_of_blocks_a_paused_sequences_blocks_go_before_a_running_ones():
    # 4 seats, 40 blocks: the heavy decoders take most; the light requests, once in, need the blocks
    # the paused heavy sequences hold
    p, blocks, events = policy(num_blocks=40, seats=4)
    hs = [Seq(f"h{i}", "heavy", 100, 60, blocks) for i in range(4)]
    for seq in hs:
        p.add(seq)
    for _ in range(8):
        step(p)
    ls = [Seq(f"l{i}", "light", 120, 60, blocks) for i in range(2)]
    for seq in ls:
        p.add(seq)
    for _ in range(60):
        step(p)
    kinds = [kind for kind, _ in events]
    assert "pause" in kinds and "drop" in kinds
    # every block a running sequence gave up went after the paused ones': no running heavy
    # sequence was recomputed while one was paused
    first_drop = kinds.index("drop")
    assert "preempt" not in kinds[:first_drop]
    dropped = {name for kind, name in events if kind == "drop"}
    assert all(s.preemptions == 1 for s in hs if s.name in dropped)  # recomputed once, after all
    run(p)
    assert {name for kind, name in events if kind == "finish"} == {s.name for s in hs + ls}
    assert not p.paused and blocks.free_blocks == blocks.num_blocks


def test_a_paused_sequence_gives_up_its_staging_slot_when_none_is_left():
    """Formats that quantize whole blocks hold a staging slot per sequence: with every slot taken by
    running and paused sequences, a newcomer's admission drops a paused one instead of stalling."""
    config = SchedulerConfig(512, 3, preemption="pause")
    blocks = BlockCounts(2000, 1, max_slots=4)  # one slot beside the seats, not kv_slots' three
    events: list[tuple[str, str]] = []
    p = SchedulingPolicy(blocks, config, lambda kind, seq: events.append((kind, seq.name)))
    hs = [Seq(f"h{i}", "heavy", 20, 200, blocks) for i in range(4)]
    for seq in hs:
        p.add(seq)
    for _ in range(5):
        step(p)
    p.add(Seq("l0", "light", 20, 100, blocks))
    p.add(Seq("l1", "light", 20, 100, blocks))
    step(p)
    assert [name for kind, name in events if kind == "pause"] == ["h2"]  # every slot is taken now
    p.add(Seq("m0", "mid", 20, 100, blocks))
    step(p)
    kinds = [(kind, name) for kind, name in events if kind in ("pause", "drop", "preempt", "admit")]
    assert kinds[-3:] == [("drop", "h2"), ("pause", "h1"), ("admit", "m0")]
    run(p)
    assert {name for kind, name in events if kind == "finish"} == {s.name for s in hs} | {"l0", "l1", "m0"}
    assert not p.paused and blocks.free_blocks == blocks.num_blocks


def test_a_paused_request_cancelled_while_it_waits_gives_back_its_blocks():
    """A client that goes away while its sequence is paused (the engine's abort calls finish): the
    blocks it held come back at once and it is no longer paused; nobody else is held up."""
    p, blocks, events = policy(seats=4)
    hs, ls = heavy_then_light(p, blocks)
    step(p)
    paused = [s for s in hs if s.order in p.paused]
    assert len(paused) == 2
    held = sum(s.kv.blocks for s in paused)
    free = blocks.free_blocks
    for seq in paused:
        seq.status = SeqStatus.FINISHED
        p.finish(seq)
    assert not p.paused and blocks.free_blocks == free + held
    assert all(s.kv.blocks == 0 for s in paused)
    run(p)
    assert not p.running and not p.waiting and blocks.free_blocks == blocks.num_blocks
