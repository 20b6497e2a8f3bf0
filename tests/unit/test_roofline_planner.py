"""Target-model specs, the roofline cost model and the placement planner."""

from __future__ import annotations

import json

import pytest

from capacity import cli as capacity_cli
from capacity.planner import layout_sizes, min_layout, plan
from edge_sim.roofline import (
    GIB,
    RooflineModel,
    SimulationError,
    active_params,
    gpu_type,
    kv_bytes_per_token,
    weight_bytes,
)
from edge_sim.target_models import GLM_4_5, KIMI_K2, target_model
from tests.conftest import SHIPPED_KIMI


def test_published_sizes():
    # Kimi K2: ~1.03T parameters, ~32B active; GLM-4.5: ~355B (353B without the MTP layer), ~32B active.
    kimi, glm = weight_bytes(KIMI_K2), weight_bytes(GLM_4_5)
    assert 1.00e12 < kimi.total_params < 1.05e12
    assert 30e9 < active_params(KIMI_K2) < 34e9
    assert 345e9 < glm.total_params < 360e9
    assert 30e9 < active_params(GLM_4_5) < 35e9


def test_kimi_k2_fp8_needs_more_than_one_h200():
    fp8 = weight_bytes(KIMI_K2, "fp8").total_bytes
    assert 0.95e12 < fp8 < 1.1e12  # about 1 TB of fp8 weights
    h200 = gpu_type("H200")
    assert fp8 > h200.memory_gib * GIB
    layout = min_layout(KIMI_K2, "H200", "fp8", "auto", context=4096)
    assert layout is not None and layout.gpus >= 8
    assert min_layout(KIMI_K2, "H200", "fp8", "auto", context=4096, max_gpus=4) is None


def test_glm_fp8_halves_weight_bytes():
    bf16 = weight_bytes(GLM_4_5, "bf16")
    fp8 = weight_bytes(GLM_4_5, "fp8")
    # the linear weights halve (plus 4 bytes per 128x128 block); embeddings stay bf16
    assert bf16.bytes["routed_experts"] / fp8.bytes["routed_experts"] == pytest.approx(2.0, rel=1e-3)
    assert 1.9 < bf16.total_bytes / fp8.total_bytes <= 2.0
    assert fp8.bytes["embeddings"] == bf16.bytes["embeddings"]
    int4 = weight_bytes(GLM_4_5, "int4")
    assert int4.bytes["routed_experts"] / bf16.bytes["routed_experts"] == pytest.approx(
        (0.5 + 2 / 32) / 2, rel=1e-3
    )


@pytest.mark.parametrize("model", [KIMI_K2, GLM_4_5], ids=lambda m: m.name)
def test_int4_kv_is_about_3_4x_smaller_than_bf16(model):
    bf16, int4 = kv_bytes_per_token(model, "bf16"), kv_bytes_per_token(model, "int4")
    assert kv_bytes_per_token(model, "auto") == bf16  # target models run in bf16
    assert 3.2 < bf16 / int4 < 3.7
    assert bf16 / kv_bytes_per_token(model, "fp8") == pytest.approx(2.0, rel=0.01)


def test_kv_bytes_agree_with_the_engine():
    from engine import LLM

    mini = target_model(SHIPPED_KIMI)
    llm = LLM(SHIPPED_KIMI, device="cpu", kv_cache_dtype="int4", kv_cache_bytes=2**22)
    assert kv_bytes_per_token(mini, "int4") == llm.engine.cache.bytes_per_token()


def test_decode_tpot_grows_with_context_and_batch():
    r = RooflineModel(KIMI_K2, gpu_type("H200"), 8, "fp8", "auto")
    for batch in (1, 16, 64):
        times = [r.decode_ms(batch, batch * c) for c in (1024, 8192, 65536)]
        assert times == sorted(times) and times[0] < times[-1]
    for context in (1024, 32768):
        times = [r.decode_ms(b, b * context) for b in (1, 8, 64, 256)]
        assert times == sorted(times) and times[0] < times[-1]
    # MoE: the distinct experts a batch hits saturate at E
    assert r.distinct_experts(1) == pytest.approx(KIMI_K2.experts_per_token)
    assert r.distinct_experts(10_000) == pytest.approx(KIMI_K2.n_routed_experts, rel=1e-6)
    # a longer prompt takes longer to prefill, and more GPUs make decoding faster
    assert r.prefill_ms(1000) < r.prefill_ms(8000) < r.prefill_ms(32000)
    r16 = RooflineModel(KIMI_K2, gpu_type("H200"), 16, "fp8", "auto")
    assert r16.decode_ms(64, 64 * 4096) < r.decode_ms(64, 64 * 4096)


