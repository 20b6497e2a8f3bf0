"""Compressed-weight matmuls on the CPU that read int8 and int4 weights as stored (kernels/csrc/qlinear.c):
no dense copy of the weight per call, which is what made quantized weights slower than bf16 here.

The layout is the format table's own (kernels/formats.py: int8 [out, in] with a float32 scale per
row; int4 two codes a byte, low nibble first, a bfloat16 scale per 32 along the input), read as
stored: no repack at load, so a checkpoint, the Triton kernels and these share one layout.

The C source is compiled once per source hash with the system's C compiler (`cc -O3 -fopenmp`,
about a second; `make native` does it ahead of time) into the build folder of engine.native (or the
user's cache folder where that is not writable), and loaded with ctypes, which releases the GIL
for the call. ctypes rather than a torch.library C++ op: the kernels need no torch headers (a plain
C file builds in a second where a cpp_extension build takes a minute and a matching toolchain), and
a ctypes call costs a few microseconds, less than the op dispatcher plus its Python wrapper.

The path is chosen at run time by CPUID: AVX-512 (F, BW, VL) where the CPU has it, else AVX2 + FMA,
else a portable scalar path of the same loops (`isa()` says which; `set_max_isa` caps it, for the
tests). Without a compiler, or with EDGE_CPU_KERNELS=0, `available()` is False and kernels.linear
keeps the reference (dequantize, then multiply), saying so once on stderr.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from kernels.formats import WEIGHT, QuantizedWeight

log = logging.getLogger(__name__)
SOURCE = Path(__file__).resolve().parent / "csrc" / "qlinear.c"
HEADER = SOURCE.parent / "edge_kernels.h"  # its format codes and shared declarations
FORMATS = ("int8", "int4")
ENV = "EDGE_CPU_KERNELS"  # "0": never build or use them (the reference path, dequantize then multiply)
ISAS = ("scalar", "avx2", "avx512")  # the C code's paths, lowest first
_lib: ctypes.CDLL | None = None
_problem: str | None = None  # why they are not available, once known


def build_dirs() -> list[Path]:
    """A checkout's .native/ (beside engine.native's build), else the user's cache folder (an
    installed wheel: nothing is written into site-packages)."""
    repo = Path(__file__).resolve().parents[1]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edge-workers"
    return [repo / ".native", cache] if (repo / "pyproject.toml").exists() else [cache]


def _compile(target: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) found")
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        base = [cc, "-O3", "-fPIC", "-shared", "-o", str(out), str(SOURCE)]
        made = subprocess.run([*base[:4], "-fopenmp", *base[4:]], capture_output=True, text=True, timeout=120)
        if made.returncode != 0:  # no OpenMP: one thread, still no dense copy
            made = subprocess.run(base, capture_output=True, text=True, timeout=120)
        if made.returncode != 0:
            raise RuntimeError(f"{cc} failed: {made.stderr.strip()[-500:]}")
        os.replace(out, target)  # atomic: a concurrent loader sees the whole library or none


def cached_build(name: str, compile_to: Callable[[Path], None]) -> Path:
    """The library file `name` (its sources' hash in it) in the first build folder that has it or
    can make it with `compile_to(target)`, one compiler at a time per folder (pytest-xdist's
    workers load at once); RuntimeError saying why in every folder."""
    problems = []
    for folder in build_dirs():
        target = folder / name
        if target.exists():
            return target
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"{name.split('-')[0]}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not target.exists():
                    compile_to(target)
            return target
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            problems.append(f"{folder}: {exc}")
    raise RuntimeError("; ".join(problems))


def build() -> Path:
    """The compiled library for the current source (compiled now if missing); RuntimeError why not."""
    digest = hashlib.sha256(SOURCE.read_bytes() + HEADER.read_bytes()).hexdigest()[:16]
    return cached_build(f"qlinear-{digest}.so", _compile)


def _fallback(why: str) -> None:
    """Say once on stderr (and in the log) that compressed weights take the reference path."""
    global _problem
    _problem = why
    message = f"compressed weights run dequantize-then-multiply on this CPU (the reference path): {why}"
    log.info(message)
    print(f"edge: {message}", file=sys.stderr)


def _load() -> ctypes.CDLL | None:
    global _lib
    if _lib is not None or _problem is not None:
        return _lib
    if os.environ.get(ENV, "1").strip() == "0":
        _fallback(f"{ENV}=0")
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (RuntimeError, OSError) as exc:
        _fallback(str(exc))
        return None
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for name in ("qlinear_int8", "qlinear_int4"):
        getattr(lib, name).argtypes = [p, i64, i64, p, p, i64, p, i32]
        getattr(lib, name).restype = None
    lib.qlinear_isa.restype = ctypes.c_char_p
    lib.qlinear_cpu_isa.restype = ctypes.c_char_p
    lib.qlinear_set_max_isa.argtypes = [i32]
    lib.qlinear_force_scalar.argtypes = [i32]
    _lib = lib
    return lib


def _reset() -> None:
    """Forget what _load decided (the tests of the fallback; the library itself stays mapped)."""
    global _lib, _problem
    _lib, _problem = None, None


def available() -> bool:
    return _load() is not None


def problem() -> str | None:
    """Why the kernels are not in use (None when they are)."""
    _load()
    return _problem


def isa() -> str:
    """The path these kernels run on this CPU now: "avx512", "avx2", "scalar", or "none" (not built)."""
    lib = _load()
    return lib.qlinear_isa().decode() if lib is not None else "none"


def isas() -> tuple[str, ...]:
    """Every path this CPU can run, lowest first (empty when not built): what the tests cover."""
    lib = _load()
    return ISAS[: ISAS.index(lib.qlinear_cpu_isa().decode()) + 1] if lib is not None else ()


def set_max_isa(name: str) -> None:
    """Cap the path ("scalar", "avx2", "avx512"; the CPU's best still bounds it)."""
    lib = _load()
    if lib is not None:
        lib.qlinear_set_max_isa(ISAS.index(name))


def force_scalar(on: bool) -> None:
    """Run the portable path even where AVX2 or AVX-512 is there (the tests check both)."""
    set_max_isa("scalar" if on else "avx512")


def supports(x: torch.Tensor, w: QuantizedWeight) -> bool:
    """Whether qlinear takes this product (else the reference does). The C code trusts the sizes
    it is given, so the stored tensors must be exactly what the format table says of the shape."""
    if not (
        x.device.type == "cpu"
        and w.format in FORMATS
        and w.data.device.type == "cpu"
        and len(w.shape) == 2
        and x.shape[-1] == w.shape[1]
        and (w.format != "int4" or w.shape[1] % 32 == 0)
    ):
        return False
    return (w.data.dtype, w.data.shape, w.scale.dtype, w.scale.shape) == stored_as(
        w.format, w.shape
    ) and available()


@functools.lru_cache(maxsize=1024)
def stored_as(fmt: str, shape: tuple[int, ...]) -> tuple:
    """What the format table says a `fmt` weight of `shape` stores (dtypes and shapes), computed
    once per shape: `supports` runs on every matmul."""
    spec = WEIGHT[fmt]
    return (
        spec.storage,
        torch.Size(spec.data_shape(shape)),
        spec.scale_dtype,
        torch.Size(spec.full_scale_shape(shape)),
    )


def qlinear(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W^T (+ b) for an int8 or int4 W [out, in], in x's dtype (computed in float32); only
    for what `supports` takes."""
    if not supports(x, w):
        raise ValueError(f"qlinear does not take x {tuple(x.shape)} with a {w.format} W {w.shape}")
    return qlinear_unchecked(x, w, bias)


def qlinear_unchecked(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """qlinear for a caller that has just asked `supports` (kernels.linear)."""
    lib = _lib if _lib is not None else _load()
    n, k = w.shape
    lead = x.shape[:-1]
    xf = x if x.dim() == 2 else x.reshape(-1, k)
    if xf.dtype != torch.float32:
        xf = xf.to(torch.float32)
    if not xf.is_contiguous():
        xf = xf.contiguous()
    data, scale = w.data, w.scale
    if not data.is_contiguous():
        data = data.contiguous()
    if not scale.is_contiguous():
        scale = scale.contiguous()
    y = torch.empty((xf.shape[0], n), dtype=torch.float32)
    fn = lib.qlinear_int8 if w.format == "int8" else lib.qlinear_int4
    fn(
        xf.data_ptr(),
        xf.shape[0],
        k,
        data.data_ptr(),
        scale.data_ptr(),
        n,
        y.data_ptr(),
        torch.get_num_threads(),
    )
    if bias is not None:
        y += bias
    if len(lead) != 1:
        y = y.reshape(*lead, n)
    return y if x.dtype == torch.float32 else y.to(x.dtype)
