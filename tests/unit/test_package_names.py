"""Our top-level `kernels` package must not confuse transformers, which integrates a PyPI package of
the same name when it believes that one is installed."""

import subprocess
import sys


def test_transformers_imports_and_runs_beside_our_kernels_package():
    code = (
        "import kernels, transformers\n"
        "from transformers.utils import import_utils as u\n"
        "assert kernels.__file__.endswith('kernels/__init__.py'), kernels.__file__\n"
        "assert not u.is_kernels_available(), 'transformers thinks our kernels is the hub package'\n"
        "import torch\n"
        "from transformers import DeepseekV3Config, DeepseekV3ForCausalLM\n"
        "cfg = DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=64,"
        " moe_intermediate_size=16,"
        " num_hidden_layers=2, num_attention_heads=2, n_routed_experts=4, num_experts_per_tok=2, n_group=1,"
        " topk_group=1, kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=32,"
        " v_head_dim=32, first_k_dense_replace=1)\n"
        "out = DeepseekV3ForCausalLM(cfg)(torch.tensor([[1, 2, 3]])).logits\n"
        "assert out.shape == (1, 3, 64)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
