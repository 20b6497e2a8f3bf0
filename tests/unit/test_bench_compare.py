"""edge bench serve --compare: settings parsed, the catalog written for each, the PoP view's peak,
the modeled cost, and one live run of two KV settings on the shipped miniature."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_sim.target import TargetSpec
from edge_sim.topology import Topology
from runtime.ai.catalog import load_catalog
from runtime.bench.clients import RequestOutput
from runtime.bench.compare import Setting, apply, cost, eval_contexts, parse_compare, peak_of, write_catalog

REPO = Path(__file__).resolve().parents[2]
MODEL = "@edge/moonshotai/kimi-k2-mini"


def test_compare_settings_are_parsed_and_bad_ones_named():
    assert parse_compare("kv=auto,int8,int4") == [Setting("kv", v) for v in ("auto", "int8", "int4")]
    assert [s.label for s in parse_compare("weights=bf16,fp8")] == ["weights=bf16", "weights=fp8"]
    for bad in ("kv=int4", "kvv=auto,int4", "kv=auto,int3", "auto,int4"):
        with pytest.raises(ValueError, match="--compare"):
            parse_compare(bad)


def test_the_written_catalog_serves_the_setting(tmp_path):
    entry, folder = load_catalog(REPO / "models")[MODEL]
    write_catalog(tmp_path, apply(entry, Setting("kv", "int8")), folder)
    served, where = load_catalog(tmp_path)[MODEL]
    assert where == folder and served.kv_cache_dtype == "int8" and served.target.kv == "int8"
    write_catalog(tmp_path, apply(entry, Setting("weights", "int4")), folder)
    served = load_catalog(tmp_path)[MODEL][0]
    assert served.weights == "int4" and served.target.weights == "int4" and served.kv_cache_dtype == "auto"


def test_the_peak_of_the_pop_view_and_the_modeled_cost():
    view = lambda used, running: [  # noqa: E731
        {"models": {MODEL: {"kv_blocks_used": used, "kv_blocks_free": 10 - used, "kv_blocks_total": 10,
                            "running": running, "kv_bytes_per_token": 224.0}}}
    ]  # fmt: skip
    peak = peak_of(view(3, 2), MODEL, peak_of(view(7, 1), MODEL, peak_of(view(1, 1), MODEL, _peak())))
    assert (peak.blocks_used, peak.blocks_free, peak.running, peak.blocks_total) == (7, 3, 2, 10)
    outputs = [RequestOutput(success=True, pop="ICN", prompt_tokens=100, output_tokens=10, batch=2)] * 3
    priced = cost(outputs, TargetSpec(model="kimi-k2"), Topology.default())
    assert priced.per_request_usd > 0 and priced.per_million_tokens_usd == pytest.approx(
        priced.per_request_usd / 10 * 1e6
    )
    assert cost(outputs, None, Topology.default()).per_request_usd is None


def _peak():
    from runtime.bench.compare import KVPeak

    return KVPeak()


def test_eval_contexts_cover_the_median_and_the_longest_request():
    assert eval_contexts([20, 30, 500], [4, 4, 100], 4096, 4096) == [64, 1024]
    assert eval_contexts([5000], [10], 4096, 4096) == [4096]


TINY_WORKLOAD = '[prompt]\ndist = "fixed"\nmean = 24\n[output]\ndist = "fixed"\nmean = 4\n'


@pytest.mark.slow
def test_compare_two_kv_settings_on_the_miniature(tmp_path):
    (tmp_path / "tiny.toml").write_text('name = "tiny"\n' + TINY_WORKLOAD)
    env = {k: v for k, v in os.environ.items() if k != "EDGE_API_TOKEN"}
    r = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "bench", "serve", "--compare", "kv=auto,int4", "--dataset",
         "tiny.toml", "--num-prompts", "3", "--max-concurrency", "2", "--disable-tqdm",
         "--compare-eval-windows", "1", "--save-result", "out.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "starts" in r.stderr or "edge dev of its own" in r.stderr
    for row in ("KV MiB used / free", "sequences admitted", "P99 TTFT", "P99 E2EL", "cost per request",
                "cost per 1M output tokens", "perplexity change @ 64"):  # fmt: skip
        assert row in r.stdout, r.stdout
    results = json.loads((tmp_path / "out.json").read_text())["compare"]
    assert [x["setting"]["value"] for x in results] == ["auto", "int4"]
    assert all(x["metrics"]["completed"] == 3 and x["metrics"]["failed"] == 0 for x in results)
    auto, int4 = results
    assert int4["kv"]["bytes_per_token"] < auto["kv"]["bytes_per_token"]
    assert auto["ppl_change_pct"]["64"] == 0.0 and int4["ppl_change_pct"]["64"] != 0.0
    assert all(x["cost"]["per_request_usd"] > 0 for x in results)
