"""Shares under contention in the one scheduling policy (engine.sched.policy): while another tenant waits,
a tenant holds at most its weighted share of the decode seats and of the KV blocks (a tenant alone
uses everything), and a tenant under its share takes room back by preempting (recompute) the
sequences of the tenant furthest over its own, charged to that tenant, bounded so that two tenants
never trade a seat back and forth. Both ways of preempting are held to it: recompute (the victim's
blocks freed, "preempt") and pause (its blocks kept while it waits, "pause"). Counted in admissions,
preemptions and steps, never timed."""

from __future__ import annotations

import random

import pytest

from engine.sched.block_counts import BlockCounts
from engine.sched.policy import PREEMPT_COOLDOWN_STEPS, SchedulerConfig, SchedulingPolicy, SeqStatus
from tests.unit.test_fair_share import Seq, run, step

PREEMPTED = ("preempt", "pause")  # the events of a preemption, by recompute and by pause


@pytest.fixture(params=["recompute", "pause"])
def mode(request) -> str:
    return request.param


def policy(num_blocks=1000, seats=4, budget=512, mode="recompute"):
    blocks = BlockCounts(num_blocks, max_slots=64)
    events: list[tuple[str, str, int]] = []
    holder: list[SchedulingPolicy] = []
    p = SchedulingPolicy(
        blocks,
        SchedulerConfig(budget, seats, preemption=mode),
        lambda kind, seq: events.append((kind, seq.name, holder[0].steps)),
    )
    holder.append(p)
    return p, blocks, events


def seats_by_tenant(p: SchedulingPolicy) -> dict[str, int]:
    return {name: row[0] for name, row in p.tenant_stats().items()}


def test_a_burst_takes_only_its_share_of_seats_while_another_tenant_waits():
    p, blocks, _ = policy(seats=4)
    for i in range(10):
        p.add(Seq(f"a{i}", "a", 32, 50, blocks))
    for i in range(10):
        p.add(Seq(f"b{i}", "b", 32, 50, blocks))
    step(p)  # arrival order would seat a0..a3
    assert seats_by_tenant(p) == {"a": 2, "b": 2}
    for _ in range(30):
        step(p)
        assert seats_by_tenant(p) == {"a": 2, "b": 2}


@pytest.mark.parametrize("weight, want", [(3.0, {"gold": 6, "silver": 2}), (1.0, {"gold": 4, "silver": 4})])
def test_seat_shares_follow_the_weights(weight, want):
    p, blocks, _ = policy(seats=8)
    p.configure_tenant("gold", weight=weight)
    for i in range(20):
        p.add(Seq(f"g{i}", "gold", 16, 40, blocks))
        p.add(Seq(f"s{i}", "silver", 16, 40, blocks))
    for _ in range(10):
        step(p)
    assert seats_by_tenant(p) == want


def test_a_tenant_alone_uses_every_seat_and_block():
    """Work-conserving: with nobody else waiting the cap does not apply."""
    p, blocks, _ = policy(num_blocks=40, seats=8)
    for i in range(12):
        p.add(Seq(f"a{i}", "a", 60, 40, blocks))
    p.add(Seq("b0", "b", 16, 1, blocks))  # a second tenant is known: shares are counted from now on
    run(p)
    for i in range(12):
        p.add(Seq(f"late{i}", "a", 60, 40, blocks))
    for _ in range(3):
        step(p)
    assert seats_by_tenant(p) == {"a": 8}
    assert blocks.num_blocks - blocks.free_blocks >= 8 * 4  # 8 requests of 4 blocks: past half of them


def test_a_tenant_holds_at_most_its_share_of_blocks_and_one_request_while_others_wait():
    # 60 blocks, plenty of seats: the blocks are what is shared; each request takes 4-5 blocks
    p, blocks, _ = policy(num_blocks=60, seats=32)
    for i in range(30):
        p.add(Seq(f"a{i}", "a", 60, 10, blocks))
        p.add(Seq(f"b{i}", "b", 60, 10, blocks))
    for _ in range(200):
        if not p.has_work():
            break
        stats = p.tenant_stats()
        if all(stats.get(t, (0, 0, 0, 0))[2] for t in ("a", "b")):  # both wait
            for name in ("a", "b"):
                assert stats[name][1] <= 30 + 5, stats
        step(p)


