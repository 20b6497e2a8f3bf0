"""Our GQA/MoE engine against transformers' Glm4MoeForCausalLM on fresh random weights.

Tolerance: float32 logits within 1e-4 absolute on a 64-token prompt; greedy continuations equal.
"""

import pytest
import torch

from engine import LLM, SamplingParams
from tests.hf_reference import tiny_glm4_moe

CASES = {
    "qk-norm-bias-partial-rope": {},
    "no-qk-norm-no-bias-full-rope-grouped": dict(
        use_qk_norm=False,
        attention_bias=False,
        partial_rotary_factor=1.0,
        n_group=2,
        topk_group=1,
        norm_topk_prob=False,
        first_k_dense_replace=0,
    ),
    "mha-two-dense-layers": dict(num_key_value_heads=4, first_k_dense_replace=2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_greedy_match_transformers(tmp_path, case):
    seed = torch.seed() % 2**31
    ref = tiny_glm4_moe(tmp_path, seed=seed, **CASES[case])
    ids = torch.randint(2, 256, (64,), generator=torch.Generator().manual_seed(seed)).tolist()
    llm = LLM(tmp_path, device="cpu", allow_unsigned=True)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].float()
    got = llm.logits(ids)
    assert (got - want).abs().max().item() < 1e-4, f"seed {seed}"
    with torch.no_grad():
        ref_out = ref.generate(
            torch.tensor([ids[:16]]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, 16:].tolist()
    stream = list(llm.stream(ids[:16], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)))
    assert [e.token_id for e in stream] == ref_out, f"seed {seed}"
