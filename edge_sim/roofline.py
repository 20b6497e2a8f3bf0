"""A roofline cost model of serving a full-size model on a PoP's GPUs.

The model is an engine.arch.architecture.Architecture, the description the engine builds its models
from (the built-in full-size ones are in edge_sim.target_models). Parameter counts are computed
from it (every linear layer, with its shape), so weight bytes in each format include the
format's scales exactly as our engine stores them. KV bytes per token come from the engine's own
cache layout (`PagedKVCache.layout_bytes` over the architecture's `kv_components`), so the
simulator, the planner and the engine agree on capacity.

Time model (one continuous-batching step that processes T tokens, on N GPUs):

    compute = (2 * active linear params * T + attention FLOPs) / (N * peak * mfu)
    memory  = (weight bytes read + KV bytes read) / (N * hbm_bandwidth * mbu)
    step    = max(compute, memory) + communication

* Weight bytes read: every dense weight (attention, dense MLP, shared experts, LM head, router),
  plus the routed experts the step's tokens hit: for T tokens each picking k of E experts, the
  expected number of distinct experts per MoE layer is E * (1 - (1 - k/E)^T).
* Attention FLOPs: per (query, key) pair and layer, 2 * heads * (qk_dim + v_dim). Prefill runs
  MLA unabsorbed (qk 192, v 128 for Kimi K2); decode runs it absorbed over the 512-wide latent
  plus the 64-wide rope key (DeepSeek's serving form). GQA uses head_dim for both.
* Peaks: the fp8 datasheet peak for the linear layers when the weights are fp8 (W8A8, as DeepSeek
  serves), the bf16 peak otherwise (int8 and int4 are weight-only: dequantized to bf16 in the
  matmul); attention always at the bf16 peak (the KV cache is dequantized to bf16).
* Efficiencies (defaults): mfu 0.5 of peak FLOPs, mbu 0.8 of datasheet HBM bandwidth; both are
  typical of well-tuned serving engines and can be changed.
* Parallel layout: routed experts are split over all N GPUs (expert parallel); dense MLP, shared
  experts and the LM head are tensor parallel over N; attention is tensor parallel up to the
  number of KV heads (GQA) and data parallel beyond that; MLA (one latent "head") runs data
  parallel attention (SGLang/DeepSeek style): attention weights replicated, each GPU holding the
  KV of its own sequences. Either way the KV cache is split without replication.
* Communication, when N > 1: two collectives per layer (after attention and after the MLP/MoE:
  an all-reduce or an all-to-all of the same size), each costing a fixed latency plus
  2 * (N - 1) / N * T * hidden * 2 bytes over the GPU link (NVLink or PCIe), not overlapped.
"""

from __future__ import annotations

import functools
import math

import msgspec

from edge_sim.step_cost import RooflineStepTimes
from edge_sim.topology import GPU_TYPES, GPUType
from engine.arch.architecture import Architecture

__all__ = [
    "WEIGHT_FORMATS",  # noqa: F822 (module __getattr__, from the format table)
    "Efficiency",
    "RooflineModel",
    "SimulationError",
    "gpu_type",
    "kv_layout",
]

COMPRESSIBLE_PARTS = ("routed_experts", "shared_experts", "dense_mlp", "attention")
GIB = 2**30

# GPU-to-GPU link per direction (GB/s) and the fixed cost of one collective (us): NVLink for the
# SXM parts, PCIe Gen4 x16 for the PCIe cards. Datasheet-order numbers, used only by the
# communication term.
LINK_GBS = {"H100-SXM": 450.0, "H200": 450.0, "A100-80G": 300.0, "L40S": 32.0, "L4": 32.0}
LINK_LATENCY_US = {"H100-SXM": 5.0, "H200": 5.0, "A100-80G": 6.0, "L40S": 15.0, "L4": 15.0}


