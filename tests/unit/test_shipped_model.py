"""The shipped miniature: read identically by transformers and by us, and measurably trained."""

import json
import math

import pytest
import torch

from engine import LLM, SamplingParams
from tests.conftest import REPO, SHIPPED_KIMI


@pytest.fixture(scope="module")
def llm():
    return LLM(SHIPPED_KIMI, device="cpu")


def test_config_carries_the_published_keys():
    cfg = json.loads((SHIPPED_KIMI / "config.json").read_text())
    for key, value in {
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "n_group": 1,
        "topk_group": 1,
        "model_type": "deepseek_v3",
        "n_shared_experts": 1,
    }.items():
        assert cfg[key] == value, key
    assert cfg["n_routed_experts"] >= 8 and cfg["num_experts_per_tok"] >= 2
    for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        assert cfg[key] % 32 == 0, key  # quantization groups of 32 divide evenly


def test_transformers_reads_the_checkpoint_as_we_do(llm):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(SHIPPED_KIMI, dtype=torch.float32).eval()
    text = (REPO / "models" / "eval" / "heldout.txt").read_text()[5000:7000]
    ids = llm.encode(text)[:64]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    assert (llm.logits(ids) - want).abs().max().item() < 1e-4


def test_the_model_has_learned_python(llm):
    text = (REPO / "models" / "eval" / "heldout.txt").read_text()
    ids = llm.encode(text[20000:40000])[:512]
    logits = llm.logits(ids)
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    ppl = math.exp(nll.item())
    assert ppl < 100, f"held-out perplexity {ppl:.1f} (vocabulary 4096): the model has not learned"
    out = llm.generate("import os\nimport sys\n\n\ndef main(", SamplingParams(max_tokens=24, temperature=0))[
        0
    ]
    assert out.text.strip() and "\ufffd" not in out.text
