"""kernels.dispatch decides which op a model's product runs: per weight format (dense float32 /
bfloat16 / float16, int8, int4, fp8), device (the CPU; `meta` stands for any other), whether the CPU
ops are built (kernels.native_ops.available, patched off for the unbuilt cases) and eager or inside a
compiled step. The engine's layers follow it (engine.models.layers)."""

import pytest
import torch

from engine.models import layers
from kernels import dispatch, native_ops
from kernels.dispatch import (
    EAGER_LINEAR,
    EAGER_MOE,
    EXPERT_LOOP,
    KERNELS_LINEAR,
    MATMUL,
    NATIVE_LINEAR,
    NATIVE_MOE,
    QLINEAR,
    REFERENCE,
    TRITON,
)
from kernels.formats import QuantizedWeight
from kernels.quant import concat_out, quantize, stack

built = pytest.mark.skipif(not native_ops.available(), reason=f"not built: {native_ops.problem()}")


@pytest.fixture
def unbuilt(monkeypatch):
    monkeypatch.setattr(native_ops, "available", lambda: False)


def _weight(fmt: str, device: str = "cpu", shape=(64, 128)) -> torch.Tensor | QuantizedWeight:
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    dense = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    if fmt in dense:
        return w.to(dense[fmt]).to(device)
    q = quantize(w, fmt)
    return QuantizedWeight(q.format, q.data.to(device), q.scale.to(device), q.shape)


def _both(w) -> tuple[str, str]:
    return dispatch.linear_op(w), dispatch.linear_op(w, compiled=True)


# (format, device) -> (eager op, compiled op), with the CPU ops built
LINEAR_BUILT = {
    ("f32", "cpu"): (NATIVE_LINEAR, NATIVE_LINEAR),
    ("bf16", "cpu"): (NATIVE_LINEAR, NATIVE_LINEAR),  # bf16 rows read as stored (kept bf16 at load)
    ("f16", "cpu"): (MATMUL, MATMUL),
    ("int8", "cpu"): (NATIVE_LINEAR, NATIVE_LINEAR),
    ("int4", "cpu"): (NATIVE_LINEAR, NATIVE_LINEAR),
    ("fp8", "cpu"): (KERNELS_LINEAR, EAGER_LINEAR),
    ("f32", "meta"): (MATMUL, MATMUL),
    ("int8", "meta"): (KERNELS_LINEAR, EAGER_LINEAR),
    ("int4", "meta"): (KERNELS_LINEAR, EAGER_LINEAR),
}
# without the build: no native op anywhere
LINEAR_UNBUILT = {
    ("f32", "cpu"): (MATMUL, MATMUL),
    ("bf16", "cpu"): (MATMUL, MATMUL),
    ("int8", "cpu"): (KERNELS_LINEAR, EAGER_LINEAR),
    ("int4", "cpu"): (KERNELS_LINEAR, EAGER_LINEAR),
    ("fp8", "cpu"): (KERNELS_LINEAR, EAGER_LINEAR),
}


@built
@pytest.mark.parametrize(("fmt", "device"), list(LINEAR_BUILT))
def test_linear_op_per_format_and_device_with_the_build(fmt, device):
    assert _both(_weight(fmt, device)) == LINEAR_BUILT[fmt, device]


@pytest.mark.parametrize(("fmt", "device"), list(LINEAR_UNBUILT))
def test_linear_op_per_format_without_the_build(fmt, device, unbuilt):
    assert _both(_weight(fmt, device)) == LINEAR_UNBUILT[fmt, device]


@built
def test_a_compressed_weight_the_op_cannot_read_as_stored_stays_eager():
    """Non-contiguous stored bytes (edge_cpu::linear wants them contiguous) or a stack of experts'
    weights: kernels.linear eagerly, the opaque op in a graph."""
    q = _weight("int8")
    strided = QuantizedWeight("int8", q.data.t().contiguous().t(), q.scale, q.shape)
    assert not strided.data.is_contiguous()
    assert _both(strided) == (KERNELS_LINEAR, EAGER_LINEAR)
    assert _both(quantize(torch.randn(2, 8, 64), "int4")) == (KERNELS_LINEAR, EAGER_LINEAR)
    # per call, kernels.linear still reads it as stored through the C kernel (which copies it)
    assert dispatch.linear_impl(torch.randn(3, 128), strided) == QLINEAR


@built
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_linear_impl_per_call(fmt, monkeypatch):
    w = _weight(fmt)
    assert dispatch.linear_impl(torch.randn(2, 128), w) == QLINEAR
    assert dispatch.linear_impl(torch.randn(2, 64), w) == REFERENCE  # x's width is not W's
    assert dispatch.linear_impl(torch.randn(2, 128, device="meta"), w) == REFERENCE
    monkeypatch.setenv(dispatch.BACKEND_ENV, "triton")
    assert dispatch.linear_impl(torch.randn(2, 128), w) == TRITON
    monkeypatch.setenv(dispatch.BACKEND_ENV, "torch")
    assert dispatch.linear_impl(torch.randn(2, 128), w) == QLINEAR  # "torch" forces off Triton only


