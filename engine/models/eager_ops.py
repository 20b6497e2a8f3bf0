"""The parts of a compiled decode step that stay eager, as opaque torch ops.

A compiled graph (engine.compiled_step) cannot hold a host read or a C call through ctypes:

- the routed experts read which experts have tokens (a host sync) and run only those, so a
  batch-1 token touches 2 of 8 experts' weights instead of all of them;
- a compressed-weight matmul calls kernels.cpu_qlinear, which reads the stored bytes in C.

Each becomes a custom op whose implementation is the eager code itself, looked up by an integer
handle registered at load (torch.library ops take tensors and scalars, not Python objects), with
a fake implementation that gives inductor only the output's shape. The graph around them (norms,
RoPE, attention, the router, dense matmuls) is compiled; outputs are the eager code's own.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from contextlib import contextmanager

import torch

# weak: a model unloaded is freed, its handles with it
_registry: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_handles = itertools.count()


_step = threading.local()  # rows of the running compiled step that are real (not padding)


@contextmanager
def real_rows(n: int):
    """Within: the compiled step's first `n` rows are real; padding rows skip the eager ops (their
    output is zeros, discarded by the caller) and their routing is not counted as expert load."""
    before = getattr(_step, "rows", None)
    _step.rows = n
    try:
        yield
    finally:
        _step.rows = before


def _real(x: torch.Tensor) -> int:
    n = getattr(_step, "rows", None)
    return x.shape[0] if n is None else min(n, x.shape[0])


def register(obj) -> int:
    """A handle naming `obj` inside compiled graphs."""
    handle = next(_handles)
    _registry[handle] = obj
    return handle


@torch.library.custom_op("edge::routed_experts", mutates_args=())
def routed_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, handle: int) -> torch.Tensor:
    """The routed experts of MoE layer `handle` (engine.models.layers.MoE.routed), eagerly. The ids
    are copied: the layer keeps them for its expert load, and the graph reuses their buffer."""
    n = _real(x)
    if n == x.shape[0]:
        return _registry[handle].routed(x, weights, ids.clone())
    out = torch.zeros_like(x)
    if n:
        out[:n] = _registry[handle].routed(x[:n], weights[:n], ids[:n].clone())
    return out


@routed_experts.register_fake
def _(x, weights, ids, handle):
    return torch.empty_like(x)


@torch.library.custom_op("edge::quantized_linear", mutates_args=())
def quantized_linear(x: torch.Tensor, handle: int) -> torch.Tensor:
    """x @ W^T (+ b) for the compressed weight of Linear `handle`, through kernels.linear."""
    n, linear = _real(x), _registry[handle]
    if n == x.shape[0]:
        return linear.eager(x)
    out = x.new_zeros(*x.shape[:-1], linear.out_features)
    if n:
        out[:n] = linear.eager(x[:n])
    return out


@quantized_linear.register_fake
def _(x, handle):
    return x.new_empty(*x.shape[:-1], _registry[handle].out_features)
