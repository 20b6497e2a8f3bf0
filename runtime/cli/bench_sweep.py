"""`edge bench serve --sweep` and `--compare-sim`: the runs and prints beyond a single benchmark
(runtime.bench.sweep and runtime.bench.simcompare do the work)."""

from __future__ import annotations

import argparse
import json
import sys

import msgspec

from runtime.cli.common import _fail


def _log(message: str) -> None:
    print(f"edge bench: {message}", file=sys.stderr, flush=True)


def sweep(args: argparse.Namespace, target, tenants, dataset, load, percentiles, goodput) -> int:
    from runtime.bench.serve import benchmark
    from runtime.bench.sweep import find_knee, format_sweep, plot_sweep, run_sweep

    if load.ramp is not None:
        return _fail("--sweep sets the rates itself: leave out --ramp-up-strategy")
    wanted = sorted({*percentiles, 50.0, 99.0})  # the table's and the knee's

    def run_at(rate: float):
        at = msgspec.structs.replace(load, request_rate=rate)
        outcome = benchmark(target, tenants, dataset, at, wanted, goodput, progress=not args.disable_tqdm)
        return outcome.metrics, outcome.duration_s

    try:
        points = run_sweep(run_at, args.sweep_start_rate, args.sweep_max_rate, args.sweep_max_seconds, _log)
    except ValueError as exc:
        return _fail(str(exc))
    knee = find_knee(points)
    print(format_sweep(points, knee))
    if args.plot:
        print(plot_sweep(points, knee, args.plot))
    if args.save_result:
        rows = [
            {"request_rate": pt.rate, "duration": pt.duration_s, **msgspec.to_builtins(pt.metrics)}
            for pt in points
        ]
        knee_rate = None if knee is None else points[knee].rate
        body = {"backend": target.backend, "model_id": target.model, "knee_rate": knee_rate, "sweep": rows}
        with open(args.save_result, "w") as f:
            json.dump(body, f, indent=2)
        print(f"wrote {args.save_result}", file=sys.stderr)
    return 0


def compare_sim(args: argparse.Namespace, config, dataset, outcome, rate: float, p: float) -> int:
    from edge_sim.roofline import SimulationError
    from edge_sim.topology import TopologyError
    from runtime.bench.simcompare import cost_model, replay, side_by_side, topology_for

    if dataset.workload is None or dataset.sample is None:
        return _fail(
            "--compare-sim needs a profile or workload dataset (a JSONL file has no lengths to draw)"
        )
    pops = [c.strip() for c in args.sim_pops.split(",")] if args.sim_pops else None
    if pops is None and config is not None:
        pops = config.gpu_pops or None
    try:
        cost = cost_model(args.sim_cost, args.sim_model, args.sim_profile, _log)
        sim = replay(dataset.workload, dataset.sample, outcome.times, rate, cost, topology_for(pops))
    except (SimulationError, TopologyError, ValueError) as exc:
        return _fail(f"--compare-sim: {exc}")
    print(side_by_side(outcome.metrics, outcome.duration_s, sim, p))
    return 0
