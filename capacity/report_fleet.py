"""The fleet report (capacity.fleet.FleetReport) as Markdown tables: one row per model, workload
and load, then the knee per PoP, then where each model is served and why not elsewhere."""

from __future__ import annotations

from capacity.fleet import FleetReport
from capacity.report_table import _ms, _usd


def _triple(d: dict[str, float]) -> str:
    return " / ".join(_ms(d[k]) for k in ("p50", "p90", "p99"))


def _load(x: float) -> str:
    return f"{x:g}x"


def _md(header: list[str], rows: list[list[str]]) -> list[str]:
    right = ["---" if i == 0 else "---:" for i in range(len(header))]
    return ["| " + " | ".join(r) + " |" for r in (header, right, *rows)]


def format_fleet(r: FleetReport) -> str:
    """Latency, cost and knee tables of a fleet run."""
    lines = [
        f"fleet: {r.duration_s:g} s of arrivals per run, seed {r.seed}; every replica planned for "
        f"{r.concurrency} x {r.context:,} tokens, KV {r.kv}; SLO TTFT <= {r.slo['ttft_ms']:g} ms, "
        f"TPOT <= {r.slo['tpot_ms']:g} ms",
        "",
    ]
    header = [
        "model", "workload", "load", "req/s", "served / 3040 / 3006", "TTFT p50 / p90 / p99 ms",
        "TPOT p50 / p90 / p99 ms", "goodput req/s", "$/M out busy / all-in",
    ]  # fmt: skip
    rows = [
        [
            f"{x.model} {x.weights}",
            x.workload,
            _load(x.load),
            f"{x.offered_rps:.1f}",
            f"{x.served} / {x.refused_3040} / {x.too_long_3006}",
            _triple(x.ttft_ms),
            _triple(x.tpot_ms),
            f"{x.goodput_rps:.2f}",
            f"{_usd(x.cost_per_million_busy)} / {_usd(x.cost_per_million_all_in)}",
        ]  # fmt: skip
        for x in r.rows
    ]
    lines += _md(header, rows)
    lines += ["", "knee per PoP: the first load at which its p99 TTFT or goodput crosses the SLO", ""]
    groups: dict[tuple[str, str], dict[str, str]] = {}
    for k in r.knees:
        cell = f"> {_load(r.loads[-1])}" if k.knee_load is None else _load(k.knee_load)
        groups.setdefault((f"{k.model} {k.weights}", k.workload), {})[f"{k.pop} {k.layout}"] = cell
    by_model: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for (model, workload), cells in groups.items():
        by_model.setdefault(model, []).append((workload, cells))
    for model, series in by_model.items():
        pops = list(dict.fromkeys(p for _, cells in series for p in cells))
        lines += _md([model, *pops], [[w, *(cells.get(p, "-") for p in pops)] for w, cells in series])
        lines.append("")
    lines.append("not serving:")
    for key, pops in r.layouts.items():
        missing = {code: why for code, why in pops.items() if why.startswith("none")}
        for why in dict.fromkeys(missing.values()):
            where = ", ".join(c for c, w in missing.items() if w == why)
            lines.append(f"- {key}: {where}: {why[len('none (') : -1]}")
    return "\n".join(lines)
