"""`--sweep`: the same seeded dataset at rates from light to past the knee, one row per rate, and
the latency-against-load plot.

Rates start at `--sweep-start-rate` and double until one of: the next rate would pass
`--sweep-max-rate`; the sweep has run `--sweep-max-seconds`; a rate had failures; or throughput
(goodput when `--goodput` is given) stopped growing, less than 5% above the best so far. The
point that stopped it is kept: it is the first past the knee.

The knee, the rollback signal "latency grows non-linearly with load": the first rate whose P99
E2EL is more than KNEE_LATENCY_RATIO (2x) the lightest rate's while its request throughput is
less than KNEE_THROUGHPUT_GAIN (10%) above the previous rate's, i.e. more load bought latency
and no more served requests. None when no swept rate qualifies."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from runtime.bench.metrics import BenchmarkMetrics

KNEE_LATENCY_RATIO = 2.0
KNEE_THROUGHPUT_GAIN = 1.10
GROWTH = 1.05  # throughput (or goodput) must beat the best so far by this to keep sweeping


class SweepPoint(msgspec.Struct):
    rate: float
    metrics: BenchmarkMetrics
    duration_s: float


def _p(metrics: BenchmarkMetrics, name: str, p: float) -> float | None:
    return dict(metrics.stats[name].percentiles).get(p)


def served(m: BenchmarkMetrics) -> float:
    return m.request_goodput if m.request_goodput is not None else m.request_throughput


def find_knee(points: list[SweepPoint]) -> int | None:
    """Index of the knee (see the module docstring), or None."""
    if not points:
        return None
    base = _p(points[0].metrics, "e2el", 99.0)
    if base is None or base <= 0:
        return None
    for i in range(1, len(points)):
        p99 = _p(points[i].metrics, "e2el", 99.0)
        gain = points[i].metrics.request_throughput / max(points[i - 1].metrics.request_throughput, 1e-12)
        if p99 is not None and p99 > KNEE_LATENCY_RATIO * base and gain < KNEE_THROUGHPUT_GAIN:
            return i
    return None


def run_sweep(
    run_at: Callable[[float], tuple[BenchmarkMetrics, float]],
    start_rate: float,
    max_rate: float,
    max_seconds: float,
    log: Callable[[str], None],
) -> list[SweepPoint]:
    """`run_at(rate)` -> (metrics, duration) for each rate, doubling, until a stop (module docstring)."""
    if not (start_rate > 0 and max_rate >= start_rate):
        raise ValueError("--sweep needs 0 < --sweep-start-rate <= --sweep-max-rate (finite rates)")
    points: list[SweepPoint] = []
    began, rate, best = time.monotonic(), start_rate, 0.0
    while rate <= max_rate:
        log(f"sweep: {rate:g} req/s")
        metrics, duration = run_at(rate)
        points.append(SweepPoint(rate, metrics, duration))
        if metrics.failed:
            log(f"sweep: stopped at {rate:g} req/s: {metrics.failed} request(s) failed")
            break
        if points[:-1] and served(metrics) < GROWTH * best:
            log(f"sweep: stopped at {rate:g} req/s: throughput stopped growing")
            break
        best = max(best, served(metrics))
        if time.monotonic() - began >= max_seconds:
            log(f"sweep: stopped at {rate:g} req/s: --sweep-max-seconds reached")
            break
        rate *= 2
    return points


def format_sweep(points: list[SweepPoint], knee: int | None) -> str:
    header = (
        "rate (req/s)", "completed", "failed", "req/s", "goodput", "out tok/s",
        "P50 TTFT", "P99 TTFT", "P50 E2EL", "P99 E2EL",
    )  # fmt: skip
    rows = [header]
    for i, pt in enumerate(points):
        m = pt.metrics
        rows.append(
            (
                f"{pt.rate:g}" + (" <- knee" if i == knee else ""),
                str(m.completed),
                str(m.failed),
                f"{m.request_throughput:.2f}",
                "-" if m.request_goodput is None else f"{m.request_goodput:.2f}",
                f"{m.output_throughput:.1f}",
                *(
                    _ms(_p(m, name, p))
                    for name, p in (("ttft", 50.0), ("ttft", 99.0), ("e2el", 50.0), ("e2el", 99.0))
                ),
            )  # fmt: skip
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.append("(latencies in ms)")
    if knee is None:
        lines.append("knee: none within the swept rates (P99 E2EL never doubled while throughput stalled)")
    else:
        lines.append(
            f"knee: {points[knee].rate:g} req/s (P99 E2EL > {KNEE_LATENCY_RATIO:g}x the lightest rate's)"
        )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def plot_sweep(points: list[SweepPoint], knee: int | None, path: str) -> str:
    """The latency-against-load PNG; returns what was written (or why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return f"--plot {path}: matplotlib is not installed (pip install matplotlib); no plot drawn"
    rates = [pt.rate for pt in points]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, p, style in (("e2el", 50.0, "-o"), ("e2el", 99.0, "-s"), ("ttft", 99.0, "--^")):
        ys = [_p(pt.metrics, name, p) for pt in points]
        ax.plot(rates, [float("nan") if y is None else y for y in ys], style, label=f"P{p:g} {name.upper()}")
    if knee is not None:
        ax.axvline(points[knee].rate, color="red", linestyle=":", label=f"knee ({points[knee].rate:g} req/s)")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.set_xlabel("offered load (req/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("latency against load")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"
