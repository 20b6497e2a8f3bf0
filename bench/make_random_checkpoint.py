"""A seeded random-weight checkpoint at a mid-size shape, in the hub's layout, for the benchmarks
where bandwidth rules (a miniature's step is bound by per-op overhead; a user's real model by the
bytes of its active weights).

    python bench/make_random_checkpoint.py --arch kimi --out bench/out/mid-kimi
    python bench/make_random_checkpoint.py --arch glm  --out bench/out/mid-glm

transformers writes it (DeepseekV3ForCausalLM / Glm4MoeForCausalLM, `save_pretrained` in bf16), so
the names and config.json are the hub's; the shipped miniature of the same layout gives its tokenizer
and its vocabulary size (4,128, its chat markers included). About 0.9B parameters each, 1.8 GB; write
it into an ignored folder (bench/out/),
never commit it. Unsigned: load it with `allow_unsigned=True`. Random weights give nearly flat
logits, so compare speed on it, and agreement only as top-1 agreement.

The shapes (stated so a run can be repeated):
- kimi (DeepSeek-V3 layout): hidden 1024, 12 layers (the first dense, intermediate 2816), MLA
  with 16 heads, no q-LoRA, kv_lora_rank 256, rope 32 / nope 64 / v 64; 48 routed experts of
  width 512, top-4 (8 groups, top 4), 1 shared expert.
- glm (GLM-4.5 layout): hidden 1024, 12 layers (the first dense, intermediate 2816), GQA with 16
  heads of 64 and 4 KV heads, half rotary, QK norm, attention bias; 48 routed experts of width 512,
  top-4, 1 shared expert.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
# each layout takes its own miniature's tokenizer (GLM's markers for GLM: llama.cpp's converter looks
# them up) and that miniature's vocabulary size, ids of its special tokens included
MINIATURE = {"kimi": REPO / "models" / "kimi-k2-mini", "glm": REPO / "models" / "glm-4.5-mini"}

COMMON = dict(
    hidden_size=1024,
    intermediate_size=2816,
    moe_intermediate_size=512,
    num_hidden_layers=12,
    num_attention_heads=16,
    n_shared_experts=1,
    n_routed_experts=48,
    num_experts_per_tok=4,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
ARCHS = {
    "kimi": dict(
        num_key_value_heads=16,
        n_group=8,
        topk_group=4,
        q_lora_rank=None,
        kv_lora_rank=256,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=64,
    ),
    "glm": dict(
        num_key_value_heads=4,
        head_dim=64,
        n_group=1,
        topk_group=1,
        attention_bias=True,
        use_qk_norm=True,
        partial_rotary_factor=0.5,
    ),
}


def make(arch: str, out: Path, seed: int) -> int:
    """Write the checkpoint; its parameter count."""
    if arch == "kimi":
        from transformers import DeepseekV3Config as Config
        from transformers import DeepseekV3ForCausalLM as Model
    else:
        from transformers import Glm4MoeConfig as Config
        from transformers import Glm4MoeForCausalLM as Model
    torch.manual_seed(seed)
    shipped = json.loads((MINIATURE[arch] / "config.json").read_text())
    tokens = {k: shipped[k] for k in ("vocab_size", "eos_token_id", "bos_token_id") if k in shipped}
    config = Config(**COMMON, **ARCHS[arch], **tokens)
    config.scoring_func, config.topk_method = "sigmoid", "noaux_tc"  # as the published configs say
    model = Model(config).eval().to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MINIATURE[arch] / name, out / name)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(ARCHS), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    params = make(args.arch, args.out, args.seed)
    took = time.perf_counter() - started
    print(f"{args.arch}: {params / 1e9:.2f}B parameters in {args.out} ({took:.0f} s)")


if __name__ == "__main__":
    main()
