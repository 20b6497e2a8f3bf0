"""The single place that decides which implementation of a kernel runs.

`EDGE_KERNELS=auto` (default): Triton on CUDA tensors, the torch reference on CPU.
`EDGE_KERNELS=torch` or `triton` forces one (tests run Triton on the CPU under TRITON_INTERPRET=1).
There is no silent fallback on a GPU: a kernel that cannot take a shape raises, naming it.
"""

from __future__ import annotations

import os

import torch

BACKEND_ENV = "EDGE_KERNELS"
_BACKENDS = ("auto", "torch", "triton")


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
