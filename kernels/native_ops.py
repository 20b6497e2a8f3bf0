"""Fused CPU ops registered with torch.library: the `edge_cpu::` ops a compiled step calls as one
C++ op each (no Python, no host read, no thread-local lookup of the model's objects).

    edge_cpu::fused_moe   the routed experts of a MoE layer (kernels/csrc/moe.c): top-k weights and
                          ids as tensors in, tokens counted per expert inside, only the active
                          experts' weights read, in any stored format (f32, bf16, int8, int4)
    edge_cpu::linear      x W^T (+ b) for a weight read as stored (kernels/csrc/qlinear.c): int8, int4,
                          or dense f32 / bf16 [out, in]; the weight's tensors as arguments

The schemas and CPU kernels are C++ (kernels/csrc/ops.cpp, the one file with torch's headers) over
plain C (kernels/csrc/qlinear.c, moe.c); the fake implementations, which give torch.compile the
output's shape, are registered here. The library is built once per source hash with the system's
C and C++ compilers against this torch's headers (about 5 s; `make native` does it ahead of time)
into the same build folders as kernels.cpu_qlinear, and loaded with torch.ops.load_library. Without
a compiler, or with EDGE_CPU_KERNELS=0, `available()` is False, the model keeps its eager path (the
reference), and why is said once on stderr.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from kernels import cpu_qlinear
from kernels.formats import QuantizedWeight

log = logging.getLogger(__name__)
CSRC = Path(__file__).resolve().parent / "csrc"
C_SOURCES = ("qlinear.c", "moe.c")
SOURCES = (*C_SOURCES, "ops.cpp", "edge_kernels.h")
# stored weight formats and their code in the C kernels (edge_kernels.h: the bits per weight)
FORMAT_CODES = {"f32": 32, "bf16": 16, "int8": 8, "int4": 4}
_lib: ctypes.CDLL | None = None  # the loaded library (its C symbols: the ISA cap the tests set)
_problem: str | None = None


def _digest() -> str:
    h = hashlib.sha256(torch.__version__.encode())
    for name in SOURCES:
        h.update((CSRC / name).read_bytes())
    return h.hexdigest()[:16]


def _compile(target: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cc is None or cxx is None:
        raise RuntimeError("no C and C++ compilers (cc, c++) found")
    from torch.utils.cpp_extension import include_paths, library_paths

    includes = [f"-I{p}" for p in include_paths()]
    libs = library_paths()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = []
        for name in C_SOURCES:
            obj = Path(tmp) / f"{name}.o"
            _run([cc, "-O3", "-fPIC", "-fopenmp", "-c", str(CSRC / name), "-o", str(obj)])
            objects.append(str(obj))
        out = Path(tmp) / target.name
        _run(
            [cxx, "-O2", "-fPIC", "-std=c++17", "-shared", "-fopenmp", *includes, str(CSRC / "ops.cpp")]
            + [*objects, "-o", str(out), *(f"-L{p}" for p in libs), "-ltorch_cpu", "-lc10"]
            + [f"-Wl,-rpath,{p}" for p in libs]
        )
        os.replace(out, target)  # atomic: a concurrent loader sees the whole library or none


def _run(cmd: list[str]) -> None:
    made = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if made.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {made.stderr.strip()[-800:]}")


def build() -> Path:
    """The compiled library for the current sources and torch (built now if missing); RuntimeError
    why not."""
    return cpu_qlinear.cached_build(f"edge_ops-{_digest()}.so", _compile)


def _load() -> ctypes.CDLL | None:
    global _lib, _problem
    if _lib is not None or _problem is not None:
        return _lib
    if os.environ.get(cpu_qlinear.ENV, "1").strip() == "0":
        _problem = f"{cpu_qlinear.ENV}=0"
    else:
        try:
            path = build()
            torch.ops.load_library(str(path))
            _lib = ctypes.CDLL(str(path))  # the same mapping: its ISA cap is the ops' own
            _lib.qlinear_set_max_isa.argtypes = [ctypes.c_int]
            _lib.qlinear_isa.restype = ctypes.c_char_p
            _register_fakes()
        except (RuntimeError, OSError) as exc:
            _problem = str(exc)
    if _problem is not None:
        message = f"the fused CPU ops are not built; MoE layers run their eager loop: {_problem}"
        log.info(message)
        print(f"edge: {message}", file=sys.stderr)
    return _lib


def _register_fakes() -> None:
    @torch.library.register_fake("edge_cpu::fused_moe")
    def _(x, topk_weights, topk_ids, w13, s13, w2, s2, fmt, inter, real_rows, load):
        return torch.empty_like(x)

    @torch.library.register_fake("edge_cpu::linear")
    def _(x, w, scale, bias, fmt, out_features):
        return x.new_empty(*x.shape[:-1], out_features)


def available() -> bool:
    return _load() is not None


def problem() -> str | None:
    """Why the ops are not in use (None when they are)."""
    _load()
    return _problem


def isa() -> str:
    """The path the ops run on this CPU now: "avx512", "avx2", "scalar", or "none" (not built)."""
    lib = _load()
    return lib.qlinear_isa().decode() if lib is not None else "none"


def set_max_isa(name: str) -> None:
    """Cap the ops' path ("scalar", "avx2", "avx512"; the CPU's best still bounds it): the tests."""
    lib = _load()
    if lib is not None:
        lib.qlinear_set_max_isa(cpu_qlinear.ISAS.index(name))


def fused_moe(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: torch.Tensor,
    s13: torch.Tensor | None,
    w2: torch.Tensor,
    s2: torch.Tensor | None,
    fmt: str,
    inter: int,
    load: torch.Tensor,
    real_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_j topk_weights[t, j] * down(silu(gate(x_t)) * up(x_t)) over each token's experts
    topk_ids[t, j], for the stored weights w13 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I]
    in `fmt` with their scales (int8, int4); `load` [E] int64 gains the tokens routed to each
    expert; `real_rows` (a one-element int64 tensor): only that many leading rows are real (the
    others come back zero). Needs `available()`."""
    return torch.ops.edge_cpu.fused_moe(
        x, topk_weights, topk_ids, w13, s13, w2, s2, FORMAT_CODES[fmt], inter, real_rows, load
    )


def linear_dense(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W^T (+ b) for a dense float32 or bfloat16 W [out, in] (contiguous), in x's dtype (computed
    in float32)."""
    code = FORMAT_CODES["bf16" if w.dtype == torch.bfloat16 else "f32"]
    return torch.ops.edge_cpu.linear(x, w, None, bias, code, w.shape[0])


def takes(w: QuantizedWeight) -> bool:
    """Whether edge_cpu::linear reads this weight as stored: int8 or int4 [out, in] on the CPU (int4's
    input a multiple of its 32-wide scale group), its tensors exactly what the format table says of
    the shape, contiguous; and the ops are built."""
    if w.format not in cpu_qlinear.FORMATS or w.data.device.type != "cpu" or len(w.shape) != 2:
        return False
    if w.format == "int4" and w.shape[1] % 32:
        return False
    stored = (w.data.dtype, w.data.shape, w.scale.dtype, w.scale.shape)
    if stored != cpu_qlinear.stored_as(w.format, w.shape):
        return False
    return w.data.is_contiguous() and w.scale.is_contiguous() and available()


def linear(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W^T (+ b) for an int8 or int4 W [out, in] read as stored, in x's dtype (computed in float32);
    only for a weight `takes` accepts."""
    return torch.ops.edge_cpu.linear(x, w.data, w.scale, bias, FORMAT_CODES[w.format], w.shape[0])