def test_linear_impl_without_the_build_or_for_fp8_is_the_reference(unbuilt):
    for fmt in ("int8", "int4", "fp8"):
        assert dispatch.linear_impl(torch.randn(2, 128), _weight(fmt)) == REFERENCE


def _experts(
    fmt: str, device: str = "cpu", down_fmt: str | None = None, e: int = 4, h: int = 64, i: int = 32
):
    """(w13 [E, 2I, H], w2 [E, H, I], I) stacked as engine.models.layers.RoutedExperts stacks them."""
    gen = torch.Generator().manual_seed(2)
    gate, up, down = (torch.randn(e, *s, generator=gen) for s in ((i, h), (i, h), (h, i)))
    dense = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    if fmt in dense:
        return torch.cat([gate, up], 1).to(dense[fmt]).to(device), down.to(dense[fmt]).to(device), i

    def q(w, f):
        return stack([_move(quantize(w[k], f), device) for k in range(e)])

    return concat_out([q(gate, fmt), q(up, fmt)]), q(down, down_fmt or fmt), i


def _move(w: QuantizedWeight, device: str) -> QuantizedWeight:
    return QuantizedWeight(w.format, w.data.to(device), w.scale.to(device), w.shape)


def _experts_both(w13, w2, inter) -> tuple[str, str]:
    return dispatch.experts_op(w13, w2, inter), dispatch.experts_op(w13, w2, inter, compiled=True)


@built
@pytest.mark.parametrize(
    ("fmt", "device", "down_fmt", "want"),
    [
        ("f32", "cpu", None, NATIVE_MOE),
        ("bf16", "cpu", None, NATIVE_MOE),
        ("int8", "cpu", None, NATIVE_MOE),
        ("int4", "cpu", None, NATIVE_MOE),
        ("f16", "cpu", None, EXPERT_LOOP),  # no float16 path in the C kernels
        ("int8", "cpu", "int4", EXPERT_LOOP),  # gate/up and down in two formats
        ("f32", "meta", None, EXPERT_LOOP),  # not on a CPU
        ("int8", "meta", None, EXPERT_LOOP),
    ],
)
def test_experts_op_per_format_and_device_with_the_build(fmt, device, down_fmt, want):
    w13, w2, inter = _experts(fmt, device, down_fmt)
    assert _experts_both(w13, w2, inter) == (want, want if want == NATIVE_MOE else EAGER_MOE)


@pytest.mark.parametrize("fmt", ["f32", "bf16", "int8", "int4"])
def test_experts_op_without_the_build(fmt, unbuilt):
    assert _experts_both(*_experts(fmt)) == (EXPERT_LOOP, EAGER_MOE)


def test_experts_that_cannot_be_stacked_for_a_fused_op_run_the_loop():
    """fp8 experts: gate and up are not joined (kernels.quant.concat_out: block scales span rows)."""
    assert _experts_both(None, None, 32) == (EXPERT_LOOP, EAGER_MOE)


def _tensors(fmt: str, e: int = 4, h: int = 64, i: int = 32) -> dict:
    gen = torch.Generator().manual_seed(3)
    t = {}
    for k in range(e):
        for proj, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
            w = torch.randn(*shape, generator=gen)
            t[f"x.{k}.{proj}.weight"] = w if fmt == "f32" else quantize(w, fmt)
    return t


@pytest.mark.parametrize("fmt", ["f32", "int8", "int4", "fp8"])
@pytest.mark.parametrize("have_build", [True, False])
def test_the_layers_run_what_dispatch_picks(fmt, have_build, monkeypatch):
    """engine.models.layers keeps dispatch's choice (eager and compiled) and decides nothing itself:
    a layer is an eager part of a compiled step exactly where dispatch names the opaque op."""
    if have_build and not native_ops.available():
        pytest.skip(f"not built: {native_ops.problem()}")
    if not have_build:
        monkeypatch.setattr(native_ops, "available", lambda: False)
    w = _weight(fmt)
    linear = layers.Linear(w)
    assert (linear.op, linear.graph_op) == _both(w)
    assert linear.eager_part == (linear.graph_op == EAGER_LINEAR)
    experts = layers.RoutedExperts(_tensors(fmt), "x", 4)
    if fmt == "fp8":
        assert (experts.op, experts.graph_op) == (EXPERT_LOOP, EAGER_MOE)
    else:
        assert (experts.op, experts.graph_op) == _experts_both(*_experts(fmt))
    assert (experts.native is not None) == (experts.op == NATIVE_MOE)
    # the eager product is the same values whichever op runs (float32 tolerance: a different order)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(4))
    dense = w if isinstance(w, torch.Tensor) else w.dequantize(torch.float32)
    torch.testing.assert_close(linear(x), x @ dense.T, rtol=1e-5, atol=1e-4)