def test_a_light_tenant_preempts_the_heavy_one_down_to_its_share(mode):
    p, blocks, events = policy(seats=4, mode=mode)
    for i in range(8):
        p.add(Seq(f"h{i}", "heavy", 32, 200, blocks))
    for _ in range(20):
        step(p)
    assert seats_by_tenant(p) == {"heavy": 4}
    p.add(Seq("light0", "light", 32, 50, blocks))
    p.add(Seq("light1", "light", 32, 50, blocks))
    p.add(Seq("light2", "light", 32, 50, blocks))
    step(p)
    # the heavy tenant keeps its share (2 of 4), the light one gets its share at once
    assert seats_by_tenant(p) == {"heavy": 2, "light": 2}
    preempted = [name for kind, name, _ in events if kind in PREEMPTED]
    assert preempted == ["h3", "h2"]  # the newest of the heavy tenant, none of the light one
    assert {kind for kind, _, _ in events if kind in PREEMPTED} == {"pause" if mode == "pause" else "preempt"}
    assert p.fair_preemptions == 2 and p.tenant_preemptions == {"heavy": 2}
    run(p)
    assert not p.running and not p.waiting and blocks.free_blocks == blocks.num_blocks
    finished = {name for kind, name, _ in events if kind == "finish"}
    assert finished == {f"h{i}" for i in range(8)} | {"light0", "light1", "light2"}  # nobody lost


def test_the_recomputed_prefill_is_charged_to_the_preempted_tenant():
    p, blocks, events = policy(seats=2)
    heavy = [Seq(f"h{i}", "heavy", 40, 100, blocks) for i in range(2)]
    for seq in heavy:
        p.add(seq)
    for _ in range(10):
        step(p)
    light = Seq("light", "light", 8, 30, blocks)
    p.add(light)
    q = p.waiting
    start = {name: q.counter(q.tenant(name), p.clock) for name in ("heavy", "light")}
    step(p)
    assert [name for kind, name, _ in events if kind == "preempt"] == ["h1"]
    redo = heavy[1].prompt + heavy[1].generated  # its prompt and what it had generated, run again
    while light.status is not SeqStatus.FINISHED:
        step(p)
    gained = {name: q.counter(q.tenant(name), p.clock) - start[name] for name in ("heavy", "light")}
    # the light tenant paid for its own prompt and tokens only (at most 2 per generated token);
    # the heavy one for its decoding and the recompute, which the light one did not pay for
    assert gained["light"] <= light.prompt + 2.0 * light.output
    assert gained["heavy"] >= redo


def test_a_sequence_is_not_preempted_for_a_share_twice_within_the_bound(mode):
    """Light requests keep arriving: each one would preempt the heavy tenant's newest again, but a
    sequence preempted once is left alone for PREEMPT_COOLDOWN_STEPS steps."""
    p, blocks, events = policy(seats=2, mode=mode)
    for i in range(4):
        p.add(Seq(f"h{i}", "heavy", 24, 400, blocks))
    for _ in range(5):
        step(p)
    for s in range(600):
        if s % 7 == 0:
            p.add(Seq(f"l{s}", "light", 8, 3, blocks))
        step(p)
    run(p)
    at: dict[str, list[int]] = {}
    for kind, name, when in events:
        if kind in PREEMPTED:
            at.setdefault(name, []).append(when)
    assert any(len(v) > 1 for v in at.values()), at  # preempted again, later
    for name, steps in at.items():
        assert all(b - a >= PREEMPT_COOLDOWN_STEPS for a, b in zip(steps, steps[1:], strict=False)), name


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_tenants_alternating_never_livelock_and_nothing_is_lost(seed, mode):
    """Both tenants backlogged with bursts in turn: every request finishes, every block comes back,
    and no seat is traded back and forth (a victim's tenant keeps its share)."""
    rng = random.Random(seed)
    p, blocks, events = policy(num_blocks=120, seats=6, budget=128, mode=mode)
    names = []
    for burst in range(8):
        tenant = "a" if burst % 2 == 0 else "b"
        for i in range(rng.randrange(3, 9)):
            name = f"{tenant}{burst}.{i}"
            names.append(name)
            p.add(Seq(name, tenant, rng.randrange(8, 80), rng.randrange(2, 60), blocks))
        for _ in range(rng.randrange(5, 40)):
            step(p)
    run(p, steps=20_000)
    assert not p.running and not p.waiting and blocks.free_blocks == blocks.num_blocks
    assert {name for kind, name, _ in events if kind == "finish"} == set(names)
    preempts = [(name, when) for kind, name, when in events if kind in PREEMPTED]
    assert preempts, "bursts in turn were meant to preempt"
    # a preemption for a tenant is never answered by one the other way in the same step
    by_step: dict[int, set[str]] = {}
    for name, when in preempts:
        by_step.setdefault(when, set()).add(name[0])
    assert all(len(tenants) == 1 for tenants in by_step.values()), by_step
    assert len(preempts) <= len(names)


