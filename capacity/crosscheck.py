"""The roofline against published serving numbers for these models (or their architecture's
twin, DeepSeek-V3, which Kimi K2 copies with 384 experts and 64 heads) on H100 and H200.

Each point names its source, what was measured, and how our number for the same configuration
is computed; `gap` is ours / theirs. The published runs are not ours to repeat, and most do not
state their batch, so ours is taken at the batch the memory holds (at most MAX_BATCH_PER_GPU
sequences per GPU), or at the published batch where one is given or follows from the published
throughput and inter-token latency (Little's law).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from capacity.planner import min_layout
from edge_sim.roofline import RooflineModel, gpu_type
from edge_sim.target_models import target_model
from engine.arch.architecture import Architecture, describe
from engine.arch.config import parse_config

__all__ = ["DEEPSEEK_V3", "POINTS", "CrossCheck", "cross_check"]

MAX_BATCH_PER_GPU = 256

# deepseek-ai/DeepSeek-V3 config.json (the fields the engine reads)
DEEPSEEK_V3: Architecture = describe(
    parse_config(
        {
            "model_type": "deepseek_v3",
            "hidden_size": 7168,
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "vocab_size": 129280,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "n_routed_experts": 256,
            "num_experts_per_tok": 8,
            "n_shared_experts": 1,
            "first_k_dense_replace": 3,
            "max_position_embeddings": 163840,
            "q_lora_rank": 1536,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
        },  # fmt: skip
        "deepseek-ai/DeepSeek-V3 config.json",
    ),
    "deepseek-v3",
)


class CrossCheck(msgspec.Struct):
    source: str  # URL
    claim: str  # what the source reports, in its words' substance
    config: str  # the configuration both numbers are for
    metric: str
    theirs: float
    ours: float
    how: str  # how ours was computed

    @property
    def gap(self) -> float:
        return self.ours / self.theirs


def _decode_per_gpu(r: RooflineModel, context: int, batch: int | None = None) -> tuple[float, int, float]:
    """(output tokens/s per GPU, batch, TPOT ms) of decode at `batch` sequences of `context` tokens,
    or at the most the KV holds (capped at MAX_BATCH_PER_GPU per GPU)."""
    if batch is None:
        batch = min(r.kv_capacity_tokens() // context, MAX_BATCH_PER_GPU * r.gpus)
    tpot = r.decode_ms(batch, batch * context)
    return batch * 1000.0 / tpot / r.gpus, batch, tpot


def _k2_min_gpus() -> CrossCheck:
    r = min_layout(target_model("kimi-k2"), "H100-SXM", "fp8", "auto", 131072, 1)
    return CrossCheck(
        "https://docs.vllm.ai/projects/recipes/en/latest/moonshotai/Kimi-K2.html",
        "the smallest deployment unit for Kimi-K2 FP8 weights with 128k seqlen on H800 is 16 GPUs",
        "Kimi K2, fp8 weights, one 131,072-token sequence, 80 GB GPUs (H800 = H100 memory)",
        "GPUs",
        16.0,
        float(r.gpus if r else 0),
        "edge plan's smallest layout on H100-SXM (80 GiB, 90% usable), KV bf16",
    )


def _lmsys_h100_decode() -> CrossCheck:
    # 22.3k output tokens/s per node of 8 H100 on the 9 decode nodes (EP72), 2,000-token inputs;
    # the post gives the decode inter-token latency as about 100 ms: 22.3k x 0.1 s in flight per node
    r = RooflineModel(DEEPSEEK_V3, gpu_type("H100-SXM"), 72, "fp8", "auto")
    batch = int(22_300 * 0.1 * 9)
    per_gpu, _, tpot = _decode_per_gpu(r, 2000 + 100, batch)
    return CrossCheck(
        "https://lmsys.org/blog/2025-05-05-large-scale-ep/",
        "SGLang, prefill-decode disaggregation and EP72 decode: 22.3k output tokens/s per 8-H100 node, "
        "2,000-token inputs (inter-token latency about 100 ms)",
        "DeepSeek-V3, fp8, 72 H100 decoding (EP72, DP attention)",
        "output tokens/s per node",
        22_300.0,
        per_gpu * 8,
        f"roofline decode of {batch:,} sequences of 2,100 tokens on 72 H100 (the published rate x "
        f"100 ms in flight); our TPOT there {tpot:.0f} ms",
    )


def _vllm_h200_wide_ep() -> CrossCheck:
    r = RooflineModel(DEEPSEEK_V3, gpu_type("H200"), 16, "fp8", "auto")
    per_gpu, batch, tpot = _decode_per_gpu(r, 2048)
    return CrossCheck(
        "https://blog.vllm.ai/2025/12/17/large-scale-serving.html",
        "vLLM wide-EP, multi-node H200 with InfiniBand: sustained 2.2k tokens/s per H200 (DeepSeek)",
        "DeepSeek-V3 family, fp8, H200, DP attention + EP (batch and lengths not stated)",
        "tokens/s per GPU",
        2_200.0,
        per_gpu,
        f"roofline decode on 16 H200 at the {batch:,} sequences of 2,048 tokens their KV holds "
        f"(<= {MAX_BATCH_PER_GPU}/GPU); our TPOT there {tpot:.0f} ms",
    )


def _gpustack_glm_h200() -> CrossCheck:
    # "Long prompt" (4,000 input, 200 output tokens), SGLang --tp 4 on H200, GLM-4.6-FP8 (the
    # GLM-4.5 architecture): total 14,979.90 tokens/s, mean TPOT 97.74 ms
    theirs = 14_979.90 * 200 / 4200
    r = RooflineModel(target_model("glm-4.5"), gpu_type("H200"), 4, "fp8", "auto")
    batch = int(theirs * 0.09774)  # Little's law: sequences decoding at their rate and TPOT
    per_gpu, _, tpot = _decode_per_gpu(r, 4100, batch)
    return CrossCheck(
        "https://docs.gpustack.ai/latest/performance-lab/glm-4.6/h200",
        "SGLang --tp 4, GLM-4.6-FP8 on H200, 4,000-token prompts and 200-token outputs: total 14,979.9 "
        "tokens/s, mean TPOT 97.74 ms",
        "GLM-4.5/4.6 architecture, fp8, 4 H200 (TP4), KV bf16",
        "output tokens/s per 4 GPUs",
        theirs,
        per_gpu * 4,
        f"roofline decode of the {batch} sequences of 4,100 tokens their rate x TPOT keeps in flight, "
        f"decode only (their TPOT also carries the 4,000-token prefills); our TPOT there {tpot:.1f} ms",
    )


POINTS: tuple[Callable[[], CrossCheck], ...] = (
    _k2_min_gpus,
    _lmsys_h100_decode,
    _vllm_h200_wide_ep,
    _gpustack_glm_h200,
)


def cross_check() -> list[CrossCheck]:
    return [point() for point in POINTS]


def format_cross_check(points: list[CrossCheck]) -> str:
    lines = [
        "| source | configuration | metric | theirs | ours | ours / theirs |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for p in points:
        lines.append(
            f"| {p.source} | {p.config} | {p.metric} | {p.theirs:,.0f} | {p.ours:,.0f} | {p.gap:.2f} |"
        )
    lines.append("")
    lines += [f"- {p.source}: {p.claim}. Ours: {p.how}." for p in points]
    return "\n".join(lines)
