"""Compressed checkpoints: written by `edge models quantize`, read back exactly, still generating."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, ModelLoadError, SamplingParams
from engine.load.checkpoint import checkpoint_info, quantize_checkpoint
from kernels.quant import QuantizedWeight
from runtime.cli import main as edge
from tests.conftest import SHIPPED_KIMI
from tests.hf_reference import tiny_deepseek_v3, tiny_glm4_moe

# Relative L2 error of the logits against the uncompressed model, per format (experts compressed).
# the relative error of the logits of SEQUENCES fresh sequences taken together, against the bf16
# checkpoint's (a random tiny model's logits are nearly flat, so one sequence's error has a long tail:
# int8's ranged 0.001-0.11 over 40 single draws); over 12 draws of 16 it measured int8 0.022-0.052,
# fp8 0.060-0.092, int4 0.17-0.21
LOGIT_TOLERANCE = {"int8": 0.1, "fp8": 0.25, "int4": 0.5}
SEQUENCES = 16


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def ids():
    return [torch.randint(10, 4000, (48,)).tolist() for _ in range(SEQUENCES)]


def logits(llm, sequences):
    return torch.cat([llm.logits(s) for s in sequences])


@pytest.mark.parametrize("fmt", ["int8", "fp8", "int4"])
def test_quantized_checkpoint_round_trips(tiny_model_dir, tmp_path, ids, fmt):
    dst = tmp_path / fmt
    sizes = quantize_checkpoint(tiny_model_dir, dst, fmt)
    assert sizes["bytes_after"] < sizes["bytes_before"]
    cfg = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert cfg["parts"] == ["routed_experts", "shared_experts"]
    assert (dst / "tokenizer.json").is_file()

    base = LLM(tiny_model_dir, device="cpu", allow_unsigned=True)
    stored = LLM(dst, device="cpu", allow_unsigned=True)
    assert stored.weight_formats == {
        "routed_experts": fmt,
        "shared_experts": fmt,
        "dense_mlp": "bf16",
        "attention": "bf16",
    }
    assert stored.weights_label == f"{fmt} experts, bf16 rest"
    expert = stored.model.layers[1].mlp.experts.w_up
    assert isinstance(expert, QuantizedWeight) and expert.format == fmt
    # Quantizing at load gives exactly what the compressed checkpoint holds.
    at_load = LLM(tiny_model_dir, weights=fmt, device="cpu", allow_unsigned=True)
    torch.testing.assert_close(logits(stored, ids), logits(at_load, ids), atol=1e-5, rtol=0)
    err = rel_err(logits(stored, ids), logits(base, ids))
    assert err < LOGIT_TOLERANCE[fmt]
    out = stored.generate("def f(x):", SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    assert out.completion_tokens == 8


def test_fp8_checkpoint_uses_deepseeks_layout(tiny_model_dir, tmp_path):
    quantize_checkpoint(tiny_model_dir, tmp_path / "fp8", "fp8", "all")
    tensors = load_file(tmp_path / "fp8" / "model.safetensors")
    w = tensors["model.layers.1.mlp.experts.0.gate_proj.weight"]  # [32, 64]
    assert w.dtype == torch.float8_e4m3fn
    assert tensors["model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv"].shape == (1, 1)
    assert tensors["model.layers.0.self_attn.kv_b_proj.weight"].dtype == torch.float8_e4m3fn
    cfg = json.loads((tmp_path / "fp8" / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "fp8" and cfg["weight_block_size"] == [128, 128]
    llm = LLM(
        tmp_path / "fp8", device="cpu", allow_unsigned=True
    )  # attention compressed too: MLA expands kv_b at load
    assert llm.weight_formats["attention"] == "fp8"
    assert (
        llm.generate("x", SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))[0].completion_tokens
        == 3
    )


def test_bf16_expands_a_compressed_checkpoint(tiny_model_dir, tmp_path, ids):
    quantize_checkpoint(tiny_model_dir, tmp_path / "q", "int8")
    expanded = LLM(tmp_path / "q", weights="bf16", device="cpu", allow_unsigned=True)
    assert set(expanded.weight_formats.values()) == {"bf16"}
    torch.testing.assert_close(
        logits(expanded, ids),
        logits(LLM(tmp_path / "q", device="cpu", allow_unsigned=True), ids),
        atol=1e-4,
        rtol=0,
    )


def test_int4_refuses_a_group_that_does_not_divide(tmp_path):
    tiny_deepseek_v3(tmp_path / "m", moe_intermediate_size=40)
    with pytest.raises(
        ModelLoadError, match=r"experts\.0\.down_proj\.weight: input dimension 40 is not a multiple"
    ):
        LLM(tmp_path / "m", weights="int4", device="cpu", allow_unsigned=True)
    with pytest.raises(ModelLoadError, match="input dimension 40"):
        quantize_checkpoint(tmp_path / "m", tmp_path / "out", "int4")


def test_missing_or_misshapen_scales_are_named(tiny_model_dir, tmp_path):
    quantize_checkpoint(tiny_model_dir, tmp_path / "q", "int4")
    path = tmp_path / "q" / "model.safetensors"
    tensors = load_file(path)
    name = "model.layers.2.mlp.experts.5.up_proj.weight_scale"
    tensors[name] = tensors[name][:, :1].contiguous()
    save_file(tensors, path)
    with pytest.raises(ModelLoadError, match=rf"{name} has shape \[32, 1\]; expected \[32, 2\]"):
        LLM(tmp_path / "q", device="cpu", allow_unsigned=True)
    del tensors[name]
    save_file(tensors, path)
    with pytest.raises(ModelLoadError, match=rf"but its scale {name} is missing"):
        LLM(tmp_path / "q", device="cpu", allow_unsigned=True)


def test_sharded_checkpoints_load_the_same(tmp_path, ids):
    ref = tiny_deepseek_v3(tmp_path / "one", seed=3)
    ref.save_pretrained(tmp_path / "sharded", max_shard_size="200KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    torch.testing.assert_close(
        LLM(tmp_path / "sharded", device="cpu", allow_unsigned=True).logits([3, 4, 5, 6]),
        LLM(tmp_path / "one", device="cpu", allow_unsigned=True).logits([3, 4, 5, 6]),
        atol=0,
        rtol=0,
    )
    # and our writer shards compressed output the same way
    quantize_checkpoint(tmp_path / "sharded", tmp_path / "q", "int4", max_shard_bytes=64 * 1024)
    index = json.loads((tmp_path / "q" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert LLM(tmp_path / "q", device="cpu", allow_unsigned=True).weight_formats["routed_experts"] == "int4"


def test_kimi_k2_model_type_reads_as_deepseek_v3(tiny_model_dir, tmp_path, ids):
    d = shutil.copytree(tiny_model_dir, tmp_path / "kimi")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "kimi_k2"
    (d / "config.json").write_text(json.dumps(cfg))
    torch.testing.assert_close(
        logits(LLM(d, device="cpu", allow_unsigned=True), ids),
        logits(LLM(tiny_model_dir, device="cpu", allow_unsigned=True), ids),
    )


def test_glm_compresses_too(tmp_path):
    tiny_glm4_moe(tmp_path / "glm")
    llm = LLM(tmp_path / "glm", weights="int4", weight_parts="all", device="cpu", allow_unsigned=True)
    assert set(llm.weight_formats.values()) == {"int4"}
    assert llm.logits([1, 2, 3]).isfinite().all()


def test_models_info_shows_the_saving(capsys):
    rows = {r.part: r for r in checkpoint_info(SHIPPED_KIMI, "int4")}
    experts = rows["routed_experts"]
    assert experts.target_bytes / experts.bf16_bytes <= 0.3
    assert rows["attention"].target_bytes == rows["attention"].bf16_bytes  # not compressed by default
    assert edge(["models", "info", str(SHIPPED_KIMI), "--weights", "int4"]) == 0
    out = capsys.readouterr().out
    assert "routed_experts" in out and "0.281x" in out


def test_quantize_cli_refuses_to_overwrite_its_source(tiny_model_dir, capsys):
    assert edge(["models", "quantize", str(tiny_model_dir), str(tiny_model_dir), "--weights", "int4"]) == 2
    assert "destination must differ" in capsys.readouterr().err
