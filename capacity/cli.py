"""`edge sim` (the capacity simulator) and `edge plan` (the placement planner).

    edge sim --workload chat|rag|code|agent|two-tenant|FILE --kv auto,fp8,int4 --duration 600 --seed 1
             [--model kimi-k2|glm-4.5|DIR] [--weights fp8] [--topology FILE] [--out DIR] [--json]
             [--cost roofline|profiled] [--profile FILE] [--knee 0.25,0.5,1,2,4|none]
             [--speculative mtp:1|ngram:5 [--acceptance 0.85] [--spec-max-decoders N] [--spec-batches 1,8,64]]
    edge sim --fleet [--fleet-models kimi-k2:fp8,glm-4.5:fp8] [--fleet-workloads chat,rag,code,agent]
             [--fleet-loads 1,2,5,10] [--fleet-concurrency 32] [--kv fp8] --duration 120
    edge plan --model kimi-k2|glm-4.5|DIR --gpu H200 --weights fp8 --kv int4
              --context 131072 --concurrency 64 [--json] [--launch vllm|sglang]

`register(subparsers)` adds both to the `edge` command line; `main(argv)` runs them on their own.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

DEFAULT_OUT = "sim-out"
DEFAULT_PROFILE = "sim-out/profile.json"


def _fail(message: str) -> int:
    print(f"edge: error: {message}", file=sys.stderr)
    return 2


def _kv_list(text: str) -> list[str]:
    from edge_sim.roofline import check_kv

    kvs = [k.strip() for k in text.split(",") if k.strip()]
    if not kvs:
        raise ValueError("--kv: give at least one KV dtype, e.g. --kv auto,fp8,int4")
    for kv in kvs:
        check_kv(kv)
    return list(dict.fromkeys(kvs))


def _multipliers(text: str, flag: str = "--knee") -> list[float]:
    if text.strip().lower() in ("none", "off", ""):
        return []
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not a comma-separated list of rate multipliers") from None
    bad = [v for v in values if not v > 0]
    if bad:
        raise ValueError(f"{flag}: rate multipliers must be > 0, got {bad[0]!r}")
    return sorted(set(values))


def _speculation(args: argparse.Namespace):
    """The --speculative spec (None when off); raises SimulationError on a bad value."""
    from edge_sim.roofline import SimulationError
    from edge_sim.speculation_cost import parse_speculative

    spec = parse_speculative(args.speculative or "off", args.acceptance, args.spec_max_decoders)
    if spec is None:
        if args.acceptance is not None or args.spec_max_decoders is not None:
            raise SimulationError("--acceptance and --spec-max-decoders need --speculative mtp:K or ngram:K")
        return None
    if args.cost != "roofline":
        raise SimulationError("--speculative models a full-size target's steps: use it with --cost roofline")
    return spec


def _batches(text: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--spec-batches: {text!r} is not a comma-separated list of batch sizes") from None
    if not values or values[0] < 1:
        raise ValueError(f"--spec-batches: batch sizes must be >= 1, got {text!r}")
    return values


def _speculation_report(args, workload, setup, plain_results, kvs, spec, log) -> tuple[list[str], dict]:
    """The same workload with speculation, beside `plain_results`, and the roofline's batch table."""
    import msgspec

    from capacity.report import _clean, summarize
    from capacity.report_speculation import format_comparison, format_roofline_rows, roofline_rows
    from capacity.simulator import simulate
    from edge_sim.roofline import Efficiency

    context = workload.prompt.mean + workload.output.mean / 2  # a decoding sequence's mean context
    cost = _cost_model(args, kvs, log, spec, context)
    lines: list[str] = []
    out: dict = {"spec": msgspec.to_builtins(spec), "context_tokens": context, "runs": []}
    for kv, plain in zip(kvs, plain_results, strict=True):
        log(f"simulating {workload.name}, KV {kv}, speculative {spec.describe()}")
        with_spec = simulate(
            workload, cost, kv, duration_s=args.duration, seed=args.seed, setup=setup,
            max_queue_ms=args.max_queue_ms,
        )  # fmt: skip
        a, b = summarize(plain)["overall"], summarize(with_spec)["overall"]
        pop = plain.pops[0]
        rows, times = roofline_rows(
            cost.model, pop.gpu, pop.gpus_per_replica, args.weights, kv, spec, context,
            _batches(args.spec_batches), Efficiency(args.mfu, args.mbu), args.prices,
        )  # fmt: skip
        layout = f"{cost.model.name} on {pop.gpus_per_replica} x {pop.gpu}, {args.weights} weights, KV {kv}"
        lines += ["", format_roofline_rows(rows, times, layout, context), ""]
        lines.append(format_comparison(a, b, a["gpus"], f"{workload.name}, KV {kv}, {spec.describe()}"))
        by_code = {q.code: q.num_blocks for q in with_spec.pops}
        blocks = [(p.code, p.num_blocks, by_code.get(p.code, 0)) for p in plain.pops]
        if any(x != y for _, x, y in blocks):
            lines.append(
                "  KV blocks per replica without / with: "
                + ", ".join(f"{code} {x:,} / {y:,}" for code, x, y in blocks)
                + " (the MTP layer's weights and its own KV)"
            )
        out["runs"].append(
            {
                "kv": kv,
                "crossover_batch": times.crossover,
                "pays_again_from_batch": times.pays_again,
                "paying_batches": [list(r) for r in times.paying],
                "max_decoders": times.max_decoders,
                "expected_tokens": times.expected,
                "roofline": [{**msgspec.to_builtins(r), "speedup": r.speedup} for r in rows],
                "without": a,
                "with": b,
            }
        )
    return lines, _clean(out)


