"""Write compressed HF-format checkpoints, and report what each part of a checkpoint costs.

`quantize_checkpoint(SRC, DST, "int4", parts)` writes DST with the compressed weights and their
scales (layouts in engine.load.weights), the untouched tensors as stored, the tokenizer files, and a
`quantization_config` in config.json that says exactly what was done.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import torch
from safetensors.torch import save_file

from engine.arch.config import load_config
from engine.errors import ModelLoadError
from engine.load.integrity import manifest_digest
from engine.load.weight_parts import COMPRESSIBLE_PARTS, apply_weight_format, parse_parts, part_of
from engine.load.weights import SCALE_SUFFIX, load_tensors
from engine.models import expected_tensors
from kernels.formats import COMPRESSED_WEIGHT_FORMATS, DENSE_WEIGHT, WEIGHT
from kernels.quant import QuantizedWeight

_NOT_COPIED = ("model.safetensors", "model.safetensors.index.json", "config.json", "manifest.json")
MAX_SHARD_BYTES = 2 * 1024**3


def _load_as_stored(model_dir: Path) -> tuple[dict, dict[str, torch.Tensor | QuantizedWeight]]:
    config, raw = load_config(model_dir)
    layers = range(config.num_hidden_layers, config.num_hidden_layers + 8)
    tensors = load_tensors(
        model_dir,
        expected_tensors(config),
        None,
        torch.device("cpu"),
        ignore_prefixes=tuple(f"model.layers.{i}." for i in layers),
    )
    return raw, tensors


def _flatten(tensors: dict[str, torch.Tensor | QuantizedWeight]) -> dict[str, torch.Tensor]:
    flat = {}
    for name, t in tensors.items():
        if isinstance(t, QuantizedWeight):
            flat[name] = t.data.contiguous()
            flat[name + SCALE_SUFFIX[t.format]] = t.scale.contiguous()
        else:
            flat[name] = t.contiguous()
    return flat


def _write_safetensors(out: Path, flat: dict[str, torch.Tensor], max_shard_bytes: int) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in flat.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], out / "model.safetensors", metadata=metadata)
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, out / fname, metadata=metadata)
        weight_map.update(dict.fromkeys(shard, fname))
    total = sum(t.numel() * t.element_size() for t in flat.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def quantization_config(weights: str, parts: tuple[str, ...]) -> dict:
    config = dict(WEIGHT[weights].checkpoint_config)  # the format's own description
    config["parts"] = list(parts)
    config["not_quantized"] = [
        "embeddings",
        "lm_head",
        "norms",
        "router",
        "biases",
        *[p for p in COMPRESSIBLE_PARTS if p not in parts],
    ]
    return config


def quantize_checkpoint(
    src: str | Path,
    dst: str | Path,
    weights: str,
    parts: str | tuple[str, ...] | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> dict[str, int]:
    """Compress `parts` of SRC to `weights` and write DST; returns bytes before and after."""
    src, dst = Path(src), Path(dst)
    if weights not in COMPRESSED_WEIGHT_FORMATS:
        *first, last = COMPRESSED_WEIGHT_FORMATS
        raise ModelLoadError(f"--weights {weights!r}: choose {', '.join(first)} or {last}")
    if dst.resolve() == src.resolve():
        raise ModelLoadError(f"{dst}: the destination must differ from the source")
    chosen = parse_parts(parts)
    raw, tensors = _load_as_stored(src)
    before = sum(_nbytes(t) for t in tensors.values())
    if "quantization_config" in raw:
        raise ModelLoadError(
            f"{src}: already compressed ({raw['quantization_config'].get('quant_method')}); "
            "quantize from the uncompressed checkpoint"
        )
    compressed = apply_weight_format(tensors, weights, chosen, torch.bfloat16)
    dst.mkdir(parents=True, exist_ok=True)
    _write_safetensors(dst, _flatten(compressed), max_shard_bytes)
    raw = dict(raw)
    raw["quantization_config"] = quantization_config(weights, chosen)
    source_manifest = manifest_digest(src)
    if source_manifest:  # what it was made from; `edge models sign` carries it into the manifest
        raw["quantization_config"]["source_manifest_sha256"] = source_manifest
    (dst / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for item in src.iterdir():
        if item.is_file() and item.name not in _NOT_COPIED and not item.name.endswith(".safetensors"):
            shutil.copy2(item, dst / item.name)
    return {"bytes_before": before, "bytes_after": sum(_nbytes(t) for t in compressed.values())}


def _nbytes(t: torch.Tensor | QuantizedWeight) -> int:
    return t.nbytes() if isinstance(t, QuantizedWeight) else t.numel() * t.element_size()


def format_nbytes(fmt: str, shape: tuple[int, ...]) -> int:
    """Bytes a [out, in] weight takes in `fmt`, scales included (kernels.formats' layouts)."""
    if fmt not in WEIGHT:
        raise ModelLoadError(f"unknown weight format {fmt!r}")
    return WEIGHT[fmt].nbytes(tuple(shape))


class PartInfo(msgspec.Struct):
    part: str
    tensors: int
    parameters: int
    bf16_bytes: int
    stored_bytes: int
    stored_format: str
    target_bytes: int | None = None  # with --weights


def checkpoint_info(
    model_dir: str | Path, weights: str | None = None, parts: str | tuple[str, ...] | None = None
) -> list[PartInfo]:
    """Parameters and bytes per part: as bf16, as stored, and (with `weights`) as compressed."""
    raw, tensors = _load_as_stored(Path(model_dir))
    chosen = parse_parts(parts) if weights else ()
    rows: dict[str, PartInfo] = {}
    for name, t in tensors.items():
        part = part_of(name)
        shape = t.shape if isinstance(t, QuantizedWeight) else tuple(t.shape)
        params = 1
        for d in shape:
            params *= d
        info = rows.setdefault(part, PartInfo(part, 0, 0, 0, 0, ""))
        info.tensors += 1
        info.parameters += params
        dense = int(params * WEIGHT[DENSE_WEIGHT].bytes_per_element)
        info.bf16_bytes += dense
        info.stored_bytes += _nbytes(t)
        fmt = t.format if isinstance(t, QuantizedWeight) else str(t.dtype).removeprefix("torch.")
        if fmt not in info.stored_format.split("+"):
            info.stored_format = "+".join(filter(None, [info.stored_format, fmt]))
        if weights:
            target = format_nbytes(weights, shape) if part in chosen and len(shape) == 2 else dense
            info.target_bytes = (info.target_bytes or 0) + target
    order = ["embeddings", *COMPRESSIBLE_PARTS, "router", "norms", "other"]
    return [rows[p] for p in order if p in rows]
