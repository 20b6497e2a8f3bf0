"""`edge bench serve --compare kv=auto,int8,int4`: one seeded workload against each setting in
turn, side by side (runtime.bench.compare has the pieces).

Switching a setting means serving the model from a catalog that names it, so the command starts its
own `edge dev` (runtime.bench.devserver: one GPU PoP, ICN) on a catalog it writes in a temporary
folder, and between settings rewrites that catalog and has the same PoP reload the model (POST
/cdn-cgi/edge/models/reload): one process, no restart. `--base-url` is not used with --compare."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from runtime.cli.common import _fail
from runtime.control.config import INSTALLED_MODELS_DIR, ConfigError


def _catalog_entry(config, model: str):
    from runtime.ai.catalog import load_catalog

    catalog = load_catalog(config.models_dir if config is not None else INSTALLED_MODELS_DIR)
    if model not in catalog:
        raise ConfigError(f"--compare: {model!r} is not in the catalog ({', '.join(catalog)})")
    return catalog[model]


def quality_changes(folder: Path, settings, entry, contexts: list[int], windows: int) -> dict[str, dict]:
    """Perplexity change of each setting against the uncompressed model, by context (label -> {ctx: %})."""
    from quality.perplexity import evaluate

    if not contexts:
        return {}
    values = [s.value for s in settings]
    if settings[0].axis == "kv":
        rows = evaluate(folder, values, contexts, weights=[entry.weights], max_windows=windows)
        return {
            f"kv={kv}": {r.context: r.ppl_change_pct for r in rows if r.kv_cache_dtype == kv} for kv in values
        }
    weights = ["auto", *(v for v in values if v != "auto")]
    rows = evaluate(folder, [entry.kv_cache_dtype], contexts, weights=weights, max_windows=windows)
    n = len(contexts)
    by_weights = {w: rows[i * n : (i + 1) * n] for i, w in enumerate(weights)}
    return {f"weights={w}": {r.context: r.ppl_change_pct for r in by_weights[w]} for w in values}


def run_compare(args: argparse.Namespace, config, target, dataset, load, percentiles, goodput) -> int:
    import msgspec

    from runtime.bench.compare import eval_contexts, format_compare, parse_compare
    from runtime.bench.serve import describe_load

    try:
        settings = parse_compare(args.compare)
        entry, folder = _catalog_entry(config, target.model)
    except (ValueError, ConfigError) as exc:
        return _fail(str(exc))
    window = entry.context_window or 4096
    prompts, outputs = [r.prompt_len for r in dataset.requests], [r.output_len for r in dataset.requests]
    contexts = [] if args.compare_no_eval else eval_contexts(prompts, outputs, window, window)
    print(
        f"--compare {args.compare}: starting an edge dev of its own (one GPU PoP, ICN) and reloading "
        f"{target.model} there for each setting",
        file=sys.stderr,
    )
    print("\n".join(describe_load(load)))
    try:
        results = _serve_each(args, target, entry, folder, settings, dataset, load, percentiles, goodput)
    except (ConfigError, RuntimeError, TimeoutError) as exc:
        return _fail(str(exc))
    if contexts:
        print(f"--compare: perplexity at contexts {', '.join(map(str, contexts))}", file=sys.stderr)
        changes = quality_changes(folder, settings, entry, contexts, args.compare_eval_windows)
        for r in results:
            r.ppl_change_pct = changes.get(r.setting.label, {})
    print(format_compare(results, percentiles))
    if args.save_result:
        from runtime.bench.report import save_result

        save_result(args.save_result, {"compare": msgspec.to_builtins(results)})
        print(f"wrote {args.save_result}", file=sys.stderr)
    return 0


def _serve_each(args, target, entry, folder, settings, dataset, load, percentiles, goodput):
    """Each setting served in turn by one edge dev of this command's own; its results."""
    import httpx
    import msgspec

    from edge_sim.topology import Topology
    from runtime.bench.compare import Sampler, SettingResult, apply, cost, write_catalog
    from runtime.bench.devserver import start_dev, write_project
    from runtime.bench.serve import benchmark
    from runtime.bench.tenants import default_tenant
    from runtime.cli.client import admin_headers

    topology = Topology.default()
    results: list[SettingResult] = []
    with tempfile.TemporaryDirectory(prefix="edge-compare-") as tmp:
        project, models = Path(tmp) / "project", Path(tmp) / "models"
        project.mkdir()
        write_catalog(models, apply(entry, settings[0]), folder)
        write_project(project, "compare", model=target.model, models_dir=models)
        config_path = str(project / "wrangler-like.toml")
        proc, url = start_dev(project, {})
        try:
            tenant = default_tenant(None, None, config_path)
            headers = admin_headers(config_path)

            def view() -> list[dict]:
                return httpx.get(url + "/cdn-cgi/edge/pops", headers=headers, timeout=30).json()["pops"]

            here = msgspec.structs.replace(target, base_url=url)
            for i, setting in enumerate(settings):
                served = apply(entry, setting)
                if i:  # the first setting is what the edge dev started with
                    write_catalog(models, served, folder)
                    reload = url + "/cdn-cgi/edge/models/reload"
                    r = httpx.post(reload, json={"model": target.model}, headers=headers, timeout=600)
                    if r.status_code != 200:
                        raise RuntimeError(f"{setting.label}: the PoP did not load it: {r.text[:300]}")
                print(f"--compare: {setting.label}", file=sys.stderr)
                warm = dataset._replace(requests=dataset.requests[:2])  # a fresh engine's first steps
                benchmark(here, [tenant], warm, load, percentiles, goodput, False)
                with Sampler(view, target.model) as sampler:
                    progress = not args.disable_tqdm
                    outcome = benchmark(here, [tenant], dataset, load, percentiles, goodput, progress)
                priced = cost(outcome.outputs, served.target, topology)
                results.append(SettingResult(setting, outcome.metrics, sampler.peak, priced, {}))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return results
