"""`edge sim --speculative`: speculative decoding's predicted effect, with and without, as tables.

Two views of the same model (edge_sim.speculation_cost):
* the roofline at fixed batches (every sequence `context` tokens long): TPOT, tokens/s per sequence
  and per GPU, cost per million output tokens, and the batch at which speculation stops paying;
* the simulated workload run twice with the same requests, without and with speculation.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from edge_sim.roofline import Efficiency, RooflineModel, gpu_type
from edge_sim.speculation_cost import SpeculationSpec, SpeculativeStepTimes, mtp_note
from engine.arch.architecture import Architecture

__all__ = ["SpeculationRow", "format_comparison", "format_roofline_rows", "roofline_rows"]


class SpeculationRow(msgspec.Struct, frozen=True):
    batch: int
    tpot_ms: float  # without speculation
    spec_tpot_ms: float  # with: (verify + draft) / expected tokens, speculating at this batch
    verify_ms: float
    draft_ms: float
    tokens_per_s_per_gpu: float
    spec_tokens_per_s_per_gpu: float
    usd_per_million: float
    spec_usd_per_million: float

    @property
    def speedup(self) -> float:
        return self.tpot_ms / self.spec_tpot_ms


def roofline_rows(
    model: Architecture,
    gpu: str,
    gpus: int,
    weights: str,
    kv: str,
    spec: SpeculationSpec,
    context: float,
    batches: list[int],
    efficiency: Efficiency | None = None,
    prices: dict[str, float] | None = None,
) -> tuple[list[SpeculationRow], SpeculativeStepTimes]:
    """Decode with and without speculation at each batch of `context`-token sequences."""
    g = gpu_type(gpu, prices)
    target = RooflineModel(model, g, gpus, weights, kv, efficiency)
    times = SpeculativeStepTimes(target, spec, context)
    usd_per_ms = g.price_per_hour * gpus / 3.6e6
    rows = []
    for b in batches:
        kv_tokens = b * context
        plain = target.times.decode_ms(b, kv_tokens)
        verify, draft = times.verify_ms(b, kv_tokens), times.draft_ms(b, kv_tokens)
        spec_tpot = (verify + draft) / times.expected
        rows.append(
            SpeculationRow(
                b,
                plain,
                spec_tpot,
                verify,
                draft,
                b * 1e3 / plain / gpus,
                b * 1e3 / spec_tpot / gpus,
                usd_per_ms * plain / b * 1e6,
                usd_per_ms * spec_tpot / b * 1e6,
            )  # fmt: skip
        )
    return rows, times


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    return [fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def format_roofline_rows(
    rows: list[SpeculationRow], times: SpeculativeStepTimes, layout: str, context: float
) -> str:
    spec = times.spec
    lines = [f"speculative decoding, roofline: {layout}, {context:g}-token sequences, {spec.describe()}"]
    if spec.method == "mtp":
        lines.append(
            f"  draft: one MTP layer of {times.target.model.name}'s shape (an MoE decoder layer + the shared "
            f"LM head) per draft token, chained {spec.num_tokens} x; {mtp_note(times.target.model.name)}"
        )
    else:
        lines.append("  draft: n-gram lookup in the sequence's own context (no weights, ~0 cost)")
    lines.append(f"  expected tokens per sequence per step: {times.expected:.3f}")
    header = [
        "batch", "TPOT ms", "spec TPOT", "verify+draft ms", "tok/s/seq", "spec tok/s/seq",
        "tok/s/GPU", "spec tok/s/GPU", "$/Mtok", "spec $/Mtok", "speed-up",
    ]  # fmt: skip
    body = [
        [
            str(r.batch), f"{r.tpot_ms:.2f}", f"{r.spec_tpot_ms:.2f}", f"{r.verify_ms:.2f}+{r.draft_ms:.2f}",
            f"{1e3 / r.tpot_ms:.1f}", f"{1e3 / r.spec_tpot_ms:.1f}", f"{r.tokens_per_s_per_gpu:.1f}",
            f"{r.spec_tokens_per_s_per_gpu:.1f}", f"{r.usd_per_million:.3f}", f"{r.spec_usd_per_million:.3f}",
            f"{r.speedup:.2f}x",
        ]
        for r in rows
    ]  # fmt: skip
    lines += ["", *_table(header, body), ""]
    c = times.crossover
    spans = ", ".join(f"{a}-{b}" + ("+" if b == 4096 else "") for a, b in times.paying) or "none"
    lines.append(
        "speculation stops paying at batch "
        + (f"{c}" if c is not None else "> 4096 (pays at every batch up to 4096)")
        + f"; it pays at batches {spans}"
    )
    cap = times.max_decoders
    lines.append(
        "  the simulation speculates "
        + (f"while at most {cap} sequences decode" if cap < 1 << 30 else "at every batch")
    )
    return "\n".join(lines)


def format_comparison(plain: dict[str, Any], spec: dict[str, Any], gpus: int, label: str) -> str:
    """Two runs' overall summaries (capacity.report.summarize) side by side."""

    def p50(s: dict[str, Any], key: str) -> float:
        return s[key]["p50"] if s.get(key) else math.nan

    rows = []
    for name, get, fmt in (
        ("TPOT p50 ms", lambda s: p50(s, "tpot_ms"), "{:.2f}"),
        ("TPOT p99 ms", lambda s: s["tpot_ms"]["p99"] if s.get("tpot_ms") else math.nan, "{:.2f}"),
        ("tok/s per sequence (1000/TPOT p50)", lambda s: 1e3 / p50(s, "tpot_ms"), "{:.1f}"),
        ("E2E p50 ms", lambda s: p50(s, "e2e_ms"), "{:.0f}"),
        ("output tok/s", lambda s: s["output_tokens_per_s"], "{:.0f}"),
        ("output tok/s per GPU", lambda s: s["output_tokens_per_s"] / gpus, "{:.1f}"),
        ("GPU busy", lambda s: s["gpu_busy_fraction"], "{:.1%}"),
        ("$/M output tokens (busy)", lambda s: s["cost_per_million_output_tokens_usd"], "{:.3f}"),
    ):
        a, b = get(plain), get(spec)
        ratio = b / a if a and not math.isnan(a) and not math.isnan(b) else math.nan
        rows.append([name, fmt.format(a), fmt.format(b), f"{ratio:.2f}"])
    return "\n".join([f"simulated, {label}", *_table(["overall", "without", "with", "ratio"], rows)])
