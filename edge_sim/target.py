"""Roofline-modeled times for a catalog entry's full-size target, beside the measured ones.

The engine at a PoP runs a miniature; a catalog entry may name the model it stands for (say the
full Kimi K2 at FP8) and the account then also says how long this request's prefill and decode
would take on the PoP's own GPUs, from their datasheet roofline (`edge_sim.roofline`).
"""

from __future__ import annotations

import functools

import msgspec

from edge_sim.roofline import (
    Efficiency,
    RooflineModel,
    SimulationError,
    check_kv,
    check_weights,
    gpu_type,
)
from edge_sim.target_models import target_model
from edge_sim.topology import PoP


class TargetSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: str  # kimi-k2, glm-4.5, or a folder with a full-size config.json
    weights: str = "fp8"
    kv: str = "auto"
    gpu: str | None = None  # default: the PoP's GPU type
    gpus: int | None = None  # default: every GPU of that type at the PoP
    mfu: float = 0.5
    mbu: float = 0.8

    def check(self) -> TargetSpec:
        """Raise SimulationError naming the field when the spec cannot be modeled."""
        target_model(self.model)
        check_weights(self.weights)
        check_kv(self.kv)
        if self.gpu is not None:
            gpu_type(self.gpu)
        if self.gpus is not None and self.gpus < 1:
            raise SimulationError(f"target.gpus must be at least 1, got {self.gpus}")
        Efficiency(self.mfu, self.mbu)
        return self


class ModeledTimes(msgspec.Struct, kw_only=True):
    target: str  # e.g. "kimi-k2 fp8 weights, auto KV on 8 x H200"
    fits: bool  # whether the weights fit those GPUs at all; times are None when not
    batch: int  # sequences assumed to decode together (the PoP's in-flight count)
    prefill_ms: float | None = None
    decode_ms: float | None = None
    tpot_ms: float | None = None
    ttft_ms: float | None = None  # network + modeled prefill (queueing is not modeled)
    total_ms: float | None = None


@functools.lru_cache(maxsize=32)
def _roofline(spec: TargetSpec, gpu: str, gpus: int) -> RooflineModel:
    return RooflineModel(
        target_model(spec.model), gpu_type(gpu), gpus, spec.weights, spec.kv, Efficiency(spec.mfu, spec.mbu)
    )


def pop_layout(spec: TargetSpec, pop: PoP) -> tuple[str, int]:
    """The GPU type and count the target runs on at `pop`."""
    if spec.gpu is not None:
        gpu = gpu_type(spec.gpu).name
        return gpu, spec.gpus or pop.gpus.get(gpu) or 1
    if not pop.gpus:
        raise SimulationError(f"PoP {pop.code} has no GPUs; name target.gpu in the catalog")
    gpu = max(pop.gpus, key=lambda g: pop.gpus[g])
    return gpu, spec.gpus or pop.gpus[gpu]


def modeled_times(
    spec: TargetSpec,
    pop: PoP,
    prompt_tokens: int,
    completion_tokens: int,
    batch: int,
    network_ms: float,
) -> ModeledTimes:
    """What this request would take on `pop`'s GPUs running the full-size target, decoding
    alongside `batch - 1` sequences of about the same length."""
    gpu, gpus = pop_layout(spec, pop)
    label = f"{spec.model} {spec.weights} weights, {spec.kv} KV on {gpus} x {gpu}"
    batch = max(1, batch)
    model = _roofline(spec, gpu, gpus)
    if model.kv_capacity_tokens() <= 0:
        return ModeledTimes(target=label, fits=False, batch=batch)
    prefill = model.prefill_ms(max(1, prompt_tokens))
    decode = sum(
        model.decode_ms(batch, batch * (prompt_tokens + i)) for i in range(1, max(0, completion_tokens))
    )
    tpot = decode / (completion_tokens - 1) if completion_tokens > 1 else 0.0
    ttft = network_ms + prefill
    return ModeledTimes(
        target=label,
        fits=True,
        batch=batch,
        prefill_ms=round(prefill, 3),
        decode_ms=round(decode, 3),
        tpot_ms=round(tpot, 3),
        ttft_ms=round(ttft, 3),
        total_ms=round(ttft + decode, 3),
    )
