"""`edge bench serve`: a load generator against a running runtime with `vllm bench serve`'s flags
and metric names (runtime.bench does the work; this module reads the flags and prints).

    edge bench serve --backend workers-ai|openai-chat|worker [--base-url URL] [--model NAME]
        [--dataset chat|rag|code|agent|FILE] [--num-prompts N] [--request-rate R] [--burstiness B]
        [--max-concurrency N] [--ramp-up-strategy linear|exponential --ramp-up-start-rps A
        --ramp-up-end-rps B] [--goodput ttft:MS tpot:MS e2el:MS] [--percentile-metrics ttft,...]
        [--metric-percentiles 50,90,99] [--tenants N --admin-token T | --api-keys a,b,c]
        [--save-result FILE] [--sweep [--plot FILE.png]] [--compare-sim]
        [--compare kv=auto,int8,int4 | --compare weights=bf16,fp8,int8,int4]

It exits 0 with a report whenever the runtime answered, failures included (they are counted by
code); 2 when it cannot start (bad flags, no token, no runtime to create tenants on)."""

from __future__ import annotations

import argparse
import math
import sys

from runtime.cli.common import _fail
from runtime.control.config import ConfigError

DEFAULT_URL = "http://127.0.0.1:8787"


def _config(path: str | None):
    from runtime.control.config import load_config

    try:
        return load_config(path)
    except ConfigError:
        if path is not None:
            raise
        return None  # no project here: the shipped catalog, no saved token


def default_model(config) -> str:
    """The first model the config serves (`[edge] models`, else the catalog's first entry)."""
    from runtime.ai.catalog import load_catalog
    from runtime.control.config import INSTALLED_MODELS_DIR

    if config is not None and config.edge.models:
        return config.edge.models[0]
    catalog = load_catalog(config.models_dir if config is not None else INSTALLED_MODELS_DIR)
    return next(iter(catalog))


def _tenants(args: argparse.Namespace, config):
    from runtime.bench.clients import Tenant
    from runtime.bench.tenants import create_tenants, default_tenant, parse_api_keys

    account = args.account or (config.account_id if config is not None else "local")
    if args.api_keys:
        return parse_api_keys(args.api_keys, account)
    if args.tenants is not None:
        if not args.admin_token:
            raise ConfigError("--tenants N makes N accounts: give --admin-token (else use --api-keys a,b,c)")
        settings = {k: v for k, v in (("rpm", args.tenant_rpm), ("tpm", args.tenant_tpm)) if v is not None}
        return create_tenants(args.base_url.rstrip("/"), args.admin_token, args.tenants, settings)
    try:
        return [default_tenant(args.api_key, args.account, args.config)]
    except ConfigError:
        if args.backend == "worker":
            return [Tenant(account, "")]  # a worker route needs no API token
        raise