def _cost_model(args: argparse.Namespace, kvs: list[str], log, speculation=None, context: float = 2048.0):
    from capacity.costmodel import RooflineCostModel
    from capacity.profile import ProfiledCostModel
    from edge_sim.roofline import Efficiency

    if args.serving_steps and args.cost != "profiled":
        raise ValueError("--serving-steps fits the profiled cost model: add --cost profiled")
    if args.cost == "roofline":
        return RooflineCostModel(
            args.model or "kimi-k2",
            args.weights,
            Efficiency(args.mfu, args.mbu),
            args.usable_fraction,
            args.max_seqs,
            args.max_batched_tokens,
            args.prices,
            speculation,
            context,
        )
    model = Path(args.model or "models/kimi-k2-mini")
    path = Path(args.profile)
    cost = ProfiledCostModel.load(path) if path.is_file() else None
    if cost is not None and cost.model_name != model.name:
        log(f"{path} profiles {cost.model_name}, not {model.name}: profiling again")
        cost = None
    missing = [kv for kv in kvs if cost is None or kv not in cost.fits]
    if missing:
        cost = ProfiledCostModel.ensure(
            path, model, kvs, existing=cost, threads=args.profile_threads or None, log=log
        )
    cost.prices = dict(args.prices)
    if args.serving_steps:
        from capacity.serving_fit import fit_serving_steps, load_step_log

        steps = load_step_log(args.serving_steps)
        fitted = {kv: fit_serving_steps(steps, cost, kv) for kv in kvs}
        device = next(iter(fitted.values())).device
        cost = ProfiledCostModel(
            cost.model_name, device, {kv: f.fits[kv] for kv, f in fitted.items()}, cost.threads, cost.prices
        )
        log(f"step times fitted to {len(steps)} serving steps from {args.serving_steps}")
    return cost


