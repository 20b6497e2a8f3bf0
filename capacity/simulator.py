"""Discrete-event capacity simulator (in the style of Vidur and DistServe's simulator).

Clients around the world send requests (capacity.workload); each enters at its nearest PoP
(anycast ingress), is routed over the backbone to a GPU PoP replica, waits in that replica's
queue, and is served by continuous batching by the engine's own scheduling policy
(engine.sched.policy, driven by capacity.replica with modelled step times instead of model steps).
KV capacity is the replica's number of 16-token blocks (GPU memory left after the weights, divided
by the block size of the KV dtype), counted per sequence as the engine's block pool counts them.

Step durations come from a cost model (capacity.costmodel): the roofline model of the PoP's GPUs
for a target model, or our engine's profile measured on this machine.

Routing uses the live router's scoring (edge_sim.router.route_score): the replica with the least
backbone RTT + expected queue wait + this prompt's prefill, skipping replicas over the admission
limit (expected wait above `max_queue_ms`) or too small for the request; when none is left the
request is refused (3040, no capacity). Routing decides at send time on the state then; the
request reaches the PoP half its RTTs later.

Accounting, per request (the same parts as a live answer's `timing`):
    TTFT = client RTT + backbone RTT + queue + prefill (to the first token)
    E2E  = client RTT + backbone RTT + queue + prefill + decode
    TPOT = decode time / (output tokens - 1)
RTTs come from edge_sim.network; with `jitter_ms` set, each request draws its own (seeded).
"""

from __future__ import annotations

import gc
import math
import random
import time
from collections.abc import Callable, Sequence

import msgspec

from capacity.costmodel import CostModel, ReplicaPlan
from capacity.event_loop import REJECTED_CAPACITY, REJECTED_TOO_LONG, SERVED, Route, Trace, run_events
from capacity.replica import Replica
from capacity.sampling import sample_requests
from capacity.workload import SLO, TopologySetup, Workload, WorkloadSample
from edge_sim.network import NetworkModel
from edge_sim.roofline import SimulationError, check_kv
from edge_sim.topology import Topology
from engine.sched.fair_queue import TenantShare

__all__ = [
    "REJECTED_CAPACITY",
    "REJECTED_TOO_LONG",
    "SERVED",
    "PopInfo",
    "SimResult",
    "SimulationError",
    "refusals",
    "simulate",
    "simulate_kv",
]


class PopInfo(msgspec.Struct):
    """A GPU PoP as simulated: its place, GPUs and how it serves the model."""

    code: str
    city: str
    lat: float
    lon: float
    gpu: str
    gpu_count: int
    gpus_per_replica: int
    replicas: int
    num_blocks: int  # per replica
    price_per_hour: float  # per replica
    note: str = ""


class ReplicaStats(msgspec.Struct):
    pop: str
    busy_ms: float
    steps: int
    kv_block_ms: float  # integral of blocks in use over time
    kv_peak_blocks: int
    num_blocks: int
    preemptions: int
    served: int
    running_ms: float  # integral of running sequences over time
    max_running: int


class SimResult(msgspec.Struct):
    """Everything the report needs: per-request records and per-replica counters."""

    workload: str
    kv: str
    cost_model: str
    model: str
    duration_s: float
    seed: int
    rate_multiplier: float
    offered_rps: float
    slo: SLO
    end_ms: float  # when the last request finished at its PoP (at least the duration)
    wall_s: float
    pops: list[PopInfo]
    skipped: list[PopInfo]  # GPU PoPs that cannot serve the model, with why
    replicas: list[ReplicaStats]
    ingress_counts: dict[str, int]
    places: dict[str, tuple[float, float]]  # every PoP's (lon, lat), for maps
    # per request, in arrival order
    send_ms: list[float]
    prompt: list[int]
    output: list[int]
    network_ms: list[float]  # client RTT + backbone RTT
    pop: list[str]  # GPU PoP code, or "" when refused
    status: list[int]  # SERVED, REJECTED_CAPACITY or REJECTED_TOO_LONG
    queue_ms: list[float]
    ttft_ms: list[float]
    e2e_ms: list[float]
    tpot_ms: list[float]  # NaN for one-token outputs and refusals
    preempted: list[int]
    # the prefix cache, when the sample carries block identities: per request, the prompt tokens
    # the cache held at its first admission (0 when refused)
    prefix_cache: bool = False
    cached: list[int] = []
    tenant: list[str] = []  # per request, its account (empty: the sample named none)
    max_queue_ms: float = math.inf  # the admission limit the router refused by (expected wait)
    fit_tokens: int = 0  # the longest request (prompt + output) a replica holds alone


