"""Which part of the model a tensor belongs to, and which weight format each part gets.

Compression is chosen per part: routed experts, shared experts, dense MLP, attention. Embeddings,
the LM head, norms, biases and the router stay in the model dtype whatever is asked.
"""

from __future__ import annotations

import re

import torch

from engine.errors import ModelLoadError
from kernels.formats import DENSE_WEIGHT, WEIGHT, WEIGHT_FORMATS
from kernels.quant import QuantizationError, QuantizedWeight, dequantize, quantize

COMPRESSIBLE_PARTS = ("routed_experts", "shared_experts", "dense_mlp", "attention")
PART_ALIASES = {
    "experts": ("routed_experts", "shared_experts"),
    "mlp": ("routed_experts", "shared_experts", "dense_mlp"),
    "all": COMPRESSIBLE_PARTS,
}
DEFAULT_PARTS = PART_ALIASES["experts"]  # miniatures: experts compressed, attention and embeddings not

_DENSE_MLP = re.compile(r"\.mlp\.(gate|up|down)_proj\.weight$")
_ATTENTION = re.compile(r"\.self_attn\.[a-z_]+_proj(_with_mqa)?\.weight$")


def part_of(name: str) -> str:
    """The part a checkpoint tensor belongs to (also the non-compressible ones, for reports)."""
    if ".mlp.experts." in name:
        return "routed_experts" if name.endswith(".weight") else "other"
    if ".mlp.shared_experts." in name:
        return "shared_experts"
    if _DENSE_MLP.search(name):
        return "dense_mlp"
    if _ATTENTION.search(name):
        return "attention"
    if ".mlp.gate." in name:
        return "router"
    if "embed_tokens" in name or name.startswith("lm_head"):
        return "embeddings"
    if name.endswith("norm.weight"):
        return "norms"
    return "other"


def parse_parts(parts: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """'experts,attention' -> ('routed_experts', 'shared_experts', 'attention'); raises naming a bad one."""
    if parts is None:
        return DEFAULT_PARTS
    items = parts.split(",") if isinstance(parts, str) else list(parts)
    out: list[str] = []
    for item in (i.strip() for i in items if i.strip()):
        expanded = PART_ALIASES.get(item, (item,))
        for part in expanded:
            if part not in COMPRESSIBLE_PARTS:
                known = ", ".join((*COMPRESSIBLE_PARTS, *PART_ALIASES))
                raise ModelLoadError(f"weight part {item!r} is unknown; use one of {known}")
            if part not in out:
                out.append(part)
    return tuple(out)


def check_format(weights: str) -> None:
    if weights != "auto" and weights not in WEIGHT_FORMATS:
        raise ModelLoadError(
            f"weights={weights!r} is not supported; use one of auto, {', '.join(WEIGHT_FORMATS)}"
        )


def apply_weight_format(
    tensors: dict[str, torch.Tensor | QuantizedWeight],
    weights: str,
    parts: tuple[str, ...],
    dtype: torch.dtype,
) -> dict[str, torch.Tensor | QuantizedWeight]:
    """Bring loaded tensors to the asked format: 'auto' keeps what is stored, 'bf16' expands
    everything, a compressed format compresses `parts` (and leaves other parts as stored)."""
    check_format(weights)
    spec = WEIGHT.get(weights)  # None: "auto"
    out = {}
    for name, t in tensors.items():
        if spec is not None and not spec.compressed and isinstance(t, QuantizedWeight):
            t = dequantize(t, dtype)
        elif spec is not None and spec.compressed and part_of(name) in parts:
            if not (isinstance(t, QuantizedWeight) and t.format == weights):
                dense = dequantize(t, torch.float32) if isinstance(t, QuantizedWeight) else t
                try:
                    t = quantize(dense, weights, name)
                except QuantizationError as exc:
                    raise ModelLoadError(str(exc)) from None
        out[name] = t
    return out


def formats_by_part(tensors: dict[str, torch.Tensor | QuantizedWeight]) -> dict[str, str]:
    """Each compressible part's weight format ('bf16' for dense), as served; for transparency."""
    seen: dict[str, set[str]] = {}
    for name, t in tensors.items():
        part = part_of(name)
        if part in COMPRESSIBLE_PARTS:
            seen.setdefault(part, set()).add(t.format if isinstance(t, QuantizedWeight) else DENSE_WEIGHT)
    return {p: "+".join(sorted(seen[p])) for p in COMPRESSIBLE_PARTS if p in seen}


def weights_label(by_part: dict[str, str]) -> str:
    """'bf16', 'int4', or 'int4 experts, bf16 rest' style summary for responses and the catalog."""
    formats = set(by_part.values())
    if len(formats) <= 1:
        return formats.pop() if formats else DENSE_WEIGHT
    compressed = {p: f for p, f in by_part.items() if f != DENSE_WEIGHT}
    groups: dict[str, list[str]] = {}
    for part, fmt in compressed.items():
        groups.setdefault(fmt, []).append(part)
    pieces = []
    for fmt, ps in groups.items():
        if set(ps) == set(PART_ALIASES["experts"]):
            ps = ["experts"]
        pieces.append(f"{fmt} {'+'.join(ps)}")
    return ", ".join(pieces) + (f", {DENSE_WEIGHT} rest" if DENSE_WEIGHT in formats else "")
