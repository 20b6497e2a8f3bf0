"""Discrete-event capacity simulator (in the style of Vidur and DistServe's simulator).

Clients around the world send requests (capacity.workload); each enters at its nearest PoP
(anycast ingress), is routed over the backbone to a GPU PoP replica, waits in that replica's
queue, and is served by continuous batching exactly as our engine's scheduler does it:

* every step, decoding sequences go first (one token each), then sequences still prefilling
  continue their prompt in chunks, then waiting sequences are admitted first come, first served,
  all under a per-step token budget and a cap on running sequences;
* KV capacity is a number of 16-token blocks (GPU memory left after the weights, divided by the
  block size of the KV dtype), and fp8/int4 keep one staging slot per running sequence;
* when the blocks run out, the newest running sequence is preempted and recomputed later.

Step durations come from a cost model (capacity.costmodel): the roofline model of the PoP's GPUs
for a target model, or our engine's profile measured on this machine.

Routing: the GPU PoP replica that minimises backbone RTT + expected queue wait + expected
prefill, skipping replicas over the admission limit (expected wait above `max_queue_ms`) or
too small for the request; when none is left the request is refused (3040, no capacity).

The expected queue wait of a replica is the step in progress, plus the prompt tokens queued
ahead at its prefill rate, plus, for requests beyond the seats left (sequence cap or KV room),
their number over the replica's recent finish rate. Routing decides at send time on the state
then; the request reaches the PoP half its RTTs later.

Accounting, per request (the same parts as a live answer's `timing`):
    TTFT = client RTT + backbone RTT + queue + prefill (to the first token)
    E2E  = client RTT + backbone RTT + queue + prefill + decode
    TPOT = decode time / (output tokens - 1)
RTTs come from edge_sim.network; with `jitter_ms` set, each request draws its own (seeded).

Speed: per-request work is O(1) amortised. A replica's pure-decode stretch (no prefill, no
admission possible) is advanced as one event up to the next finishing sequence or KV
exhaustion, using step times interpolated linearly in the growing context (exact for the
profiled model, which is linear; for the roofline's max(compute, memory) it is exact on either
side of the crossover); likewise the full-chunk prefill steps of a long prompt (no admission
is possible while a chunk takes the whole token budget). KV blocks are accounted in aggregate
as tokens/16 plus half a block per sequence (the expected partial block), not per sequence.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import deque
from collections.abc import Sequence

import msgspec

from capacity.costmodel import BLOCK_TOKENS, CostModel, ReplicaPlan
from capacity.workload import SLO, TopologySetup, Workload, WorkloadSample, sample_requests
from edge_sim.network import NetworkModel
from edge_sim.roofline import SimulationError, check_kv
from edge_sim.topology import Topology

__all__ = ["PopInfo", "SimResult", "SimulationError", "simulate", "simulate_kv"]

# Request outcome codes (Workers AI codes): served, refused for capacity, too long for the model.
SERVED, REJECTED_CAPACITY, REJECTED_TOO_LONG = 0, 3040, 3006

_IDLE, _STEP, _SEG = 0, 1, 2
_MERGE_RUNS = True  # advance a long prompt's full-chunk steps as one event (tests compare both ways)
_WAIT, _PREFILL, _DECODE, _DONE = 0, 1, 2, 3


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
    kv_peak_blocks: float
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


class _Rep:
    """One engine replica's scheduler state (plain attributes; the hot loop reads them)."""

    __slots__ = (
        "idx", "pop", "nb", "stg", "max_seqs", "budget", "step_fn", "dec_fn", "pf_tok", "fit_tokens",
        "kind", "ver", "t0", "t_end", "seg_k", "seg_d0", "seg_g", "seg_B", "seg_C",
        "step_no", "dec_B", "dec_C", "fin", "pref", "pref_T", "waiting", "n_run", "pending",
        "busy_ms", "steps", "kv_int", "kv_peak", "preempts", "served", "run_int", "max_run",
        "fin_rate", "fin_t", "step_est",
    )  # fmt: skip

    def __init__(self, idx: int, pop: int, plan: ReplicaPlan):
        self.idx, self.pop = idx, pop
        self.nb = plan.num_blocks
        self.stg = 0.5 + plan.staging_blocks  # expected partial block + staging slot, per sequence
        self.max_seqs, self.budget = plan.max_num_seqs, plan.max_batched_tokens
        self.step_fn, self.dec_fn = plan.step_ms, plan.decode_ms
        # the longest request (prompt + output) the model's window and this cache hold alone
        self.fit_tokens = min(plan.max_context, int((self.nb - self.stg) * BLOCK_TOKENS))
        chunk = min(plan.max_batched_tokens, 2048)
        self.pf_tok = plan.step_ms(chunk, chunk * (chunk + 1) / 2, chunk, 0, 0) / chunk
        self.kind, self.ver, self.t0, self.t_end = _IDLE, 0, 0.0, 0.0
        self.seg_k, self.seg_d0, self.seg_g, self.seg_B, self.seg_C = 0, 0.0, 0.0, 0, 0.0
        self.step_no = 0
        self.dec_B, self.dec_C = 0, 0.0
        self.fin: list = []  # (finish step, rid, epoch)
        self.pref: list[int] = []
        self.pref_T = 0.0
        self.waiting: deque[int] = deque()
        self.n_run = 0
        self.pending = 0.0  # prompt tokens still to prefill (waiting and prefilling)
        self.busy_ms = self.kv_int = self.kv_peak = self.run_int = 0.0
        self.steps = self.preempts = self.served = self.max_run = 0
        self.fin_rate, self.fin_t = 0.0, 0.0
        self.step_est = 0.0  # duration of the step in progress (0 when idle)


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
) -> SimResult:
    """Run the workload for `duration_s` of arrivals (then drain) on the topology's GPU PoPs.

    `sample`: replay these requests (a recorded trace) instead of drawing them from the workload."""
    started = time.perf_counter()
    check_kv(kv)
    setup = setup or TopologySetup(Topology.default(), NetworkModel(), {})
    topology, network = setup.topology, setup.network
    jitter = network.jitter_ms
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

    reps: list[_Rep] = []
    for i, plan in enumerate(plans):
        for _ in range(plan.replicas):
            reps.append(_Rep(len(reps), i, plan))

    # Per client location: client RTT, ingress, and GPU replicas ranked by backbone RTT.
    all_pops = list(topology.pops.values())
    loc_rtt: list[float] = []
    loc_ingress: list[str] = []
    loc_cands: list[list[tuple[float, _Rep]]] = []
    by_ingress: dict[str, list[tuple[float, _Rep]]] = {}
    for loc in sample.locations:
        ingress, rtt = _anycast(network, all_pops, loc)
        loc_rtt.append(rtt)
        loc_ingress.append(ingress.code)
        cands = by_ingress.get(ingress.code)
        if cands is None:
            bb = [network.backbone_rtt_ms(ingress, p) for p in topo_pops]
            ranked = sorted(((bb[r.pop], r.idx), r) for r in reps)
            cands = by_ingress[ingress.code] = [(key[0], r) for key, r in ranked]
        loc_cands.append(cands)

    n = len(sample.times)
    send = [t * 1000.0 for t in sample.times]
    P, OUT, CL = sample.prompts, sample.outputs, sample.clients
    NET = [0.0] * n
    AT = [0.0] * n  # time the request reaches its GPU PoP
    REP = [-1] * n
    STATUS = [SERVED] * n
    GEN = [0] * n  # tokens generated before the current run (recompute after preemption)
    CMP = [0] * n  # prompt tokens computed in the current run
    S0 = [0] * n  # step of the current run's first token
    L0 = [0] * n  # KV tokens at that step
    G0 = [0] * n  # tokens generated by that step
    EP = [0] * n  # epoch: bumped on preemption, invalidates heap entries
    ST = [_WAIT] * n
    TS = [-1.0] * n  # first admitted
    TF = [-1.0] * n  # first token at the PoP
    TD = [-1.0] * n  # last token at the PoP
    PRE = [0] * n
    ingress_counts: dict[str, int] = {}

    heap: list = []
    push, pop_ = heapq.heappush, heapq.heappop
    tau = 5000.0  # ms, time constant of each replica's finish-rate estimate
    exp = math.exp

    def finish(r: _Rep, rid: int, t: float) -> None:
        TD[rid] = t
        ST[rid] = _DONE
        r.n_run -= 1
        r.served += 1
        r.fin_rate = r.fin_rate * exp((r.fin_t - t) / tau) + 1.0 / tau
        r.fin_t = t

    def pop_finished(r: _Rep, s: int, t: float) -> None:
        """Decoders whose last token is step `s`: done at `t`."""
        fin = r.fin
        while fin and fin[0][0] <= s:
            _, rid, ep = pop_(fin)
            if EP[rid] != ep or ST[rid] != _DECODE:
                continue
            r.dec_B -= 1
            r.dec_C -= L0[rid] + (s - S0[rid])
            finish(r, rid, t)

    def preempt_newest(r: _Rep) -> None:
        """Preempt the running sequence that arrived last (recompute later), as the engine does.

        Rare, so it scans the running sequences rather than keeping an ordered index of them."""
        best_key, rid = None, -1
        for _, x, ep in r.fin:
            if EP[x] == ep and ST[x] == _DECODE and (best_key is None or (AT[x], x) > best_key):
                best_key, rid = (AT[x], x), x
        for x in r.pref:
            if best_key is None or (AT[x], x) > best_key:
                best_key, rid = (AT[x], x), x
        if rid < 0:
            return
        if ST[rid] == _DECODE:
            done = r.step_no - S0[rid]
            GEN[rid] = G0[rid] + done
            r.dec_B -= 1
            r.dec_C -= L0[rid] + done
        else:
            r.pref.remove(rid)
            r.pref_T -= CMP[rid]
            r.pending -= P[rid] + GEN[rid] - CMP[rid]
        CMP[rid] = 0
        EP[rid] += 1
        ST[rid] = _WAIT
        r.n_run -= 1
        r.waiting.appendleft(rid)
        r.pending += P[rid] + GEN[rid]
        PRE[rid] += 1
        r.preempts += 1

    def admissible(r: _Rep) -> bool:
        if not r.waiting or r.n_run >= r.max_seqs:
            return False
        rid = r.waiting[0]
        left = r.budget - r.dec_B
        if left <= 0:
            return False
        need = P[rid] + GEN[rid]
        chunk = need if need < left else left
        return (r.dec_C + r.pref_T + r.dec_B + chunk) / BLOCK_TOKENS + (r.n_run + 1) * r.stg <= r.nb

    def mixed_step(r: _Rep, t: float) -> None:
        nb, stg, budget = r.nb, r.stg, r.budget
        while True:
            B = r.dec_B
            left = budget - B
            chunks = []
            Pt = 0
            pairs = pkv = 0.0
            for rid in r.pref:
                if left <= 0:
                    break
                s0 = CMP[rid]
                rem = P[rid] + GEN[rid] - s0
                c = rem if rem < left else left
                chunks.append((rid, c))
                Pt += c
                left -= c
                pairs += c * (s0 + (c + 1) * 0.5)
                pkv += s0 + c
            T = r.dec_C + r.pref_T
            if r.n_run == 0 or (T + B + Pt) / BLOCK_TOKENS + r.n_run * stg <= nb:
                break
            preempt_newest(r)
        waiting = r.waiting
        if waiting and left > 0:
            max_seqs = r.max_seqs
            n_run = r.n_run
            room = (nb - n_run * stg) * BLOCK_TOKENS - T - B - Pt  # tokens that still fit
            pref = r.pref
            while waiting and left > 0 and n_run < max_seqs:
                rid = waiting[0]
                need = P[rid] + GEN[rid]
                c = need if need < left else left
                if c + stg * BLOCK_TOKENS > room:
                    break
                room -= c + stg * BLOCK_TOKENS
                waiting.popleft()
                ST[rid] = _PREFILL
                pref.append(rid)
                n_run += 1
                if TS[rid] < 0:
                    TS[rid] = t
                chunks.append((rid, c))
                Pt += c
                left -= c
                pairs += c * (c + 1) * 0.5
                pkv += c
            r.n_run = n_run
        if not chunks and B == 0:
            r.kind = _IDLE
            r.step_est = 0.0
            return
        if left == 0 and len(chunks) == 1 and _MERGE_RUNS:
            rid, c = chunks[0]
            # A long prompt filling whole steps: nothing can be admitted until its last chunk,
            # so run its full-chunk steps up to the next finish as one event.
            m = (P[rid] + GEN[rid] - CMP[rid] - 1) // c
            if m > 1:
                fin = r.fin
                if fin:
                    while fin and (EP[fin[0][1]] != fin[0][2] or ST[fin[0][1]] != _DECODE):
                        pop_(fin)
                    if fin and fin[0][0] - r.step_no < m:
                        m = fin[0][0] - r.step_no
                kv_room = int(((nb - r.n_run * stg) * BLOCK_TOKENS - T) // (B + c))
                if kv_room < m:
                    m = kv_room
                if m > 1:
                    prefill_run(r, t, rid, c, m)
                    return
        dur = r.step_fn(Pt, pairs, pkv, B, r.dec_C + B)
        te = t + dur
        r.step_no = s = r.step_no + 1
        r.dec_C += B
        fin = r.fin
        if fin and fin[0][0] <= s:
            pop_finished(r, s, te)
        done_prefill = False
        pref_T = r.pref_T + Pt
        r.pending -= Pt
        for rid, c in chunks:
            cm = CMP[rid] + c
            CMP[rid] = cm
            if cm == P[rid] + GEN[rid]:
                done_prefill = True
                pref_T -= cm
                ST[rid] = _DECODE
                if TF[rid] < 0:
                    TF[rid] = te
                g0 = GEN[rid] + 1
                if g0 >= OUT[rid]:
                    finish(r, rid, te)
                else:
                    r.dec_B += 1
                    r.dec_C += cm
                    S0[rid] = s
                    L0[rid] = cm
                    G0[rid] = g0
                    push(fin, (s + OUT[rid] - g0, rid, EP[rid]))
        r.pref_T = pref_T
        if done_prefill:
            r.pref = [rid for rid in r.pref if ST[rid] == _PREFILL]
        n_run = r.n_run
        used = (r.dec_C + pref_T) / BLOCK_TOKENS + n_run * stg
        r.kv_int += used * dur
        if used > r.kv_peak:
            r.kv_peak = used
        r.run_int += n_run * dur
        if n_run > r.max_run:
            r.max_run = n_run
        r.busy_ms += dur
        r.steps += 1
        r.step_est = dur
        r.kind = _STEP
        r.t0 = t
        r.t_end = te
        r.ver = ver = r.ver + 1
        push(heap, (te, 1, r.idx, ver))

    def prefill_run(r: _Rep, t: float, rid: int, c: int, m: int) -> None:
        """m steps, each a full chunk of c prompt tokens of `rid` beside the same decoders."""
        B, C0, s0 = r.dec_B, r.dec_C, CMP[rid]
        step = r.step_fn
        dur = 0.0
        for j in range(m):
            start = s0 + j * c
            dur += step(c, c * (start + (c + 1) * 0.5), start + c, B, C0 + B * (j + 1))
        te = t + dur
        u0 = (C0 + r.pref_T + B + c) / BLOCK_TOKENS + r.n_run * r.stg
        r.step_no += m
        r.dec_C = C0 + m * B
        CMP[rid] = s0 + m * c
        r.pref_T += m * c
        r.pending -= m * c
        if r.fin and r.fin[0][0] <= r.step_no:
            pop_finished(r, r.step_no, te)
        u1 = (C0 + m * B + r.pref_T) / BLOCK_TOKENS + r.n_run * r.stg
        r.kv_int += (u0 + u1) * 0.5 * dur
        if u1 > r.kv_peak:
            r.kv_peak = u1
        r.run_int += r.n_run * dur
        if r.n_run > r.max_run:
            r.max_run = r.n_run
        r.busy_ms += dur
        r.steps += m
        r.step_est = dur / m
        r.kind = _STEP
        r.t0 = t
        r.t_end = te
        r.ver = ver = r.ver + 1
        push(heap, (te, 1, r.idx, ver))

    def compose(r: _Rep, t: float) -> None:
        """Start the replica's next step (or stretch of decode steps) at time t."""
        if r.pref or (r.waiting and admissible(r)):
            mixed_step(r, t)
            return
        B = r.dec_B
        if B == 0:
            r.kind = _IDLE
            r.step_est = 0.0
            return
        fin = r.fin
        while fin and (EP[fin[0][1]] != fin[0][2] or ST[fin[0][1]] != _DECODE):
            pop_(fin)
        k = fin[0][0] - r.step_no
        C = r.dec_C
        room = ((r.nb - r.n_run * r.stg) * BLOCK_TOKENS - C) // B
        if room < k:
            k = int(room)
        if k < 1:
            mixed_step(r, t)  # blocks ran out: preempts
            return
        dec = r.dec_fn
        d0 = dec(B, C + B)
        if k > 1:
            d1 = dec(B, C + k * B)
            g = (d1 - d0) / (k - 1)
            total = k * (d0 + d1) * 0.5
        else:
            g = 0.0
            total = d0
        r.kind = _SEG
        r.step_est = d0
        r.t0, r.t_end = t, t + total
        r.seg_k, r.seg_d0, r.seg_g, r.seg_B, r.seg_C = k, d0, g, B, C
        r.ver += 1
        push(heap, (t + total, 1, r.idx, r.ver))

    def end_segment(r: _Rep, t: float) -> None:
        k, B, C = r.seg_k, r.seg_B, r.seg_C
        dur = t - r.t0
        r.step_no += k
        r.dec_C = C + k * B
        base = r.pref_T / BLOCK_TOKENS + r.n_run * r.stg
        u0 = base + (C + B) / BLOCK_TOKENS
        u1 = base + r.dec_C / BLOCK_TOKENS
        r.kv_int += (u0 + u1) * 0.5 * dur
        if u1 > r.kv_peak:
            r.kv_peak = u1
        r.run_int += r.n_run * dur
        r.busy_ms += dur
        r.steps += k
        pop_finished(r, r.step_no, t)

    def cut_segment(r: _Rep, t: float) -> None:
        """An admissible request arrived mid-stretch: stop after the step in progress at t."""
        e = t - r.t0
        d0, g = r.seg_d0, r.seg_g
        if g > 1e-12:
            b = d0 - g * 0.5
            j = int((-b + math.sqrt(b * b + 2.0 * g * e)) / g)
        else:
            j = int(e / d0) if d0 > 0 else r.seg_k
        # j: whole steps done by t (S(j) <= e < S(j + 1)), guarded against rounding
        while j > 0 and j * d0 + g * j * (j - 1) * 0.5 > e:
            j -= 1
        while (j + 1) * d0 + g * (j + 1) * j * 0.5 <= e:
            j += 1
        k = j + 1
        if k >= r.seg_k:
            return
        r.seg_k = k
        r.t_end = end = r.t0 + k * d0 + g * k * (k - 1) * 0.5
        r.ver += 1
        push(heap, (end, 1, r.idx, r.ver))

    # --- the event loop -----------------------------------------------------------------------
    ai = 0
    inf = math.inf
    while True:
        if ai < n and (not heap or send[ai] <= heap[0][0]):
            rid = ai
            ai += 1
            t = send[rid]
            loc = CL[rid]
            p = P[rid]
            total_tokens = p + OUT[rid]
            best = None
            best_score = best_bb = inf
            for bb, r in loc_cands[loc]:
                if bb >= best_score:
                    break
                if total_tokens > r.fit_tokens:
                    continue
                # A newcomer waits for the step in progress, the prefill queued ahead of it ...
                wait = r.step_est + r.pending * r.pf_tok
                nw = len(r.waiting)
                if nw:
                    # ... and, beyond the seats (sequence cap or KV room) left, requests wait for finishes.
                    seats = r.max_seqs - r.n_run
                    if r.n_run:
                        used = (r.dec_C + r.pref_T) / BLOCK_TOKENS + r.n_run * r.stg
                        kv_seats = (r.nb - used) * r.n_run / used
                        if kv_seats < seats:
                            seats = kv_seats
                    if nw > seats:
                        wait += (nw - seats) / (r.fin_rate if r.fin_rate > 0 else 1.0 / tau)
                if wait > max_queue_ms:
                    continue
                score = bb + wait + p * r.pf_tok
                if score < best_score:
                    best_score, best, best_bb = score, r, bb
            ing = loc_ingress[loc]
            ingress_counts[ing] = ingress_counts.get(ing, 0) + 1
            if best is None:
                fits_any = any(total_tokens <= r.fit_tokens for _, r in loc_cands[loc])
                STATUS[rid] = REJECTED_CAPACITY if fits_any else REJECTED_TOO_LONG
                NET[rid] = loc_rtt[loc]
                continue
            net = loc_rtt[loc] + best_bb
            if jitter:  # on each path's propagation part; never below the fixed costs
                floor = network.base_ms + (network.backbone_base_ms if best_bb else 0.0)
                net = max(floor, net + jitter_rng.gauss(0.0, jitter))
            NET[rid] = net
            REP[rid] = best.idx
            at = t + net * 0.5
            AT[rid] = at
            push(heap, (at, 0, rid, 0))
            continue
        if not heap:
            break
        t, kind, x, ver = pop_(heap)
        if kind == 0:
            r = reps[REP[x]]
            was_empty = not r.waiting
            r.waiting.append(x)
            r.pending += P[x]
            if r.kind == _IDLE:
                compose(r, t)
            elif r.kind == _SEG and was_empty and admissible(r):
                cut_segment(r, t)
            continue
        r = reps[x]
        if ver != r.ver:
            continue
        if r.kind == _SEG:
            end_segment(r, t)
        compose(r, t)

    # --- results ------------------------------------------------------------------------------
    end_ms = max([duration_s * 1000.0, *(r.t_end for r in reps)])
    pop_codes = [p.code for p in pops]
    nan = math.nan
    ok = [st == SERVED for st in STATUS]
    queue = [TS[i] - AT[i] if ok[i] else nan for i in range(n)]
    ttft = [NET[i] + TF[i] - AT[i] if ok[i] else nan for i in range(n)]
    e2e = [NET[i] + TD[i] - AT[i] if ok[i] else nan for i in range(n)]
    tpot = [(TD[i] - TF[i]) / (OUT[i] - 1) if ok[i] and OUT[i] > 1 else nan for i in range(n)]
    rep_pop = [pop_codes[r.pop] for r in reps]
    popc = [rep_pop[REP[i]] if ok[i] else "" for i in range(n)]
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
    return SimResult(
        workload=workload.name,
        kv=kv,
        cost_model=cost.describe(),
        model=cost.model_name,
        duration_s=duration_s,
        seed=seed,
        rate_multiplier=rate_multiplier,
        offered_rps=workload.arrivals.rate * rate_multiplier,
        slo=slo,
        end_ms=end_ms,
        wall_s=time.perf_counter() - started,
        pops=pops,
        skipped=skipped,
        replicas=stats,
        ingress_counts=ingress_counts,
        places={p.code: (p.lon, p.lat) for p in all_pops},
        send_ms=send,
        prompt=list(P),
        output=list(OUT),
        network_ms=NET,
        pop=popc,
        status=STATUS,
        queue_ms=queue,
        ttft_ms=ttft,
        e2e_ms=e2e,
        tpot_ms=tpot,
        preempted=PRE,
    )


def simulate_kv(
    workload: Workload,
    cost: CostModel,
    kvs: Sequence[str] = ("auto",),
    **kwargs,
) -> list[SimResult]:
    """The same workload (same seed, so the same requests) once per KV dtype."""
    return [simulate(workload, cost, kv, **kwargs) for kv in kvs]