def _plan_pops(
    topology: Topology, cost: CostModel, kv: str, min_kv_tokens: int
) -> tuple[list[PopInfo], list[PopInfo], list[ReplicaPlan]]:
    gpu_pops = topology.gpu_pops()
    if not gpu_pops:
        raise SimulationError(
            "the topology has no GPU PoP; give at least one PoP GPUs (gpus = { H200 = 8 } or [gpu_pops])"
        )
    pops, skipped, plans = [], [], []
    for p in gpu_pops:
        plan = cost.plan_pop(p.gpus, kv, min_kv_tokens)
        count = sum(p.gpus.values())
        info = PopInfo(
            p.code, p.city, p.lat, p.lon, plan.gpu, count, plan.gpus, plan.replicas, plan.num_blocks,
            plan.price_per_hour, plan.note,
        )  # fmt: skip
        if plan.replicas < 1 or plan.num_blocks < 1:
            skipped.append(info)
        else:
            pops.append(info)
            plans.append(plan)
    if not pops:
        why = "; ".join(f"{s.code}: {s.note}" for s in skipped)
        raise SimulationError(f"no GPU PoP in the topology can serve {cost.model_name} with KV {kv}: {why}")
    return pops, skipped, plans


_ANYCAST: dict[tuple, tuple] = {}


def _anycast(network: NetworkModel, pops: list, loc) -> tuple:
    """The ingress PoP nearest to a client (anycast) and the client RTT to it, memoised: the
    same world is simulated many times over (KV dtypes, load sweeps)."""
    key = (network, loc.lat, loc.lon, tuple((p.code, p.lat, p.lon) for p in pops))
    hit = _ANYCAST.get(key)
    if hit is None:
        if len(_ANYCAST) > 4096:
            _ANYCAST.clear()
        ingress, _ = network.nearest_pop(loc, pops)
        hit = _ANYCAST[key] = (ingress, network.client_rtt_ms(loc, ingress))
    return hit


def simulate(
    workload: Workload,
    cost: CostModel,
    kv: str = "auto",
    *,
    duration_s: float = 600.0,
    seed: int = 1,
    setup: TopologySetup | None = None,
    rate_multiplier: float = 1.0,
    max_queue_ms: float | None = None,
    sample: WorkloadSample | None = None,
    on_event: Callable[[str, int, float], None] | None = None,
    shares: dict[str, TenantShare] | None = None,
) -> SimResult:
    """Run the workload for `duration_s` of arrivals (then drain) on the topology's GPU PoPs.

    `sample`: replay these requests (a recorded trace) instead of drawing them from the workload.
    `on_event(kind, request index, ms)`: hears every scheduling decision ("admit", "preempt",
    "pause", "resume", "drop", "finish") at every replica, in the order they are made.
    `shares`: each tenant's fair-share weight and KV share (the sample's `tenants` name them)."""
    started = time.perf_counter()
    check_kv(kv)
    setup = setup or TopologySetup(Topology.default(), NetworkModel(), {})
    topology, network = setup.topology, setup.network
    jitter = network.jitter_ms
    jitter_rng = None
    if jitter:  # RTTs below are the model's jitter-free ones; jitter is drawn per request, seeded
        network = msgspec.structs.replace(network, jitter_ms=0.0)
        jitter_rng = random.Random(seed * 1_000_003 + 17)
    slo = workload.slo
    if max_queue_ms is None:
        max_queue_ms = 10.0 * slo.ttft_ms
    if sample is None:
        sample = sample_requests(workload, topology, duration_s, seed, rate_multiplier)
    pops, skipped, plans = _plan_pops(topology, cost, kv, workload.max_context)
    topo_pops = [topology.pop(p.code) for p in pops]

    reps: list[Replica] = []
    for i, plan in enumerate(plans):
        for _ in range(plan.replicas):
            reps.append(Replica(len(reps), i, plan, on_event))
    for name, share in (shares or {}).items():
        for r in reps:
            r.policy.configure_tenant(name, share.weight, share.kv_share)
    routes = _routes(sample, network, list(topology.pops.values()), topo_pops, reps)

    n = len(sample.times)
    trace = Trace(n, [t * 1000.0 for t in sample.times])
    # The loop allocates an object or two per event and keeps every request until the result: the
    # cyclic collector would walk them all again and again (a fifth of the run) to free nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        ingress_counts = run_events(sample, routes, reps, trace, max_queue_ms, network, jitter, jitter_rng)
    finally:
        if collecting:
            gc.enable()

    end_ms = max([duration_s * 1000.0, *(r.t_end for r in reps)])
    return _result(
        msgspec.structs.replace(
            _EMPTY, workload=workload.name, kv=kv, cost_model=cost.describe(), model=cost.model_name,
            duration_s=duration_s, seed=seed, rate_multiplier=rate_multiplier,
            offered_rps=workload.arrivals.rate * rate_multiplier, slo=slo, end_ms=end_ms, pops=pops,
            skipped=skipped, ingress_counts=ingress_counts,
            places={p.code: (p.lon, p.lat) for p in topology.pops.values()},
            tenant=list(sample.tenants or []), max_queue_ms=max_queue_ms,
            fit_tokens=max(r.fit_tokens for r in reps),
        ),
        reps, sample, trace, started,
    )  # fmt: skip


