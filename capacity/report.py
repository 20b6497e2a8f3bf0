"""Reports of simulator runs: summary statistics, a terminal table, JSON and PNG plots.

Definitions (all over the arrival window [0, duration]):

* latency percentiles (TTFT, TPOT, E2E, queue) are over served requests, whenever they finished;
* throughput counts requests (and their tokens) whose answer reached the client within the
  window; goodput counts those of them that met both SLOs (TTFT and TPOT), per second;
* GPU busy fraction: time a replica was running steps over the simulated time (until the last
  request finished); KV occupancy: blocks in use over blocks, time-averaged and peak;
* cost: the GPU price per hour x GPUs x busy time ("busy") or x the whole simulated time
  ("all-in", counting idle GPUs), divided by served requests or millions of output tokens;
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
    return {
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
        "pops": pops,
        "skipped_pops": {p.code: p.note for p in r.skipped},
        "ingress_requests": dict(sorted(r.ingress_counts.items())),
        "simulated_requests_per_wall_second": len(r.send_ms) / r.wall_s if r.wall_s > 0 else math.nan,
    }


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


# --- terminal table ---------------------------------------------------------------------------


def _ms(x: float) -> str:
    if math.isnan(x):
        return "-"
    return f"{x / 1000:.2f}s" if x >= 10000 else f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _triple(d: dict[str, float]) -> str:
    return " / ".join(_ms(d[f"p{q}"]) for q in PCTS)


def _usd(x: float) -> str:
    if math.isnan(x):
        return "-"
    if x >= 0.1 or x == 0:
        return f"${x:.2f}"
    decimals = max(2, 1 - math.floor(math.log10(x)))  # two significant digits
    return f"${x:.{decimals}f}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.0f}%"


def _overall_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    o = s["overall"]
    return [
        ("requests (offered req/s)", f"{o['requests']} ({o['offered_rps']:.1f}/s)"),
        ("served / refused 3040 / too long", f"{o['served']} / {o['rejected_3040']} / {o['too_long_3006']}"),
        ("TTFT p50/p90/p99 ms", _triple(o["ttft_ms"])),
        ("TPOT p50/p90/p99 ms", _triple(o["tpot_ms"])),
        ("E2E p50/p90/p99 ms", _triple(o["e2e_ms"])),
        ("queue p50/p90/p99 ms", _triple(o["queue_ms"])),
        ("network RTT p50 ms", _ms(o["network_ms"]["p50"])),
        ("throughput req/s", f"{o['throughput_rps']:.2f}"),
        ("output tokens/s", f"{o['output_tokens_per_s']:,.0f}"),
        ("goodput req/s (SLO met)", f"{o['goodput_rps']:.2f} ({_pct(o['slo_attainment'])})"),
        ("GPU busy", _pct(o["gpu_busy_fraction"])),
        ("KV occupancy mean / peak", f"{_pct(o['kv_occupancy_mean'])} / {_pct(o['kv_occupancy_peak'])}"),
        ("running seqs per replica mean / max", f"{o['mean_running']:.1f} / {o['max_running']}"),
        ("preemptions", f"{o['preemptions']}"),
        (
            "$ per request busy / all-in",
            f"{_usd(o['cost_per_request_usd'])} / {_usd(o['all_in_cost_per_request_usd'])}",
        ),
        (
            "$ per M output tokens busy / all-in",
            f"{_usd(o['cost_per_million_output_tokens_usd'])} / "
            f"{_usd(o['all_in_cost_per_million_output_tokens_usd'])}",
        ),
    ]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    fmt = lambda row: "  ".join(  # noqa: E731
        str(c).ljust(w) if i == 0 else str(c).rjust(w)
        for i, (c, w) in enumerate(zip(row, widths, strict=True))
    )
    return [fmt(header), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)]


def format_table(report: dict[str, Any]) -> str:
    """The report as terminal tables: overall side by side per KV dtype, then per PoP."""
    runs = report["runs"]
    meta = report["meta"]
    lines = [
        f"edge sim: {meta['workload_description']}",
        f"  {meta['duration_s']:g} s of arrivals, seed {meta['seed']}; cost model {meta['cost_model']}",
        f"  SLO: TTFT <= {meta['slo']['ttft_ms']:g} ms, TPOT <= {meta['slo']['tpot_ms']:g} ms",
        "  GPU PoPs: "
        + ", ".join(f"{p['code']} {p['replicas']}x{p['gpus_per_replica']} {p['gpu']}" for p in meta["pops"]),
    ]
    by_note: dict[str, list[str]] = {}
    for p in meta["skipped"]:
        by_note.setdefault(p["note"], []).append(f"{p['code']} {p['gpu_count']}x{p['gpu']}")
    for note, where in by_note.items():
        lines.append(f"  not serving: {', '.join(where)}: {note}")
    lines.append("")
    columns = [_overall_rows(s) for s in runs]
    header = ["overall", *(f"KV {s['kv']}" for s in runs)]
    rows = [[label, *(col[i][1] for col in columns)] for i, (label, _) in enumerate(columns[0])]
    lines += _table(header, rows)
    for s in runs:
        lines.append("")
        lines.append(f"per PoP, KV {s['kv']}")
        header = [
            "PoP", "GPUs", "served", "TTFT p50/p99", "TPOT p50/p99", "E2E p50/p99", "req/s", "busy",
            "KV mean/peak", "preempt", "$/req",
        ]  # fmt: skip
        rows = []
        for code, g in s["pops"].items():
            rows.append(
                [
                    code,
                    f"{g['replicas']}x{g['gpus_per_replica']} {g['gpu']}",
                    str(g["served"]),
                    f"{_ms(g['ttft_ms']['p50'])} / {_ms(g['ttft_ms']['p99'])}",
                    f"{_ms(g['tpot_ms']['p50'])} / {_ms(g['tpot_ms']['p99'])}",
                    f"{_ms(g['e2e_ms']['p50'])} / {_ms(g['e2e_ms']['p99'])}",
                    f"{g['throughput_rps']:.2f}",
                    _pct(g["gpu_busy_fraction"]),
                    f"{_pct(g['kv_occupancy_mean'])} / {_pct(g['kv_occupancy_peak'])}",
                    str(g["preemptions"]),
                    _usd(g["cost_per_request_usd"]),
                ]
            )
        lines += _table(header, rows)
    knee = report.get("knee")
    if knee:
        lines.append("")
        parts = []
        for kv, rps in knee["knee_rps"].items():
            parts.append(f"KV {kv}: {'none within the sweep' if rps is None else f'{rps:.1f} req/s'}")
        lines.append("knee (highest load with p90 TTFT within the SLO): " + "; ".join(parts))
    return "\n".join(lines)


# --- JSON and plots ---------------------------------------------------------------------------


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


def write_plots(results: list[SimResult], report: dict[str, Any], out: Path) -> list[Path]:
    """latency_cdf.png, knee.png (when the report has a load sweep) and world_map.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, field, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "e2e_ms", "end-to-end latency")):
        for r in results:
            vals = sorted(v for v in getattr(r, field) if not math.isnan(v))
            if not vals:
                continue
            n = len(vals)
            ax.plot([v / 1000 for v in vals], [(i + 1) / n for i in range(n)], label=f"KV {r.kv}")
        ax.set_xscale("log")
        ax.set_xlabel("seconds (log)")
        ax.set_ylabel("fraction of served requests")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    slo_s = results[0].slo.ttft_ms / 1000
    axes[0].axvline(slo_s, color="grey", linestyle="--", linewidth=1)
    fig.suptitle(f"{results[0].workload} on {results[0].model}: latency CDFs per KV dtype")
    fig.tight_layout()
    path = out / "latency_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    knee = report.get("knee")
    fig, ax = plt.subplots(figsize=(8, 4.8))
    if knee:
        for kv, points in knee["series"].items():
            x = [p["offered_rps"] for p in points]
            (line,) = ax.plot(
                x, [_s(p["p90_ttft_ms"]) for p in points], marker="o", label=f"p90 TTFT, KV {kv}"
            )
            ax.plot(
                x, [_s(p["p90_e2e_ms"]) for p in points], marker="s", linestyle="--", color=line.get_color(),
                label=f"p90 E2E, KV {kv}",
            )  # fmt: skip
            k = knee["knee_rps"].get(kv)
            if k is not None:
                kp = next(p for p in points if p["offered_rps"] == k)
                ax.plot([k], [_s(kp["p90_ttft_ms"])], marker="*", markersize=18, color=line.get_color())
                ax.annotate(f"knee {k:.1f} req/s", (k, _s(kp["p90_ttft_ms"])), textcoords="offset points",
                            xytext=(6, 10), fontsize=8)  # fmt: skip
        ax.axhline(results[0].slo.ttft_ms / 1000, color="grey", linestyle=":", linewidth=1, label="TTFT SLO")
    else:
        ax.text(0.5, 0.5, "no load sweep (--knee none)", ha="center", va="center", transform=ax.transAxes)
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("seconds (log)")
    ax.set_title("latency against offered load")
    ax.grid(True, which="both", alpha=0.3)
    if knee:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "knee.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    r = results[0]
    fig, ax = plt.subplots(figsize=(11, 5.5))
    run = report["runs"][0]
    ingress = run["ingress_requests"]
    ax.set_xlim(-180, 180)
    ax.set_ylim(-60, 75)
    ax.set_aspect("equal")
    ax.grid(True, alpha=0.3)
    coords = {p["code"]: (p["lon"], p["lat"]) for p in report["meta"]["pops"]}
    places = r.places
    biggest_in = max(ingress.values(), default=1)
    for code, count in ingress.items():
        if code in coords or code not in places:
            continue
        lon, lat = places[code]
        ax.scatter([lon], [lat], s=10 + 300 * count / biggest_in, color="tab:blue", alpha=0.35)
    served = {code: g["served"] for code, g in run["pops"].items()}
    biggest = max(served.values(), default=1) or 1
    for code, (lon, lat) in coords.items():
        n = served.get(code, 0)
        ax.scatter([lon], [lat], s=40 + 1500 * n / biggest, color="tab:red", alpha=0.6, edgecolors="black")
        ax.annotate(f"{code} {n}", (lon, lat), textcoords="offset points", xytext=(5, 5), fontsize=8)
    for p in r.skipped:
        ax.scatter([p.lon], [p.lat], s=30, marker="x", color="grey")
    ax.set_xlabel("longitude")
    ax.set_ylabel("latitude")
    ax.set_title(
        f"GPU PoPs sized by requests served (red), ingress PoPs by requests received (blue); KV {r.kv}",
        fontsize=10,
    )
    fig.tight_layout()
    path = out / "world_map.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def _s(ms: float | None) -> float:
    return math.nan if ms is None else ms / 1000


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
