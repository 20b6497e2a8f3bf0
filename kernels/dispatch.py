"""The single place that decides which implementation of a kernel runs.

Triton or torch, per call (`use_triton`): `EDGE_KERNELS=auto` (default): Triton on CUDA tensors, the
torch reference on CPU. `EDGE_KERNELS=torch` or `triton` forces one (tests run Triton on the CPU
under TRITON_INTERPRET=1). There is no silent fallback on a GPU: a kernel that cannot take a shape
raises, naming it.

Which op a model's weight product runs, chosen once when the layer is built (the engine's layers ask
here and never decide it themselves): from the weight's format (dense float32 / bfloat16, int8,
int4, fp8), its device, whether the CPU ops of kernels.native_ops are built, and whether the call is
eager or inside a compiled step's graph:

- `linear_op(w, compiled)`: a projection x W^T (+ b): NATIVE_LINEAR, KERNELS_LINEAR, EAGER_LINEAR or MATMUL;
- `experts_op(w13, w2, inter, compiled)`: a MoE layer's routed experts: NATIVE_MOE, EXPERT_LOOP or EAGER_MOE;

and, per call, what the eager kernels.linear runs for a compressed weight: `linear_impl(x, w)`
(TRITON, QLINEAR or REFERENCE). The names are the ops' own, so they also say which path ran.

What an int8 / int4 or bf16 product that edge_cpu::linear or edge_cpu::fused_moe runs computes in,
chosen once when the layer is built: `linear_activations(w)`, `experts_activations(w13, w2, inter)`,
the activation formats (kernels.formats.ACTIVATION) that `EDGE_CPU_ACTIVATIONS` names, comma-separated:
"f32" (default: the weights widened to float32 in registers), "a8" (int8 / int4: x quantized to 8 bits
per block of 32 once per call, integer dot products: kernels/csrc/qlinear_a8.c), "bf16x2" (bf16: x
split into two bf16 halves once per call, vdpbf16ps where the CPU has AVX-512 BF16). A weight those
ops do not take (float32, fp8, a GPU, no build) computes as before whatever it says.

Whether an int8 weight that runs with "a8" activations is repacked at load into blocks of four
interleaved rows (`repacks`, EDGE_CPU_REPACK "1" default, "0" off): the a8 kernel then reads one
stream instead of four, the same bits.

Whether a bf16 checkpoint's matrices stay bf16 in memory on a CPU, chosen once at load
(`keeps_bf16(device)`): `EDGE_CPU_BF16` "bf16" (default: the native ops read bf16 rows as stored,
half the bytes of float32, widened in registers or multiplied by vdpbf16ps) or "f32" (widened to
float32 at load, as before). Without the ops built (or on a GPU) nothing changes whatever it says.
"""

from __future__ import annotations

import os

import torch

from kernels import native_ops
from kernels.formats import ACTIVATION, DEFAULT_ACTIVATION, QuantizedWeight

BACKEND_ENV = "EDGE_KERNELS"
_BACKENDS = ("auto", "torch", "triton")
ACTIVATIONS_ENV = "EDGE_CPU_ACTIVATIONS"  # "f32" (default) | "a8" | "bf16x2" | "a8,bf16x2": activations()
BF16_ENV = "EDGE_CPU_BF16"  # "bf16" (default) | "f32": keeps_bf16
REPACK_ENV = "EDGE_CPU_REPACK"  # "1" (default) | "0": repacks
BF16_CHOICES = ("bf16", "f32")

