"""The CPU ops of kernels/csrc, one library (kernels.native_build) and this one wrapper: whether they
are there (`available`, `problem`), which instruction-set path they run (`isa`, `isas`,
`set_max_isa`), and the calls.

Registered with torch.library, the `edge_cpu::` ops a model calls as one C++ op each, eager or
inside a compiled step (no Python, no host read, no thread-local lookup of the model's objects):

    edge_cpu::fused_moe   the routed experts of a MoE layer (kernels/csrc/moe.c): top-k weights and
                          ids as tensors in, tokens counted per expert inside, only the active
                          experts' weights read, in any stored format (f32, bf16, int8, int4)
    edge_cpu::linear      x W^T (+ b) for a weight read as stored (kernels/csrc/qlinear.c): int8, int4,
                          or dense f32 / bf16 [out, in]; the weight's tensors as arguments; an int8 /
                          int4 product in float32 activations or, `act` 8, in 8-bit ones on integer
                          units (kernels/csrc/qlinear_a8.c, kernels.formats.ACTIVATION's "a8"); a
                          bf16 one widened in registers or, `act` 16 ("bf16x2"), on vdpbf16ps

The same library's C entry points, called with ctypes (a few microseconds a call, less than the op
dispatcher plus its Python wrapper; the GIL released for the call):

    qlinear               x W^T (+ b) for an int8 or int4 W [out, in] (the same C as edge_cpu::linear):
                          kernels.linear's CPU path for a compressed weight a model layer did not
                          hand to edge_cpu::linear (kernels.dispatch decides which runs)

The layout is the format table's own (kernels/formats.py: int8 [out, in] with a float32 scale per
row; int4 two codes a byte, low nibble first, a bfloat16 scale per 32 along the input), read as
stored: no repack at load, so a checkpoint, the Triton kernels and these share one layout. The
path is chosen at run time by CPUID: AVX-512 (F, BW, VL) where the CPU has it, else AVX2 + FMA, else
a portable scalar path of the same loops; `set_max_isa` caps it (the tests run every path). The a8
products have paths of their own (`a8_isa`, `a8_isas`, `set_max_a8_isa`): "avx512_vnni", "avx_vnni"
(256-bit vpdpbusd: AVX-VNNI's, else AVX-512 VNNI's at 256 bits), "avx2" (maddubs) and "scalar".
bf16 weights' products list theirs too (`bf16_isa`, `bf16_isas`, `set_max_bf16_isa`): the widening
ones and "avx512_bf16" (vdpbf16ps, for the "bf16x2" activations, where the CPU has AVX-512 BF16).

The fake implementations, which give torch.compile the ops' output shapes, are registered here.
Without compilers, or with EDGE_CPU_KERNELS=0, `available()` is False: compressed weights run
dequantize-then-multiply (the reference), MoE layers their eager loop, dense products torch's
matmul, and why is said once on stderr.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels import native_build
from kernels.formats import ACTIVATION, DEFAULT_ACTIVATION, WEIGHT, QuantizedWeight

log = logging.getLogger(__name__)
ENV = "EDGE_CPU_KERNELS"  # "0": never build or use them (the reference paths)
ISAS = ("scalar", "avx2", "avx512")  # the C code's paths, lowest first
A8_ISAS = ("scalar", "avx2", "avx_vnni", "avx512_vnni")  # qlinear_a8.c's paths, lowest first
BF16_ISAS = ("scalar", "avx2", "avx512", "avx512_bf16")  # qlinear.c's paths for a bf16 weight
FORMATS = ("int8", "int4")  # the compressed formats the C kernels read as stored
DENSE_FORMATS = {torch.float32: "f32", torch.bfloat16: "bf16"}  # the dense ones (by dtype)
# stored weight formats and their code in the C kernels (edge_kernels.h: the bits per weight; int8_r4:
# int8 repacked at load for the a8 products, RepackedInt8)
FORMAT_CODES = {"f32": 32, "bf16": 16, "int8": 8, "int4": 4, "int8_r4": 9}
ACTIVATION_CODES = {name: f.code for name, f in ACTIVATION.items()}  # f32 32, a8 8, bf16x2 16 (EDGE_ACT_*)
_lib: ctypes.CDLL | None = None  # the loaded library, its C symbols (the same mapping as the ops')
_problem: str | None = None  # why the ops are not available, once known


def build() -> Path:
    """The compiled library for the current sources and torch (built now if missing); RuntimeError
    why not."""
    return native_build.build()


def _load() -> ctypes.CDLL | None:
    global _lib, _problem
    if _lib is not None or _problem is not None:
        return _lib
    if os.environ.get(ENV, "1").strip() == "0":
        _problem = f"{ENV}=0"
    else:
        try:
            path = build()
            torch.ops.load_library(str(path))
            lib = ctypes.CDLL(str(path))  # the same mapping: its ISA cap is the ops' own
            p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
            for name in ("qlinear_int8", "qlinear_int4", "qlinear_a8_int8", "qlinear_a8_int4"):
                getattr(lib, name).argtypes = [p, i64, i64, p, p, i64, p, i32]
                getattr(lib, name).restype = ctypes.c_int if "_a8_" in name else None
            for name in ("qlinear_isa", "qlinear_cpu_isa", "qlinear_a8_isa", "qlinear_a8_cpu_isa"):
                getattr(lib, name).restype = ctypes.c_char_p
            for name in ("qlinear_bf16_isa", "qlinear_bf16_cpu_isa"):
                getattr(lib, name).restype = ctypes.c_char_p
            lib.qlinear_set_max_isa.argtypes = [i32]
            lib.qlinear_bf16_set_max.argtypes = [i32]
            lib.qlinear_a8_quantize.argtypes = [p, i64, i64, p, p]
            lib.qlinear_a8_quantize.restype = ctypes.c_int
            lib.qlinear_a8_set_max.argtypes = [i32]
            _register_fakes()
            _lib = lib
        except (RuntimeError, OSError) as exc:
            _problem = str(exc)
    if _problem is not None:
        message = (
            "the CPU ops are not built: compressed weights run dequantize-then-multiply on this CPU "
            f"(the reference path), MoE layers their eager loop: {_problem}"
        )
        log.info(message)
        print(f"edge: {message}", file=sys.stderr)
    return _lib


_faked = False


def _register_fakes() -> None:
    global _faked
    if _faked:  # a second load after _reset: the library stays mapped, its fakes registered
        return

    @torch.library.register_fake("edge_cpu::fused_moe")
    def _(x, topk_weights, topk_ids, w13, s13, w2, s2, fmt, inter, real_rows, load, act=32):
        return torch.empty_like(x)

    @torch.library.register_fake("edge_cpu::linear")
    def _(x, w, scale, bias, fmt, out_features, act=32):
        return x.new_empty(*x.shape[:-1], out_features)

    _faked = True


def _reset() -> None:
    """Forget what _load decided (the tests of the fallback; the library itself stays mapped)."""
    global _lib, _problem
    _lib, _problem = None, None


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


def isas() -> tuple[str, ...]:
    """Every path this CPU can run, lowest first (empty when not built): what the tests cover."""
    lib = _load()
    return ISAS[: ISAS.index(lib.qlinear_cpu_isa().decode()) + 1] if lib is not None else ()


def set_max_isa(name: str) -> None:
    """Cap the ops' path ("scalar", "avx2", "avx512"; the CPU's best still bounds it): the tests."""
    lib = _load()
    if lib is not None:
        lib.qlinear_set_max_isa(ISAS.index(name))


def a8_isa() -> str:
    """The path the a8 products run now: "avx512_vnni", "avx_vnni", "avx2", "scalar", or "none"."""
    lib = _load()
    return lib.qlinear_a8_isa().decode() if lib is not None else "none"


def a8_isas() -> tuple[str, ...]:
    """Every a8 path this CPU can run, lowest first (empty when not built): what the tests cover."""
    lib = _load()
    return A8_ISAS[: A8_ISAS.index(lib.qlinear_a8_cpu_isa().decode()) + 1] if lib is not None else ()


def set_max_a8_isa(name: str) -> None:
    """Cap the a8 products' path (one of A8_ISAS; the CPU's best and set_max_isa still bound it)."""
    lib = _load()
    if lib is not None:
        lib.qlinear_a8_set_max(A8_ISAS.index(name))


def bf16_isa(activations: str = DEFAULT_ACTIVATION) -> str:
    """The path a bf16 weight's product in `activations` runs now: "avx512_bf16" (vdpbf16ps: "bf16x2"
    where the CPU has AVX-512 BF16), "avx512", "avx2" (widened in registers), "scalar", or "none"
    (not built)."""
    lib = _load()
    if lib is None:
        return "none"
    best = lib.qlinear_bf16_isa().decode()
    if activations != "bf16x2" and best == "avx512_bf16":
        return "avx512"  # float32 activations: the widening path at most
    return best


def bf16_isas() -> tuple[str, ...]:
    """Every bf16 path this CPU can run, lowest first (empty when not built): what the tests cover."""
    lib = _load()
    return BF16_ISAS[: BF16_ISAS.index(lib.qlinear_bf16_cpu_isa().decode()) + 1] if lib is not None else ()


def set_max_bf16_isa(name: str) -> None:
    """Cap the bf16 products' path (one of BF16_ISAS; the CPU's best and set_max_isa still bound it)."""
    lib = _load()
    if lib is not None:
        lib.qlinear_bf16_set_max(BF16_ISAS.index(name))


def a8_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The C code's 8-bit activations of x [m, k] (float32): codes int8 [m, nb, 32] (nb = ceil(k / 32),
    zero past k) and block scales float32 [m, nb], as every a8 path rounds them (the tests hold them
    to kernels.activation_quant.a8_quantize)."""
    lib = _load()
    assert lib is not None, "the CPU ops are not built"
    xf = x.to(torch.float32).contiguous()
    m, k = xf.shape
    nb = -(-k // 32)
    q = torch.empty(m, nb, 32, dtype=torch.int8)
    d = torch.empty(m, nb, dtype=torch.float32)
    if lib.qlinear_a8_quantize(xf.data_ptr(), m, k, q.data_ptr(), d.data_ptr()):
        raise MemoryError(f"a8_codes: no memory for x {tuple(xf.shape)}")
    return q, d


def force_scalar(on: bool) -> None:
    """Run the portable path even where AVX2 or AVX-512 is there (the tests check both)."""
    set_max_isa("scalar" if on else "avx512")


# --- what the ops take ----------------------------------------------------------------------------


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


def _readable(w: QuantizedWeight) -> bool:
    """An int8 or int4 W [out, in] on the CPU (int4's input a multiple of its 32-wide scale group)
    whose stored tensors are exactly what the format table says of the shape: the C code trusts the
    sizes it is given."""
    if w.format not in FORMATS or w.data.device.type != "cpu" or len(w.shape) != 2:
        return False
    if w.format == "int4" and w.shape[1] % 32:
        return False
    return (w.data.dtype, w.data.shape, w.scale.dtype, w.scale.shape) == stored_as(w.format, w.shape)


def supports(x: torch.Tensor, w: QuantizedWeight) -> bool:
    """Whether qlinear takes this product (else the reference does): x on the CPU, as wide as W's
    input, and a W the C code reads as stored (any strides: qlinear makes them contiguous)."""
    return x.device.type == "cpu" and x.shape[-1] == w.shape[-1] and _readable(w) and available()


def takes(w: QuantizedWeight) -> bool:
    """Whether edge_cpu::linear reads this weight as stored: int8 or int4 [out, in] on the CPU (int4's
    input a multiple of its 32-wide scale group), its tensors exactly what the format table says of
    the shape, contiguous; and the ops are built."""
    return _readable(w) and w.data.is_contiguous() and w.scale.is_contiguous() and available()


def experts_format(
    w13: torch.Tensor | QuantizedWeight, w2: torch.Tensor | QuantizedWeight, inter: int
) -> str | None:
    """The format edge_cpu::fused_moe reads a layer's stacked experts in (w13 [E, 2I, H]: gate rows,
    then up rows; w2 [E, H, I]), or None where it cannot: dense float32 or bfloat16, or int8 / int4
    with both in one format (int4: H and I multiples of 32), every stored tensor contiguous, on the
    CPU, and the ops built."""
    if isinstance(w13, QuantizedWeight):
        if not isinstance(w2, QuantizedWeight) or w13.format not in FORMATS or w2.format != w13.format:
            return None
        if w13.format == "int4" and (w13.shape[-1] % 32 or inter % 32):
            return None
        fmt, stored = w13.format, (w13.data, w13.scale, w2.data, w2.scale)
    else:
        fmt, stored = DENSE_FORMATS.get(w13.dtype), (w13, w2)
        if fmt is None or isinstance(w2, QuantizedWeight) or w2.dtype != w13.dtype:
            return None
    if not all(t.is_contiguous() for t in stored) or stored[0].device.type != "cpu":
        return None
    return fmt if available() else None


def experts_args(
    w13: torch.Tensor | QuantizedWeight, w2: torch.Tensor | QuantizedWeight, inter: int
) -> tuple:
    """fused_moe's weight arguments (w13, s13, w2, s2, fmt, inter) for experts `experts_format` takes."""
    fmt = experts_format(w13, w2, inter)
    assert fmt is not None, "edge_cpu::fused_moe does not read these experts as stored"
    if isinstance(w13, QuantizedWeight) and isinstance(w2, QuantizedWeight):
        return w13.data, w13.scale, w2.data, w2.scale, fmt, inter
    return w13, None, w2, None, fmt, inter


# --- int8 repacked at load for the a8 products ---------------------------------------------------

R4_ROWS, R4_CHUNK = 4, 64  # rows interleaved per block, bytes of each row per chunk


@dataclass
class RepackedInt8:
    """An int8 W [out, in] (or a stack [E, out, in]) repacked at load for the a8 products
    (qlinear_a8.c's EDGE_INT8_R4): each block of four rows is one stream, chunk c holding the four
    rows' bytes 64c .. 64c + 63 one after another, rows padded with zeros to a multiple of 64 bytes
    and the last block with zero rows to four. Why: the a8 kernel reads four rows at once, and four
    short streams are what the hardware prefetcher follows worst (int8 streamed from memory at batch
    1, one thread: 1.0-1.2x the rows as stored, most where rows are short). The same codes meet the same
    activations in the same order: the product is the same bits as on `unpack()`. The scales are the
    checkpoint's (a float32 per row, 1/k of the bytes); the checkpoint on disk keeps its layout."""

    data: torch.Tensor  # int8 [.., ceil(out / 4) * 4, ceil(in / 64) * 64]
    scale: torch.Tensor  # float32 [.., out]
    shape: tuple[int, ...]  # logical [.., out, in]
    format = "int8_r4"  # the op's format name (FORMAT_CODES)

    def __getitem__(self, index: int) -> RepackedInt8:
        """One expert of a stacked weight."""
        return RepackedInt8(self.data[index], self.scale[index], self.shape[1:])

    def nbytes(self) -> int:
        return self.data.numel() + self.scale.numel() * self.scale.element_size()

    def unpack(self) -> QuantizedWeight:
        """The int8 weight as the format table stores it (a copy)."""
        *lead, n, k = self.shape
        rows, width = self.data.shape[-2:]
        blocks = self.data.reshape(*lead, rows // R4_ROWS, width // R4_CHUNK, R4_ROWS, R4_CHUNK)
        natural = blocks.transpose(-3, -2).reshape(*lead, rows, width)[..., :n, :k].contiguous()
        return QuantizedWeight("int8", natural, self.scale, self.shape)


def repack_int8(w: QuantizedWeight) -> RepackedInt8:
    """An int8 W [.., out, in] as RepackedInt8 (a new tensor; W itself is left as it is)."""
    assert w.format == "int8", w.format
    *lead, n, k = w.shape
    rows, width = -(-n // R4_ROWS) * R4_ROWS, -(-k // R4_CHUNK) * R4_CHUNK
    padded = torch.nn.functional.pad(w.data, (0, width - k, 0, rows - n))
    blocks = padded.reshape(*lead, rows // R4_ROWS, R4_ROWS, width // R4_CHUNK, R4_CHUNK)
    data = blocks.transpose(-3, -2).reshape(*lead, rows, width).contiguous()
    return RepackedInt8(data, w.scale.contiguous(), tuple(w.shape))


# --- the calls ------------------------------------------------------------------------------------


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
    activations: str = DEFAULT_ACTIVATION,
) -> torch.Tensor:
    """sum_j topk_weights[t, j] * down(silu(gate(x_t)) * up(x_t)) over each token's experts
    topk_ids[t, j], for the stored weights w13 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I]
    in `fmt` with their scales (int8, int4); `load` [E] int64 gains the tokens routed to each
    expert; `real_rows` (a one-element int64 tensor): only that many leading rows are real (the
    others come back zero); `activations`: "f32", or "a8" for int8 / int4 experts on integer units
    (each token quantized once for all its experts). Needs `available()`."""
    return torch.ops.edge_cpu.fused_moe(
        x, topk_weights, topk_ids, w13, s13, w2, s2, FORMAT_CODES[fmt], inter, real_rows, load,
        ACTIVATION_CODES[activations],
    )  # fmt: skip


def linear_dense(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    activations: str = DEFAULT_ACTIVATION,
) -> torch.Tensor:
    """x @ W^T (+ b) for a dense float32 or bfloat16 W [out, in] (contiguous), in x's dtype (computed
    in float32: a bf16 W widened in registers; or, `activations` "bf16x2" for a bf16 W, x split into
    two bf16 halves on vdpbf16ps where the CPU has AVX-512 BF16)."""
    code = FORMAT_CODES["bf16" if w.dtype == torch.bfloat16 else "f32"]
    return torch.ops.edge_cpu.linear(x, w, None, bias, code, w.shape[0], ACTIVATION_CODES[activations])


def linear(
    x: torch.Tensor,
    w: QuantizedWeight | RepackedInt8,
    bias: torch.Tensor | None = None,
    activations: str = DEFAULT_ACTIVATION,
) -> torch.Tensor:
    """x @ W^T (+ b) for an int8 or int4 W [out, in] read as stored, in x's dtype, computed with the
    activations in `activations` (kernels.formats.ACTIVATION: "f32", or "a8" on integer units); only
    for a weight `takes` accepts, or an int8 one repacked (RepackedInt8, "a8" only)."""
    return torch.ops.edge_cpu.linear(
        x, w.data, w.scale, bias, FORMAT_CODES[w.format], w.shape[0], ACTIVATION_CODES[activations]
    )


def qlinear(
    x: torch.Tensor,
    w: QuantizedWeight,
    bias: torch.Tensor | None = None,
    activations: str = DEFAULT_ACTIVATION,
) -> torch.Tensor:
    """x @ W^T (+ b) for an int8 or int4 W [out, in], in x's dtype, computed with the activations in
    `activations` ("f32" or "a8"), through the C entry point; only for what `supports` takes."""
    if not supports(x, w):
        raise ValueError(f"qlinear does not take x {tuple(x.shape)} with a {w.format} W {w.shape}")
    if activations not in ACTIVATION:
        raise ValueError(f"activations {activations!r}: one of {', '.join(ACTIVATION)}")
    return qlinear_unchecked(x, w, bias, activations)


def qlinear_unchecked(
    x: torch.Tensor,
    w: QuantizedWeight,
    bias: torch.Tensor | None = None,
    activations: str = DEFAULT_ACTIVATION,
) -> torch.Tensor:
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
    if activations == "a8":
        fn = lib.qlinear_a8_int8 if w.format == "int8" else lib.qlinear_a8_int4
    else:
        fn = lib.qlinear_int8 if w.format == "int8" else lib.qlinear_int4
    done = fn(
        xf.data_ptr(),
        xf.shape[0],
        k,
        data.data_ptr(),
        scale.data_ptr(),
        n,
        y.data_ptr(),
        torch.get_num_threads(),
    )
    if done:  # the a8 entries' -1: no memory to pack the activations
        raise MemoryError(f"qlinear: no memory for x {tuple(xf.shape)} in 8 bits")
    if bias is not None:
        y += bias
    if len(lead) != 1:
        y = y.reshape(*lead, n)
    return y if x.dtype == torch.float32 else y.to(x.dtype)
