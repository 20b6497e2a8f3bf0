"""vLLM's serving metrics of a benchmark run, from what each request measured.

Per completed request: TTFT (first streamed text), E2EL (the whole answer), TPOT = (E2EL - TTFT) /
(output tokens - 1) for answers of more than one token, and ITL, every gap between streamed deltas.
Each is summarised as mean, median, population standard deviation and linear-interpolated
percentiles (numpy's default, as vLLM reports them), in ms; a metric nothing measured (TTFT
without streaming) is None. Goodput (DistServe's) counts the completed requests that meet every
given SLO (`ttft:MS tpot:MS e2el:MS`; a one-token answer's TPOT counts as 0), per second."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence

import msgspec

from capacity.report import percentile
from runtime.bench.clients import RequestOutput
from runtime.bench.dataset import BenchRequest

METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


class Stats(msgspec.Struct):
    mean: float | None
    median: float | None
    std: float | None
    percentiles: list[tuple[float, float | None]]


class BenchmarkMetrics(msgspec.Struct, kw_only=True):
    completed: int
    failed: int
    failures_by_code: dict[str, int]
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float | None  # None: no --goodput
    output_throughput: float
    total_token_throughput: float
    stats: dict[str, Stats]  # by metric name, in ms


def parse_goodput(items: Sequence[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 500.0, "tpot": 50.0} (ms); ValueError saying what to fix."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = math.nan
        if not sep or name not in GOODPUT_METRICS or not ms >= 0:
            raise ValueError(
                f"--goodput {item!r}: give METRIC:MS pairs with METRIC one of "
                f"{', '.join(GOODPUT_METRICS)} and MS >= 0, e.g. --goodput ttft:500 tpot:50"
            )
        out[name] = ms
    return out


def parse_list(text: str, allowed: Sequence[str] | None, flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if allowed is not None and x not in allowed]
    if not items or bad:
        raise ValueError(f"{flag} {text!r}: a comma-separated list of {', '.join(allowed or ['numbers'])}")
    return items


def parse_percentiles(text: str) -> list[float]:
    try:
        values = [float(x) for x in parse_list(text, None, "--metric-percentiles")]
    except ValueError:
        values = []
    if not values or not all(0 <= v <= 100 for v in values):
        raise ValueError(
            f"--metric-percentiles {text!r}: comma-separated numbers from 0 to 100, e.g. 50,90,99"
        )
    return values


def summarise(values_s: Sequence[float], percentiles: Sequence[float]) -> Stats:
    """Summary in ms of values measured in seconds."""
    ms = sorted(v * 1000.0 for v in values_s)
    if not ms:
        return Stats(None, None, None, [(p, None) for p in percentiles])
    return Stats(
        sum(ms) / len(ms),
        percentile(ms, 50),
        statistics.pstdev(ms),
        [(p, percentile(ms, p)) for p in percentiles],
    )


def tpot(out: RequestOutput) -> float | None:
    """Seconds per output token after the first; None without a TTFT or for one-token answers."""
    if out.ttft is None or out.output_tokens < 2:
        return None
    return (out.latency - out.ttft) / (out.output_tokens - 1)


def is_good(out: RequestOutput, slo_ms: dict[str, float]) -> bool:
    if not out.success:
        return False
    measured = {
        "ttft": out.ttft,
        "tpot": tpot(out) if out.output_tokens > 1 else 0.0,
        "e2el": out.latency,
    }
    return all(measured[k] is not None and measured[k] * 1000.0 <= v for k, v in slo_ms.items())


def calculate_metrics(
    requests: Sequence[BenchRequest],
    outputs: Sequence[RequestOutput],
    duration_s: float,
    percentiles: Sequence[float],
    goodput_ms: dict[str, float],
) -> BenchmarkMetrics:
    ok = [(req, out) for req, out in zip(requests, outputs, strict=True) if out.success]
    series: dict[str, list[float]] = {m: [] for m in METRICS}
    total_input = total_output = 0
    for req, out in ok:
        total_input += req.prompt_len if out.prompt_tokens is None else out.prompt_tokens
        total_output += out.output_tokens
        if out.ttft is not None:
            series["ttft"].append(out.ttft)
        t = tpot(out)
        if t is not None:
            series["tpot"].append(t)
        series["itl"] += out.itl
        series["e2el"].append(out.latency)
    codes = Counter(out.code or "unknown" for out in outputs if not out.success)
    dur = duration_s if duration_s > 0 else math.inf
    good = sum(is_good(out, goodput_ms) for _, out in ok) if goodput_ms else None
    return BenchmarkMetrics(
        completed=len(ok),
        failed=len(outputs) - len(ok),
        failures_by_code=dict(codes.most_common()),
        total_input=total_input,
        total_output=total_output,
        request_throughput=len(ok) / dur,
        request_goodput=None if good is None else good / dur,
        output_throughput=total_output / dur,
        total_token_throughput=(total_input + total_output) / dur,
        stats={m: summarise(series[m], percentiles) for m in METRICS},
    )