# the ops a model's product can run as
NATIVE_LINEAR = "edge_cpu::linear"  # C++ op (kernels.native_ops): int8 / int4 as stored, or dense f32 / bf16
NATIVE_MOE = "edge_cpu::fused_moe"  # C++ op (kernels.native_ops): the routed experts in one call
KERNELS_LINEAR = "kernels.linear"  # eager: per call Triton, the C kernel (qlinear) or the reference
EAGER_LINEAR = (
    "edge::quantized_linear"  # kernels.linear as an opaque op of a compiled step (engine.models.eager_ops)
)
EXPERT_LOOP = (
    "expert loop"  # eager: per call Triton's grouped GEMM (kernels.fused_moe) or the per-expert loop
)
EAGER_MOE = (
    "edge::routed_experts"  # the expert loop as an opaque op of a compiled step (engine.models.eager_ops)
)
MATMUL = "torch.matmul"  # a dense weight kept [in, out]: x @ W^T, torch's matmul
# what kernels.linear runs for a compressed weight, per call
TRITON = "triton"  # kernels.dequant_matmul's Triton kernel, decoded in registers
QLINEAR = "qlinear"  # the C kernel through its ctypes entry (kernels.native_ops.qlinear)
REFERENCE = "torch"  # dequantize, then multiply (kernels.quant.linear_ref)


class KernelShapeError(ValueError):
    """A Triton kernel was asked for a shape or dtype it does not handle."""


_cached: tuple[str, str] | None = None  # (raw env value, validated choice): read per call, parsed once


def backend() -> str:
    global _cached
    raw = os.environ.get(BACKEND_ENV, "auto")
    if _cached is not None and _cached[0] == raw:
        return _cached[1]
    choice = raw.strip().lower() or "auto"
    if choice not in _BACKENDS:
        raise ValueError(f"{BACKEND_ENV}={choice!r}; expected one of {', '.join(_BACKENDS)}")
    _cached = (raw, choice)
    return choice


def use_triton(t: torch.Tensor) -> bool:
    choice = backend()
    if choice == "auto":
        return t.is_cuda
    return choice == "triton"


def activations() -> str:
    """The activation formats EDGE_CPU_ACTIVATIONS asks for ("f32" unset), comma-separated, one per
    weight format at most: "a8" (int8 / int4), "bf16x2" (bf16), or "a8,bf16x2"; ValueError naming a
    name that is not one of kernels.formats.ACTIVATION."""
    raw = os.environ.get(ACTIVATIONS_ENV, "").strip().lower() or DEFAULT_ACTIVATION
    names = [name.strip() for name in raw.split(",") if name.strip()] or [DEFAULT_ACTIVATION]
    for name in names:
        if name not in ACTIVATION:
            raise ValueError(f"{ACTIVATIONS_ENV}={name!r}; expected one of {', '.join(ACTIVATION)}")
    return ",".join(names)


def activations_for(fmt: str | None) -> str:
    """The activation format asked for (`activations()`) that pairs with weight format `fmt`, else
    "f32"; "bf16x2" only where the CPU has AVX-512 BF16 (elsewhere the op would widen: say so)."""
    for name in activations().split(","):
        if name != DEFAULT_ACTIVATION and fmt in ACTIVATION[name].weights:
            if name == "bf16x2" and "avx512_bf16" not in native_ops.bf16_isas():
                continue
            return name
    return DEFAULT_ACTIVATION


def keeps_bf16(device: torch.device) -> bool:
    """Whether a bf16 checkpoint's matrices stay bf16 in memory on `device` (EDGE_CPU_BF16, "bf16"
    unset): on a CPU with the native ops built, which read them as stored; ValueError naming a value
    that is not one of BF16_CHOICES."""
    choice = os.environ.get(BF16_ENV, "").strip().lower() or BF16_CHOICES[0]
    if choice not in BF16_CHOICES:
        raise ValueError(f"{BF16_ENV}={choice!r}; expected one of {', '.join(BF16_CHOICES)}")
    return choice == "bf16" and device.type == "cpu" and native_ops.available()


def repacks(fmt: str | None, activations: str) -> bool:
    """Whether a layer's int8 weights the native ops read with 8-bit activations are repacked at load
    (kernels.native_ops.RepackedInt8: four rows a stream, the same bits, about 20% more of the memory
    rate at batch 1): EDGE_CPU_REPACK, "1" unset, "0" keeps the rows as stored (to compare)."""
    if fmt != "int8" or activations != "a8":
        return False
    return os.environ.get(REPACK_ENV, "1").strip() != "0"


