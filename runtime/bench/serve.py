"""One benchmark run: the dataset sent on its schedule, then vLLM's metrics of what came back."""

from __future__ import annotations

import asyncio
import math

import msgspec

from runtime.bench.clients import RequestOutput, Target, Tenant
from runtime.bench.dataset import Dataset
from runtime.bench.load import Ramp, request_rates, send_times
from runtime.bench.metrics import BenchmarkMetrics, calculate_metrics
from runtime.bench.runner import run_requests


class Load(msgspec.Struct, kw_only=True):
    request_rate: float = math.inf
    burstiness: float = 1.0
    ramp: Ramp | None = None
    max_concurrency: int | None = None
    seed: int = 0


class Outcome(msgspec.Struct):
    metrics: BenchmarkMetrics
    outputs: list[RequestOutput]
    duration_s: float
    times: list[float]  # when each request was scheduled to be sent (s from the start)


def benchmark(
    target: Target,
    tenants: list[Tenant],
    dataset: Dataset,
    load: Load,
    percentiles: list[float],
    goodput_ms: dict[str, float],
    progress: bool = True,
) -> Outcome:
    n = len(dataset.requests)
    times = send_times(n, load.request_rate, load.burstiness, load.seed, load.ramp)
    rates = request_rates(n, load.request_rate, load.ramp)
    run = asyncio.run(
        run_requests(target, tenants, dataset.requests, times, rates, load.max_concurrency, progress)
    )
    metrics = calculate_metrics(dataset.requests, run.outputs, run.duration_s, percentiles, goodput_ms)
    return Outcome(metrics, run.outputs, run.duration_s, times)


def describe_load(load: Load) -> list[str]:
    """vLLM's lines before a run: the traffic, its burstiness and the concurrency limit."""
    if load.ramp is not None:
        r = load.ramp
        traffic = f"Traffic ramp-up strategy: {r.strategy}, {r.start_rps:g} to {r.end_rps:g} RPS"
    else:
        traffic = f"Traffic request rate: {load.request_rate:g}"
    kind = "Poisson process" if load.burstiness == 1.0 else "Gamma distribution"
    return [
        traffic,
        f"Burstiness factor: {load.burstiness:g} ({kind})",
        f"Maximum request concurrency: {load.max_concurrency}",
    ]