def __getattr__(name: str):
    # WEIGHT_FORMATS / KV_DTYPES come from kernels.formats, imported only when used: the table
    # brings torch with it, and importing this module (runtime.ai.catalog, the CLI) does not need it.
    if name in ("WEIGHT_FORMATS", "KV_DTYPES"):
        from kernels import formats

        return getattr(formats, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SimulationError(ValueError):
    """Bad input to the simulator or the planner (unknown model, GPU, city; negative rates ...).

    The message names the entry and says what to change."""


def gpu_type(name: str, prices: dict[str, float] | None = None) -> GPUType:
    """The datasheet entry for a GPU type (case-insensitive), with an optional price override."""
    by_fold = {k.lower(): v for k, v in GPU_TYPES.items()}
    gpu = by_fold.get(name.strip().lower())
    if gpu is None:
        raise SimulationError(f"unknown GPU type {name!r}; known types: {', '.join(GPU_TYPES)}")
    if prices and gpu.name in prices:
        gpu = msgspec.structs.replace(gpu, price_per_hour=float(prices[gpu.name]))
    return gpu


def check_weights(fmt: str) -> str:
    from kernels.formats import WEIGHT_FORMATS

    if fmt not in WEIGHT_FORMATS:
        raise SimulationError(f"unknown weight format {fmt!r}; use one of {', '.join(WEIGHT_FORMATS)}")
    return fmt


def check_kv(kv: str) -> str:
    from kernels.formats import KV_DTYPES

    if kv not in KV_DTYPES:
        raise SimulationError(f"unknown KV cache dtype {kv!r}; use one of {', '.join(KV_DTYPES)}")
    return kv


# --- parameters and bytes ---------------------------------------------------------------------

Matrix = tuple[int, int, int]  # (in_features, out_features, how many in the whole model)


def linear_shapes(m: Architecture) -> dict[str, list[Matrix]]:
    """Every linear layer of the model by part: (in, out, count)."""
    h, L, moe = m.hidden_size, m.num_layers, m.moe_layers
    if m.attention == "mla":
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = [(h, m.q_lora_rank, L), (m.q_lora_rank, m.num_heads * qk, L)]
        else:
            q = [(h, m.num_heads * qk, L)]
        attention = [
            *q,
            (h, m.kv_lora_rank + m.qk_rope_head_dim, L),  # kv_a_proj_with_mqa
            (m.kv_lora_rank, m.num_heads * (m.qk_nope_head_dim + m.v_head_dim), L),  # kv_b_proj
            (m.num_heads * m.v_head_dim, h, L),  # o_proj
        ]
    else:
        hd = m.head_dim
        attention = [
            (h, m.num_heads * hd, L),
            (h, m.num_kv_heads * hd, 2 * L),  # k_proj, v_proj
            (m.num_heads * hd, h, L),
        ]
    mlp = lambda inter, count: [(h, inter, 2 * count), (inter, h, count)]  # noqa: E731 gate, up; down
    return {
        "attention": attention,
        "dense_mlp": mlp(m.dense_intermediate, m.first_dense_layers),
        "shared_experts": mlp(m.moe_intermediate * m.n_shared_experts, moe) if m.n_shared_experts else [],
        "routed_experts": mlp(m.moe_intermediate, moe * m.n_routed_experts),
    }


def matrix_bytes(fmt: str, n_in: int, n_out: int) -> float:
    """Bytes of one linear weight stored in `fmt`, scales included: kernels.formats' entry, the
    same count the checkpoint tools report (engine.load.checkpoint.format_nbytes)."""
    from kernels.formats import WEIGHT

    check_weights(fmt)
    return float(WEIGHT[fmt].nbytes((n_out, n_in)))


class WeightBytes(msgspec.Struct, frozen=True):
    """Parameters and stored bytes per part for one weight format."""

    params: dict[str, int]
    bytes: dict[str, float]

    @property
    def total_params(self) -> int:
        return sum(self.params.values())

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes.values())


def weight_bytes(
    m: Architecture, fmt: str = "bf16", parts: tuple[str, ...] = COMPRESSIBLE_PARTS
) -> WeightBytes:
    """Parameters and bytes per part; `fmt` applies to the linear weights of `parts`, everything
    else (embeddings, LM head, router, norms, biases) stays bf16."""
    check_weights(fmt)
    params: dict[str, int] = {}
    nbytes: dict[str, float] = {}
    for part, mats in linear_shapes(m).items():
        params[part] = sum(i * o * n for i, o, n in mats)
        f = fmt if part in parts else "bf16"
        nbytes[part] = sum(matrix_bytes(f, i, o) * n for i, o, n in mats)
    h = m.hidden_size
    params["embeddings"] = m.vocab_size * h
    params["lm_head"] = 0 if m.tie_embeddings else m.vocab_size * h
    # router weights plus the e_score_correction_bias, per MoE layer
    params["router"] = m.moe_layers * (m.n_routed_experts * h + m.n_routed_experts)
    norms = m.num_layers * 2 * h + h
    if m.attention == "mla":
        norms += m.num_layers * ((m.q_lora_rank or 0) + m.kv_lora_rank)
    elif m.attention_bias:
        norms += m.num_layers * (m.num_heads + 2 * m.num_kv_heads) * m.head_dim  # q/k/v biases
    params["norms_biases"] = norms
    for part in ("embeddings", "lm_head", "router", "norms_biases"):
        nbytes[part] = 2.0 * params[part]
    return WeightBytes(params, nbytes)