def cmd_fleet(args: argparse.Namespace) -> int:
    """`edge sim --fleet`: every GPU PoP in the planner's layout, per model, workload and load."""
    import msgspec

    from capacity.fleet import parse_models, run_fleet
    from capacity.report import _clean, to_json
    from capacity.report_fleet import format_fleet
    from capacity.workload import load_topology
    from edge_sim.roofline import Efficiency, SimulationError
    from edge_sim.topology import TopologyError

    def log(message: str) -> None:
        if not args.quiet:
            print(f"edge sim: {message}", file=sys.stderr, flush=True)

    try:
        kv = _kv_list(args.kv or "fp8")
        if len(kv) > 1:
            raise ValueError("--fleet: give one KV dtype (--kv fp8): the launch commands have one")
        setup = load_topology(args.topology)
        setup = msgspec.structs.replace(setup, prices={**setup.prices, **_prices(args.price)})
        report = run_fleet(
            parse_models(args.fleet_models),
            [w.strip() for w in args.fleet_workloads.split(",") if w.strip()],
            _multipliers(args.fleet_loads, "--fleet-loads"),
            duration_s=args.duration,
            seed=args.seed,
            kv=kv[0],
            context=args.fleet_context,
            concurrency=args.fleet_concurrency,
            setup=setup,
            efficiency=Efficiency(args.mfu, args.mbu),
            usable_fraction=args.usable_fraction,
            progress=log,
        )
    except (SimulationError, TopologyError, ValueError) as exc:
        return _fail(str(exc))
    print(to_json(_clean(msgspec.to_builtins(report))) if args.json else format_fleet(report))
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    if args.fleet:
        if args.speculative:
            return _fail("--speculative simulates one workload: use it without --fleet")
        return cmd_fleet(args)
    from capacity.report import build_report, format_table, load_sweep, to_json, write_outputs
    from capacity.simulator import simulate
    from capacity.workload import load_topology, load_workload
    from edge_sim.roofline import SimulationError
    from edge_sim.topology import TopologyError
    from engine.errors import EngineError, ModelLoadError

    def log(message: str) -> None:
        if not args.quiet:
            print(f"edge sim: {message}", file=sys.stderr, flush=True)

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            workload = load_workload(args.workload)
            setup = load_topology(args.topology)
        for w in caught:
            print(f"edge: warning: {w.message}", file=sys.stderr)
        workload = _override(workload, args)
        kvs = _kv_list(args.kv or "auto")
        multipliers = _multipliers(args.knee)
        if not args.duration > 0:
            raise ValueError(f"--duration must be a positive number of seconds, got {args.duration!r}")
        args.prices = {**setup.prices, **_prices(args.price)}
        spec = _speculation(args)
        cost = _cost_model(args, kvs, log)
        results = []
        for kv in kvs:
            log(f"simulating {workload.name}, KV {kv}")
            results.append(
                simulate(
                    workload,
                    cost,
                    kv,
                    duration_s=args.duration,
                    seed=args.seed,
                    setup=setup,
                    max_queue_ms=args.max_queue_ms,
                )
            )
        knee = None
        if multipliers:
            knee = load_sweep(
                workload,
                cost,
                kvs,
                multipliers,
                duration_s=args.knee_duration or min(args.duration, 300.0),
                seed=args.seed,
                setup=setup,
                progress=log,
            )
        report = build_report(results, workload, knee)
        spec_lines: list[str] = []
        if spec is not None:
            spec_lines, report["speculation"] = _speculation_report(
                args, workload, setup, results, kvs, spec, log
            )
        written = write_outputs(results, report, args.out, plots=not args.no_plots)
    except (SimulationError, TopologyError, ModelLoadError, EngineError, ValueError) as exc:
        return _fail(str(exc))
    if args.json:
        print(to_json(report))
    else:
        print(format_table(report))
        for line in spec_lines:
            print(line)
        print("")
        print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _prices(items: list[str] | None) -> dict[str, float]:
    from edge_sim.roofline import gpu_type

    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--price {item!r}: use GPU=USD_PER_HOUR, e.g. --price H200=3.50")
        try:
            price = float(value)
        except ValueError:
            raise ValueError(f"--price {item!r}: {value!r} is not a number") from None
        if not price >= 0:
            raise ValueError(f"--price {item!r}: the price must be >= 0")
        out[gpu_type(name).name] = price
    return out


