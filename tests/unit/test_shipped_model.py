"""The shipped miniatures: signed, read identically by transformers and by us, measurably trained,
and small enough to ship."""

import json
import math

import pytest
import torch

from engine import LLM, SamplingParams
from tests.conftest import REPO

MODELS = {
    "kimi-k2-mini": {
        "model_type": "deepseek_v3",
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "n_shared_experts": 1,
        "q_lora_rank": None,
    },
    "glm-4.5-mini": {
        "model_type": "glm4_moe",
        "use_qk_norm": True,
        "attention_bias": True,
        "partial_rotary_factor": 0.5,
        "n_shared_experts": 1,
    },
}
DIM_KEYS = {
    "kimi-k2-mini": ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"),
    "glm-4.5-mini": ("head_dim",),
}
HELDOUT = REPO / "models" / "eval" / "heldout.txt"


@pytest.fixture(scope="module", params=sorted(MODELS))
def shipped(request):
    path = REPO / "models" / request.param
    return request.param, path, LLM(path, device="cpu")  # verifies the signed manifest too


def test_config_carries_the_published_keys(shipped):
    name, path, _ = shipped
    cfg = json.loads((path / "config.json").read_text())
    for key, value in MODELS[name].items():
        assert cfg[key] == value, key
    assert cfg["n_routed_experts"] >= 8 and cfg["num_experts_per_tok"] >= 2
    for key in DIM_KEYS[name]:
        assert cfg[key] % 32 == 0, key  # quantization groups of 32 divide evenly


def test_transformers_reads_the_checkpoint_as_we_do(shipped):
    from transformers import AutoModelForCausalLM

    _, path, llm = shipped
    assert llm.verification.signed
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = llm.encode(HELDOUT.read_text()[5000:7000])[:64]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    assert (llm.logits(ids) - want).abs().max().item() < 1e-4


def test_the_model_has_learned_python(shipped):
    _, _, llm = shipped
    ids = llm.encode(HELDOUT.read_text()[20000:40000])[:1024]
    logits = llm.logits(ids)
    ppl = math.exp(torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:])).item())
    assert ppl < 100, f"held-out perplexity {ppl:.1f} (vocabulary 4096): the model has not learned"
    out = llm.generate("import os\nimport sys\n\n\ndef main(", SamplingParams(max_tokens=24, temperature=0))[
        0
    ]
    assert out.text.strip() and "\ufffd" not in out.text


def test_together_they_fit_the_size_budget():
    # 25 MiB for the main models, plus each MTP layer (~6.5 MB: its decoder layer and eh_proj, and the
    # frozen copies of the embedding and LM head that the hub layout stores in it).
    total = sum(f.stat().st_size for name in MODELS for f in (REPO / "models" / name).iterdir())
    assert total <= 40 * 1024 * 1024, f"{total / 2**20:.1f} MiB"