def active_params(m: Architecture) -> int:
    """Parameters one token multiplies by (k routed + shared experts; LM head included)."""
    p = weight_bytes(m).params
    per_expert = p["routed_experts"] / max(1, m.moe_layers * m.n_routed_experts)
    routed = m.moe_layers * m.experts_per_token * per_expert
    return int(p["attention"] + p["dense_mlp"] + p["shared_experts"] + routed + p["lm_head"] + p["router"])


@functools.lru_cache(maxsize=64)
def kv_layout(m: Architecture, kv: str) -> tuple[int, int]:
    """(bytes of one 16-token block over all layers, bytes of one sequence's staging slot), with
    bf16 as the dense dtype: exactly what engine.kv.kv_cache.PagedKVCache allocates."""
    import torch

    from engine.errors import InvalidRequestError
    from engine.kv.kv_cache import PagedKVCache

    check_kv(kv)
    try:
        return PagedKVCache.layout_bytes(m.kv_components, m.num_layers, kv, torch.bfloat16)
    except InvalidRequestError as exc:
        raise SimulationError(f"KV dtype {kv!r} does not fit model {m.name}: {exc}") from None


def kv_bytes_per_token(m: Architecture, kv: str) -> float:
    from engine.kv.kv_cache import BLOCK_SIZE

    return kv_layout(m, kv)[0] / BLOCK_SIZE


def staging_blocks(m: Architecture, kv: str) -> int:
    block, staging = kv_layout(m, kv)
    return math.ceil(staging / block) if staging else 0


# --- the time model ---------------------------------------------------------------------------


