"""The parts of a compiled decode step that stay eager, as opaque torch ops.

A compiled graph (engine.step.compiled_step) cannot hold a host read or a C call through ctypes:

- the routed experts read which experts have tokens (a host sync) and run only those, so a
  batch-1 token touches 2 of 8 experts' weights instead of all of them;
- a compressed-weight matmul that no native op takes (fp8, or no build of kernels.native_ops) calls
  kernels.linear, which picks its implementation per call (kernels.dispatch.linear_impl).

kernels.dispatch decides where these run (EAGER_LINEAR, EAGER_MOE: the ops below); the model's
layers call them.

Each becomes a custom op whose implementation is the eager code itself, looked up by an integer
handle (torch.library ops take tensors and scalars, not Python objects) in the parts of the model
whose step is running, with a fake implementation that gives inductor only the output's shape.
The graph around them (norms, RoPE, attention, the router, dense matmuls) is compiled; outputs
are the eager code's own.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch

_step = threading.local()  # the running compiled step: its model's eager parts, its real rows


def number_parts(root) -> list:
    """Number the eager parts (objects with a true `eager_part`) reachable from `root`, in a fixed
    walk order, setting each one's `handle`: two loads of one model number theirs alike, so their
    graphs are the same and a second engine reuses the first one's compile."""
    parts: list = []
    seen: set[int] = set()

    def visit(obj) -> None:
        if isinstance(obj, list | tuple):
            for item in obj:
                visit(item)
            return
        if isinstance(obj, torch.Tensor) or not hasattr(obj, "__dict__") or id(obj) in seen:
            return
        seen.add(id(obj))
        if getattr(obj, "eager_part", False):
            obj.handle = len(parts)
            parts.append(obj)
        for value in vars(obj).values():
            visit(value)

    visit(root)
    return parts


@contextmanager
def step(parts: list, rows: int):
    """Within: a compiled step of the model whose eager parts are `parts` runs on this thread, its
    first `rows` rows real; padding rows skip the eager ops (their output is zeros, discarded by
    the caller) and their routing is not counted as expert load."""
    before = getattr(_step, "parts", None), getattr(_step, "rows", None), in_compiled_step()
    _step.parts, _step.rows, _step.compiled = parts, rows, True
    try:
        yield
    finally:
        _step.parts, _step.rows, _step.compiled = before


def in_compiled_step() -> bool:
    """Whether this thread runs (or traces) a compiled step: the model's code takes its graph
    branches then. Not torch.compiler.is_compiling(), a process-wide flag: while one thread
    compiles a bucket, another serves eager steps of the same model. (Dynamo reads and guards this
    thread-local flag as a plain bool.)"""
    return getattr(_step, "compiled", False)


def _part(handle: int):
    parts = getattr(_step, "parts", None)
    if parts is None:
        raise RuntimeError("an edge:: eager op ran outside a compiled step (engine.models.eager_ops.step)")
    return parts[handle]


def _real(x: torch.Tensor) -> int:
    n = getattr(_step, "rows", None)
    return x.shape[0] if n is None else min(n, x.shape[0])


@torch.library.custom_op("edge::routed_experts", mutates_args=())
def routed_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, handle: int) -> torch.Tensor:
    """The routed experts of MoE layer `handle` (engine.models.layers.MoE.routed), eagerly. The ids
    are copied: the layer keeps them for its expert load, and the graph reuses their buffer."""
    n = _real(x)
    if n == x.shape[0]:
        return _part(handle).routed(x, weights, ids.clone())
    out = torch.zeros_like(x)
    if n:
        out[:n] = _part(handle).routed(x[:n], weights[:n], ids[:n].clone())
    return out


@routed_experts.register_fake
def _(x, weights, ids, handle):
    return torch.empty_like(x)


@torch.library.custom_op("edge::quantized_linear", mutates_args=())
def quantized_linear(x: torch.Tensor, handle: int) -> torch.Tensor:
    """x @ W^T (+ b) for the compressed weight of Linear `handle`, through kernels.linear."""
    n, linear = _real(x), _part(handle)
    if n == x.shape[0]:
        return linear.eager(x)
    out = x.new_zeros(*x.shape[:-1], linear.out_features)
    if n:
        out[:n] = linear.eager(x[:n])
    return out


@quantized_linear.register_fake
def _(x, handle):
    return x.new_empty(*x.shape[:-1], _part(handle).out_features)
