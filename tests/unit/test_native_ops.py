"""The fused CPU ops (kernels.native_ops, kernels/csrc/ops.cpp over moe.c and qlinear.c) against a
float64 reference on fresh random inputs, on every path this CPU has (AVX-512, AVX2 + FMA, the
portable one), for every weight format the op reads as stored (f32, bf16, int8, int4), at 1, 7 and
32 tokens; padding rows and the expert load; the op inside a full compiled graph; and a shipped
model's greedy tokens with the op against its eager per-expert loop.

Tolerance: each output is two float32 products (lengths H and I) weighted and summed, so it is
within a few (H + I) * 2^-24 of the exact value relative to the sum of the magnitudes of its terms;
the test allows 4 (H + I) 2^-24 of max |reference| plus the same of each output's own size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.llm import LLM
from engine.sampling import SamplingParams
from kernels import native_ops
from kernels.quant import QuantizedWeight, concat_out, dequantize, quantize, stack
from tests.conftest import SHIPPED_KIMI

pytestmark = pytest.mark.skipif(not native_ops.available(), reason=f"not built: {native_ops.problem()}")

FORMATS = ("f32", "bf16", "int8", "int4")
ISAS = native_ops.isas() or ("none",)


@pytest.fixture(params=ISAS)
def isa(request):
    """Each path the CPU has, capped for the test (a CI host with AVX2 only runs two of three)."""
    native_ops.set_max_isa(request.param)
    assert native_ops.isa() == request.param
    yield request.param
    native_ops.set_max_isa("avx512")


def _experts(fmt: str, e: int, h: int, i: int, gen: torch.Generator):
    """(gate, up, down) as the reference reads them (float64), and the op's stored arguments."""
    w = [torch.randn(e, rows, cols, generator=gen) * 0.1 for rows, cols in ((i, h), (i, h), (h, i))]
    if fmt in ("f32", "bf16"):
        dtype = torch.float32 if fmt == "f32" else torch.bfloat16
        g, u, d = (t.to(dtype) for t in w)
        return (g.double(), u.double(), d.double()), (torch.cat([g, u], 1).contiguous(), None, d, None)
    g, u, d = (stack([quantize(t[k], fmt) for k in range(e)]) for t in w)
    joined = concat_out([g, u])
    assert isinstance(joined, QuantizedWeight)
    dense = tuple(dequantize(q, torch.float64) for q in (g, u, d))
    return dense, (joined.data, joined.scale, d.data, d.scale)


