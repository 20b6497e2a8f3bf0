"""The fleet on paper (`edge sim --fleet`, bench/fleet.py): the shipped topology with every GPU
PoP serving a full-size model in the planner's layout, for several workloads and loads.

Each GPU PoP runs as many replicas of `edge plan`'s layout (the smallest that holds the weights
plus `concurrency` sequences of `context` tokens, what `edge plan --launch` prints as a vLLM or
SGLang command) as its GPUs allow; a PoP with too few GPUs for one replica serves nothing and
says why. Replicas admit at most `concurrency` sequences (the launch's --max-num-seqs) of at most
`context` tokens (--max-model-len), with the KV blocks the rest of their memory holds.

Per (model, workload, load) it reports what `edge sim` does (TTFT and TPOT percentiles, cost per
million output tokens busy and all-in), and per PoP the knee: the first load at which that PoP's
p99 TTFT exceeds the TTFT SLO or its goodput falls below KNEE_ATTAINMENT of what it served.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from capacity.costmodel import ReplicaPlan, RooflineCostModel
from capacity.planner import DEFAULT_PREFILL_CHUNK, DEFAULT_USABLE_FRACTION, MAX_GPUS, min_layout
from capacity.report import summarize
from capacity.simulator import simulate
from capacity.workload import TopologySetup, Workload, load_workload
from edge_sim.roofline import Efficiency, RooflineModel, SimulationError
from engine.arch.architecture import Architecture

__all__ = ["FleetCostModel", "FleetReport", "FleetRow", "PopKnee", "knees", "parse_models", "run_fleet"]

DEFAULT_MODELS = ("kimi-k2:fp8", "kimi-k2:int4", "glm-4.5:fp8")
DEFAULT_WORKLOADS = ("chat", "rag", "code", "agent")
DEFAULT_LOADS = (1.0, 2.0, 5.0, 10.0)
DEFAULT_CONCURRENCY = 32
KNEE_ATTAINMENT = 0.9  # goodput under this share of a PoP's served requests is past the knee
MAX_RUNS = 256  # model variants x workloads x loads, so one command stays bounded


class FleetCostModel(RooflineCostModel):
    """RooflineCostModel with each PoP's replicas in the planner's layout for `concurrency`
    sequences of `context` tokens (not the smallest layout for one sequence)."""

    name = "roofline-fleet"

    def __init__(
        self,
        model: str | Path | Architecture,
        weights: str,
        context: int,
        concurrency: int = DEFAULT_CONCURRENCY,
        efficiency: Efficiency | None = None,
        usable_fraction: float = DEFAULT_USABLE_FRACTION,
        prices: dict[str, float] | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    ):
        for label, value in (
            ("context", context),
            ("concurrency", concurrency),
            ("prefill chunk", prefill_chunk),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SimulationError(f"fleet {label} must be a positive integer, got {value!r}")
        super().__init__(
            model, weights, efficiency, usable_fraction, concurrency, max(prefill_chunk, concurrency), prices
        )
        if context > self.model.max_context:
            raise SimulationError(
                f"fleet context {context} exceeds {self.model.name}'s {self.model.max_context}-token window"
            )
        self.context, self.concurrency = context, concurrency

    def describe(self) -> str:
        return f"{super().describe()}; planned for {self.concurrency} x {self.context:,} tokens"

    def _layout(self, gpu: str, count: int, kv: str, context: int) -> RooflineModel | None:
        return min_layout(
            self.model, gpu, self.weights, kv, self.context, self.concurrency, count,
            self.usable_fraction, self.efficiency, self.prices,
        )  # fmt: skip

    def _max_context(self, context: int) -> int:
        return self.context

    def _sequences(self, context: int) -> str:
        return f"{self.concurrency} sequences of {self.context} tokens"

    def _plan_pop(self, gpus: dict[str, int], kv: str, min_kv_tokens: int) -> ReplicaPlan:
        plan = super()._plan_pop(gpus, kv, min_kv_tokens)
        if plan.replicas < 1:  # say how many GPUs one replica needs, not only that these are too few
            name, count = plan.gpu, gpus.get(plan.gpu, 0)
            r = self._layout(name, MAX_GPUS, kv, self.context)
            if r is not None:
                plan.note = f"one replica needs {r.gpus} x {name} ({self._sequences(0)}); the PoP has {count}"
        return plan


class PopPoint(msgspec.Struct):
    served: int
    ttft_p99_ms: float
    tpot_p99_ms: float
    goodput_rps: float
    slo_attainment: float


class FleetRow(msgspec.Struct):
    model: str
    weights: str
    kv: str
    workload: str
    load: float
    offered_rps: float
    requests: int
    served: int
    refused_3040: int
    too_long_3006: int
    ttft_ms: dict[str, float]  # p50, p90, p99
    tpot_ms: dict[str, float]
    goodput_rps: float
    output_tokens_per_s: float
    cost_per_million_busy: float
    cost_per_million_all_in: float
    pops: dict[str, PopPoint]


class PopKnee(msgspec.Struct):
    model: str
    weights: str
    workload: str
    pop: str
    layout: str  # "2x8 H200": replicas x GPUs per replica
    knee_load: float | None  # the first load past the knee; None: none within the loads run
    why: str


class FleetReport(msgspec.Struct):
    duration_s: float
    seed: int
    context: int
    concurrency: int
    kv: str
    loads: list[float]
    slo: dict[str, float]
    layouts: dict[str, dict[str, str]]  # "model:weights" -> PoP -> "2x8 H200", or why it serves nothing
    rows: list[FleetRow]
    knees: list[PopKnee]


def parse_models(text: str | Sequence[str]) -> list[tuple[str, str]]:
    """ "kimi-k2:fp8,glm-4.5" -> [(model, weights)]; weights default to fp8."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in (i.strip() for i in items):
        if item:
            model, _, weights = item.partition(":")
            out.append((model.strip(), weights.strip() or "fp8"))
    if not out:
        raise SimulationError("--fleet-models: give at least one model, e.g. kimi-k2:fp8,glm-4.5:fp8")
    return list(dict.fromkeys(out))


