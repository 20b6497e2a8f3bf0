"""The format table: one entry per weight format and per KV-cache format, read by every layer.

Checkpoint loading and sizing (engine.load.weights, engine.load.checkpoint), the KV cache (engine.kv.kv_cache,
kernels.paged_kv), the planner's roofline (edge_sim.roofline) and both families of Triton kernels
(weights: kernels._triton_dequant via dequant_matmul / moe; KV: kernels._triton_kv_format via
paged_kv_triton) take names, byte counts, scale shapes, reference functions, checkpoint
descriptions and the Triton format code from here. The torch references themselves live in
kernels.weight_quant (weights) and kernels.kv_quant (KV cache); QuantizedWeight, a weight stored
in one of these formats, is defined here.

Adding a format (fp4, say): write its torch encode / decode in kernels.weight_quant (or quantize /
dequantize in kernels.kv_quant), add one entry to WEIGHT (or KV) below with a new FMT_* code, and
add that code's branch to the Triton kernels: `weight_tile` in kernels._triton_dequant for a weight
format; `load_block` and `store_token` / `store_block` in kernels._triton_kv_format for a KV
format. Byte counts, checkpoint checks and descriptions, CLI choices and the planner follow from
the entry; tests/unit/test_format_table.py checks the entry against what its quantize produces.

ACTIVATION is the third, smaller table: what an int8 / int4 or bf16 product computes in on a CPU (the
C kernels of kernels.native_ops), "f32" (the default: the weight widened to float32 in registers), "a8"
(int8 / int4: 8-bit activations per block of 32 on integer units) or "bf16x2" (bf16 weights: each
activation as two bf16 halves on vdpbf16ps, where the CPU has AVX-512 BF16); kernels.activation_quant
holds their float64 references, kernels.dispatch picks them from EDGE_CPU_ACTIVATIONS, and
tests/unit/test_int_dot_linear.py / test_bf16_rows.py hold the C code to them. A bf16 checkpoint's
matrices stay bf16 in memory on a CPU (kernels.dispatch.keeps_bf16, EDGE_CPU_BF16): the dense "bf16"
entry of WEIGHT below, read as stored by the same ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kernels import activation_quant as aq
from kernels import kv_quant
from kernels import weight_quant as wq
from kernels.weight_quant import FP8_BLOCK, INT4_GROUP, QuantizationError

# The one integer coding of formats that every Triton kernel branches on (tl.constexpr arguments).
FMT_DENSE, FMT_INT8, FMT_INT4, FMT_FP8 = 0, 1, 2, 3

KV_BLOCK = 16  # tokens per paged-KV block (kernels.paged_kv.BLOCK, engine.kv.kv_cache.BLOCK_SIZE)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# --- weights ------------------------------------------------------------------------------------


@dataclass
class QuantizedWeight:
    """A compressed [out, in] weight (or a stack [E, out, in] of them, one per expert) in one of
    the formats of WEIGHT below; its layout is that entry's."""

    format: str  # a compressed name of WEIGHT: "fp8" | "int8" | "int4"
    data: torch.Tensor  # WEIGHT[format].data_shape(shape), of WEIGHT[format].storage
    scale: torch.Tensor  # WEIGHT[format].full_scale_shape(shape), of WEIGHT[format].scale_dtype
    shape: tuple[int, ...]  # logical shape

    def __getitem__(self, index: int) -> QuantizedWeight:
        """One expert of a stacked weight."""
        return QuantizedWeight(self.format, self.data[index], self.scale[index], self.shape[1:])

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return WEIGHT[self.format].dequantize(self, dtype)


Encode = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # float32 w -> (data, scale)
Decode = Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]  # (data, scale, dtype) -> w