def _reference(x, weights, ids, gate, up, down) -> torch.Tensor:
    """float64: sum_j weights[t, j] * down(silu(gate x_t) * up x_t) over the token's experts."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        xt = x[t].double()
        for j, e in enumerate(ids[t].tolist()):
            act = F.silu(gate[e] @ xt) * (up[e] @ xt)
            out[t] += weights[t, j].double() * (down[e] @ act)
    return out


def _routing(tokens: int, experts: int, k: int, gen: torch.Generator):
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    return torch.rand(tokens, k, generator=gen), ids


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tokens", [1, 7, 32])
@pytest.mark.parametrize(("experts", "hidden", "inter", "k"), [(8, 256, 128, 2), (5, 96, 64, 3)])
def test_fused_moe_matches_the_reference(fmt, tokens, experts, hidden, inter, k, isa):
    gen = torch.Generator().manual_seed(hash((fmt, tokens, experts, isa)) % 2**31)
    (gate, up, down), stored = _experts(fmt, experts, hidden, inter, gen)
    x = torch.randn(tokens, hidden, generator=gen)
    weights, ids = _routing(tokens, experts, k, gen)
    load = torch.zeros(experts, dtype=torch.long)
    got = native_ops.fused_moe(x, weights, ids, *stored, fmt, inter, load)
    exact = _reference(x, weights, ids, gate, up, down)
    bound = 4 * (hidden + inter) * 2.0**-24 * (exact.abs().max() + exact.abs())
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert ((got.double() - exact).abs() <= bound).all(), (got.double() - exact).abs().max()
    assert torch.equal(load, torch.bincount(ids.reshape(-1), minlength=experts))


def test_padding_rows_are_zero_and_not_counted():
    gen = torch.Generator().manual_seed(7)
    (gate, up, down), stored = _experts("f32", 8, 64, 32, gen)
    x = torch.randn(6, 64, generator=gen)
    weights, ids = _routing(6, 8, 2, gen)
    load = torch.full((8,), 5, dtype=torch.long)  # the load adds up over calls
    got = native_ops.fused_moe(x, weights, ids, *stored, "f32", 32, load, torch.tensor([4]))
    assert torch.equal(got[4:], torch.zeros(2, 64))
    exact = _reference(x[:4], weights[:4], ids[:4], gate, up, down)
    torch.testing.assert_close(got[:4].double(), exact, rtol=1e-5, atol=1e-6)
    assert torch.equal(load, 5 + torch.bincount(ids[:4].reshape(-1), minlength=8))


def test_bfloat16_activations_come_back_in_bfloat16():
    gen = torch.Generator().manual_seed(3)
    (gate, up, down), stored = _experts("bf16", 4, 64, 32, gen)
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    weights, ids = _routing(3, 4, 2, gen)
    got = native_ops.fused_moe(x, weights, ids, *stored, "bf16", 32, torch.zeros(4, dtype=torch.long))
    assert got.dtype == torch.bfloat16
    exact = _reference(x, weights, ids, gate, up, down)
    torch.testing.assert_close(got.double(), exact, rtol=2e-2, atol=2e-2 * exact.abs().max().item())


def test_a_bad_format_code_is_refused_by_name():
    x = torch.zeros(1, 32)
    with pytest.raises(RuntimeError, match="weight format code 7"):
        torch.ops.edge_cpu.fused_moe(
            x, torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 64, 32), None,
            torch.zeros(1, 32, 32), None, 7, 32, None, torch.zeros(1, dtype=torch.long),
        )  # fmt: skip


def test_the_op_runs_inside_a_full_compiled_graph():
    """No graph break (fullgraph), the same output as the eager call, and the load mutated in place
    by the graph as by the eager op."""
    gen = torch.Generator().manual_seed(11)
    _, stored = _experts("int8", 8, 64, 32, gen)
    x = torch.randn(4, 64, generator=gen)
    weights, ids = _routing(4, 8, 2, gen)
    eager_load, graph_load = torch.zeros(8, dtype=torch.long), torch.zeros(8, dtype=torch.long)

    def layer(x, weights, ids, load, real):
        return native_ops.fused_moe(x * 2, weights, ids, *stored, "int8", 32, load, real) + 1

    real = torch.tensor([3])
    want = layer(x, weights, ids, eager_load, real)
    got = torch.compile(layer, fullgraph=True)(x, weights, ids, graph_load, real)
    torch.testing.assert_close(got, want)
    assert torch.equal(graph_load, eager_load) and int(graph_load.sum()) == 6


@pytest.mark.parametrize("weights", ["auto", "int4"])
def test_a_shipped_model_decodes_the_same_tokens_as_its_eager_expert_loop(weights, monkeypatch):
    """The fused ops are the model's default on a CPU (the MoE's experts, and every dense and int4
    product); without the build the per-expert loop and torch's products run, the reference and the
    path without a compiler: greedy tokens and expert loads of both agree."""
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    fused = LLM(SHIPPED_KIMI, device="cpu", compile=False, weights=weights)
    assert all(layer.experts.native is not None for layer in fused.engine.model.moe_layers())
    monkeypatch.setattr(native_ops, "available", lambda: False)
    loop = LLM(SHIPPED_KIMI, device="cpu", compile=False, weights=weights)
    assert all(layer.experts.native is None for layer in loop.engine.model.moe_layers())
    prompts = ["def fibonacci(n):\n", "What is the capital of France?", "import os\nimport sys\n"]
    want = [g.token_ids for g in loop.generate(prompts, params)]  # batched: several tokens a call
    assert [g.token_ids for g in fused.generate(prompts, params)] == want
    assert fused.engine.expert_load() == loop.engine.expert_load()


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 256, 512), (7, 96, 130), (32, 64, 7)])
def test_linear_matches_the_dequantized_product(fmt, m, k, n, isa):
    """edge_cpu::linear (the stored weight's tensors in) against float64; a bias and leading dims."""
    gen = torch.Generator().manual_seed(hash((fmt, m, k, n, isa)) % 2**31)
    qw = quantize(torch.randn(n, k, generator=gen), fmt)
    assert native_ops.takes(qw)
    x, bias = torch.randn(1, m, k, generator=gen), torch.randn(n, generator=gen)
    dense = dequantize(qw, torch.float64)
    exact = x.double() @ dense.T + bias.double()
    bound = 2 * k * 2.0**-24 * (x.double().abs() @ dense.abs().T + bias.double().abs()) + 1e-30
    got = native_ops.linear(x, qw, bias)
    assert got.shape == (1, m, n) and got.dtype == torch.float32
    assert ((got.double() - exact).abs() <= bound).all(), (got.double() - exact).abs().max()


def test_linear_refuses_what_it_cannot_read_as_stored():
    assert not native_ops.takes(quantize(torch.randn(2, 8, 64), "int4"))  # a stack of experts' weights
    assert not native_ops.takes(quantize(torch.randn(8, 64), "fp8"))


def test_every_compressed_matrix_runs_as_a_native_op_in_the_compiled_step():
    """int4 on every matrix (weight_parts "all"): no Python op is left in the graph (no eager part)
    and the compiled step's greedy tokens are the eager model's."""
    kw = dict(device="cpu", weights="int4", weight_parts="all", speculative=None)
    eager = LLM(SHIPPED_KIMI, compile=False, **kw)
    compiled = LLM(SHIPPED_KIMI, compile=True, **kw)
    assert compiled.engine.model.eager_parts == []
    decode = compiled.engine.compiled_decode
    decode.warm_up([2])
    assert decode.failed is None
    prompts = ["def fibonacci(n):\n", "What is the capital of France?"]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    want = [g.token_ids for g in eager.generate(prompts, params)]
    before = decode.steps
    assert [g.token_ids for g in compiled.generate(prompts, params)] == want
    assert decode.steps - before >= 15


@pytest.mark.parametrize("fmt", ["f32", "bf16"])
def test_dense_products_are_the_same_bits_at_every_batch_size(fmt, isa):
    """A row's product (and a token's routed experts) does not depend on the rows beside it: what a
    sequence computes alone, in a batch, or recomputed in a prefill after a preemption is the same."""
    gen = torch.Generator().manual_seed(5)
    dtype = torch.float32 if fmt == "f32" else torch.bfloat16
    w = torch.randn(130, 96, generator=gen).to(dtype)
    x = torch.randn(33, 96, generator=gen)
    whole = native_ops.linear_dense(x, w)
    for m in (1, 2, 3, 7, 32):
        assert torch.equal(native_ops.linear_dense(x[:m], w), whole[:m]), m
    _, stored = _experts(fmt, 6, 64, 32, gen)
    tokens = torch.randn(9, 64, generator=gen)
    weights, ids = _routing(9, 6, 2, gen)
    load = torch.zeros(6, dtype=torch.long)
    batch = native_ops.fused_moe(tokens, weights, ids, *stored, fmt, 32, load)
    for t in range(9):
        one = native_ops.fused_moe(
            tokens[t : t + 1], weights[t : t + 1], ids[t : t + 1], *stored, fmt, 32, load
        )
        assert torch.equal(one[0], batch[t]), t