def _override(workload, args: argparse.Namespace):
    import msgspec

    from capacity.workload import check_workload

    changes = {}
    if args.rate is not None:
        changes["arrivals"] = msgspec.structs.replace(workload.arrivals, rate=args.rate)
    slo = workload.slo
    if args.slo_ttft_ms is not None:
        slo = msgspec.structs.replace(slo, ttft_ms=args.slo_ttft_ms)
    if args.slo_tpot_ms is not None:
        slo = msgspec.structs.replace(slo, tpot_ms=args.slo_tpot_ms)
    changes["slo"] = slo
    return check_workload(msgspec.structs.replace(workload, **changes), "command line")


def cmd_plan(args: argparse.Namespace) -> int:
    import msgspec

    from capacity.planner import format_plan, plan
    from edge_sim.roofline import Efficiency, SimulationError

    try:
        result = plan(
            args.model,
            args.gpu,
            args.weights,
            args.kv,
            args.context,
            args.concurrency,
            usable_fraction=args.usable_fraction,
            efficiency=Efficiency(args.mfu, args.mbu),
            prices=_prices(args.price),
        )
    except (SimulationError, ValueError) as exc:
        return _fail(str(exc))
    if args.launch:
        from capacity.launch_flags import format_launch, launch_command

        try:
            cmd = launch_command(
                result, args.launch, checkpoint=args.checkpoint, served_name=args.served_model_name
            )
        except SimulationError as exc:
            return _fail(str(exc))
        if args.json:
            print(
                json.dumps(
                    {"plan": msgspec.to_builtins(result), "launch": msgspec.to_builtins(cmd)}, indent=2
                )
            )
        else:
            print(format_plan(result))
            print("")
            print(format_launch(cmd))
        return 0
    if args.json:
        print(json.dumps(msgspec.to_builtins(result), indent=2))
    else:
        print(format_plan(result))
    return 0


def _add_model_args(p: argparse.ArgumentParser, default_model: str | None) -> None:
    p.add_argument(
        "--model",
        default=default_model,
        help="target model: kimi-k2, glm-4.5 or a model directory (config.json)"
        + ("" if default_model else "; default kimi-k2, or models/kimi-k2-mini with --cost profiled"),
    )
    p.add_argument("--weights", default="fp8", choices=["bf16", "fp8", "int8", "int4"], help="weight format")
    p.add_argument("--mfu", type=float, default=0.5, help="fraction of peak FLOPs reached (roofline)")
    p.add_argument("--mbu", type=float, default=0.8, help="fraction of HBM bandwidth reached (roofline)")
    p.add_argument("--usable-fraction", type=float, default=0.9, help="GPU memory usable for weights + KV")
    p.add_argument("--price", action="append", metavar="GPU=USD", help="override a GPU's price per hour")


