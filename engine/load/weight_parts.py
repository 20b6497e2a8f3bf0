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


def is_bf16_matrix(t: torch.Tensor | QuantizedWeight) -> bool:
    """A dense bfloat16 matrix (what kernels.dispatch.keeps_bf16 keeps bf16 on a CPU)."""
    return isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 and t.dim() == 2


def dense_path(
    tensors: dict[str, torch.Tensor | QuantizedWeight], dtype: torch.dtype, stored_bf16: bool
) -> str:
    """How the uncompressed matrices (every 2-D dense tensor: projections, experts, embeddings, the
    head) are held and multiplied, for the format disclosure beside the weights' format:
    "bf16 (edge_cpu, <path>)": kept bf16 under float32 activations (a CPU), read as stored by the
    native ops on that path (kernels.native_ops.bf16_isa; "bf16 (edge_cpu, avx512_bf16, bf16x2
    activations)" with EDGE_CPU_ACTIVATIONS=bf16x2); "f32 (widened at load)": the checkpoint's
    bf16 matrices held as float32 ($EDGE_CPU_BF16=f32, or no build); else the dtype they are held
    and multiplied in ("f32": a float32 checkpoint on a CPU; "bf16" on a GPU). MLA's absorbed
    projections are folded at load in the activations' dtype whatever this says."""
    held = {t.dtype for t in tensors.values() if isinstance(t, torch.Tensor) and t.dim() == 2}
    if dtype == torch.float32 and torch.bfloat16 in held:
        from kernels import dispatch, native_ops  # the ops' library: loaded by the model's layers anyway

        acts = dispatch.activations_for("bf16")
        path = native_ops.bf16_isa(acts)
        return f"bf16 (edge_cpu, {path}, {acts} activations)" if acts != "f32" else f"bf16 (edge_cpu, {path})"
    if dtype == torch.float32 and stored_bf16:
        return "f32 (widened at load)"
    return {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}.get(dtype, str(dtype))
