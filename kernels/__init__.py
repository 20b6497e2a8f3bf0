"""Kernels: one module per op, each a Triton kernel plus its torch reference twin.

The engine calls only the functions exported here; `kernels.dispatch` picks the implementation.
"""

from __future__ import annotations

import torch

from kernels.dispatch import KernelShapeError, backend, use_triton
from kernels.quant import QuantizedWeight, linear_ref
from kernels.rmsnorm import rms_norm_ref, rms_norm_triton

__all__ = ["KernelShapeError", "QuantizedWeight", "backend", "linear", "rms_norm"]


def linear(
    x: torch.Tensor, w: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ W^T (+ b) for a dense or compressed weight."""
    return linear_ref(x, w, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):
        return rms_norm_triton(x, weight, eps)
    return rms_norm_ref(x, weight, eps)


def rms_norm_for(weight: torch.Tensor):
    """The rms_norm implementation for tensors on `weight`'s device, chosen once."""
    return rms_norm_triton if use_triton(weight) else rms_norm_ref
