"""PNG plots of simulator runs: latency CDFs per KV dtype, the load sweep's knee, a world map.

matplotlib is imported only when plots are written, so the rest of the planner runs without it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from capacity.simulator import SimResult


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