def register(subparsers) -> None:
    """Add `sim` and `plan` to an argparse subparsers object."""
    sim = subparsers.add_parser(
        "sim",
        help="capacity simulator: latency, throughput and cost of a workload on the simulated edge",
        description="Discrete-event simulation of clients around the world sending a workload through "
        "anycast ingress and routing to GPU PoPs that batch continuously; reports latency, throughput, "
        "goodput, GPU and KV use and cost, per KV dtype.",
    )
    sim.add_argument(
        "--workload", default="chat", help="chat, rag, code, agent, two-tenant or a TOML/JSON workload file"
    )
    sim.add_argument("--kv", help="KV dtypes to compare, e.g. auto,fp8,int4 (default auto; --fleet: fp8)")
    sim.add_argument("--duration", type=float, default=600.0, help="seconds of arrivals (then drained)")
    sim.add_argument("--seed", type=int, default=1)
    sim.add_argument("--topology", help="TOML/JSON topology file (default: the built-in world)")
    sim.add_argument("--out", default=DEFAULT_OUT, help="directory for report.json and the plots")
    sim.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
    sim.add_argument("--rate", type=float, help="override the workload's arrival rate (requests/s)")
    sim.add_argument("--slo-ttft-ms", type=float, help="TTFT SLO (default from the workload: 2000)")
    sim.add_argument("--slo-tpot-ms", type=float, help="TPOT SLO (default from the workload: 100)")
    sim.add_argument("--cost", default="roofline", choices=["roofline", "profiled"], help="cost model")
    sim.add_argument(
        "--profile", default=DEFAULT_PROFILE, help="profiled cost model file (measured once, then reused)"
    )
    sim.add_argument(
        "--profile-threads", type=int, default=1, help="torch CPU threads while profiling (0: as is)"
    )
    sim.add_argument(
        "--serving-steps",
        metavar="FILE",
        help="--cost profiled: fit step times to the steps edge dev recorded (EDGE_STEP_LOG=FILE)",
    )
    _add_model_args(sim, None)
    sim.add_argument("--max-seqs", type=int, default=256, help="running sequences per replica (roofline)")
    sim.add_argument("--max-batched-tokens", type=int, default=8192, help="tokens per step (roofline)")
    sim.add_argument(
        "--max-queue-ms", type=float, help="admission limit: expected wait (default 10x TTFT SLO)"
    )
    sim.add_argument(
        "--knee",
        default="0.25,0.5,0.75,1,1.5,2,3,4",
        help="rate multipliers for the latency-against-load sweep, or 'none'",
    )
    sim.add_argument(
        "--knee-duration", type=float, help="seconds per sweep point (default min(duration, 300))"
    )
    sim.add_argument(
        "--speculative",
        help="also simulate speculative decoding: mtp, mtp:K, ngram or ngram:K (K draft tokens per step); "
        "prints with and without, and the batch where it stops paying (roofline cost model)",
    )
    sim.add_argument(
        "--acceptance",
        help="--speculative: acceptance per draft position given the ones before, one rate (0.85) or one "
        "per position (0.9,0.7); default 0.85 for mtp (DeepSeek-V3's report), 0.5 for ngram",
    )
    sim.add_argument(
        "--spec-max-decoders",
        type=int,
        help="--speculative: speculate only while at most N sequences decode (default: up to the batch "
        "where it stops paying)",
    )
    sim.add_argument(
        "--spec-batches", default="1,8,64", help="--speculative: batch sizes of the roofline table"
    )
    sim.add_argument("--no-plots", action="store_true", help="write report.json only")
    sim.add_argument(
        "--fleet", action="store_true", help="every GPU PoP in edge plan's layout: models x workloads x loads"
    )
    sim.add_argument(
        "--fleet-models", default="kimi-k2:fp8,kimi-k2:int4,glm-4.5:fp8", help="MODEL:WEIGHTS,..."
    )
    sim.add_argument("--fleet-workloads", default="chat,rag,code,agent", help="workloads, comma-separated")
    sim.add_argument("--fleet-loads", default="1,2,5,10", help="rate multipliers, comma-separated")
    sim.add_argument(
        "--fleet-context", type=int, help="tokens per sequence planned (default: the longest request)"
    )
    sim.add_argument("--fleet-concurrency", type=int, default=32, help="sequences per replica planned")
    sim.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    sim.set_defaults(func=cmd_sim)

    plan = subparsers.add_parser(
        "plan",
        help="placement planner: GPUs, parallel layout, decode speed and cost for a model",
        description="GPUs needed for weights plus KV, the parallel layout, modeled decode TPOT and "
        "throughput, and cost per million tokens (roofline model of the GPU's datasheet).",
    )
    _add_model_args(plan, "kimi-k2")
    plan.add_argument("--gpu", default="H200", help="GPU type: H100-SXM, H200, L40S, L4, A100-80G")
    plan.add_argument("--kv", default="auto", help="KV cache dtype: auto, bf16, fp8, int8, int4")
    plan.add_argument("--context", type=int, default=131072, help="tokens per sequence")
    plan.add_argument("--concurrency", type=int, default=64, help="sequences decoding together")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument(
        "--launch", choices=["vllm", "sglang"], help="also print the layout as that engine's launch command"
    )
    plan.add_argument("--checkpoint", help="--launch: the checkpoint to serve (default: the published one)")
    plan.add_argument("--served-model-name", help="--launch: the model name the upstream answers to")
    plan.set_defaults(func=cmd_plan)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edge")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
