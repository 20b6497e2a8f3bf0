"""`--compare-sim`: the capacity simulator (capacity.simulator.simulate) on the very requests the
live run sent (the same drawn prompt and output lengths, at the same send times, from the same
client location), printed beside what the live run measured.

The simulated edge is the built-in world with GPUs only at the given PoPs (by default the
config's `[edge] pops`, each with the GPUs the built-in world gives it, else one H200); its cost
model is the roofline of the full-size target (`--sim-cost roofline`, default kimi-k2 in fp8) or
our engine's profile measured on this machine (`--sim-cost profiled`, measured once into
`--sim-profile`). The live run's miniature on a CPU and a roofline-modeled H200 are different
machines: the comparison shows where load bends each, not that they agree."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from capacity.report import percentile
from capacity.simulator import SERVED, SimResult, simulate
from capacity.workload import Arrivals, TopologySetup, Workload, WorkloadSample
from edge_sim.network import NetworkModel
from edge_sim.topology import Topology
from runtime.bench.metrics import BenchmarkMetrics
from runtime.control.config_schema import INSTALLED_MODELS_DIR

DEFAULT_PROFILE = "sim-out/profile.json"
MINIATURE = INSTALLED_MODELS_DIR / "kimi-k2-mini"


def cost_model(kind: str, model: str | None, profile: str, log):
    if kind == "roofline":
        from capacity.costmodel import RooflineCostModel

        return RooflineCostModel(model or "kimi-k2")
    from capacity.profile import ProfiledCostModel

    path = Path(profile)
    existing = ProfiledCostModel.load(path) if path.is_file() else None
    if existing is None or "auto" not in existing.fits:
        log(f"profiling {model or MINIATURE} into {path} (once)")
    return ProfiledCostModel.ensure(path, Path(model) if model else MINIATURE, ["auto"], existing=existing)


def topology_for(pops: list[str] | None) -> TopologySetup:
    world = Topology.default()
    if pops:
        gpus = {code: (world.pop(code).gpus or {"H200": 1}) for code in pops}
        world = world.with_overrides(gpu_pops=gpus)
    return TopologySetup(world, NetworkModel(), {})


def replay(
    workload: Workload, sample: WorkloadSample, times: list[float], rate: float, cost, setup: TopologySetup
) -> SimResult:
    """The sample's requests sent at `times` (the live run's schedule) through the simulator."""
    replayed = msgspec.structs.replace(sample, times=list(times))
    offered = rate if math.isfinite(rate) else len(times) / max(times[-1], 1e-3) if times[-1] else 1e6
    w = msgspec.structs.replace(workload, arrivals=Arrivals(rate=max(offered, 1e-6)))
    duration = max(times[-1], 1e-3)
    return simulate(w, cost, "auto", duration_s=duration, seed=1, setup=setup, sample=replayed)


def _stats(values: list[float], p: float) -> tuple[float, float, float]:
    vals = sorted(v for v in values if not math.isnan(v))
    if not vals:
        return math.nan, math.nan, math.nan
    return sum(vals) / len(vals), percentile(vals, 50), percentile(vals, p)


def side_by_side(live: BenchmarkMetrics, live_duration_s: float, sim: SimResult, p: float = 99.0) -> str:
    served = [i for i, s in enumerate(sim.status) if s == SERVED]
    first = min(sim.send_ms) if sim.send_ms else 0.0
    span_s = max((sim.end_ms - first) / 1000.0, 1e-9)
    out_tokens = sum(sim.output[i] for i in served)
    rows = [
        ("completed", str(live.completed), str(len(served))),
        ("failed (refused)", str(live.failed), str(len(sim.status) - len(served))),
        ("duration (s)", f"{live_duration_s:.2f}", f"{span_s:.2f}"),
        ("request throughput (req/s)", f"{live.request_throughput:.2f}", f"{len(served) / span_s:.2f}"),
        ("output token throughput (tok/s)", f"{live.output_throughput:.2f}", f"{out_tokens / span_s:.2f}"),
    ]
    pw = str(int(p)) if float(p).is_integer() else str(p)
    for name, key, sim_values in (
        ("TTFT", "ttft", sim.ttft_ms),
        ("TPOT", "tpot", sim.tpot_ms),
        ("E2EL", "e2el", sim.e2e_ms),
    ):
        s = live.stats[key]
        live_p = dict(s.percentiles).get(p)
        mean, median, tail = _stats([sim_values[i] for i in served], p)
        for label, a, b in (("mean", s.mean, mean), ("median", s.median, median), (f"P{pw}", live_p, tail)):
            rows.append((f"{label} {name} (ms)", _num(a), _num(b)))
    width = max(len(r[0]) for r in rows)
    lines = [
        f"live vs simulated ({sim.cost_model}; PoPs {', '.join(p.code for p in sim.pops)})",
        f"{'':<{width}}  {'live':>12}  {'simulated':>12}",
    ]
    lines += [f"{a:<{width}}  {b:>12}  {c:>12}" for a, b, c in rows]
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"
