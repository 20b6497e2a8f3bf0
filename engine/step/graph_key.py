"""Compiled step graphs with their guards checked once, at load, instead of on every call.

Dynamo guards every call of a compiled function: a few hundred checks on the model's objects and
tensors (their types, shapes, strides, constants), about 70 us of a 0.6 ms decode step of a miniature
(bench/compiled_step.py's profile). The step's inputs never change structure between calls: the same
model, the same KV stores, a bucket's fixed row count, the context as the one dynamic dimension. So
the checks are made once here instead: `structure_key` walks what the graph reads (the model's
objects and tensors, the KV stores) and digests every type, shape, stride, dtype, device and constant
of it, as the guards would; `graph` gives each (structure, step function, bucket) its own code
object, compiled with every guard dropped (`guard_filter_fn`), so each has exactly one graph and
nothing to tell apart at call time. Two engines whose structures digest alike (another PoP's load of
the same model) share the graphs; any difference in what a guard would see gives another key and
another compile. EDGE_COMPILE_GUARDS=1 keeps dynamo's guards (the check this replaces).
"""

from __future__ import annotations

import enum
import hashlib
import os
import threading
import types
from collections.abc import Callable

import torch

GUARDS_ENV = "EDGE_COMPILE_GUARDS"
# runtime state, not structure: the expert-load ids a MoE layer has not yet folded into its counts
_SKIP = frozenset({"_pending"})
_GRAPHS: dict[tuple[str, str, int], Callable] = {}
_LOCK = threading.Lock()


def structure_key(*roots) -> str:
    """A digest of everything a dynamo guard would check on `roots` (walked depth first in a fixed
    order): each object's type, each tensor's shape, stride, dtype and device, each constant's value,
    each container's length and keys, and which references are shared."""
    h = hashlib.sha256()
    seen: dict[int, str] = {}

    def visit(obj, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            first = seen.setdefault(id(obj), path)
            h.update(f"{path}=T{tuple(obj.shape)}{obj.stride()}{obj.dtype}{obj.device}{first}\n".encode())
            return
        if obj is None or isinstance(obj, bool | int | float | str | bytes | torch.dtype | torch.device):
            h.update(f"{path}=V{obj!r}\n".encode())
            return
        if isinstance(obj, enum.Enum | types.FunctionType | types.BuiltinFunctionType | type):
            h.update(f"{path}=F{getattr(obj, '__qualname__', obj)!r}\n".encode())
            return
        if id(obj) in seen:  # a shared reference: the graph reads one object through both paths
            h.update(f"{path}=R{seen[id(obj)]}\n".encode())
            return
        seen[id(obj)] = path
        kind = type(obj).__qualname__
        if isinstance(obj, list | tuple):
            h.update(f"{path}=L{kind}{len(obj)}\n".encode())
            for i, item in enumerate(obj):
                visit(item, f"{path}[{i}]")
        elif isinstance(obj, dict):
            h.update(f"{path}=D{sorted(map(repr, obj))}\n".encode())
            for k in sorted(obj, key=repr):
                visit(obj[k], f"{path}[{k!r}]")
        elif isinstance(obj, types.MethodType):
            h.update(f"{path}=M{obj.__func__.__qualname__}\n".encode())
            visit(obj.__self__, f"{path}.__self__")
        elif hasattr(obj, "__dict__"):
            h.update(f"{path}=O{type(obj).__module__}.{kind}\n".encode())
            for name in sorted(vars(obj)):
                if name not in _SKIP:
                    visit(vars(obj)[name], f"{path}.{name}")
        else:
            h.update(f"{path}=X{kind}\n".encode())

    for i, root in enumerate(roots):
        visit(root, f"r{i}")
    return h.hexdigest()[:24]


def _no_guards(entries) -> list[bool]:
    return [False] * len(entries)


def graph(key: str, fn: Callable, rows: int) -> Callable:
    """The compiled form of step function `fn` (unbound: its first argument is the CompiledDecode)
    for the structure `key` and a bucket of `rows` rows, made at first use; guard-free unless
    EDGE_COMPILE_GUARDS=1."""
    slot = (key, fn.__qualname__, rows)
    compiled = _GRAPHS.get(slot)
    if compiled is not None:
        return compiled
    with _LOCK:
        compiled = _GRAPHS.get(slot)
        if compiled is None:
            # a code object of its own: dynamo keeps one cache (one graph) per code object
            code = fn.__code__.replace(co_name=f"{fn.__name__}_{key}_{rows}")
            own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
            options = {} if os.environ.get(GUARDS_ENV) == "1" else {"guard_filter_fn": _no_guards}
            compiled = _GRAPHS[slot] = torch.compile(own, fullgraph=True, options=options)
    return compiled