def _setup(args: argparse.Namespace):
    """Everything a run needs, checked before any request is sent."""
    from runtime.bench.clients import Target
    from runtime.bench.dataset import load_dataset
    from runtime.bench.load import Ramp, check_load
    from runtime.bench.metrics import METRICS, parse_goodput, parse_list, parse_percentiles
    from runtime.bench.serve import Load

    config = _config(args.config)
    ramp = None
    if args.ramp_up_strategy:
        if args.ramp_up_start_rps is None or args.ramp_up_end_rps is None:
            raise ValueError("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps")
        if not math.isinf(args.request_rate):
            raise ValueError("with --ramp-up-strategy the ramp sets the rate: leave out --request-rate")
        ramp = Ramp(args.ramp_up_strategy, args.ramp_up_start_rps, args.ramp_up_end_rps)
    check_load(args.request_rate, args.burstiness, ramp)
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be at least 1, got {args.max_concurrency}")
    streamed = not args.no_stream and args.backend != "worker"
    default_metrics = "ttft,tpot,itl,e2el" if streamed else "e2el"  # the others need a stream
    metrics = parse_list(args.percentile_metrics or default_metrics, METRICS, "--percentile-metrics")
    percentiles = parse_percentiles(args.metric_percentiles)
    goodput = parse_goodput(args.goodput)
    if not streamed and {"ttft", "tpot"} & set(goodput):
        raise ValueError(
            "--goodput ttft/tpot need streamed answers: drop them, or stream (leave out --no-stream)"
        )
    target = Target(
        backend=args.backend,
        base_url=args.base_url.rstrip("/"),
        model=args.model or default_model(config),
        stream=not args.no_stream,
        url=args.url,
        method=args.method,
        temperature=args.temperature,
        location=args.client_location,
    )
    location = args.client_location or (config.edge.client_location if config is not None else "Seoul")
    dataset = load_dataset(args.dataset, args.num_prompts, args.seed, args.max_context, location)
    load = Load(
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        ramp=ramp,
        max_concurrency=args.max_concurrency,
        seed=args.seed,
    )
    tenants = [] if args.compare else _tenants(args, config)  # --compare uses its own edge dev's
    return config, target, tenants, dataset, load, metrics, percentiles, goodput


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from edge_sim.roofline import SimulationError

    try:
        config, target, tenants, dataset, load, metrics, percentiles, goodput = _setup(args)
    except (ConfigError, SimulationError, ValueError) as exc:
        return _fail(str(exc))
    if args.compare:
        from runtime.cli.bench_compare import run_compare

        return run_compare(args, config, target, dataset, load, percentiles, goodput)
    print(
        f"edge bench serve: {target.backend} at {target.base_url}, model {target.model}, dataset "
        f"{dataset.name}, {len(dataset.requests)} prompts, {len(tenants)} tenant(s)",
        file=sys.stderr,
    )
    if args.sweep:
        from runtime.cli.bench_sweep import sweep

        return sweep(args, target, tenants, dataset, load, percentiles, goodput)
    from runtime.bench.report import format_result, result_json, save_result
    from runtime.bench.serve import benchmark, describe_load

    print("\n".join(describe_load(load)))
    outcome = benchmark(target, tenants, dataset, load, percentiles, goodput, not args.disable_tqdm)
    m = outcome.metrics
    print(format_result(m, outcome.duration_s, metrics, load.request_rate, load.max_concurrency))
    if args.compare_sim:
        from runtime.cli.bench_sweep import compare_sim

        code = compare_sim(args, config, dataset, outcome, load.request_rate, max(percentiles))
        if code:
            return code
    if args.save_result:
        setup = {
            "backend": target.backend,
            "model_id": target.model,
            "num_prompts": len(dataset.requests),
            "request_rate": load.request_rate,
            "burstiness": load.burstiness,
            "max_concurrency": load.max_concurrency,
            "dataset": dataset.name,
            "tenants": [t.account for t in tenants],
            "goodput_slo_ms": goodput or None,
        }
        if load.ramp is not None:
            setup.update(
                ramp_up_strategy=load.ramp.strategy,
                ramp_up_start_rps=load.ramp.start_rps,
                ramp_up_end_rps=load.ramp.end_rps,
            )
        result = result_json(m, outcome.outputs, outcome.duration_s, metrics, setup, args.save_detailed)
        save_result(args.save_result, result)
        print(f"wrote {args.save_result}", file=sys.stderr)
    return 0


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of requests per second, or inf") from None
    return value