def _point(g: dict) -> PopPoint:
    return PopPoint(
        g["served"], g["ttft_ms"]["p99"], g["tpot_ms"]["p99"], g["goodput_rps"], g["slo_attainment"]
    )


def _row(model: str, weights: str, kv: str, workload: Workload, load: float, s: dict) -> FleetRow:
    o = s["overall"]
    pick = lambda d: {k: d[k] for k in ("p50", "p90", "p99")}  # noqa: E731
    return FleetRow(
        model, weights, kv, workload.name, load, o["offered_rps"], o["requests"], o["served"],
        o["rejected_3040"], o["too_long_3006"], pick(o["ttft_ms"]), pick(o["tpot_ms"]), o["goodput_rps"],
        o["output_tokens_per_s"], o["cost_per_million_output_tokens_usd"],
        o["all_in_cost_per_million_output_tokens_usd"], {code: _point(g) for code, g in s["pops"].items()},
    )  # fmt: skip


def _past_knee(p: PopPoint, ttft_slo_ms: float) -> str:
    if p.served == 0:
        return ""
    if p.ttft_p99_ms > ttft_slo_ms:
        return f"p99 TTFT {p.ttft_p99_ms:.0f} ms > {ttft_slo_ms:g} ms"
    if not p.slo_attainment >= KNEE_ATTAINMENT:
        return f"goodput {p.slo_attainment:.0%} of requests < {KNEE_ATTAINMENT:.0%}"
    return ""


def knees(rows: list[FleetRow], layouts: dict[str, dict[str, str]], ttft_slo_ms: float) -> list[PopKnee]:
    """Per (model, workload, PoP): the first load whose p99 TTFT or goodput crosses the SLO."""
    out = []
    groups: dict[tuple[str, str, str], list[FleetRow]] = {}
    for r in rows:
        groups.setdefault((r.model, r.weights, r.workload), []).append(r)
    for (model, weights, workload), series in groups.items():
        series.sort(key=lambda r: r.load)
        pops = dict.fromkeys(code for r in series for code in r.pops)
        for code in pops:
            knee, why = None, ""
            for r in series:
                point = r.pops.get(code)
                why = _past_knee(point, ttft_slo_ms) if point else ""
                if why:
                    knee = r.load
                    break
            out.append(
                PopKnee(model, weights, workload, code, layouts[f"{model}:{weights}"][code], knee, why)
            )
    return out


def run_fleet(
    models: Sequence[tuple[str, str]] = tuple(tuple(m.split(":")) for m in DEFAULT_MODELS),
    workloads: Sequence[str | Workload] = DEFAULT_WORKLOADS,
    loads: Sequence[float] = DEFAULT_LOADS,
    *,
    duration_s: float = 60.0,
    seed: int = 1,
    kv: str = "fp8",
    context: int | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    setup: TopologySetup | None = None,
    efficiency: Efficiency | None = None,
    usable_fraction: float = DEFAULT_USABLE_FRACTION,
    progress: Callable[[str], None] | None = None,
) -> FleetReport:
    """Simulate every (model, workload, load) on the fleet; `context` defaults to the longest
    request any of the workloads can send, so that no request is refused as too long."""
    wls = [w if isinstance(w, Workload) else load_workload(w) for w in workloads]
    loads = sorted({float(x) for x in loads})
    if not wls or not loads or any(not (x > 0 and math.isfinite(x)) for x in loads):
        raise SimulationError("fleet: give at least one workload and load multipliers > 0")
    if len(models) * len(wls) * len(loads) > MAX_RUNS:
        raise SimulationError(f"fleet: at most {MAX_RUNS} runs (models x workloads x loads); ask for fewer")
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise SimulationError(f"fleet duration must be a positive number of seconds, got {duration_s!r}")
    ctx = context or max(w.max_context for w in wls)
    slo = wls[0].slo
    rows, layouts = [], {}
    for model, weights in models:
        prices = setup.prices if setup else None
        cost = FleetCostModel(model, weights, ctx, concurrency, efficiency, usable_fraction, prices)
        key = f"{cost.model_name}:{weights}"
        for w in wls:
            for load in loads:
                if progress:
                    progress(f"fleet: {key}, {w.name}, {load:g}x")
                try:
                    res = simulate(
                        w, cost, kv, duration_s=duration_s, seed=seed, setup=setup, rate_multiplier=load
                    )
                except SimulationError as exc:  # no PoP can hold one replica: say so, run the rest
                    if "no GPU PoP" not in str(exc):
                        raise
                    layouts[key] = {"-": f"none ({exc})"}
                    break
                layouts[key] = {p.code: f"{p.replicas}x{p.gpus_per_replica} {p.gpu}" for p in res.pops} | {
                    p.code: f"none ({p.note})" for p in res.skipped
                }
                rows.append(_row(cost.model_name, weights, kv, w, load, summarize(res)))
    return FleetReport(
        duration_s, seed, ctx, concurrency, kv, loads, {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        layouts, rows, knees(rows, layouts, slo.ttft_ms),
    )  # fmt: skip
