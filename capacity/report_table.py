"""The capacity report as terminal tables: overall side by side per KV dtype, then per PoP.

Reads the dict capacity.report.build_report makes; times are in ms, costs in USD.
"""

from __future__ import annotations

import math
from typing import Any


def _ms(x: float | None) -> str:
    if x is None or math.isnan(x):  # None: NaN as the JSON report writes it (no request served)
        return "-"
    return f"{x / 1000:.2f}s" if x >= 10000 else f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _triple(d: dict[str, float]) -> str:
    """The percentiles of one distribution (its p50, p90, p99 keys, in order)."""
    return " / ".join(_ms(v) for k, v in d.items() if k.startswith("p"))


def _usd(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "-"
    if x >= 0.1 or x == 0:
        return f"${x:.2f}"
    decimals = max(2, 1 - math.floor(math.log10(x)))  # two significant digits
    return f"${x:.{decimals}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.0f}%"


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
        *(
            [("prefix cache hit rate", _pct(o["prefix_cache_hit_rate"]))]
            if "prefix_cache_hit_rate" in o
            else []
        ),
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
        if "tenants" not in s:
            continue
        lines.append("")
        lines.append(f"per account, KV {s['kv']} (server TTFT: queue + prefill, no network)")
        header = ["account", "requests", "served", "TTFT p50/p90/p99", "server TTFT p50/p90/p99", "preempted"]
        rows = [
            [name, str(t["requests"]), str(t["served"]), _triple(t["ttft_ms"]), _triple(t["server_ttft_ms"]),
             str(t["preempted"])]
            for name, t in s["tenants"].items()
        ]  # fmt: skip
        lines += _table(header, rows)
    for s in runs:
        lines.append("")
        lines.append(f"per PoP, KV {s['kv']}")
        header = [
            "PoP", "GPUs", "served", "TTFT p50/p99", "TPOT p50/p99", "E2E p50/p99", "req/s", "busy",
            "KV mean/peak", "preempt", "$/req",
        ]  # fmt: skip
        cache = "prefix_cache_hit_rate" in s["overall"]
        if cache:
            header.append("cache hit")
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
                    *([_pct(g["prefix_cache_hit_rate"])] if cache else []),
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
