"""Placement planner: how many GPUs of a type a model needs for weights plus KV, in what parallel
layout, and what decode speed and cost per million tokens the roofline model gives it.

Layout sizes are 1, 2, 4 or 8 GPUs (one node), then whole nodes of 8 (16, 24, 32, ...). A layout
fits when, on every GPU, its share of the weights plus its share of the KV cache for
`concurrency` sequences of `context` tokens (whole 16-token blocks, plus the staging slot the
fp8/int4 formats keep per sequence) is at most `usable_fraction` (default 0.9) of the GPU's
memory; the rest is left to activations, the CUDA context and fragmentation.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from edge_sim.roofline import (
    COMPRESSIBLE_PARTS,
    GIB,
    Efficiency,
    RooflineModel,
    SimulationError,
    active_params,
    check_kv,
    check_weights,
    gpu_type,
)
from edge_sim.target_models import target_model
from engine.arch.architecture import Architecture

__all__ = ["LayoutOption", "Plan", "SimulationError", "layout_sizes", "min_layout", "plan"]

MAX_GPUS = 1024
DEFAULT_USABLE_FRACTION = 0.9
DEFAULT_PREFILL_CHUNK = 8192


def layout_sizes(limit: int = MAX_GPUS) -> list[int]:
    """GPU counts a layout may use: powers of two up to a node of 8, then multiples of 8."""
    sizes = [n for n in (1, 2, 4, 8) if n <= limit]
    sizes += list(range(16, limit + 1, 8))
    return sizes


def _blocks_per_seq(tokens: int, staging: int) -> int:
    from engine.kv.kv_cache import BLOCK_SIZE

    return -(-tokens // BLOCK_SIZE) + staging


def kv_bytes_needed(r: RooflineModel, context: int, concurrency: int) -> float:
    return concurrency * _blocks_per_seq(context, r.staging_blocks) * r.kv_block_bytes


def fits(r: RooflineModel, context: int, concurrency: int, usable_fraction: float) -> bool:
    per_gpu = r.weight_bytes_per_gpu + kv_bytes_needed(r, context, concurrency) / r.gpus
    return per_gpu <= r.gpu.memory_gib * GIB * usable_fraction


def min_layout(
    model: Architecture,
    gpu_name: str,
    weights: str,
    kv: str,
    context: int,
    concurrency: int = 1,
    max_gpus: int = MAX_GPUS,
    usable_fraction: float = DEFAULT_USABLE_FRACTION,
    efficiency: Efficiency | None = None,
    prices: dict[str, float] | None = None,
    parts: tuple[str, ...] = COMPRESSIBLE_PARTS,
) -> RooflineModel | None:
    """The smallest layout of at most `max_gpus` GPUs that holds the weights and the KV of
    `concurrency` sequences of `context` tokens; None when none does."""
    gpu = gpu_type(gpu_name, prices)
    for n in layout_sizes(max_gpus):
        r = RooflineModel(model, gpu, n, weights, kv, efficiency, parts)
        if fits(r, context, concurrency, usable_fraction):
            return r
    return None


class LayoutOption(msgspec.Struct):
    gpus: int
    tensor_parallel_attention: int
    data_parallel_attention: int
    expert_parallel: int
    tensor_parallel_mlp: int
    weights_gib_per_gpu: float
    kv_gib_per_gpu: float
    max_concurrency: int  # sequences of `context` tokens the free memory holds
    decode_tpot_ms: float
    decode_tokens_per_s: float
    prefill_ms: float  # one `context`-token prompt alone, chunked
    cost_per_million_tokens: float  # output tokens at `concurrency`, GPUs priced per hour


class Plan(msgspec.Struct):
    model: str
    gpu: str
    weights: str
    kv: str
    context: int
    concurrency: int
    total_params_b: float
    active_params_b: float
    weight_gib: float
    kv_bytes_per_token: float
    kv_gib: float  # concurrency x context, whole blocks and staging slots
    gpu_memory_gib: float
    usable_fraction: float
    price_per_gpu_hour: float
    mfu: float
    mbu: float
    layout: LayoutOption
    alternatives: list[LayoutOption]
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK  # tokens per step (chunked prefill)


def _option(
    r: RooflineModel, context: int, concurrency: int, usable_fraction: float, chunk: int
) -> LayoutOption:
    kv_total = kv_bytes_needed(r, context, concurrency)
    per_seq = kv_bytes_needed(r, context, 1)
    free = (r.gpu.memory_gib * GIB * usable_fraction - r.weight_bytes_per_gpu) * r.gpus
    tpot = r.decode_ms(concurrency, concurrency * context)
    tokens_per_s = concurrency * 1000.0 / tpot
    cost = r.gpus * r.gpu.price_per_hour / (tokens_per_s * 3600.0) * 1e6
    return LayoutOption(
        gpus=r.gpus,
        tensor_parallel_attention=r.attn_tp,
        data_parallel_attention=r.attn_dp,
        expert_parallel=r.gpus,
        tensor_parallel_mlp=r.gpus,
        weights_gib_per_gpu=r.weight_bytes_per_gpu / GIB,
        kv_gib_per_gpu=kv_total / r.gpus / GIB,
        max_concurrency=max(0, int(free // per_seq)),
        decode_tpot_ms=tpot,
        decode_tokens_per_s=tokens_per_s,
        prefill_ms=r.prefill_ms(context, chunk),
        cost_per_million_tokens=cost,
    )


def plan(
    model: str | Path | Architecture,
    gpu: str = "H200",
    weights: str = "fp8",
    kv: str = "auto",
    context: int = 131072,
    concurrency: int = 64,
    *,
    usable_fraction: float = DEFAULT_USABLE_FRACTION,
    efficiency: Efficiency | None = None,
    prices: dict[str, float] | None = None,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    alternatives: int = 3,
) -> Plan:
    """GPUs needed for weights plus KV, the layout, modeled decode speed and cost."""
    m = model if isinstance(model, Architecture) else target_model(model)
    g = gpu_type(gpu, prices)
    check_weights(weights)
    check_kv(kv)
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise SimulationError(f"context must be a positive number of tokens, got {context!r}")
    if context > m.max_context:
        raise SimulationError(f"context {context} exceeds {m.name}'s {m.max_context}-token context window")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise SimulationError(f"concurrency must be a positive number of sequences, got {concurrency!r}")
    if not 0.0 < usable_fraction <= 1.0:
        raise SimulationError(f"usable memory fraction must be in (0, 1], got {usable_fraction!r}")
    best = min_layout(
        m, g.name, weights, kv, context, concurrency, MAX_GPUS, usable_fraction, efficiency, prices
    )
    if best is None:
        raise SimulationError(
            f"{m.name} with {weights} weights and {concurrency} x {context} tokens of {kv} KV does not fit "
            f"in {MAX_GPUS} {g.name} GPUs; lower the concurrency or context, or compress further"
        )
    sizes = [n for n in layout_sizes(MAX_GPUS) if n > best.gpus][: max(0, alternatives)]
    others = [RooflineModel(m, g, n, weights, kv, efficiency) for n in sizes]
    options = [_option(r, context, concurrency, usable_fraction, prefill_chunk) for r in (best, *others)]
    wb = best.weight_bytes
    return Plan(
        model=m.name,
        gpu=g.name,
        weights=weights,
        kv=kv,
        context=context,
        concurrency=concurrency,
        total_params_b=wb.total_params / 1e9,
        active_params_b=active_params(m) / 1e9,
        weight_gib=wb.total_bytes / GIB,
        kv_bytes_per_token=best.kv_bpt,
        kv_gib=kv_bytes_needed(best, context, concurrency) / GIB,
        gpu_memory_gib=g.memory_gib,
        usable_fraction=usable_fraction,
        price_per_gpu_hour=g.price_per_hour,
        mfu=best.eff.mfu,
        mbu=best.eff.mbu,
        layout=options[0],
        alternatives=options[1:],
        prefill_chunk=prefill_chunk,
    )


def _params(billions: float) -> str:
    return f"{billions:.1f}B" if billions >= 1 else f"{billions * 1000:.1f}M"


def _size(gib: float) -> str:
    if gib >= 1:
        return f"{gib:.1f} GiB"
    if gib * 1024 >= 1:
        return f"{gib * 1024:.1f} MiB"
    return f"{gib * 2**20:.1f} KiB"


def _money(x: float) -> str:
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3g}"


def format_plan(p: Plan) -> str:
    """The plan as a terminal report."""
    lay = p.layout
    lines = [
        f"edge plan: {p.model} ({_params(p.total_params_b)} parameters, {_params(p.active_params_b)} active)"
        f" on {p.gpu}",
        f"  weights {p.weights}: {_size(p.weight_gib)}; KV {p.kv}: {p.kv_bytes_per_token:,.0f} bytes/token, "
        f"{p.concurrency} x {p.context:,} tokens = {_size(p.kv_gib)}",
        f"  GPUs needed: {lay.gpus} x {p.gpu} ({p.gpu_memory_gib:.0f} GiB each, "
        f"{p.usable_fraction:.0%} usable)",
        f"  layout: attention TP {lay.tensor_parallel_attention} x DP {lay.data_parallel_attention}, "
        f"experts EP {lay.expert_parallel}, dense MLP / shared experts / LM head TP "
        f"{lay.tensor_parallel_mlp}",
        f"  per GPU: weights {_size(lay.weights_gib_per_gpu)} + KV {_size(lay.kv_gib_per_gpu)}; "
        f"room for {lay.max_concurrency:,} sequences of {p.context:,} tokens",
        f"  decode at {p.concurrency} x {p.context:,}: TPOT {lay.decode_tpot_ms:.1f} ms, "
        f"{lay.decode_tokens_per_s:,.0f} tokens/s; prefill of {p.context:,} tokens "
        f"{lay.prefill_ms / 1000:.2f} s",
        f"  cost: ${_money(lay.cost_per_million_tokens)} per million output tokens "
        f"(${p.price_per_gpu_hour:.2f}/GPU-hour, fully busy; roofline mfu {p.mfu}, mbu {p.mbu})",
    ]
    if p.alternatives:
        lines.append("")
        lines.append("  GPUs  TPOT ms  tokens/s  $/M tokens  max concurrency")
        for o in (lay, *p.alternatives):
            lines.append(
                f"  {o.gpus:4d}  {o.decode_tpot_ms:7.1f}  {o.decode_tokens_per_s:8,.0f}  "
                f"{_money(o.cost_per_million_tokens):>10}  {o.max_concurrency:15,d}"
            )
    return "\n".join(lines)