def refusals(r: SimResult) -> str:
    """Why the requests the simulator did not serve were refused, counted by reason ("" when it
    served them all): a run never loses a request without saying so."""
    capacity = sum(1 for s in r.status if s == REJECTED_CAPACITY)
    too_long = sum(1 for s in r.status if s == REJECTED_TOO_LONG)
    why = []
    if capacity:
        why.append(
            f"{capacity} refused for capacity (3040): every replica's expected queue wait was over the "
            f"admission limit of {r.max_queue_ms:,.0f} ms when it was sent (the cost model's steps are too "
            f"slow for this load, or raise max_queue_ms)"
        )
    if too_long:
        why.append(
            f"{too_long} too long (3006): prompt + output over the {r.fit_tokens:,} tokens a replica's "
            f"context window and KV cache hold"
        )
    return "; ".join(why)


def _routes(sample: WorkloadSample, network: NetworkModel, all_pops, topo_pops, reps) -> list[Route]:
    by_ingress: dict[str, list[tuple[float, Replica]]] = {}
    routes = []
    for loc in sample.locations:
        ingress, rtt = _anycast(network, all_pops, loc)
        cands = by_ingress.get(ingress.code)
        if cands is None:
            bb = [network.backbone_rtt_ms(ingress, p) for p in topo_pops]
            ranked = sorted(((bb[r.pop], r.idx), r) for r in reps)
            cands = by_ingress[ingress.code] = [(key[0], r) for key, r in ranked]
        routes.append(Route(ingress.code, rtt, cands))
    return routes


_EMPTY = SimResult(
    workload="", kv="", cost_model="", model="", duration_s=0.0, seed=0, rate_multiplier=1.0,
    offered_rps=0.0, slo=SLO(), end_ms=0.0, wall_s=0.0, pops=[], skipped=[], replicas=[],
    ingress_counts={}, places={}, send_ms=[], prompt=[], output=[], network_ms=[], pop=[], status=[],
    queue_ms=[], ttft_ms=[], e2e_ms=[], tpot_ms=[], preempted=[],
)  # fmt: skip


def _result(
    base: SimResult, reps: list[Replica], sample: WorkloadSample, trace: Trace, started: float
) -> SimResult:
    pop_codes = [p.code for p in base.pops]
    cols = trace.columns(reps, pop_codes)
    stats = [
        ReplicaStats(
            pop_codes[r.pop],
            r.busy_ms,
            r.steps,
            r.kv_int,
            r.kv_peak,
            r.nb,
            r.preempts,
            r.served,
            r.run_int,
            r.max_run,
        )  # fmt: skip
        for r in reps
    ]
    return msgspec.structs.replace(
        base, wall_s=time.perf_counter() - started, replicas=stats, send_ms=trace.send,
        prompt=list(sample.prompts), output=list(sample.outputs), network_ms=trace.net_ms, pop=cols.pop,
        status=trace.status, queue_ms=cols.queue, ttft_ms=cols.ttft, e2e_ms=cols.e2e, tpot_ms=cols.tpot,
        preempted=cols.preempted, prefix_cache=sample.block_ids is not None, cached=cols.cached,
    )  # fmt: skip


def simulate_kv(
    workload: Workload,
    cost: CostModel,
    kvs: Sequence[str] = ("auto",),
    **kwargs,
) -> list[SimResult]:
    """The same workload (same seed, so the same requests) once per KV dtype."""
    return [simulate(workload, cost, kv, **kwargs) for kv in kvs]