def test_layout_sizes_are_powers_of_two_then_whole_nodes():
    sizes = layout_sizes(64)
    assert sizes[:4] == [1, 2, 4, 8]
    assert all(n in (1, 2, 4, 8) or n % 8 == 0 for n in sizes)
    for model, gpu, weights, kv, ctx, conc in [
        ("kimi-k2", "H200", "fp8", "int4", 131072, 64),
        ("kimi-k2", "H100-SXM", "int4", "fp8", 32768, 16),
        ("glm-4.5", "H200", "fp8", "auto", 8192, 32),
        ("glm-4.5", "L40S", "int4", "int4", 4096, 8),
        ("glm-4.5", "A100-80G", "bf16", "bf16", 131072, 4),
    ]:
        p = plan(model, gpu, weights, kv, ctx, conc)
        n = p.layout.gpus
        assert n in (1, 2, 4, 8) or n % 8 == 0
        assert p.layout.tensor_parallel_attention * p.layout.data_parallel_attention == n


def test_plan_memory_check_and_minimality():
    p = plan("kimi-k2", "H200", "fp8", "int4", 131072, 64)
    usable = p.gpu_memory_gib * p.usable_fraction
    assert p.layout.weights_gib_per_gpu + p.layout.kv_gib_per_gpu <= usable
    assert p.layout.max_concurrency >= p.concurrency
    # every GPU holds its share of the weights (MLA attention is replicated: at least 1/N each)
    assert p.layout.weights_gib_per_gpu * p.layout.gpus >= p.weight_gib
    assert p.layout.kv_gib_per_gpu * p.layout.gpus == pytest.approx(p.kv_gib)
    smaller = [n for n in layout_sizes() if n < p.layout.gpus]
    for n in smaller:
        r = RooflineModel(KIMI_K2, gpu_type("H200"), n, "fp8", "int4")
        kv_per_gpu = p.kv_gib * GIB / n
        assert r.weight_bytes_per_gpu + kv_per_gpu > usable * GIB
    # bf16 KV needs more GPUs for the same sequences
    int4 = plan("kimi-k2", "H200", "fp8", "int4", 131072, 128)
    assert plan("kimi-k2", "H200", "fp8", "bf16", 131072, 128).layout.gpus > int4.layout.gpus
    # cost follows throughput
    lay = p.layout
    expected = lay.gpus * p.price_per_gpu_hour / (lay.decode_tokens_per_s * 3600) * 1e6
    assert lay.cost_per_million_tokens == pytest.approx(expected)
    assert lay.decode_tokens_per_s == pytest.approx(64 * 1000 / lay.decode_tpot_ms)


def test_plan_rejects_unknown_entries_by_name():
    with pytest.raises(SimulationError, match="'llama-9'"):
        plan("llama-9", "H200")
    with pytest.raises(SimulationError, match="'B300'.*H200"):
        plan("kimi-k2", "B300")
    with pytest.raises(SimulationError, match="'fp4'"):
        plan("kimi-k2", "H200", weights="fp4")
    with pytest.raises(SimulationError, match="'int2'"):
        plan("kimi-k2", "H200", kv="int2")
    with pytest.raises(SimulationError, match="context"):
        plan("kimi-k2", "H200", context=10**7)


def test_plan_reads_a_model_directory():
    m = target_model(str(SHIPPED_KIMI))
    assert m.name == "kimi-k2-mini" and m.attention == "mla"
    assert (m.hidden_size, m.num_layers, m.n_routed_experts) == (256, 4, 8)
    p = plan(SHIPPED_KIMI, "L4", "bf16", "auto", 4096, 16)
    assert p.model == "kimi-k2-mini" and p.layout.gpus == 1
    assert p.layout.decode_tpot_ms > 0


def test_cli_plan_json_and_errors(capsys):
    argv = ["plan", "--model", "kimi-k2", "--gpu", "H200", "--weights", "fp8", "--kv", "int4"]
    assert capacity_cli.main([*argv, "--context", "131072", "--concurrency", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"]["gpus"] == 16 and out["kv"] == "int4"
    assert out["layout"]["cost_per_million_tokens"] > 0
    assert capacity_cli.main([*argv[:7], "--context", "4096", "--concurrency", "8"]) == 0
    text = capsys.readouterr().out
    assert "GPUs needed: 8 x H200" in text and "per million output tokens" in text
    assert capacity_cli.main(["plan", "--model", "kimi-k2", "--gpu", "B300"]) == 2
    assert "edge: error: unknown GPU type 'B300'" in capsys.readouterr().err
    assert capacity_cli.main(["plan", "--model", "mistral-huge"]) == 2
    assert "'mistral-huge'" in capsys.readouterr().err
