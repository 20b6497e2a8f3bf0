"""The offline capacity planner: the capacity simulator, its cost models (roofline and profiled),
workloads, reports, and the placement planner, with the `edge sim` / `edge plan` commands.

Dependency order: runtime -> capacity -> edge_sim -> engine -> kernels. This package may import
edge_sim, engine and kernels, never runtime; edge_sim never imports it."""

from engine import native as _native

_native.install()  # the compiled hot paths, when their build is current (engine.native)
