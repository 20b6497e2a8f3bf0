"""One scheduling policy: the live engine and the capacity simulator decide alike.

A workload (staggered arrivals, prompts that need chunked prefill, a KV cache too small for all of
them at once) runs through the real engine (float32, greedy) on a virtual clock whose step times
come from a fixed cost formula, and through `capacity.simulator.simulate` with a cost model of the
same formula. Both must admit, preempt and finish the same requests in the same order, at the same
(virtual) times: the simulator is the engine's policy with modelled step times, not a second one.
With the prefix cache on, the simulator's sample carries the block identities of the engine's
prompts (their chained hashes), and its BlockCounts hits, evicts and charges as the pool does.
"""

from __future__ import annotations

import random

import pytest
import torch

from capacity.costmodel import ReplicaPlan
from capacity.simulator import SERVED, simulate
from capacity.workload import Arrivals, Lengths, TopologySetup, Workload, WorkloadSample, resolve_clients
from edge_sim.network import NetworkModel
from edge_sim.topology import Topology
from engine import LLM, SamplingParams
from engine.kv.kv_cache import PagedKVCache
from engine.kv.prefix_hash import extend_hashes
from engine.sched.block_counts import BlockIds

STEP_FIXED_MS, PREFILL_MS_PER_TOKEN, DECODE_MS_PER_SEQ = 1.5, 0.02, 0.25


def step_ms(prefill_tokens, prefill_pairs, prefill_kv, decode_seqs, decode_kv) -> float:
    return STEP_FIXED_MS + PREFILL_MS_PER_TOKEN * prefill_tokens + DECODE_MS_PER_SEQ * decode_seqs


class FixedStepCost:
    """A cost model whose replica is exactly the engine under test: its blocks, its limits."""

    name = "fixed"
    model_name = "tiny"

    def __init__(self, engine):
        self.engine = engine

    def describe(self) -> str:
        return "fixed step times"

    def plan_pop(self, gpus, kv, min_kv_tokens) -> ReplicaPlan:
        eng = self.engine
        cfg = eng.scheduler.config
        return ReplicaPlan(
            "CPU", 1, 1, num_blocks=eng.cache.num_blocks, staging_blocks=eng.cache.staging_blocks,
            max_num_seqs=cfg.max_num_seqs, max_batched_tokens=cfg.max_num_batched_tokens,
            max_context=eng.context_window, step_ms=step_ms,
            decode_ms=lambda seqs, kv: step_ms(0, 0, 0, seqs, kv),
        )  # fmt: skip


def run_live(
    engine, arrivals: list[float], prompts: list[list[int]], outputs: list[int], tenants: list[str],
    cached: dict[int, int] | None = None,
):  # fmt: skip
    """Drive the engine on a virtual clock: requests join before the first step that starts at or
    after their arrival; each step lasts step_ms of what it ran. `cached` gets each request's
    cached prompt tokens."""
    decisions: list[tuple[str, int]] = []
    engine.scheduler.on_event = lambda kind, seq: decisions.append((kind, int(seq.request_id)))
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i])
    done_at: dict[int, float] = {}
    t, nxt = 0.0, 0
    while nxt < len(order) or engine.has_unfinished():
        while nxt < len(order) and arrivals[order[nxt]] <= t:
            i = order[nxt]
            params = SamplingParams(max_tokens=outputs[i], temperature=0, ignore_eos=True)
            engine.add_request(prompts[i], params, request_id=str(i), tenant=tenants[i])
            nxt += 1
        if not engine.has_unfinished():
            t = arrivals[order[nxt]]
            continue
        events = engine.step()
        s = engine.steps[-1]
        t += step_ms(s.prefill_tokens, 0, 0, s.decode_tokens, 0)
        for e in events:
            assert e.finish_reason in (None, "length"), e
            if e.finish_reason:
                done_at[int(e.request_id)] = t
                if cached is not None:
                    cached[int(e.request_id)] = e.metrics.cached_tokens
    return decisions, done_at


def simulate_like(engine, send_s, prompts, outputs, owners, block_ids=None):
    """The simulator on the engine's own limits; its decisions, result and the live arrivals."""
    decisions: list[tuple[str, int]] = []
    topology = Topology.default().with_overrides(gpu_pops={"ICN": {"H200": 1}})
    setup = TopologySetup(topology, NetworkModel(), {})
    workload = Workload(
        name="proof", arrivals=Arrivals(rate=50.0), prompt=Lengths(mean=80.0, max=200),
        output=Lengths(mean=20.0, max=40), clients={"Seoul": 1},
    )  # fmt: skip
    seoul, _ = resolve_clients(workload, topology)
    n = len(prompts)
    sample = WorkloadSample(
        send_s, [len(p) for p in prompts], outputs, [0] * n, seoul, owners, block_ids=block_ids
    )
    sim = simulate(
        workload, FixedStepCost(engine), duration_s=1.0, setup=setup, sample=sample, max_queue_ms=1e12,
        on_event=lambda kind, rid, t: decisions.append((kind, rid)),
    )  # fmt: skip
    # the requests reach the PoP when the simulator says (half their network time after sending)
    arrivals = [s * 1000.0 + net / 2 for s, net in zip(send_s, sim.network_ms, strict=True)]
    return decisions, sim, arrivals