@dataclass(frozen=True)
class WeightFormat:
    """How a linear weight [.., out, in] is stored in one format."""

    name: str
    storage: torch.dtype  # dtype of the stored values (int4: uint8 bytes, two values each)
    bits: int  # bits per logical element
    scale_dtype: torch.dtype | None  # None: no scales (dense)
    scale_block: tuple[int, int]  # (rows, cols) one scale covers; 0 = the whole dimension
    scale_shape: Callable[[int, int], tuple[int, ...]]  # scales of one [rows, cols] matrix
    scale_suffix: str = ""  # checkpoint name of the scale: X.weight + suffix
    cols_multiple: int = 1  # the input dimension must be a multiple of this
    triton_code: int = FMT_DENSE
    # torch references (kernels.weight_quant) on plain tensors; None for the dense format
    encode: Encode | None = None
    decode: Decode | None = None
    # what a checkpoint's config.json says about this format (engine.load.checkpoint), parts aside
    checkpoint_config: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def compressed(self) -> bool:
        return self.scale_dtype is not None

    @property
    def bytes_per_element(self) -> float:
        return self.bits / 8

    @property
    def scale_bytes(self) -> int:
        return self.scale_dtype.itemsize if self.scale_dtype is not None else 0

    def data_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the stored values for a logical [.., out, in] weight."""
        *lead, rows, cols = shape
        return (*lead, rows, cols * self.bits // (8 * self.storage.itemsize))

    def full_scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        *lead, rows, cols = shape
        return (*lead, *self.scale_shape(rows, cols))

    def nbytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of a [.., out, in] weight in this format, scales included."""
        data = math.prod(self.data_shape(shape)) * self.storage.itemsize
        if not self.compressed:
            return data
        return data + math.prod(self.full_scale_shape(shape)) * self.scale_bytes

    def quantize(self, w: torch.Tensor, name: str = "weight") -> QuantizedWeight:
        """Compress a float [out, in] (or [E, out, in]) weight; raises QuantizationError naming `name`."""
        if w.dim() not in (2, 3):
            raise QuantizationError(
                f"{name}: only 2-D weights (or stacks of them) compress, got {list(w.shape)}"
            )
        if self.encode is None:
            raise QuantizationError(f"{name}: {self.name} is the dense format, nothing to compress")
        cols = w.shape[-1]
        if cols % self.cols_multiple:
            raise QuantizationError(
                f"{name}: input dimension {cols} is not a multiple of the {self.name} group size "
                f"{self.cols_multiple}"
            )
        data, scale = self.encode(w.to(torch.float32))
        return QuantizedWeight(self.name, data, scale, tuple(w.shape))

    def dequantize(self, qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.decode(qw.data, qw.scale, dtype)


def _no_scale(rows: int, cols: int) -> tuple[int, ...]:
    return ()


def _per_fp8_block(rows: int, cols: int) -> tuple[int, ...]:
    return (_ceil_div(rows, FP8_BLOCK), _ceil_div(cols, FP8_BLOCK))


def _per_row(rows: int, cols: int) -> tuple[int, ...]:
    return (rows,)


def _per_int4_group(rows: int, cols: int) -> tuple[int, ...]:
    return (rows, cols // INT4_GROUP)


DENSE_WEIGHT = "bf16"  # the uncompressed format: what a compressed weight expands to
WEIGHT: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat(DENSE_WEIGHT, torch.bfloat16, 16, None, (0, 0), _no_scale),
        # e4m3, one float32 scale per 128x128 block stored as its inverse (DeepSeek-V3 / Kimi K2)
        WeightFormat(
            "fp8",
            torch.float8_e4m3fn,
            8,
            torch.float32,
            (FP8_BLOCK, FP8_BLOCK),
            _per_fp8_block,
            "_scale_inv",
            1,
            FMT_FP8,
            wq.fp8_encode,
            wq.fp8_decode,
            # DeepSeek-V3 / Kimi K2's own block-FP8 description, which other tools read
            {
                "quant_method": "fp8",
                "fmt": "e4m3",
                "activation_scheme": "dynamic",
                "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
            },
        ),
        WeightFormat(
            "int8",
            torch.int8,
            8,
            torch.float32,
            (1, 0),
            _per_row,
            "_scale",
            1,
            FMT_INT8,
            wq.int8_encode,
            wq.int8_decode,
            {
                "quant_method": "edge",
                "format": "int8",
                "symmetric": True,
                "granularity": "channel",
                "scale_dtype": "float32",
            },
        ),
        # two per byte, bf16 scale per 32 along the input (Kimi-K2-Thinking's routed experts)
        WeightFormat(
            "int4",
            torch.uint8,
            4,
            torch.bfloat16,
            (1, INT4_GROUP),
            _per_int4_group,
            "_scale",
            INT4_GROUP,
            FMT_INT4,
            wq.int4_encode,
            wq.int4_decode,
            {
                "quant_method": "edge",
                "format": "int4",
                "symmetric": True,
                "group_size": INT4_GROUP,
                "packing": "two per byte, low nibble first, offset 8",
                "scale_dtype": "bfloat16",
            },
        ),
    )
}
WEIGHT_FORMATS = tuple(WEIGHT)
COMPRESSED_WEIGHT_FORMATS = tuple(n for n, f in WEIGHT.items() if f.compressed)