def test_merged_runs_match_step_by_step_with_two_tenants(monkeypatch, mode):
    """The simulator's steady runs never cover a step in which the policy would preempt for a
    share: a heavy and a light tenant give the same decisions merged and step by step."""
    monkeypatch.setenv("EDGE_PREEMPTION", mode)
    import capacity.replica as replica
    from capacity.costmodel import RooflineCostModel
    from capacity.simulator import simulate
    from capacity.workload import Arrivals, Lengths, TopologySetup, Workload, WorkloadSample, resolve_clients
    from edge_sim.network import NetworkModel
    from edge_sim.topology import Topology

    topology = Topology.default().with_overrides(gpu_pops={"ICN": {"H200": 8}})
    setup = TopologySetup(topology, NetworkModel(), {})
    workload = Workload(
        name="two", arrivals=Arrivals(rate=50.0), prompt=Lengths(mean=80.0, max=200),
        output=Lengths(mean=200.0, max=400), clients={"Seoul": 1},
    )  # fmt: skip
    seoul, _ = resolve_clients(workload, topology)
    rng = random.Random(5)
    times, owners = [], []
    t = 0.0
    while t < 20.0:
        times.append(t)
        owners.append("light" if rng.random() < 1 / 11 else "heavy")
        t += rng.expovariate(60.0)
    n = len(times)
    sample = WorkloadSample(
        times, [rng.randrange(40, 160) for _ in range(n)], [rng.randrange(50, 300) for _ in range(n)],
        [0] * n, seoul, owners,
    )  # fmt: skip
    runs = []
    for merged in (True, False):
        monkeypatch.setattr(replica, "MERGE_RUNS", merged)
        decisions: list[tuple[str, int]] = []
        hear = decisions.append
        sim = simulate(
            workload, RooflineCostModel("kimi-k2", "fp8"), "bf16", duration_s=20.0, setup=setup,
            sample=sample, max_queue_ms=1e12, on_event=lambda kind, rid, t, hear=hear: hear((kind, rid)),
        )  # fmt: skip
        runs.append((decisions, sim))
    (a, sa), (b, sb) = runs
    assert a == b and any(kind in PREEMPTED for kind, _ in a)
    assert sa.e2e_ms == pytest.approx(sb.e2e_ms, rel=1e-9, nan_ok=True)


def test_status_of_a_waiting_sequence_is_waiting_after_preemption(mode):
    p, blocks, _ = policy(seats=1, mode=mode)
    h = Seq("h", "heavy", 16, 100, blocks)
    p.add(h)
    p.add(Seq("h2", "heavy", 16, 100, blocks))
    for _ in range(5):
        step(p)
    p.add(Seq("l", "light", 16, 5, blocks))
    step(p)
    # one seat: the heavy tenant's share is half a seat, but a victim's tenant keeps its share, so
    # the light one waits for the seat (nobody trades a single seat back and forth)
    assert h.status is SeqStatus.RUNNING and seats_by_tenant(p) == {"heavy": 1, "light": 0}