@pytest.fixture(scope="module")
def block_bytes(tiny_model_dir) -> int:
    probe = LLM(tiny_model_dir, device="cpu", allow_unsigned=True)
    return PagedKVCache.layout_bytes(probe.model.kv_components(), 3, "auto", torch.float32)[0]


@pytest.mark.parametrize("seed, tenants", [(1, 1), (2, 1), (2, 2), (2, 3)])
def test_engine_and_simulator_admit_preempt_and_finish_alike(tiny_model_dir, block_bytes, seed, tenants):
    """With several tenants the policy's fair shares (virtual token counters) decide admission."""
    rng = random.Random(seed)
    n = 14
    prompts = [[rng.randrange(10, 4000) for _ in range(rng.randrange(4, 150))] for _ in range(n)]
    outputs = [rng.randrange(1, 40) for _ in range(n)]
    send_s = sorted(rng.uniform(0.0, 0.25) for _ in range(n))
    # one heavy tenant and lighter ones: fair shares let the light ones past the heavy one's queue
    owners = [
        "t0" if tenants == 1 or rng.random() < 0.7 else f"t{1 + rng.randrange(tenants - 1)}" for _ in range(n)
    ]

    llm = LLM(
        tiny_model_dir, device="cpu", allow_unsigned=True, kv_cache_bytes=30 * block_bytes,
        max_num_batched_tokens=64, max_num_seqs=6,
        prefix_caching=False,
    )  # fmt: skip
    # prefix caching off: this sample carries no block identities (the cache's case is below)
    engine = llm.engine

    sim_decisions, sim, arrivals = simulate_like(engine, send_s, prompts, outputs, owners)
    assert sim.status == [SERVED] * n
    live_decisions, live_done = run_live(engine, arrivals, prompts, outputs, owners)

    kinds = {k for k, _ in live_decisions}
    assert "preempt" in kinds, "the workload was meant to force preemption"
    assert live_decisions == sim_decisions
    if tenants > 1:  # fair shares decided otherwise than arrival order (else this proves nothing new)
        fcfs, _, _ = simulate_like(engine, send_s, prompts, outputs, None)
        assert engine.scheduler.waiting.fair and fcfs != sim_decisions
    sim_done = [sim.e2e_ms[i] - sim.network_ms[i] + arrivals[i] for i in range(n)]
    assert sim_done == pytest.approx([live_done[i] for i in range(n)], rel=1e-9)


KV_BLOCKS = 20


@pytest.mark.parametrize("seed, tenants", [(4, 1), (6, 1), (4, 2), (7, 2)])
def test_engine_and_simulator_alike_with_the_prefix_cache(tiny_model_dir, block_bytes, seed, tenants):
    """Requests that share their tenant's system prompt, on an engine with the prefix cache: the
    simulator, given the prompts' block identities, decides alike and hits the same tokens."""
    rng = random.Random(seed)
    n = 14
    owners = [f"t{rng.randrange(tenants)}" for _ in range(n)]
    system = {
        f"t{k}": [rng.randrange(10, 4000) for _ in range(rng.randrange(40, 110))] for k in range(tenants)
    }
    prompts = [system[o] + [rng.randrange(10, 4000) for _ in range(rng.randrange(4, 60))] for o in owners]
    outputs = [rng.randrange(1, 40) for _ in range(n)]
    send_s = sorted(rng.uniform(0.0, 0.25) for _ in range(n))
    block_ids = []
    for i, (prompt, owner) in enumerate(zip(prompts, owners, strict=True)):
        hashes: list[bytes] = []
        extend_hashes(hashes, prompt, owner.encode())  # the prompt's full blocks, as the engine names them
        block_ids.append(BlockIds(hashes, ("reply", i)))  # then its own: generated blocks are unique

    llm = LLM(
        tiny_model_dir, device="cpu", allow_unsigned=True, kv_cache_bytes=KV_BLOCKS * block_bytes,
        max_num_batched_tokens=64, max_num_seqs=6, prefix_caching=True,
    )  # fmt: skip
    engine = llm.engine
    sim_decisions, sim, arrivals = simulate_like(engine, send_s, prompts, outputs, owners, block_ids)
    assert sim.status == [SERVED] * n and sim.prefix_cache
    live_cached: dict[int, int] = {}
    live_decisions, live_done = run_live(engine, arrivals, prompts, outputs, owners, live_cached)

    assert "preempt" in {k for k, _ in live_decisions}, "the workload was meant to force preemption"
    assert live_decisions == sim_decisions
    sim_done = [sim.e2e_ms[i] - sim.network_ms[i] + arrivals[i] for i in range(n)]
    assert sim_done == pytest.approx([live_done[i] for i in range(n)], rel=1e-9)
    # the same hits: what each request found cached at its first admission
    assert sim.cached == [live_cached[i] for i in range(n)]
    assert sum(sim.cached) > 0 and engine.prefix_cache_hits >= sum(sim.cached)