# --- activations of a compressed weight's product on a CPU ---------------------------------------


@dataclass(frozen=True)
class ActivationFormat:
    """What a product x W^T with an int8 / int4 or bf16 W computes in on a CPU (kernels/csrc: qlinear.c
    for f32 and bf16x2, qlinear_a8.c for a8): the weights are read as stored either way; the
    activations stay float32, or are converted once per call (8-bit codes multiplied in integers, or
    two bf16 halves multiplied on vdpbf16ps)."""

    name: str
    bits: int  # bits per activation value
    block: int  # activation values per scale along the input; 0: not quantized
    code: int  # the C kernels' code (edge_kernels.h: EDGE_ACT_*, the bits)
    weights: tuple[str, ...]  # the weight formats it pairs with
    # float64 reference of the product: (x [.., k], W [n, k]: a QuantizedWeight, or bf16 rows) -> [.., n]
    reference: Callable[[torch.Tensor, Any], torch.Tensor]
    description: str


def _f32_reference(x: torch.Tensor, w: QuantizedWeight | torch.Tensor) -> torch.Tensor:
    dense = w.dequantize(torch.float64) if isinstance(w, QuantizedWeight) else w.to(torch.float64)
    return x.to(torch.float64) @ dense.T


DEFAULT_ACTIVATION = "f32"
ACTIVATION: dict[str, ActivationFormat] = {
    f.name: f
    for f in (
        ActivationFormat(
            DEFAULT_ACTIVATION, 32, 0, 32, ("int8", "int4", "bf16"), _f32_reference,
            "float32 activations: each weight widened to float32 in registers, float32 products",
        ),
        # llama.cpp's q8_0 activations (its q8_0 x q8_0 and q4_0 x q8_0 products): integer units at batch 1
        ActivationFormat(
            "a8", 8, aq.A8_BLOCK, 8, ("int8", "int4"), aq.a8_linear_ref,
            "8-bit activations: each row of x quantized once per call per block of 32 (scale "
            "max|x| / 127, round to nearest even), integer dot products, float32 block scaling",
        ),
        # bf16 weights on AVX-512 BF16's vdpbf16ps (bf16 x bf16): x carried in two halves, so that
        # it keeps 16 of its 24 bits rather than bf16's 8 (llama.cpp's bf16 rounds x to 8)
        ActivationFormat(
            "bf16x2", 16, 0, 16, ("bf16",), aq.bf16x2_linear_ref,
            "each row of x split once per call into two bfloat16 halves (hi = bf16(x), lo = "
            "bf16(x - hi), round to nearest even), bf16 products on vdpbf16ps, float32 sums",
        ),
    )
}  # fmt: skip
ACTIVATION_FORMATS = tuple(ACTIVATION)


# --- KV cache -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVLayout:
    """How one style of KV component (key-like or value-like) is stored in one KV format."""

    staged: bool  # quantized a whole block at a time: the block being filled stays dense
    scale_shape: Callable[[int, int, int, int], tuple[int, ...]] | None  # (blocks, BLOCK, heads, dim)
    # torch references (kernels.kv_quant): staged: x [m, BLOCK, H, D], else x [n, H, D] -> (q, scale);
    # dequantize(q, scale, dtype)
    quantize: Callable | None = None
    dequantize: Callable | None = None


