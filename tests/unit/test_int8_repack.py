"""int8 weights repacked at load for the products with 8-bit activations (kernels.native_ops.RepackedInt8,
qlinear_a8.c's EDGE_INT8_R4: four rows interleaved per 64-byte chunk, one stream a block), on fresh
random inputs, on every a8 path this CPU has.

Tolerance: none. The repacked kernel reads the same codes against the same activation codes in the
same order as on the rows as stored, so its products (edge_cpu::linear, edge_cpu::fused_moe, a model's
logits) are the same bits; the rows as stored are held to the float64 reference of the integer math by
tests/unit/test_int_dot_linear.py, and here to it within that file's looser bound as well.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.models import layers
from kernels import dispatch, native_ops
from kernels.activation_quant import a8_linear_ref
from kernels.quant import concat_out, dequantize, quantize, stack
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not native_ops.available(), reason=f"not built: {native_ops.problem()}")


@pytest.fixture(params=native_ops.a8_isas() or ("none",))
def a8_isa(request):
    native_ops.set_max_a8_isa(request.param)
    yield request.param
    native_ops.set_max_a8_isa(native_ops.A8_ISAS[-1])


def _int8(n: int, k: int, gen: torch.Generator, lead: tuple[int, ...] = ()):
    return quantize(
        torch.randn(*lead, n, k, generator=gen) * torch.rand(*lead, n, 1, generator=gen) * 3, "int8"
    )


@pytest.mark.parametrize(("n", "k"), [(77, 1000), (4, 64), (5, 40), (1, 7), (130, 4096)])
def test_the_layout_and_back(n, k):
    gen = torch.Generator().manual_seed(n * k)
    q = _int8(n, k, gen)
    r = native_ops.repack_int8(q)
    rows, width = -(-n // 4) * 4, -(-k // 64) * 64
    assert r.data.shape == (rows, width) and r.data.is_contiguous() and r.format == "int8_r4"
    # chunk c of block g: rows 4g .. 4g + 3, bytes 64c .. 64c + 63 each, one after another
    flat = r.data.reshape(-1)
    for g, c, row in ((0, 0, 0), (rows // 4 - 1, width // 64 - 1, 3), (rows // 4 // 2, 0, 1)):
        at = (g * width // 64 + c) * 256 + row * 64
        want = torch.zeros(64, dtype=torch.int8)
        if 4 * g + row < n:
            part = q.data[4 * g + row, 64 * c : 64 * c + 64]
            want[: part.numel()] = part
        assert torch.equal(flat[at : at + 64], want)
    back = r.unpack()
    assert torch.equal(back.data, q.data) and back.format == "int8" and back.shape == q.shape
    stacked = native_ops.repack_int8(_int8(n, k, gen, (3,)))
    assert stacked.data.shape == (3, rows, width) and torch.equal(
        stacked[1].unpack().data, stacked.unpack().data[1]
    )


@pytest.mark.parametrize(
    ("m", "n", "k"), [(1, 77, 1000), (5, 33, 96), (2, 5, 40), (1, 130, 4096), (3, 4, 64), (1, 9, 7)]
)
def test_the_op_on_repacked_rows_is_the_rows_as_stored(m, n, k, a8_isa):
    gen = torch.Generator().manual_seed(hash((m, n, k, a8_isa)) % 2**31)
    q = _int8(n, k, gen)
    x = torch.randn(m, k, generator=gen) * 2
    bias = torch.randn(n, generator=gen)
    got = native_ops.linear(x, native_ops.repack_int8(q), bias, "a8")
    assert torch.equal(got, native_ops.linear(x, q, bias, "a8"))
    exact = a8_linear_ref(x, q) + bias.double()
    mags = x.double().abs() @ dequantize(q, torch.float64).abs().T
    assert ((got.double() - exact).abs() <= 2 * k * 2.0**-23 * mags + 1e-5 * bias.abs().double()).all()


@pytest.mark.parametrize("tokens", [1, 5, 9])
def test_the_fused_moe_on_repacked_experts_is_the_experts_as_stored(tokens, a8_isa):
    gen = torch.Generator().manual_seed(hash((tokens, a8_isa)) % 2**31)
    e, h, i, k = 6, 96, 48, 2
    gate, up, down = (stack([_int8(r, c, gen) for _ in range(e)]) for r, c in ((i, h), (i, h), (h, i)))
    w13 = concat_out([gate, up])
    x = torch.randn(tokens, h, generator=gen)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=gen)
    want = native_ops.fused_moe(
        x, weights, ids, w13.data, w13.scale, down.data, down.scale, "int8", i,
        torch.zeros(e, dtype=torch.long), activations="a8",
    )  # fmt: skip
    p13, p2 = native_ops.repack_int8(w13), native_ops.repack_int8(down)
    load = torch.zeros(e, dtype=torch.long)
    got = native_ops.fused_moe(
        x, weights, ids, p13.data, p13.scale, p2.data, p2.scale, "int8_r4", i, load, activations="a8"
    )
    assert torch.equal(got, want)
    assert torch.equal(load, torch.bincount(ids.reshape(-1), minlength=e))


def test_the_op_refuses_repacked_rows_without_a8_or_off_their_shape():
    q = _int8(6, 40, torch.Generator().manual_seed(1))
    r = native_ops.repack_int8(q)
    x = torch.randn(1, 40)
    with pytest.raises(RuntimeError, match="int8 repacked \\(9\\) takes a8 only"):
        native_ops.linear(x, r)
    for data in (q.data, r.data[:4]):  # the rows as stored, or cut short
        with pytest.raises(RuntimeError, match="repacked int8 weight of 6 rows of 40 is \\[8, 64\\]"):
            torch.ops.edge_cpu.linear(x, data, q.scale, None, 9, 6, 8)


def test_the_op_runs_inside_a_full_compiled_graph():
    r = native_ops.repack_int8(_int8(40, 96, torch.Generator().manual_seed(2)))
    x = torch.randn(3, 96)
    fn = torch.compile(lambda t: native_ops.linear(t, r, None, "a8") * 2, fullgraph=True, dynamic=False)
    assert torch.equal(fn(x), native_ops.linear(x, r, None, "a8") * 2)


def test_a_layer_repacks_int8_for_a8_only_and_edge_cpu_repack_0_keeps_the_rows(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    q8, q4 = _int8(20, 128, gen), quantize(torch.randn(20, 128, generator=gen), "int4")
    x = torch.randn(2, 128, generator=gen)
    monkeypatch.setenv(dispatch.ACTIVATIONS_ENV, "a8")
    layer = layers.Linear(q8)
    assert isinstance(layer.quantized, native_ops.RepackedInt8)
    assert torch.equal(layer.weight.data, q8.data)  # the rows as stored, on demand
    assert torch.equal(layer(x), native_ops.linear(x, q8, None, "a8"))
    assert not isinstance(layers.Linear(q4).quantized, native_ops.RepackedInt8)  # int8 only
    monkeypatch.setenv(dispatch.REPACK_ENV, "0")
    assert layers.Linear(q8).quantized is q8
    monkeypatch.delenv(dispatch.REPACK_ENV)
    monkeypatch.setenv(dispatch.ACTIVATIONS_ENV, "f32")
    assert layers.Linear(q8).quantized is q8  # the float32 activations read the rows as stored


@pytest.mark.parametrize("model", ["kimi-k2-mini", "glm-4.5-mini"])
def test_a_shipped_model_in_int8_with_a8_gives_the_same_logits_repacked(model, monkeypatch):
    monkeypatch.setenv(dispatch.ACTIVATIONS_ENV, "a8")
    kw = dict(device="cpu", compile=False, weights="int8", weight_parts="all")
    repacked = LLM(REPO / "models" / model, **kw)
    experts = repacked.model.moe_layers()[0].experts
    assert experts.native[4] == "int8_r4" and experts.w_gate is None  # not kept twice
    monkeypatch.setenv(dispatch.REPACK_ENV, "0")
    stored = LLM(REPO / "models" / model, **kw)
    assert stored.model.moe_layers()[0].experts.native[4] == "int8"
    ids = stored.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")
    assert torch.equal(repacked.logits(ids), stored.logits(ids))


def test_a_compiled_step_on_repacked_int8_experts_decodes_the_eager_steps_tokens(monkeypatch):
    """The repacked experts' op inside a compiled bucket: the eager model's greedy tokens."""
    from engine.step.compiled_step import row_bucket
    from tests.conftest import SHIPPED_KIMI
    from tests.unit.test_compiled_step import PROMPTS, _pair, _tokens

    monkeypatch.setenv(dispatch.ACTIVATIONS_ENV, "a8")
    eager, compiled, decode = _pair(SHIPPED_KIMI, "auto", "int8", row_bucket(2))
    for llm in (eager, compiled):
        assert {layer.experts.native[4] for layer in llm.engine.model.moe_layers()} == {"int8_r4"}
    before = decode.steps
    assert _tokens(compiled, PROMPTS[:2], 24) == _tokens(eager, PROMPTS[:2], 24)
    assert decode.steps - before >= 15  # the decode steps really ran compiled
