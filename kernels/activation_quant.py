"""The activation formats of kernels.formats.ACTIVATION other than float32: their torch references.

Activations in 8 bits ("a8"): the reference of kernels/csrc/qlinear_a8.c's integer products with an
int8 or int4 weight.

Each row of x is cut into blocks of 32 along the input (the last one zero-padded). Per block, in
float32 as the C computes it: d = max|x| / 127, inv = 1 / d (0 for an all-zero block), and the codes
q = round-half-to-even(clamp(x * inv, -127, 127)). Then, exactly, in integers and float64:

    int8 W (codes w, a float32 scale s per row):        y = s * sum_b d_b * sum_i q_i w_i
    int4 W (codes c - 8, a bfloat16 scale s_b per 32):  y = sum_b s_b d_b * sum_i q_i (c_i - 8)

Each block's integer sum is exact in the C code too (int32); the C rounds only in scaling and
adding the blocks up, in float32. Against float32 activations, an activation moves by at most
d_b / 2 (plus float32 rounding), so |y_a8 - y_f32| <= sum_b d_b / 2 * sum_i |W_i| over the block.

Activations as two bf16 halves ("bf16x2"): the reference of kernels/csrc/qlinear.c's vdpbf16ps path
with a bf16 weight. Each x is split once per call, hi = bf16(x) (round to nearest even) and lo =
bf16(x - hi) (x - hi is exact in float32); the product is W (hi + lo), each bf16 x bf16 product exact
in float32, and only the float32 sums round. hi + lo keeps 16 of x's 24 significant bits:
|x - hi - lo| <= 2^-8 |x - hi| <= 2^-16 |x| (x normal: bf16 rounds to 8 significant bits).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from kernels.packing import unpack_int4


class QuantizedWeight(Protocol):
    """What the reference reads of kernels.formats.QuantizedWeight (named by shape: formats imports
    this module, so this one does not import it back)."""

    format: str
    data: torch.Tensor
    scale: torch.Tensor
    shape: tuple[int, ...]


A8_BLOCK = 32  # activation values per scale (int4's weight group too, so the two line up)
A8_MAX = 127  # codes in [-127, 127]: symmetric, and |x| fits the unsigned side of vpdpbusd / maddubs


def _blocks(t: torch.Tensor) -> torch.Tensor:
    """[.., k] -> [.., ceil(k / 32), 32], zero-padded."""
    k = t.shape[-1]
    nb = -(-k // A8_BLOCK)
    return F.pad(t, (0, nb * A8_BLOCK - k)).unflatten(-1, (nb, A8_BLOCK))


def a8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [.., k] -> (codes int8 [.., nb, 32], block scales float32 [.., nb]), nb = ceil(k / 32), the
    padding's codes zero: the C code's rounding, step by step in float32 (tensor by tensor
    divisions, so no reciprocal stands in for a quotient)."""
    blocks = _blocks(x.to(torch.float32))
    amax = blocks.abs().amax(dim=-1)
    d = amax / torch.full_like(amax, float(A8_MAX))
    safe = torch.where(d > 0, d, torch.ones_like(d))
    inv = torch.where(d > 0, torch.ones_like(d) / safe, torch.zeros_like(d))
    q = torch.round((blocks * inv[..., None]).clamp(-A8_MAX, A8_MAX))
    return q.to(torch.int8), d


def weight_codes(w: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """An int8 / int4 W [n, k] as signed integer codes in blocks of 32, float64 [n, nb, 32], and the
    float64 scale of each (row, block) [n, nb]: int8's row scale repeated, int4's group scales."""
    if w.format == "int8":
        codes = _blocks(w.data.to(torch.float64))
        scale = w.scale.to(torch.float64)[:, None].expand(-1, codes.shape[1])
    elif w.format == "int4":
        codes = _blocks(unpack_int4(w.data).to(torch.float64))
        scale = w.scale.to(torch.float64)
    else:
        raise ValueError(f"a8 activations pair with int8 or int4 weights, not {w.format}")
    return codes, scale


def block_sums(x: torch.Tensor, w: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exact integer sum of each (row of x, row of W, block) [m, n, nb] as float64 (integers far
    below 2^53: exact whatever the order), and the float64 scales it is multiplied by: the block's
    d [m, 1, nb] and W's [1, n, nb]."""
    q, d = a8_quantize(x.reshape(-1, x.shape[-1]))
    codes, scale = weight_codes(w)
    sums = torch.einsum("mbi,nbi->mnb", q.to(torch.float64), codes)
    return sums, d.to(torch.float64)[:, None, :], scale[None]


def a8_linear_ref(x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    """x [.., k] W^T with x in 8 bits, W int8 / int4 [n, k]: float64 [.., n]."""
    sums, d, scale = block_sums(x, w)
    y = (sums * d * scale).sum(dim=-1)
    return y.reshape(*x.shape[:-1], w.shape[0])


def bf16x2_split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (hi, lo) bfloat16: hi = bf16(x), lo = bf16(x - hi), each rounded to nearest even (torch's
    float32 -> bfloat16 conversion, as vcvtneps2bf16's)."""
    xf = x.to(torch.float32)
    hi = xf.to(torch.bfloat16)
    return hi, (xf - hi.to(torch.float32)).to(torch.bfloat16)


def bf16x2_linear_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [.., k] W^T with x as two bf16 halves, W bf16 [n, k]: float64 [.., n], exact."""
    hi, lo = bf16x2_split(x)
    return (hi.to(torch.float64) + lo.to(torch.float64)) @ w.to(torch.float64).T