_DENSE_LAYOUT = KVLayout(False, None)


@dataclass(frozen=True)
class KVFormat:
    """How cached keys/values of one component are stored per paged block in one format."""

    name: str
    storage: torch.dtype | None  # None: the model's dense dtype ("auto")
    bits: int | None  # bits per value; None: the dense dtype's
    scale_dtype: torch.dtype | None
    key: KVLayout
    value: KVLayout
    dim_multiple: int = 1  # a component's dim must be a multiple of this
    triton_code: int = FMT_DENSE

    def layout(self, style: str) -> KVLayout:
        return self.key if style == "key" else self.value

    def storage_dtype(self, dense: torch.dtype) -> torch.dtype:
        return self.storage if self.storage is not None else dense

    def bytes_per_element(self, dense: torch.dtype) -> float:
        return (self.bits if self.bits is not None else dense.itemsize * 8) / 8

    def data_shape(self, blocks: int, heads: int, dim: int) -> tuple[int, ...]:
        """Stored values of `blocks` blocks of a [heads, dim] component (int4: dim/2 bytes)."""
        if self.storage is not None:
            dim = dim * self.bits // (8 * self.storage.itemsize)
        return (blocks, KV_BLOCK, heads, dim)

    def scale_shape(self, style: str, blocks: int, heads: int, dim: int) -> tuple[int, ...] | None:
        shape = self.layout(style).scale_shape
        return shape(blocks, KV_BLOCK, heads, dim) if shape is not None else None

    def block_bytes(self, style: str, heads: int, dim: int, dense: torch.dtype) -> int:
        """Bytes of one block of a [heads, dim] component, scales included."""
        data = math.prod(self.data_shape(1, heads, dim)) * self.storage_dtype(dense).itemsize
        scale = self.scale_shape(style, 1, heads, dim)
        return data + (math.prod(scale) * self.scale_dtype.itemsize if scale is not None else 0)


def _per_block_head(blocks: int, block: int, heads: int, dim: int) -> tuple[int, ...]:
    return (blocks, heads)


def _per_token_head(blocks: int, block: int, heads: int, dim: int) -> tuple[int, ...]:
    return (blocks, block, heads)


def _per_block_channel(blocks: int, block: int, heads: int, dim: int) -> tuple[int, ...]:
    return (blocks, heads, dim)


def _per_token_group(blocks: int, block: int, heads: int, dim: int) -> tuple[int, ...]:
    return (blocks, block, heads, dim // kv_quant.GROUP)


_FP8_KV = KVLayout(True, _per_block_head, kv_quant.fp8_quantize_block, kv_quant.fp8_dequantize_block)
_INT8_KV = KVLayout(False, _per_token_head, kv_quant.int8_quantize_token, kv_quant.int8_dequantize_token)
KV: dict[str, KVFormat] = {
    f.name: f
    for f in (
        KVFormat("auto", None, None, None, _DENSE_LAYOUT, _DENSE_LAYOUT),
        KVFormat("bf16", torch.bfloat16, 16, None, _DENSE_LAYOUT, _DENSE_LAYOUT),
        KVFormat("fp8", torch.float8_e4m3fn, 8, torch.float32, _FP8_KV, _FP8_KV, triton_code=FMT_FP8),
        KVFormat(
            "int8",
            torch.int8,
            8,
            torch.float32,
            _INT8_KV,
            _INT8_KV,
            triton_code=FMT_INT8,
        ),
        # KIVI: keys per channel over a block (staged), values per token in groups of 32
        KVFormat(
            "int4",
            torch.uint8,
            4,
            torch.float16,
            KVLayout(
                True, _per_block_channel, kv_quant.int4_quantize_channel, kv_quant.int4_dequantize_channel
            ),
            KVLayout(False, _per_token_group, kv_quant.int4_quantize_group, kv_quant.int4_dequantize_group),
            dim_multiple=kv_quant.GROUP,
            triton_code=FMT_INT4,
        ),
    )
}
KV_DTYPES = tuple(KV)
