"""A strict safetensors reader: the header is checked before any tensor is touched.

Checks: the declared header length is capped and inside the file; the header is a JSON object of
tensors with known dtypes, non-negative shapes and offsets whose length matches dtype x shape;
offsets are in bounds, do not overlap, and cover the data section exactly (no gaps, no tail).
Nothing is ever unpickled. Files are read once, hashed while reading, and tensors are views of
those bytes, so verifying a manifest costs no second pass over the data.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

import torch

from engine.errors import ModelLoadError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the reference implementation's own cap
_CHUNK = 8 * 1024 * 1024
_PROGRESS_MIN_BYTES = 64 * 1024 * 1024  # below this a bar would only flicker
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class CheckpointIntegrityError(ModelLoadError):
    """A checkpoint file is malformed or is not the file it claims to be."""


def read_hashed(path: Path) -> tuple[bytearray, str]:
    """The file's bytes and their SHA-256, from a single read (with a progress bar on a terminal)."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    data = bytearray()
    show = size >= _PROGRESS_MIN_BYTES and sys.stderr.isatty()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            data += chunk
            if show:
                done = len(data) / size
                bar = "#" * int(done * 30)
                sys.stderr.write(f"\rverifying {path.name} [{bar:<30}] {done:4.0%}")
                sys.stderr.flush()
    if show:
        sys.stderr.write("\n")
    return data, digest.hexdigest()


class SafetensorsFile:
    def __init__(self, data: bytearray | bytes, name: str):
        self.name = name
        self._data = data if isinstance(data, bytearray) else bytearray(data)
        self.entries, self.metadata, self._base = self._parse()

    @classmethod
    def open(cls, path: Path) -> tuple[SafetensorsFile, str]:
        data, digest = read_hashed(path)
        return cls(data, path.name), digest

    def _fail(self, problem: str) -> CheckpointIntegrityError:
        return CheckpointIntegrityError(f"{self.name}: {problem}")

    def _parse(self):
        size = len(self._data)
        if size < 8:
            raise self._fail(f"{size} bytes is too short for a safetensors file (truncated?)")
        (n,) = struct.unpack("<Q", self._data[:8])
        if n > MAX_HEADER_BYTES:
            raise self._fail(f"declares a {n}-byte header; the limit is {MAX_HEADER_BYTES}")
        if 8 + n > size:
            raise self._fail(f"declares a {n}-byte header but the file has {size} bytes (truncated?)")
        try:
            header = json.loads(bytes(self._data[8 : 8 + n]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise self._fail(f"header is not valid JSON ({exc})") from None
        if not isinstance(header, dict):
            raise self._fail("header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        data_len = size - 8 - n
        spans = []
        entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
                raise self._fail(f"tensor {name}: entry needs exactly dtype, shape and data_offsets")
            dtype = DTYPES.get(info["dtype"])
            if dtype is None:
                raise self._fail(f"tensor {name}: unknown dtype {info['dtype']!r}")
            shape, offsets = info["shape"], info["data_offsets"]
            if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
                raise self._fail(f"tensor {name}: shape {shape!r} is not a list of non-negative integers")
            if not (
                isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
            ):
                raise self._fail(f"tensor {name}: data_offsets {offsets!r} is not [begin, end]")
            begin, end = offsets
            if not 0 <= begin <= end <= data_len:
                raise self._fail(
                    f"tensor {name}: offsets [{begin}, {end}] outside the {data_len}-byte data section"
                )
            numel = 1
            for d in shape:
                numel *= d
            if end - begin != numel * torch.tensor([], dtype=dtype).element_size():
                raise self._fail(
                    f"tensor {name}: {end - begin} bytes do not hold a {info['dtype']} tensor of {shape}"
                )
            entries[name] = (dtype, tuple(shape), begin, end)
            spans.append((begin, end, name))
        spans.sort()
        cursor, previous = 0, None
        for begin, end, name in spans:
            if begin < cursor:
                raise self._fail(f"tensors {previous} and {name} overlap")
            if begin > cursor:
                raise self._fail(f"{begin - cursor} bytes before tensor {name} belong to no tensor")
            cursor, previous = end, name
        if cursor != data_len:
            raise self._fail(f"{data_len - cursor} bytes after the last tensor belong to no tensor")
        return entries, metadata, 8 + n

    def keys(self) -> list[str]:
        return list(self.entries)

    def get_tensor(self, name: str) -> torch.Tensor:
        dtype, shape, begin, end = self.entries[name]
        if begin == end:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(self._data, dtype=torch.uint8, count=end - begin, offset=self._base + begin)
        return flat.view(dtype).reshape(shape)  # a view of the file's bytes: no copy
