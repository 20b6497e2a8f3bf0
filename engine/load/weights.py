"""Read an HF-format checkpoint (single file or index + shards) into tensors the model expects.

Every expected tensor is checked for presence, shape and dtype before any is used; the error names
the tensor, the file and the expected value. Compressed weights are recognised by their dtype and
companion scale, in the layouts of kernels.quant:

    fp8   X.weight float8_e4m3fn [out, in]    + X.weight_scale_inv float32 [ceil(out/128), ceil(in/128)]
    int8  X.weight int8 [out, in]             + X.weight_scale float32 [out]
    int4  X.weight uint8 [out, in/2] (packed) + X.weight_scale bfloat16 [out, in/32]
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from engine.errors import ModelLoadError
from engine.load.safetensors_io import SafetensorsFile, read_hashed
from kernels.formats import COMPRESSED_WEIGHT_FORMATS, WEIGHT
from kernels.quant import QuantizedWeight

_FLOAT_DTYPES = {torch.float32, torch.float16, torch.bfloat16}
# A compressed weight is recognised by its stored dtype (one per format in the table).
_COMPRESSED = {WEIGHT[n].storage: n for n in COMPRESSED_WEIGHT_FORMATS}
SCALE_SUFFIX = {n: WEIGHT[n].scale_suffix for n in COMPRESSED_WEIGHT_FORMATS}


class Checkpoint:
    """The safetensors files of a model directory: each read once and hashed while reading; the
    digests are checked (by `check_digests`, e.g. against a signed manifest) before any header is
    parsed, and every header is checked before any tensor is used."""

    def __init__(self, model_dir: Path, check_digests: Callable[[dict[str, str]], None] | None = None):
        self.model_dir = model_dir
        index = model_dir / "model.safetensors.index.json"
        weight_map: dict[str, str] | None = None
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                shards = sorted(set(weight_map.values()))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise ModelLoadError(f"{index}: not a safetensors index ({exc})") from None
        elif (model_dir / "model.safetensors").is_file():
            shards = ["model.safetensors"]
        else:
            raise ModelLoadError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
        raw: dict[str, bytearray] = {}
        self.digests: dict[str, str] = {}  # file name -> sha256 of its bytes
        for shard in shards:
            path = model_dir / shard
            if not path.is_file():
                raise ModelLoadError(f"{index}: shard {shard!r} is missing")
            raw[shard], self.digests[shard] = read_hashed(path)
        if check_digests is not None:
            check_digests(self.digests)
        self._files = {shard: SafetensorsFile(data, shard) for shard, data in raw.items()}
        if weight_map is None:
            self.where = dict.fromkeys(self._files["model.safetensors"].keys(), "model.safetensors")
            return
        self.where: dict[str, str] = {}  # tensor name -> file name
        for name, shard in weight_map.items():
            if name not in self._files[shard].entries:
                raise ModelLoadError(f"{index}: says {shard} holds {name}, but it does not (shards swapped?)")
            self.where[name] = shard
        for shard, f in self._files.items():
            extra = [n for n in f.keys() if weight_map.get(n) != shard]
            if extra:
                raise ModelLoadError(f"{shard}: holds {extra[0]}, which the index places elsewhere")

    def get(self, name: str) -> torch.Tensor:
        return self._files[self.where[name]].get_tensor(name)

    def file_of(self, name: str) -> str:
        return self.where[name]


def _scale_shape(fmt: str, logical: tuple[int, ...]) -> tuple[int, ...]:
    return WEIGHT[fmt].full_scale_shape(logical)


def load_tensors(
    model_dir: Path,
    expected: dict[str, tuple[int, ...]],
    dtype: torch.dtype | None,
    device: torch.device,
    keep_float32: set[str] = frozenset(),
    ignore_prefixes: tuple[str, ...] = (),
    checkpoint: Checkpoint | None = None,
    keep_bf16: bool = False,
) -> dict[str, torch.Tensor | QuantizedWeight]:
    """Expected tensors, dense ones cast to `dtype` (None keeps the stored dtype); `keep_bf16`: a
    matrix (2-D) stored as bfloat16 stays bfloat16 whatever `dtype` says, unless in `keep_float32`
    (a bf16 checkpoint on a CPU whose native ops read bf16 rows: kernels.dispatch.keeps_bf16)."""
    reader = checkpoint or Checkpoint(model_dir)
    files = reader.where
    missing = [name for name in expected if name not in files]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelLoadError(f"{model_dir}: checkpoint lacks tensor(s) the config requires: {shown}")
    scales = {name + suffix for name in expected for suffix in set(SCALE_SUFFIX.values())}
    unexpected = [
        n for n in files if n not in expected and n not in scales and not n.startswith(ignore_prefixes)
    ]
    if unexpected:
        shown = ", ".join(sorted(unexpected)[:5])
        raise ModelLoadError(f"{model_dir}: checkpoint has tensor(s) the config does not describe: {shown}")

    tensors: dict[str, torch.Tensor | QuantizedWeight] = {}
    for name, logical in expected.items():
        t = reader.get(name)
        where = f"{files[name]}: tensor {name}"
        fmt = _COMPRESSED.get(t.dtype)
        if fmt is not None and len(logical) == 2:
            spec = WEIGHT[fmt]
            stored = spec.data_shape(logical)
            if logical[1] % spec.cols_multiple:
                raise ModelLoadError(
                    f"{where}: {fmt} needs an input dimension divisible by {spec.cols_multiple}"
                )
            if tuple(t.shape) != stored:
                raise ModelLoadError(f"{where} ({fmt}) has shape {list(t.shape)}; expected {list(stored)}")
            scale_name = name + SCALE_SUFFIX[fmt]
            if scale_name not in files:
                raise ModelLoadError(f"{where} is {t.dtype} ({fmt}) but its scale {scale_name} is missing")
            scale = reader.get(scale_name)
            if tuple(scale.shape) != _scale_shape(fmt, logical):
                raise ModelLoadError(
                    f"{files[scale_name]}: tensor {scale_name} has shape {list(scale.shape)}; "
                    f"expected {list(_scale_shape(fmt, logical))} for a {list(logical)} {fmt} weight"
                )
            tensors[name] = QuantizedWeight(fmt, t.to(device), scale.to(device), logical)
            continue
        if tuple(t.shape) != logical:
            raise ModelLoadError(f"{where} has shape {list(t.shape)}; the config expects {list(logical)}")
        if t.dtype not in _FLOAT_DTYPES:
            raise ModelLoadError(f"{where} has dtype {t.dtype}; expected bfloat16, float16 or float32")
        target = torch.float32 if name in keep_float32 else (dtype or t.dtype)
        if keep_bf16 and t.dtype == torch.bfloat16 and len(logical) == 2 and name not in keep_float32:
            target = torch.bfloat16
        tensors[name] = t.to(device=device, dtype=target)
    return tensors