def linear_activations(w: torch.Tensor | QuantizedWeight) -> str:
    """What a projection's product with W computes in: the activation format asked for
    (`activations()`) that pairs with W's format (a8: int8, int4; bf16x2: bf16) where edge_cpu::linear
    takes W (native_ops.takes; bf16 rows on a CPU with the ops built), else "f32" (the op's own
    float32 path, or a dense or reference product)."""
    if isinstance(w, QuantizedWeight):
        choice = activations_for(w.format)
        return choice if choice != DEFAULT_ACTIVATION and native_ops.takes(w) else DEFAULT_ACTIVATION
    if w.dtype == torch.bfloat16 and linear_op(w) == NATIVE_LINEAR:
        return activations_for("bf16")
    return DEFAULT_ACTIVATION


def experts_activations(
    w13: torch.Tensor | QuantizedWeight | None, w2: torch.Tensor | QuantizedWeight | None, inter: int
) -> str:
    """What a MoE layer's routed experts compute in: the activation format asked for that pairs with
    the format edge_cpu::fused_moe reads them in as stored (a8: int8, int4; bf16x2: bf16), else "f32"."""
    if w13 is None or w2 is None or activations() == DEFAULT_ACTIVATION:
        return DEFAULT_ACTIVATION
    return activations_for(native_ops.experts_format(w13, w2, inter))


def linear_op(w: torch.Tensor | QuantizedWeight, compiled: bool = False) -> str:
    """The op a model's projection x W^T (+ b) runs for its checkpoint weight W [out, in]:

    NATIVE_LINEAR   int8 / int4 that edge_cpu::linear reads as stored (native_ops.takes), or dense
                    float32 / bfloat16 kept [out, in], on a CPU with the ops built; eager and compiled
                    alike
    KERNELS_LINEAR  any other compressed weight (fp8, a GPU, no build), eagerly: kernels.linear
    EAGER_LINEAR    the same inside a compiled step (`compiled`): kernels.linear as an opaque op
    MATMUL          any other dense weight (float16, a GPU, no build): x @ W^T on W kept [in, out]
    """
    if isinstance(w, QuantizedWeight):
        if native_ops.takes(w):
            return NATIVE_LINEAR
        return EAGER_LINEAR if compiled else KERNELS_LINEAR
    if w.dtype in native_ops.DENSE_FORMATS and w.device.type == "cpu" and native_ops.available():
        return NATIVE_LINEAR
    return MATMUL


def experts_op(
    w13: torch.Tensor | QuantizedWeight | None,
    w2: torch.Tensor | QuantizedWeight | None,
    inter: int,
    compiled: bool = False,
) -> str:
    """The op a MoE layer's routed experts run, for their stacked weights w13 [E, 2I, H] (gate rows,
    then up rows) and w2 [E, H, I] (None: the layer could not stack them so, e.g. fp8 gate and up):

    NATIVE_MOE   dense float32 / bfloat16, or int8 / int4 in one format, that edge_cpu::fused_moe
                 reads as stored (native_ops.experts_format), on a CPU with the ops built; eager and
                 compiled alike
    EXPERT_LOOP  otherwise, eagerly: per call Triton's grouped GEMM where use_triton(x), else the
                 per-expert loop (torch's matmuls, or kernels.linear for compressed experts)
    EAGER_MOE    the same inside a compiled step (`compiled`): the loop as an opaque op
    """
    if w13 is not None and w2 is not None and native_ops.experts_format(w13, w2, inter) is not None:
        return NATIVE_MOE
    return EAGER_MOE if compiled else EXPERT_LOOP


def linear_impl(x: torch.Tensor, w: QuantizedWeight) -> str:
    """What kernels.linear runs for x and a compressed W, per call: TRITON where use_triton(x), else
    QLINEAR where the C kernel reads W as stored (int8 / int4 on a CPU with the ops built:
    native_ops.supports), else REFERENCE (dequantize, then multiply: fp8 on a CPU, no build)."""
    if use_triton(x):
        return TRITON
    if native_ops.supports(x, w):
        return QLINEAR
    return REFERENCE