class Efficiency(msgspec.Struct, frozen=True):
    mfu: float = 0.5  # fraction of datasheet peak FLOPs reached by the matmuls
    mbu: float = 0.8  # fraction of datasheet HBM bandwidth reached by weight and KV reads

    def __post_init__(self) -> None:
        for name in ("mfu", "mbu"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise SimulationError(f"efficiency {name} must be in (0, 1], got {value!r}")


class RooflineModel:
    """Step times of `model` on `gpus` GPUs of one type, for one weight format and KV dtype."""

    def __init__(
        self,
        model: Architecture,
        gpu: GPUType,
        gpus: int,
        weights: str,
        kv: str,
        efficiency: Efficiency | None = None,
        parts: tuple[str, ...] = COMPRESSIBLE_PARTS,
    ):
        if gpus < 1:
            raise SimulationError(f"a layout needs at least one GPU, got {gpus}")
        self.model, self.gpu, self.gpus = model, gpu, gpus
        self.weights, self.kv = check_weights(weights), check_kv(kv)
        self.eff = efficiency or Efficiency()
        m = model
        wb = weight_bytes(m, weights, parts)
        self.weight_bytes = wb
        n = gpus
        # Attention: tensor parallel up to the KV heads, data parallel beyond (MLA: all DP).
        self.attn_tp = max(1, math.gcd(n, m.kv_heads)) if m.attention == "gqa" else 1
        self.attn_dp = n // self.attn_tp
        b = wb.bytes
        self.attention_bytes = b["attention"]
        self.expert_bytes = b["routed_experts"] / max(1, m.moe_layers * m.n_routed_experts)
        # Read every step regardless of the batch (embedding rows are negligible, not counted).
        dense = b["dense_mlp"] + b["shared_experts"] + b["lm_head"] + b["router"] + b["norms_biases"]
        self.dense_bytes_per_gpu = b["attention"] / self.attn_tp + dense / n
        self.weight_bytes_per_gpu = self.dense_bytes_per_gpu + (b["routed_experts"] + b["embeddings"]) / n
        self.kv_bpt = kv_bytes_per_token(m, kv)
        self.kv_block_bytes, self.kv_staging_bytes = kv_layout(m, kv)
        self.staging_blocks = staging_blocks(m, kv)

        p = wb.params
        per_expert = p["routed_experts"] / max(1, m.moe_layers * m.n_routed_experts)
        routed_active = m.moe_layers * m.experts_per_token * per_expert
        linear = p["attention"] + p["dense_mlp"] + p["shared_experts"] + routed_active + p["router"]
        self.flops_per_token = 2.0 * linear
        self.flops_per_sample = 2.0 * m.vocab_size * m.hidden_size  # LM head, sampled rows only
        if m.attention == "mla":
            qk, v = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
            self.pair_flops_prefill = 2.0 * m.num_heads * (qk + v) * m.num_layers
            absorbed = m.kv_lora_rank + m.qk_rope_head_dim + m.kv_lora_rank
            self.pair_flops_decode = 2.0 * m.num_heads * absorbed * m.num_layers
        else:
            self.pair_flops_prefill = self.pair_flops_decode = (
                2.0 * m.num_heads * 2 * m.head_dim * m.num_layers
            )

        fp8_linear = weights == "fp8"
        tflops = gpu.fp8_tflops if fp8_linear else gpu.bf16_tflops
        # Per-ms rates of the whole layout.
        self._lin_rate = tflops * 1e12 * self.eff.mfu * n / 1e3
        self._attn_rate = gpu.bf16_tflops * 1e12 * self.eff.mfu * n / 1e3
        self._bw = gpu.hbm_bandwidth_gbs * 1e9 * self.eff.mbu / 1e3  # bytes per ms per GPU
        self._experts, self._k = m.n_routed_experts, m.experts_per_token
        self._moe_expert_bytes = m.moe_layers * self.expert_bytes  # one expert in every MoE layer
        if n > 1:
            link = LINK_GBS.get(gpu.name, 32.0) * 1e9 / 1e3
            self._comm_fixed = 2 * m.num_layers * LINK_LATENCY_US.get(gpu.name, 15.0) / 1e3
            self._comm_per_token = 2 * m.num_layers * 2 * (n - 1) / n * m.hidden_size * 2 / link
        else:
            self._comm_fixed = self._comm_per_token = 0.0
        # step_ms's coefficients, folded (ms): compute per token, per sampled row, per prefill
        # pair, per decode KV token; memory fixed, all-experts bytes, (1 - k/E), per KV token;
        # communication fixed, per token.
        e, k = self._experts, self._k
        self._c = (
            self.flops_per_token / self._lin_rate,
            self.flops_per_sample / self._lin_rate,
            self.pair_flops_prefill / self._attn_rate,
            self.pair_flops_decode / self._attn_rate,
            self.dense_bytes_per_gpu / self._bw,
            e * self._moe_expert_bytes / n / self._bw,
            (1.0 - k / e) if e else 1.0,
            self.kv_bpt / n / self._bw,
            self._comm_fixed,
            self._comm_per_token,
        )
        self.times = RooflineStepTimes(self._c)
        # step_ms(prefill tokens, prefill pairs, prefill KV, decode seqs, decode KV) and
        # decode_ms(batch, KV tokens), in ms: the folded formula (edge_sim.step_cost)
        self.step_ms, self.decode_ms = self.times.step_ms, self.times.decode_ms

    def distinct_experts(self, tokens: float) -> float:
        """Expected distinct routed experts per MoE layer hit by `tokens` tokens (uniform routing)."""
        e, k = self._experts, self._k
        if tokens <= 0 or e == 0:
            return 0.0
        return e * (1.0 - (1.0 - k / e) ** tokens)

    def prefill_ms(self, tokens: int, chunk: int = 8192, context: int = 0) -> float:
        """Prefill of a `tokens`-long prompt alone, in chunks of `chunk` (chunked prefill)."""
        total, start = 0.0, context
        end = context + tokens
        while start < end:
            n = min(chunk, end - start)
            total += self.step_ms(n, n * (start + (n + 1) / 2), start + n, 0, 0)
            start += n
        return total

    def kv_capacity_tokens(self, usable_fraction: float = 0.9) -> int:
        """Tokens of KV the layout holds after the weights (whole blocks), 0 if weights do not fit."""
        free = self.gpu.memory_gib * GIB * usable_fraction - self.weight_bytes_per_gpu
        if free <= 0:
            return 0
        from engine.kv.kv_cache import BLOCK_SIZE

        return int(free * self.gpus // self.kv_block_bytes) * BLOCK_SIZE
