"""Kernels: one module per op, each a Triton kernel plus its torch reference twin.

The engine calls only the functions exported here (and kernels.paged_kv's); `kernels.dispatch`
picks the implementation: Triton on CUDA, the torch reference on a CPU, EDGE_KERNELS to force one.
"""

from __future__ import annotations

import torch

from kernels import native_ops
from kernels.dispatch import QLINEAR, TRITON, KernelShapeError, backend, linear_impl, use_triton
from kernels.quant import QuantizedWeight, linear_ref
from kernels.rmsnorm import rms_norm_cpu, rms_norm_triton

__all__ = [
    "KernelShapeError",
    "QuantizedWeight",
    "backend",
    "fused_moe",
    "linear",
    "rms_norm",
    "rms_norm_for",
    "use_triton",
]


def linear(
    x: torch.Tensor, w: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ W^T (+ b) for a dense or compressed weight: compressed weights are read as stored, decoded
    in registers on a GPU (Triton) and in an L1 tile on a CPU (kernels.native_ops.qlinear, int8 and
    int4); only where neither applies (fp8 on a CPU, no build) dequantized first (the reference).
    kernels.dispatch.linear_impl says which."""
    if isinstance(w, QuantizedWeight):
        impl = linear_impl(x, w)
        if impl == TRITON:
            from kernels.dequant_matmul import dequant_matmul_triton

            return dequant_matmul_triton(x, w, bias)
        if impl == QLINEAR:
            return native_ops.qlinear_unchecked(x, w, bias)
    return linear_ref(x, w, bias)


def fused_moe(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w_gate, w_up, w_down
) -> torch.Tensor:
    """The routed experts of a layer, weighted and summed per token (kernels.moe)."""
    from kernels import moe

    if use_triton(x):
        return moe.fused_moe_triton(x, weights, ids, w_gate, w_up, w_down)
    return moe.fused_moe_ref(x, weights, ids, w_gate, w_up, w_down)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):
        return rms_norm_triton(x, weight, eps)
    return rms_norm_cpu(x, weight, eps)


def rms_norm_for(weight: torch.Tensor):
    """The rms_norm implementation for tensors on `weight`'s device, chosen once."""
    return rms_norm_triton if use_triton(weight) else rms_norm_cpu
