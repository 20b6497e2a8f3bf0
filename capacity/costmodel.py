"""Cost models the capacity simulator runs on: how long one continuous-batching step takes and
how much KV a replica holds.

* `RooflineCostModel`: a named full-size target model (Kimi K2, GLM-4.5 or a config.json) on each
  PoP's own GPUs, timed by the roofline model in edge_sim.roofline; each PoP runs as many
  replicas of the smallest layout that fits as its GPUs allow.
* `ProfiledCostModel` (capacity.profile): our engine, measured on the machine that runs it.

With `speculation` (edge_sim.speculation_cost), the roofline plan's step times are those of
draft-and-verify steps per token step (verify + draft over the expected tokens) while a replica
has at most `max_decoders` decoders, plain beyond: the simulated TPOT is the speculative one. A
replica's `steps` then counts token steps; a real verify step is the expected tokens times longer,
which a newcomer's wait for the next step boundary does not see (a small share of its TTFT).

Both give the simulator a `ReplicaPlan`: GPUs per replica, replicas, KV blocks, scheduler limits
and two timing functions:

    step_ms(prefill_tokens, prefill_pairs, prefill_kv, decode_seqs, decode_kv) -> ms
    decode_ms(decode_seqs, decode_kv) -> ms
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from capacity.planner import DEFAULT_USABLE_FRACTION, min_layout
from edge_sim.roofline import (
    GIB,
    Efficiency,
    RooflineModel,
    SimulationError,
    check_kv,
    check_weights,
    gpu_type,
    weight_bytes,
)
from edge_sim.speculation_cost import SpeculationSpec, SpeculativeStepTimes
from edge_sim.target_models import target_model
from engine.arch.architecture import Architecture

__all__ = ["CostModel", "ReplicaPlan", "RooflineCostModel"]

BLOCK_TOKENS = 16  # engine.kv.kv_cache.BLOCK_SIZE (checked in the tests)


class ReplicaPlan:
    """How one GPU PoP serves the model: `replicas` engines of `gpus` GPUs each."""

    __slots__ = (
        "gpu",
        "gpus",
        "replicas",
        "num_blocks",
        "staging_blocks",
        "block_bytes",
        "max_num_seqs",
        "max_batched_tokens",
        "max_context",
        "price_per_hour",
        "step_ms",
        "decode_ms",
        "note",
    )

    def __init__(
        self,
        gpu: str,
        gpus: int,
        replicas: int,
        num_blocks: int = 0,
        staging_blocks: int = 0,
        block_bytes: int = 0,
        max_num_seqs: int = 256,
        max_batched_tokens: int = 8192,
        max_context: int = 131072,
        price_per_hour: float = 0.0,
        step_ms: Callable[[float, float, float, float, float], float] | None = None,
        decode_ms: Callable[[float, float], float] | None = None,
        note: str = "",
    ):
        self.gpu, self.gpus, self.replicas = gpu, gpus, replicas
        self.num_blocks, self.staging_blocks, self.block_bytes = num_blocks, staging_blocks, block_bytes
        self.max_num_seqs, self.max_batched_tokens = max_num_seqs, max_batched_tokens
        self.max_context, self.price_per_hour = max_context, price_per_hour
        self.step_ms, self.decode_ms, self.note = step_ms, decode_ms, note

    def __repr__(self) -> str:
        return (
            f"ReplicaPlan({self.replicas} x {self.gpus} {self.gpu}, {self.num_blocks} KV blocks{self.note})"
        )


class CostModel(Protocol):
    name: str
    model_name: str

    def describe(self) -> str: ...

    def plan_pop(self, gpus: dict[str, int], kv: str, min_kv_tokens: int) -> ReplicaPlan: ...


def _pick_gpu(gpus: dict[str, int]) -> tuple[str, int]:
    """A PoP with several GPU types serves the model from its most numerous type."""
    name, count = max(gpus.items(), key=lambda item: (item[1], item[0]))
    return name, count


# --- roofline ---------------------------------------------------------------------------------


class RooflineCostModel:
    """A full-size target model timed by the roofline model of each PoP's GPU."""

    name = "roofline"

    def __init__(
        self,
        model: str | Path | Architecture = "kimi-k2",
        weights: str = "fp8",
        efficiency: Efficiency | None = None,
        usable_fraction: float = DEFAULT_USABLE_FRACTION,
        max_num_seqs: int = 256,
        max_batched_tokens: int = 8192,
        prices: dict[str, float] | None = None,
        speculation: SpeculationSpec | None = None,
        speculation_context: float = 2048.0,
    ):
        """`speculation_context`: tokens per sequence at which `speculation`'s automatic
        max_decoders (the batch where it stops paying) is found."""
        self.model = model if isinstance(model, Architecture) else target_model(model)
        self.model_name = self.model.name
        self.weights = check_weights(weights)
        self.efficiency = efficiency or Efficiency()
        self.usable_fraction = usable_fraction
        if max_num_seqs < 1 or max_batched_tokens < max_num_seqs:
            raise SimulationError(
                f"scheduler limits: max_num_seqs ({max_num_seqs}) must be >= 1 and max_batched_tokens "
                f"({max_batched_tokens}) at least max_num_seqs"
            )
        self.max_num_seqs, self.max_batched_tokens = max_num_seqs, max_batched_tokens
        self.prices = dict(prices or {})
        self.speculation, self.speculation_context = speculation, speculation_context
        self._plans: dict[tuple, ReplicaPlan] = {}  # per PoP GPU set, KV dtype and longest request

    def describe(self) -> str:
        e = self.efficiency
        spec = f", speculative {self.speculation.describe()}" if self.speculation else ""
        return f"roofline: {self.model.name}, {self.weights} weights, mfu {e.mfu:g}, mbu {e.mbu:g}{spec}"

    def plan_pop(self, gpus: dict[str, int], kv: str, min_kv_tokens: int) -> ReplicaPlan:
        key = (tuple(sorted(gpus.items())), kv, min_kv_tokens)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan_pop(gpus, kv, min_kv_tokens)
        return plan

    def _layout(self, gpu: str, count: int, kv: str, context: int) -> RooflineModel | None:
        """The layout a replica runs: the smallest of at most `count` GPUs that holds the weights
        plus one `context`-token sequence (capacity.fleet sizes it for a planned concurrency)."""
        return min_layout(
            self.model,
            gpu,
            self.weights,
            kv,
            context,
            1,
            count,
            self.usable_fraction,
            self.efficiency,
            self.prices,
        )

    def _max_context(self, context: int) -> int:
        return self.model.max_context

    def _sequences(self, context: int) -> str:
        return f"one {context}-token sequence"

    def _plan_pop(self, gpus: dict[str, int], kv: str, min_kv_tokens: int) -> ReplicaPlan:
        check_kv(kv)
        name, count = _pick_gpu(gpus)
        gpu = gpu_type(name, self.prices)
        context = max(1, min(min_kv_tokens, self.model.max_context))
        r = self._layout(name, count, kv, context)
        if r is None:
            need = weight_bytes(self.model, self.weights).total_bytes / GIB
            return ReplicaPlan(
                name,
                0,
                0,
                note=f"too little memory for {self.model.name} ({need:.0f} GiB of {self.weights} weights) "
                f"plus {self._sequences(context)}",
            )
        free = (gpu.memory_gib * GIB * self.usable_fraction - r.weight_bytes_per_gpu) * r.gpus
        times, note = r.times, ""
        if self.speculation is not None:
            spec = SpeculativeStepTimes(r, self.speculation, self.speculation_context)
            if spec.draft_model is not None:  # the MTP layer's weights and its one-layer KV
                free -= spec.draft_weight_bytes_per_gpu * r.gpus
                if free < r.kv_block_bytes * (context / BLOCK_TOKENS + r.staging_blocks):
                    return ReplicaPlan(
                        name,
                        0,
                        0,
                        note=f"no room for KV beside {self.model.name}'s {self.weights} weights and the "
                        f"MTP layer ({spec.draft_weight_bytes_per_gpu / GIB:.1f} GiB per GPU) on {r.gpus} x "
                        f"{name}: raise --usable-fraction, use int4 weights or more GPUs",
                    )
                free *= r.kv_block_bytes / (r.kv_block_bytes + spec.draft_model.kv_block_bytes)
            times, note = spec, f", speculating up to {spec.max_decoders} decoders"
        return ReplicaPlan(
            gpu=name,
            gpus=r.gpus,
            replicas=count // r.gpus,
            num_blocks=int(free // r.kv_block_bytes),
            staging_blocks=r.staging_blocks,
            block_bytes=r.kv_block_bytes,
            max_num_seqs=self.max_num_seqs,
            max_batched_tokens=self.max_batched_tokens,
            max_context=self._max_context(context),
            price_per_hour=gpu.price_per_hour * r.gpus,
            step_ms=times.step_ms,
            decode_ms=times.decode_ms,
            note=note,
        )