def add_bench_parser(sub) -> None:
    """edge bench serve."""
    from runtime.bench.clients import BACKENDS

    bench = sub.add_parser(
        "bench", help="benchmark a running runtime (edge bench serve, as vllm bench serve)"
    )
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    p = bench_sub.add_parser(
        "serve",
        help="a load generator with vllm bench serve's flags and metrics",
        description="Send a dataset to a running runtime on a schedule (Poisson or gamma arrivals, "
        "a concurrency limit) and report vLLM's serving metrics: throughput, goodput, TTFT, TPOT, ITL "
        "and E2EL. Exits 0 with a report whenever the runtime answered, failures counted by code.",
    )
    target = p.add_argument_group("target")
    target.add_argument("--backend", default="workers-ai", choices=BACKENDS, help="API to load")
    target.add_argument("--base-url", default=DEFAULT_URL, help="the running runtime")
    target.add_argument("--url", help="worker backend: the worker route (default: BASE_URL/)")
    target.add_argument(
        "--method", default="GET", choices=["GET", "POST"], help="worker backend (POST sends the prompt)"
    )
    target.add_argument(
        "--model", help="model name (default: the config's first served model, else the catalog's first)"
    )
    target.add_argument(
        "--no-stream", action="store_true", help="ask for whole answers (no TTFT, TPOT or ITL)"
    )
    target.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (0: greedy, as vLLM)"
    )
    target.add_argument("--client-location", help="sent as x-edge-client-location (default: the runtime's)")
    target.add_argument("--config", default=None, help="project config: its token, account and models")
    auth = p.add_argument_group("tenants")
    auth.add_argument("--api-key", help="API token (default: $EDGE_API_TOKEN, else .edge/api-token)")
    auth.add_argument("--account", help="the account --api-key acts for (default: the config's)")
    auth.add_argument(
        "--api-keys", help="spread requests over these tokens: a,b,c (each TOKEN or ACCOUNT=TOKEN)"
    )
    auth.add_argument("--tenants", type=int, help="spread requests over N new accounts (needs --admin-token)")
    auth.add_argument("--admin-token", help="the runtime's admin token, to create --tenants")
    auth.add_argument("--tenant-rpm", type=int, help="--tenants: each account's requests per minute")
    auth.add_argument("--tenant-tpm", type=int, help="--tenants: each account's tokens per minute")
    data = p.add_argument_group("dataset")
    data.add_argument(
        "--dataset", default="chat", help="chat, rag, code, agent, a workload TOML/JSON or a JSONL"
    )
    data.add_argument("--num-prompts", type=int, default=200, help="requests to send")
    data.add_argument("--max-context", type=int, default=4096, help="clip prompt + output to this (0: never)")
    data.add_argument("--seed", type=int, default=0, help="seeds the dataset and the arrivals")
    load = p.add_argument_group("load")
    load.add_argument(
        "--request-rate", type=_rate, default=math.inf, help="req/s, Poisson (inf: all at once)"
    )
    load.add_argument("--burstiness", type=_rate, default=1.0, help="gamma shape of the gaps (1: Poisson)")
    load.add_argument("--max-concurrency", type=int, help="most requests in flight")
    load.add_argument("--ramp-up-strategy", choices=["linear", "exponential"], help="ramp the rate up")
    load.add_argument("--ramp-up-start-rps", type=float, help="the ramp's first rate")
    load.add_argument("--ramp-up-end-rps", type=float, help="the ramp's last rate")
    out = p.add_argument_group("results")
    out.add_argument(
        "--goodput", nargs="+", metavar="METRIC:MS", help="SLOs for goodput, e.g. ttft:500 tpot:50"
    )
    out.add_argument(
        "--percentile-metrics", help="of ttft,tpot,itl,e2el (default: all four; e2el unstreamed)"
    )
    out.add_argument("--metric-percentiles", default="99", help="percentiles to report, e.g. 50,90,99")
    out.add_argument("--save-result", metavar="FILE", help="write the result as JSON (vLLM's key names)")
    out.add_argument("--save-detailed", action="store_true", help="with per-request lists in the result")
    out.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    sw = p.add_argument_group("sweep and simulator")
    sw.add_argument("--sweep", action="store_true", help="rates from light to past the knee, one row each")
    sw.add_argument("--sweep-start-rate", type=float, default=1.0, help="the sweep's first rate (req/s)")
    sw.add_argument("--sweep-max-rate", type=float, default=64.0, help="the sweep's highest rate (req/s)")
    sw.add_argument("--sweep-max-seconds", type=float, default=600.0, help="stop sweeping after this long")
    sw.add_argument("--plot", metavar="FILE.png", help="--sweep: draw latency against load")
    sw.add_argument(
        "--compare-sim", action="store_true", help="also simulate the same requests, side by side"
    )
    sw.add_argument(
        "--compare",
        metavar="AXIS=A,B,...",
        help="kv=auto,int8,int4 or weights=bf16,fp8,int8,int4: the same workload against each setting "
        "(starts its own edge dev)",
    )
    sw.add_argument(
        "--compare-eval-windows", type=int, default=4, help="--compare: held-out windows scored per context"
    )
    sw.add_argument("--compare-no-eval", action="store_true", help="--compare: skip the perplexity change")
    sw.add_argument(
        "--sim-cost", default="roofline", choices=["roofline", "profiled"], help="simulator cost model"
    )
    sw.add_argument("--sim-model", help="roofline: kimi-k2 (default) or glm-4.5; profiled: a model folder")
    sw.add_argument("--sim-profile", default="sim-out/profile.json", help="profiled: the profile file")
    sw.add_argument("--sim-pops", help="GPU PoPs to simulate, e.g. ICN (default: the config's [edge] pops)")
    p.set_defaults(func=cmd_bench_serve)
