"""The simulator's event loop: requests sent, routed by the live router's score, and replica steps.

One heap of (time, kind, id, version) events: kind 0 is a request reaching its PoP, kind 1 the end
of a replica's step or steady run (a version that a cut run replaced is skipped). Requests are
routed at send time on the replicas' state then (`edge_sim.load.route_score`, the live router's
formula), with session affinity as the live edge keeps it. This module is the simulator's hot path
(with capacity.replica and the engine's policy): it is typed for mypyc (engine.native), which
compiles it when the build is there, and runs as plain Python when not.
"""

from __future__ import annotations

import math
import random
from heapq import heappop, heappush
from typing import NamedTuple

from capacity.replica import Replica, SimSeq
from capacity.workload import WorkloadSample
from edge_sim.load import expected_wait_ms, route_score
from edge_sim.network import NetworkModel

# Request outcome codes (Workers AI codes): served, refused for capacity, too long for the model.
SERVED, REJECTED_CAPACITY, REJECTED_TOO_LONG = 0, 3040, 3006


def run_events(
    sample: WorkloadSample,
    routes: list[Route],
    reps: list[Replica],
    trace: Trace,
    max_queue_ms: float,
    network: NetworkModel,
    jitter: float,
    jitter_rng: random.Random | None,
) -> dict[str, int]:
    """Simulate every request of `sample` to its end (filling `trace`); requests per ingress PoP."""
    n = len(sample.times)
    send, prompts, outputs, clients = trace.send, sample.prompts, sample.outputs, sample.clients
    ingress_counts: dict[str, int] = {}
    # (time, kind, id, version): kind 0 = arrival at the PoP, 1 = replica step end
    heap: list[tuple[float, int, int, int]] = []
    push, pop_ = heappush, heappop
    net_ms, placed, seqs = trace.net_ms, trace.placed, trace.seqs
    tenants = sample.tenants or [""] * n
    block_ids = sample.block_ids
    # session affinity, as the live edge's: a session's next turn goes back to the replica that
    # served the last one (which holds its cache) unless that one is full
    sessions, turns = sample.sessions, sample.turns
    affinity: dict[int, Replica] = {}
    ai = 0
    while True:
        if ai < n and (not heap or send[ai] <= heap[0][0]):  # the next event is a request sent
            rid = ai
            ai += 1
            route = routes[clients[rid]]
            total = prompts[rid] + outputs[rid]
            ingress_counts[route.ingress] = ingress_counts.get(route.ingress, 0) + 1
            best = None
            if sessions is not None and turns is not None and turns[rid] and sessions[rid] in affinity:
                best, best_bb = _sticky(route.candidates, affinity[sessions[rid]], total, max_queue_ms)
            if best is None:
                best, best_bb = _choose(route.candidates, prompts[rid], total, max_queue_ms)
            if best is None:
                fits_any = any(total <= r.fit_tokens for _, r in route.candidates)
                trace.status[rid] = REJECTED_CAPACITY if fits_any else REJECTED_TOO_LONG
                net_ms[rid] = route.client_rtt
                continue
            net = route.client_rtt + best_bb
            if jitter:  # on each path's propagation part; never below the fixed costs
                floor = network.base_ms + (network.backbone_base_ms if best_bb else 0.0)
                net = max(floor, net + jitter_rng.gauss(0.0, jitter))  # type: ignore[union-attr]
            net_ms[rid] = net
            placed[rid] = best.idx
            if sessions is not None:
                affinity[sessions[rid]] = best
            at = send[rid] + net * 0.5  # it reaches the PoP half its RTTs later
            seq = seqs[rid] = SimSeq(
                rid, prompts[rid], outputs[rid], at, best.blocks.new_sequence(), tenants[rid]
            )
            if block_ids is not None and block_ids[rid] is not None:
                best.track(seq, block_ids[rid])
            push(heap, (at, 0, rid, 0))
            continue
        if not heap:
            break
        t, kind, x, ver = pop_(heap)
        if kind == 0:
            r = reps[placed[x]]
            arrived = seqs[x]
            assert arrived is not None  # placed when it was sent
            end = r.arrive(arrived, t)
        else:
            r = reps[x]
            if ver != r.ver:
                continue  # a step end that a cut run replaced
            r.end(t)
            end = r.compose(t)
        if end is not None:
            push(heap, (end, 1, r.idx, r.ver))

    return ingress_counts


class Route(NamedTuple):
    """Where a client location's requests enter, and the replicas ranked by backbone RTT from there."""

    ingress: str
    client_rtt: float
    candidates: list[tuple[float, Replica]]


def _choose(
    candidates: list[tuple[float, Replica]], prompt: int, total: int, max_queue_ms: float
) -> tuple[Replica | None, float]:
    """The live router's choice among replicas (route_score), skipping the full and the too small."""
    best, best_score, best_bb = None, math.inf, math.inf
    for bb, r in candidates:
        if bb >= best_score:
            break  # ranked by RTT: no later replica can score better
        if total > r.fit_tokens:
            continue
        load = r.load()
        wait = expected_wait_ms(load)
        if wait > max_queue_ms:
            continue  # over the admission limit
        score = route_score(bb, load, prompt, wait)
        if score < best_score:
            best_score, best, best_bb = score, r, bb
    return best, best_bb


def _sticky(
    candidates: list[tuple[float, Replica]], replica: Replica, total: int, max_queue_ms: float
) -> tuple[Replica | None, float]:
    """`replica` for a session's next turn, with its backbone RTT; None when it is full or too small."""
    if total > replica.fit_tokens or expected_wait_ms(replica.load()) > max_queue_ms:
        return None, math.inf
    for bb, r in candidates:
        if r is replica:
            return r, bb
    return None, math.inf


class Trace:
    """Per request, in arrival order: when it was sent, its network time, where it went, how."""

    def __init__(self, n: int, send: list[float]):
        self.send = send
        self.net_ms = [0.0] * n  # client RTT + backbone RTT
        self.placed = [-1] * n  # replica index, -1 when refused
        self.status = [SERVED] * n
        self.seqs: list[SimSeq | None] = [None] * n

    def columns(self, reps: list[Replica], pop_codes: list[str]) -> RequestColumns:
        """The report's per-request columns (NaN and "" for refused requests)."""
        nan = math.nan
        queue, ttft, e2e, tpot = [], [], [], []
        pop: list[str] = []
        preempted: list[int] = []
        cached: list[int] = []
        net_ms, placed = self.net_ms, self.placed
        for i, seq in enumerate(self.seqs):
            if seq is None:
                queue.append(nan)
                ttft.append(nan)
                e2e.append(nan)
                tpot.append(nan)
                pop.append("")
                preempted.append(0)
                cached.append(0)
                continue
            net, out = net_ms[i], seq.output
            queue.append(seq.ts - seq.at)
            ttft.append(net + seq.tf - seq.at)
            e2e.append(net + seq.td - seq.at)
            tpot.append((seq.td - seq.tf) / (out - 1) if out > 1 else nan)
            pop.append(pop_codes[reps[placed[i]].pop])
            preempted.append(seq.preemptions)
            cached.append(seq.cached)
        return RequestColumns(queue, ttft, e2e, tpot, pop, preempted, cached)


class RequestColumns(NamedTuple):
    """Per request, in arrival order, in ms: what SimResult reports of each."""

    queue: list[float]
    ttft: list[float]
    e2e: list[float]
    tpot: list[float]
    pop: list[str]  # the GPU PoP's code
    preempted: list[int]  # times preempted
    cached: list[int]  # prompt tokens the prefix cache held at its first admission
