"""Reports of simulator runs: summary statistics and report.json (the terminal table is in
capacity.report_table, the PNG plots in capacity.report_plots; both are re-exported here).

Definitions (all over the arrival window [0, duration]):

* latency percentiles (TTFT, TPOT, E2E, queue) are over served requests, whenever they finished;
* throughput counts requests (and their tokens) whose answer reached the client within the
  window; goodput counts those of them that met both SLOs (TTFT and TPOT), per second;
* GPU busy fraction: time a replica was running steps over the simulated time (until the last
  request finished); KV occupancy: blocks in use over blocks, time-averaged and peak;
* cost: the GPU price per hour x GPUs x busy time ("busy") or x the whole simulated time
  ("all-in", counting idle GPUs), divided by served requests or millions of output tokens;
* prefix cache hit rate (workloads with sessions): cached prompt tokens over prompt tokens of the
  served requests, as found at each one's first admission;
* mean in flight: the time-average number of requests between send and answer, so that Little's
  law (in flight = throughput x mean latency) can be checked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from capacity.costmodel import CostModel
from capacity.report_plots import write_plots
from capacity.report_table import format_table
from capacity.simulator import REJECTED_CAPACITY, REJECTED_TOO_LONG, SERVED, SimResult, simulate
from capacity.workload import TopologySetup, Workload

__all__ = [
    "DEFAULT_MULTIPLIERS",
    "format_table",
    "load_sweep",
    "summarize",
    "write_outputs",
    "write_plots",
]

DEFAULT_MULTIPLIERS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
PCTS = (50, 90, 99)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values (NaN when empty)."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    pos = (n - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _dist(values: list[float]) -> dict[str, float]:
    vals = sorted(v for v in values if not math.isnan(v))
    out = {f"p{q}": percentile(vals, q) for q in PCTS}
    out["mean"] = sum(vals) / len(vals) if vals else math.nan
    return out


def _group(r: SimResult, idx: list[int], replicas: list, gpus: int, price_per_hour: float) -> dict[str, Any]:
    window_ms = r.duration_s * 1000.0
    span_ms = r.end_ms
    slo = r.slo
    served = [i for i in idx if r.status[i] == SERVED]
    in_window = [i for i in served if r.send_ms[i] + r.e2e_ms[i] <= window_ms]
    good = good_in_window = 0
    for i in served:
        tp = r.tpot_ms[i]
        if r.ttft_ms[i] <= slo.ttft_ms and (math.isnan(tp) or tp <= slo.tpot_ms):
            good += 1
            if r.send_ms[i] + r.e2e_ms[i] <= window_ms:
                good_in_window += 1
    out_tokens_all = sum(r.output[i] for i in served)
    busy_ms = sum(x.busy_ms for x in replicas)
    busy_cost = busy_ms / 3.6e6 * price_per_hour  # price per replica-hour
    all_in_cost = len(replicas) * span_ms / 3.6e6 * price_per_hour
    blocks = sum(x.num_blocks for x in replicas)
    seconds = r.duration_s
    cache = {}
    if r.prefix_cache:  # cached prompt tokens over prompt tokens, of the served requests
        prompt_tokens = sum(r.prompt[i] for i in served)
        cached = sum(r.cached[i] for i in served)
        cache = {
            "prefix_cache_hit_rate": cached / prompt_tokens if prompt_tokens else math.nan,
            "cached_prompt_tokens": cached,
        }
    return cache | {
        "requests": len(idx),
        "served": len(served),
        "rejected_3040": sum(1 for i in idx if r.status[i] == REJECTED_CAPACITY),
        "too_long_3006": sum(1 for i in idx if r.status[i] == REJECTED_TOO_LONG),
        "ttft_ms": _dist([r.ttft_ms[i] for i in served]),
        "tpot_ms": _dist([r.tpot_ms[i] for i in served]),
        "e2e_ms": _dist([r.e2e_ms[i] for i in served]),
        "queue_ms": _dist([r.queue_ms[i] for i in served]),
        "network_ms": _dist([r.network_ms[i] for i in served]),
        "throughput_rps": len(in_window) / seconds,
        "output_tokens_per_s": sum(r.output[i] for i in in_window) / seconds,
        "prompt_tokens_per_s": sum(r.prompt[i] for i in in_window) / seconds,
        "goodput_rps": good_in_window / seconds,
        "slo_attainment": good / len(idx) if idx else math.nan,
        "gpus": gpus,
        "replicas": len(replicas),
        "gpu_busy_fraction": busy_ms / (len(replicas) * span_ms) if replicas else math.nan,
        "kv_occupancy_mean": sum(x.kv_block_ms for x in replicas) / (blocks * span_ms)
        if blocks
        else math.nan,
        "kv_occupancy_peak": max((x.kv_peak_blocks / x.num_blocks for x in replicas), default=math.nan),
        "preemptions": sum(x.preemptions for x in replicas),
        "mean_running": sum(x.running_ms for x in replicas) / (span_ms * len(replicas))
        if replicas
        else math.nan,
        "max_running": max((x.max_running for x in replicas), default=0),
        "cost_busy_usd": busy_cost,
        "cost_all_in_usd": all_in_cost,
        "cost_per_request_usd": busy_cost / len(served) if served else math.nan,
        "cost_per_million_output_tokens_usd": busy_cost / out_tokens_all * 1e6
        if out_tokens_all
        else math.nan,
        "all_in_cost_per_request_usd": all_in_cost / len(served) if served else math.nan,
        "all_in_cost_per_million_output_tokens_usd": (
            all_in_cost / out_tokens_all * 1e6 if out_tokens_all else math.nan
        ),
    }


def summarize(r: SimResult) -> dict[str, Any]:
    """Overall and per-PoP metrics of one run (JSON-ready; NaN where a metric has no data)."""
    by_pop: dict[str, list[int]] = {p.code: [] for p in r.pops}
    for i, code in enumerate(r.pop):
        if code:
            by_pop[code].append(i)
    reps_by_pop: dict[str, list] = {p.code: [] for p in r.pops}
    for x in r.replicas:
        reps_by_pop[x.pop].append(x)
    pops = {}
    total_busy = total_all_in = 0.0
    for p in r.pops:
        g = _group(r, by_pop[p.code], reps_by_pop[p.code], p.replicas * p.gpus_per_replica, p.price_per_hour)
        g.update(gpu=p.gpu, gpus_per_replica=p.gpus_per_replica, kv_blocks_per_replica=p.num_blocks)
        pops[p.code] = g
        total_busy += g["cost_busy_usd"]
        total_all_in += g["cost_all_in_usd"]
    overall = _group(r, list(range(len(r.send_ms))), r.replicas, sum(g["gpus"] for g in pops.values()), 0.0)
    served = overall["served"]
    tokens = sum(r.output[i] for i in range(len(r.send_ms)) if r.status[i] == SERVED)
    overall.update(
        cost_busy_usd=total_busy,
        cost_all_in_usd=total_all_in,
        cost_per_request_usd=total_busy / served if served else math.nan,
        cost_per_million_output_tokens_usd=total_busy / tokens * 1e6 if tokens else math.nan,
        all_in_cost_per_request_usd=total_all_in / served if served else math.nan,
        all_in_cost_per_million_output_tokens_usd=total_all_in / tokens * 1e6 if tokens else math.nan,
        offered_rps=len(r.send_ms) / r.duration_s,
        mean_in_flight=_mean_in_flight(r),
    )
    return {
        "kv": r.kv,
        "overall": overall,
        **({"tenants": _tenants(r)} if r.tenant else {}),
        "pops": pops,
        "skipped_pops": {p.code: p.note for p in r.skipped},
        "ingress_requests": dict(sorted(r.ingress_counts.items())),
        "simulated_requests_per_wall_second": len(r.send_ms) / r.wall_s if r.wall_s > 0 else math.nan,
    }


def _tenants(r: SimResult) -> dict[str, dict[str, Any]]:
    """Per account: its requests, and its latencies over the served ones; `server_ttft_ms` is TTFT
    without the network (queue + prefill, what a PoP's own account of a request says)."""
    by: dict[str, list[int]] = {}
    for i, t in enumerate(r.tenant):
        by.setdefault(t, []).append(i)
    out = {}
    for name, idx in sorted(by.items()):
        served = [i for i in idx if r.status[i] == SERVED]
        out[name] = {
            "requests": len(idx),
            "served": len(served),
            "ttft_ms": _dist([r.ttft_ms[i] for i in served]),
            "server_ttft_ms": _dist([r.ttft_ms[i] - r.network_ms[i] for i in served]),
            "tpot_ms": _dist([r.tpot_ms[i] for i in served]),
            "queue_ms": _dist([r.queue_ms[i] for i in served]),
            "preempted": sum(r.preempted[i] for i in idx),
        }
    return out


def _mean_in_flight(r: SimResult) -> float:
    window = r.duration_s * 1000.0
    total = 0.0
    for i, s in enumerate(r.send_ms):
        if r.status[i] != SERVED:
            continue
        end = s + r.e2e_ms[i]
        total += (end if end < window else window) - s
    return total / window


# --- load sweep (the knee) --------------------------------------------------------------------


def load_sweep(
    workload: Workload,
    cost: CostModel,
    kvs: Sequence[str],
    multipliers: Sequence[float] = DEFAULT_MULTIPLIERS,
    *,
    duration_s: float,
    seed: int,
    setup: TopologySetup | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """p90 TTFT and E2E, throughput and goodput against offered load, per KV dtype, with the knee:
    the highest offered load whose p90 TTFT still meets the TTFT SLO."""
    series: dict[str, list[dict[str, float]]] = {}
    knees: dict[str, float | None] = {}
    for kv in kvs:
        points = []
        for m in multipliers:
            if progress:
                progress(f"load sweep: KV {kv}, {m:g}x")
            res = simulate(
                workload, cost, kv, duration_s=duration_s, seed=seed, setup=setup, rate_multiplier=m
            )
            s = summarize(res)["overall"]
            points.append(
                {
                    "multiplier": m,
                    "offered_rps": s["offered_rps"],
                    "p90_ttft_ms": s["ttft_ms"]["p90"],
                    "p90_e2e_ms": s["e2e_ms"]["p90"],
                    "throughput_rps": s["throughput_rps"],
                    "goodput_rps": s["goodput_rps"],
                    "rejected_3040": s["rejected_3040"],
                    "preemptions": s["preemptions"],
                }
            )
        series[kv] = points
        ok = [p["offered_rps"] for p in points if p["p90_ttft_ms"] <= workload.slo.ttft_ms]
        knees[kv] = max(ok) if ok else None
    return {
        "duration_s": duration_s,
        "multipliers": list(multipliers),
        "definition": "knee = the highest offered load whose p90 TTFT meets the TTFT SLO",
        "series": series,
        "knee_rps": knees,
    }


# --- JSON and files ---------------------------------------------------------------------------


def _clean(x: Any) -> Any:
    """NaN and infinities -> None, so the JSON is standard."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def build_report(
    results: list[SimResult], workload: Workload, knee: dict[str, Any] | None = None
) -> dict[str, Any]:
    first = results[0]
    meta = {
        "workload": workload.name,
        "workload_description": workload.describe(),
        "workload_spec": msgspec.to_builtins(workload),
        "model": first.model,
        "cost_model": first.cost_model,
        "duration_s": first.duration_s,
        "seed": first.seed,
        "slo": msgspec.to_builtins(first.slo),
        "pops": [msgspec.to_builtins(p) for p in first.pops],
        "skipped": [msgspec.to_builtins(p) for p in first.skipped],
    }
    return _clean({"meta": meta, "runs": [summarize(r) for r in results], "knee": knee})


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False)


def write_outputs(
    results: list[SimResult], report: dict[str, Any], out: str | Path, plots: bool = True
) -> list[Path]:
    """report.json and the PNG plots into `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    path.write_text(to_json(report) + "\n")
    written = [path]
    if plots:
        written += write_plots(results, report, out)
    return written
