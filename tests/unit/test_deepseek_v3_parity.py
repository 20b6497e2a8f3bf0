"""Our MLA/MoE engine against transformers' DeepseekV3ForCausalLM on fresh random weights.

Tolerance: float32 logits within 1e-4 absolute on a 64-token prompt; greedy continuations equal.
"""

import pytest
import torch

from engine import LLM, SamplingParams
from tests.hf_reference import tiny_deepseek_v3

CASES = {
    "no-q-lora": {},
    "q-lora-bias-yarn": dict(
        q_lora_rank=48,
        attention_bias=True,
        rope_scaling={
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    ),
    "ungrouped-unnormalised": dict(n_group=1, topk_group=1, norm_topk_prob=False, first_k_dense_replace=0),
    "four-groups-two-dense-layers": dict(
        n_routed_experts=16,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=3,
        first_k_dense_replace=2,
        num_hidden_layers=4,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_greedy_match_transformers(tmp_path, case):
    seed = torch.seed() % 2**31
    ref = tiny_deepseek_v3(tmp_path, seed=seed, **CASES[case])
    ids = torch.randint(2, 256, (64,), generator=torch.Generator().manual_seed(seed)).tolist()
    llm = LLM(tmp_path, device="cpu", allow_unsigned=True)

    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].float()
    got = llm.logits(ids)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-4, f"seed {seed}"

    with torch.no_grad():
        ref_out = ref.generate(
            torch.tensor([ids[:16]]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, 16:].tolist()
    stream = list(llm.stream(ids[:16], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)))
    assert [e.token_id for e in stream] == ref_out, f"seed {seed}"
