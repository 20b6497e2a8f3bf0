"""`edge models rollout NEW --baseline OLD --canary 10`: a canary with automatic rollback.

    edge models rollout NEW --baseline OLD [--model NAME] [--canary PCT] [--max-ppl-increase 1%]
        [--at-contexts 2048,8192] [--max-p99-ttft-ratio 1.5] [--request-rates 2,8] [--url URL]

1. NEW is verified (its signed manifest) and compared with OLD on held-out text at each context
   length the model's window allows (the shared gate, runtime.cli.model_gate).
2. The running runtime serves NEW to PCT percent of session keys (runtime.control.rollout) while this
   command drives load itself (runtime.bench: one request per session key, at each rate of
   --request-rates), and compares the canary's latency with the baseline's under the same load.
3. The seeds' rollback signals are the defaults: perplexity past --max-ppl-increase at a context
   length; latency that grows non-linearly with load on the canary and not on the baseline
   (runtime.bench.sweep.find_knee); and a P99 TTFT over --max-p99-ttft-ratio times the baseline's,
   or canary failures. Any of them rolls back, else NEW is promoted; the runtime records it in the
   tail and /metrics, and this command in the model's history (promotions.jsonl beside NEW).
Exit 0 when promoted, 1 when rolled back or refused, 2 when it cannot start."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.cli.common import CONFIG_HELP, _fail
from runtime.control.config import ConfigError


class Arm:
    """One side of the split at one rate: its requests and outputs."""

    def __init__(self) -> None:
        self.requests: list = []
        self.outputs: list = []


def split(requests, outputs, canary: str) -> tuple[Arm, Arm]:
    """(baseline, canary) by which model served each answer (a failure: by its session's side)."""
    base, cand = Arm(), Arm()
    for req, out in zip(requests, outputs, strict=True):
        arm = cand if out.served_by == canary else base
        arm.requests.append(req)
        arm.outputs.append(out)
    return base, cand


def latency_reasons(base_points, cand_points, max_ratio: float) -> list[str]:
    """The latency rollback signals (see the module docstring) from each side's sweep points."""
    from runtime.bench.sweep import _p, find_knee

    reasons = []
    kb, kc = find_knee(base_points), find_knee(cand_points)
    if kc is not None and (kb is None or kc < kb):
        reasons.append(f"canary latency grows non-linearly with load from {cand_points[kc].rate:g} req/s")
    last_b, last_c = base_points[-1].metrics, cand_points[-1].metrics
    pb, pc = _p(last_b, "ttft", 99.0), _p(last_c, "ttft", 99.0)
    if pb and pc and pc > max_ratio * pb:
        reasons.append(
            f"canary P99 TTFT {pc:.1f} ms is {pc / pb:.2f}x the baseline's {pb:.1f} ms (> {max_ratio:g}x)"
        )
    failed = sum(p.metrics.failed for p in cand_points)
    if failed > sum(p.metrics.failed for p in base_points):
        reasons.append(f"{failed} canary request(s) failed")
    return reasons


def cmd_models_rollout(args: argparse.Namespace) -> int:
    import httpx
    import msgspec

    from engine.errors import EngineError
    from runtime.bench.clients import Target
    from runtime.bench.dataset import load_dataset
    from runtime.bench.metrics import calculate_metrics
    from runtime.bench.serve import Load, benchmark
    from runtime.bench.sweep import SweepPoint, _p
    from runtime.bench.tenants import default_tenant
    from runtime.cli.bench import _config, default_model
    from runtime.cli.client import admin_headers
    from runtime.cli.model_gate import print_quality, quality_gate
    from runtime.control.rollout import append_history, canary_name, history_path

    new, old = Path(args.new).resolve(), Path(args.baseline).resolve()
    try:
        limit = float(args.max_ppl_increase.rstrip("%"))
        asked = [int(c) for c in args.at_contexts.split(",") if c.strip()]
        rates = [float(r) for r in args.request_rates.split(",") if r.strip()]
        config = _config(args.config)
        model = args.model or default_model(config)
        tenant = default_tenant(args.api_key, args.account, args.config)
        headers = admin_headers(args.config)
    except ValueError:
        return _fail("--max-ppl-increase takes a percentage (1%), --at-contexts and --request-rates numbers")
    except ConfigError as exc:
        return _fail(str(exc))
    window = _window(old)
    contexts = [c for c in asked if c <= window]
    for c in sorted(set(asked) - set(contexts)):
        print(f"--at-contexts {c}: past the model's {window}-token window, not evaluated", file=sys.stderr)
    history = history_path(new, args.record)
    record = {
        "kind": "rollout",
        "model": model,
        "new": str(new),
        "baseline": str(old),
        "canary_pct": args.canary,
    }
    try:
        gate = quality_gate(new, old, contexts, limit, 0.0, args.pubkey or None, args.allow_unsigned_baseline,
                            args.text, args.max_windows)  # fmt: skip
    except EngineError as exc:
        append_history(history, {**record, "promoted": False, "reasons": [f"refused: {exc}"]})
        print(f"REFUSED {new}: {exc}", file=sys.stderr)
        return 1
    print_quality(gate)
    base_url = args.url.rstrip("/")
    try:
        r = httpx.post(base_url + "/cdn-cgi/edge/models/rollout", headers=headers, timeout=600,
                       json={"model": model, "new": str(new), "share": args.canary})  # fmt: skip
    except httpx.HTTPError as exc:
        return _fail(f"cannot reach the runtime at {base_url} ({exc}); is edge dev running?")
    if r.status_code != 200:
        print(f"REFUSED {new}: the runtime would not start the canary: {r.text[:400]}", file=sys.stderr)
        return 1
    print(f"canary: {args.canary:g}% of sessions to {new} ({r.json()['canary']})")
    target = Target(backend="workers-ai", base_url=base_url, model=model, stream=True)
    base_points, cand_points = [], []
    for rate in rates:
        data = load_dataset(args.dataset, args.num_prompts, args.seed, args.max_context, "Seoul")
        requests = [q._replace(session=f"rollout-{args.seed}-{i}") for i, q in enumerate(data.requests)]
        data = data._replace(requests=requests)
        load = Load(request_rate=rate, max_concurrency=args.max_concurrency, seed=args.seed)
        outcome = benchmark(target, [tenant], data, load, [50.0, 99.0], {}, False)
        base, cand = split(requests, outcome.outputs, canary_name(model))
        for arm, points in ((base, base_points), (cand, cand_points)):
            m = calculate_metrics(arm.requests, arm.outputs, outcome.duration_s, [50.0, 99.0], {})
            points.append(SweepPoint(rate, m, outcome.duration_s))
        print(
            f"load {rate:g} req/s: baseline {len(base.outputs)} request(s), P99 TTFT "
            f"{_ms(_p(base_points[-1].metrics, 'ttft', 99.0))}; canary {len(cand.outputs)}, P99 TTFT "
            f"{_ms(_p(cand_points[-1].metrics, 'ttft', 99.0))} (ms)"
        )
    reasons = list(gate.failures)
    if any(p.metrics.completed for p in cand_points):
        reasons += latency_reasons(base_points, cand_points, args.max_p99_ttft_ratio)
    else:
        print("latency: no canary request completed; only quality decides", file=sys.stderr)
    promote = not reasons
    r = httpx.post(base_url + "/cdn-cgi/edge/models/rollout/finish", headers=headers, timeout=600,
                   json={"model": model, "promote": promote, "reasons": reasons})  # fmt: skip
    decision = r.json().get("decision", "rolled_back") if r.status_code == 200 else "rolled_back"
    reasons = r.json().get("reasons", reasons) if r.status_code == 200 else reasons
    append_history(history, {
        **record, "promoted": decision == "promoted", "decision": decision, "reasons": reasons,
        "signed_by": gate.signed_by, "rows": [msgspec.to_builtins(x) for x in gate.rows],
        "latency": [{"rate": b.rate, "baseline_p99_ttft_ms": _p(b.metrics, "ttft", 99.0),
                     "canary_p99_ttft_ms": _p(c.metrics, "ttft", 99.0)}
                    for b, c in zip(base_points, cand_points, strict=True)],
    })  # fmt: skip
    if decision != "promoted":
        for reason in reasons:
            print(f"ROLLED BACK {new}: {reason}", file=sys.stderr)
        return 1
    print(f"PROMOTED {new} over {old}: every PoP serves it as {model} (recorded in {history}); "
          "point the catalog at it to keep it across restarts")  # fmt: skip
    return 0


def _window(model_dir: Path) -> int:
    import json

    config = json.loads((model_dir / "config.json").read_text())
    return int(config.get("max_position_embeddings") or 4096)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def add_rollout_parser(models) -> None:
    ro = models.add_parser("rollout", help="serve a new model to a share of traffic; promote or roll back")
    ro.add_argument("new", help="the new model directory (signed)")
    ro.add_argument("--baseline", required=True, help="the model directory it replaces")
    ro.add_argument("--model", help="the catalog name it is rolled out under (default: the config's first)")
    ro.add_argument("--canary", type=float, default=10.0, help="percent of session keys served by NEW")
    ro.add_argument("--max-ppl-increase", default="1%", help="roll back past this perplexity increase")
    ro.add_argument(
        "--at-contexts", default="2048,8192", help="context lengths to evaluate (within the window)"
    )
    ro.add_argument(
        "--max-p99-ttft-ratio", type=float, default=1.5, help="roll back past this P99 TTFT ratio"
    )
    ro.add_argument("--request-rates", default="2,8", help="the live load this command drives, req/s each")
    ro.add_argument("--num-prompts", type=int, default=40, help="requests per rate")
    ro.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    ro.add_argument("--dataset", default="chat", help="as edge bench serve's --dataset")
    ro.add_argument("--max-context", type=int, default=2048, help="clip prompt + output to this")
    ro.add_argument("--seed", type=int, default=0, help="seeds the dataset, arrivals and session keys")
    ro.add_argument("--max-windows", type=int, default=4, help="held-out windows per context")
    ro.add_argument("--text", default=None, help="held-out text (default: the baseline's)")
    ro.add_argument("--pubkey", action="append", help="trusted public key (repeatable; default: models/keys)")
    ro.add_argument(
        "--allow-unsigned-baseline", action="store_true", help="accept a baseline without a manifest"
    )
    ro.add_argument("--record", default=None, help="the history file (default: promotions.jsonl beside NEW)")
    ro.add_argument("--url", default="http://127.0.0.1:8787", help="the running edge dev")
    ro.add_argument("--config", default=None, help=CONFIG_HELP)
    ro.add_argument("--api-key", help="API token for the load (default: the project's)")
    ro.add_argument("--account", help="the account --api-key acts for")
    ro.set_defaults(func=cmd_models_rollout)
