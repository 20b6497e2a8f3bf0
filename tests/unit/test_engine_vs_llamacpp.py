"""bench/engine_vs_llamacpp.py's pure parts: the GGUF config patching, the readers of llama.cpp's
output (samples from real runs in tests/fixtures/llamacpp/), and our second-half perplexity scoring.
The llama.cpp build itself never runs in the suite."""

import json
import math

import pytest
import torch

from bench.engine_runs import second_half_nll, second_half_perplexity, windows
from bench.llamacpp_gguf import is_gpt2_byte_level, patched_config, stage
from bench.llamacpp_runs import (
    completion_of,
    parse_batched_table,
    parse_bench_json,
    parse_lookup,
    parse_perplexity,
)
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "llamacpp"  # captured from real runs on kimi-k2-mini


def _config(name: str) -> dict:
    return json.loads((REPO / "models" / name / "config.json").read_text())


def test_q_lora_rank_null_becomes_zero_in_a_copy():
    config = _config("kimi-k2-mini")
    assert config["q_lora_rank"] is None
    patched = patched_config(config)
    assert patched["q_lora_rank"] == 0 and config["q_lora_rank"] is None
    assert {k: v for k, v in patched.items() if k != "q_lora_rank"} == {
        k: v for k, v in config.items() if k != "q_lora_rank"
    }


def test_a_config_without_q_lora_rank_is_left_as_it_is():
    config = _config("glm-4.5-mini")
    assert patched_config(config) == config


@pytest.mark.parametrize("scoring", [None, "softmax"])
def test_a_config_that_would_route_with_softmax_is_refused(scoring):
    config = _config("kimi-k2-mini")
    config.pop("scoring_func")
    if scoring:
        config["scoring_func"] = scoring
    with pytest.raises(ValueError, match="sigmoid"):
        patched_config(config)


def test_our_tokenizers_are_the_gpt2_byte_level_pre_tokenizer():
    for name in ("kimi-k2-mini", "glm-4.5-mini"):
        assert is_gpt2_byte_level(json.loads((REPO / "models" / name / "tokenizer.json").read_text()))
    metaspace = {"pre_tokenizer": {"type": "Metaspace"}, "normalizer": None}
    assert not is_gpt2_byte_level(metaspace)
    prefixed = {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True}, "normalizer": None}
    assert not is_gpt2_byte_level(prefixed)


def test_stage_links_the_checkpoint_and_patches_only_the_config(tmp_path):
    model = REPO / "models" / "kimi-k2-mini"
    staged = stage(model, tmp_path / "kimi")
    assert json.loads((staged / "config.json").read_text())["q_lora_rank"] == 0
    assert (staged / "model.safetensors").resolve() == (model / "model.safetensors").resolve()
    assert _config("kimi-k2-mini")["q_lora_rank"] is None  # the shipped file is untouched


def test_llama_bench_json():
    decode, prefill = (parse_bench_json((FIXTURES / f).read_text()) for f in ("bench_tg.txt", "bench_pp.txt"))
    ((tg,), (pp,)) = decode, prefill
    assert (tg.n_prompt, tg.n_gen, tg.n_depth) == (0, 64, 64) and tg.tok_s > 0 and len(tg.samples) == 3
    assert (pp.n_prompt, pp.n_gen, pp.n_depth) == (512, 0, 0) and pp.tok_s > 0
    assert min(tg.samples) <= tg.tok_s <= max(tg.samples)


def test_llama_batched_bench_table():
    rows = parse_batched_table((FIXTURES / "batched_bench.txt").read_text())
    assert [(r.pp, r.tg, r.sequences) for r in rows] == [(64, 64, 1), (64, 64, 8), (64, 64, 32)]
    for r in rows:
        assert r.total_s == pytest.approx(r.prefill_s + r.decode_s, abs=0.002)
        assert r.generated_tok_s == pytest.approx(r.sequences * 64 / r.total_s)
    with pytest.raises(ValueError, match="no llama-batched-bench table"):
        parse_batched_table("llama_model_load: error loading model\n")


def test_llama_perplexity_final_estimate():
    got = parse_perplexity((FIXTURES / "perplexity.txt").read_text())
    assert (got.context, got.chunks, got.value) == (1024, 4, 29.2404) and got.error == 1.81668
    with pytest.raises(ValueError, match="no final perplexity"):
        parse_perplexity("perplexity: tokenizing the input ..\n")


def test_llama_lookup_statistics():
    got = parse_lookup((FIXTURES / "lookup.txt").read_text())  # -n 48 --spec-draft-n-max 5
    assert (got.decoded, got.decode_s, got.drafted, got.accepted) == (49, 0.046, 45, 5)
    assert got.tok_s == pytest.approx(49 / 0.046)
    with pytest.raises(ValueError, match="no decode statistics"):
        parse_lookup("encoded 39 tokens in 0.007 seconds\n")


def test_llama_simple_completion():
    prompt = "def f(x):\n    return"
    assert completion_of(prompt + " x + 1\n\n\n", prompt) == " x + 1\n\n"
    with pytest.raises(ValueError, match="tokenization differs"):
        completion_of(" x + 1\n", prompt)


def test_windows_are_llama_perplexity_chunks():
    ids = list(range(10))
    assert windows(ids, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # the tail that fills no window is dropped
    assert windows(ids, 4, chunks=1) == [[0, 1, 2, 3]]


def test_second_half_scores_n_minus_half_minus_one_tokens():
    vocab = 16
    for n in (8, 9, 1024):
        nll, count = second_half_nll(torch.zeros(n, vocab), [i % vocab for i in range(n)])
        assert count == n - n // 2 - 1  # llama-perplexity's count per chunk
        assert nll == pytest.approx(count * math.log(vocab))  # uniform logits: log V per token
    logits = torch.full((4, vocab), -30.0)
    logits[2, 7] = 30.0  # position 2 (the second half of 4) predicts token 3 = 7 surely
    nll, count = second_half_nll(logits, [0, 0, 0, 7])
    assert count == 1 and nll == pytest.approx(0.0, abs=1e-6)


def test_second_half_perplexity_of_ours_matches_transformers(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from engine import LLM

    llm = LLM(tiny_model_dir, device="cpu", allow_unsigned=True, prefix_caching=False)
    ids = llm.encode((REPO / "models" / "eval" / "heldout.txt").read_text()[:6000])
    context, chunks = 128, 3
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for window in windows(ids, context, chunks):
            logits = hf(torch.tensor([window])).logits[0]
            first = context // 2
            nll += float(
                torch.nn.functional.cross_entropy(
                    logits[first:-1], torch.tensor(window[first + 1 :]), reduction="sum"
                )
            )
            count += context - first - 1
    assert count == chunks * 63
    assert second_half_perplexity(llm, ids, context, chunks) == pytest.approx(math.exp(nll / count), rel=1e-4)
