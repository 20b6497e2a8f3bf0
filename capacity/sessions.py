"""Multi-turn sessions over shared system prompts (a workload's `[sessions]`, the `agent` profile):
the requests and the block identities the simulator's prefix cache works on.

Sessions start as the workload's arrival process at rate / mean turns (so `arrivals.rate` stays
requests per second), each of one tenant (uniformly drawn) and one client location. Turn k's prompt
is the tenant's system prompt, the conversation so far (every earlier message and reply) and a new
user message (`prompt` lengths); its reply is `output` long; it is sent an exponential think time
(mean `think_s`) after turn k - 1 was sent. A session ends at the arrival window's end or before a
turn whose prompt and reply would not fit its `window`.

Block identities (engine.sched.block_counts.BlockIds) stand for whole prefixes, as the engine's chained
hashes do: block i < system_prompt // 16 of any request of tenant T is (T, "system", i), and every
later block is ((T, session), i), the conversation's own, so a turn hits its tenant's system prompt
and its session's earlier turns, replies included, and never another tenant's blocks.
"""

from __future__ import annotations

import random

from capacity.workload import (
    Lengths,
    Workload,
    WorkloadSample,
    arrival_times,
    draw_lengths,
    pick_clients,
    resolve_clients,
)
from edge_sim.topology import Topology
from engine.sched.block_counts import BlockIds
from engine.sched.policy_types import BLOCK_TOKENS


def sample_sessions(
    w: Workload, topology: Topology, duration_s: float, seed: int, rate_multiplier: float = 1.0
) -> WorkloadSample:
    """The sessions' turns in send order, each with its tenant, session, turn and block identities."""
    x = w.sessions
    assert x is not None
    locations, weights = resolve_clients(w, topology)
    rng = random.Random(seed)
    mean_turns = _mean_turns(x.turns, seed)
    starts = arrival_times(rng, w.arrivals, w.arrivals.rate * rate_multiplier / mean_turns, duration_s)
    n = len(starts)
    turns = draw_lengths(rng, x.turns, n)
    clients = pick_clients(rng, weights, n)
    tenant_ids = [f"tenant-{k}" for k in range(x.tenants)]
    system_ids = [[(t, "system", i) for i in range(x.system_prompt // BLOCK_TOKENS)] for t in tenant_ids]
    rows: list[tuple[float, int, int, int, int, int, str, BlockIds]] = []
    for s, start in enumerate(starts):
        k = rng.randrange(x.tenants)
        ids = BlockIds(system_ids[k], (tenant_ids[k], s))
        users = draw_lengths(rng, w.prompt, turns[s])
        replies = draw_lengths(rng, w.output, turns[s])
        context, t = x.system_prompt, start
        for turn in range(turns[s]):
            if turn:
                t += rng.expovariate(1.0 / x.think_s) if x.think_s > 0 else 0.0
            prompt = context + users[turn]
            if t >= duration_s or prompt + replies[turn] > x.window:
                break
            rows.append((t, s, turn, prompt, replies[turn], clients[s], tenant_ids[k], ids))
            context = prompt + replies[turn]
    rows.sort(key=lambda r: (r[0], r[1]))
    return WorkloadSample(
        [r[0] for r in rows], [r[3] for r in rows], [r[4] for r in rows], [r[5] for r in rows],
        locations, tenants=[r[6] for r in rows], sessions=[r[1] for r in rows],
        turns=[r[2] for r in rows], block_ids=[r[7] for r in rows],
    )  # fmt: skip


def _mean_turns(turns: Lengths, seed: int) -> float:
    """Turns per session on average, clipping included (estimated from draws of its own)."""
    draws = draw_lengths(random.Random(seed + 1), turns, 1 if turns.dist == "fixed" else 4000)
    return sum(draws) / len(draws)
