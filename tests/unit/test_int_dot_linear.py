"""int8 / int4 products with 8-bit activations on integer units (kernels/csrc/qlinear_a8.c, the "a8"
activation format of kernels.formats.ACTIVATION) on fresh random inputs, on every a8 path this CPU
has (avx512_vnni, avx_vnni, avx2, scalar), at 1 and 5 rows, odd output sizes and input sizes off
each path's step.

Tolerances:
- codes and block scales: equal to kernels.activation_quant.a8_quantize's (the same float32 steps).
- against the float64 reference of the same integer math (a8_linear_ref): each block's integer sum is
  exact in the C code, which rounds only in scaling and adding blocks in float32, so the error is at
  most (K/32 + 32) 2^-23 of M = sum_b |s_b d_b| (sum_i |w_i q_i| + 16 sum_i |q_i|) (int4: its lanes
  carry the codes 0..15 and the offset, which the 16 covers; int8: no offset, the 16 term dropped).
- against the float32-activation product: each activation moves by at most d_b / 2 plus float32
  rounding, so |y_a8 - y_f32| <= sum_b d_b / 2 sum_i |W_i| + 4 K 2^-24 sum_i |x_i W_i| (+ the tight
  bound); and on Gaussian x the error's RMS stays under 2% of the product's (about 0.6% expected:
  a code's rounding error is uniform, d / sqrt(12), and d is about 2.5 sigma / 127).
"""

import pytest
import torch

from engine.models import layers
from kernels import dispatch, native_ops
from kernels.activation_quant import a8_linear_ref, a8_quantize, block_sums, weight_codes
from kernels.formats import ACTIVATION, DEFAULT_ACTIVATION
from kernels.quant import dequantize, quantize

pytestmark = pytest.mark.skipif(not native_ops.available(), reason=f"not built: {native_ops.problem()}")

A8_ISAS = native_ops.a8_isas() or ("none",)


@pytest.fixture(params=A8_ISAS)
def a8_isa(request):
    """Each a8 path the CPU has, capped for the test (an AVX2 host runs two of four)."""
    native_ops.set_max_a8_isa(request.param)
    assert native_ops.a8_isa() == request.param
    yield request.param
    native_ops.set_max_a8_isa(native_ops.A8_ISAS[-1])


def _weight(fmt: str, n: int, k: int, gen: torch.Generator):
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen) * 3
    return quantize(w, fmt)


def _x(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    # rows of different sizes, and a few outliers as LLM activations have
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 4
    spikes = torch.rand(m, k, generator=gen) < 0.01
    return torch.where(spikes, x * 20, x)


def _tight_bound(x: torch.Tensor, qw) -> torch.Tensor:
    sums, d, scale = block_sums(x, qw)
    q, _ = a8_quantize(x)
    q = q.to(torch.float64).abs()  # [m, nb, 32]
    codes, _ = weight_codes(qw)
    mags = torch.einsum("mbi,nbi->mnb", q, codes.abs())
    if qw.format == "int4":
        mags = mags + 16 * q.sum(-1)[:, None, :]
    big = ((d * scale).abs() * mags).sum(-1)
    k = x.shape[-1]
    return (k / 32 + 32) * 2.0**-23 * big + 1e-30


def _check(fmt: str, m: int, k: int, n: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    qw, x = _weight(fmt, n, k, gen), _x(m, k, gen)
    got = native_ops.linear(x, qw, None, "a8")
    assert got.dtype == torch.float32 and got.shape == (m, n)
    exact = a8_linear_ref(x, qw)
    err = (got.double() - exact).abs()
    assert (err <= _tight_bound(x, qw)).all(), err.max()
    # the float32-activation op's product, within what moving each activation by d / 2 can do
    f32 = native_ops.linear(x, qw)
    dense = dequantize(qw, torch.float64)
    _, d = a8_quantize(x)
    nb = d.shape[-1]
    w_abs = torch.nn.functional.pad(dense.abs(), (0, nb * 32 - k)).unflatten(-1, (nb, 32)).sum(-1)
    moved = 0.5 * d.double() @ w_abs.T
    rounding = 4 * k * 2.0**-24 * (x.double().abs() @ dense.abs().T)
    diff = (got.double() - f32.double()).abs()
    assert (diff <= moved * (1 + 2.0**-20) + rounding + _tight_bound(x, qw)).all(), (diff - moved).max()


# K a multiple of the int4 group; steps of 4 blocks (avx512_vnni's int4), 2 (the 256-bit paths'), one
# over and short of each; N odd and off the 4-row tile; batch 1 and 5
SHAPES = [(1, 256, 77), (5, 256, 77), (1, 2048, 131), (5, 96, 33), (1, 160, 5), (5, 1056, 9), (1, 32, 3)]


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_matches_the_reference_of_the_same_integer_math(fmt, m, k, n, a8_isa):
    _check(fmt, m, k, n, seed=hash((fmt, m, k, n, a8_isa)) % 2**31)


@pytest.mark.parametrize(("m", "k", "n"), [(1, 200, 7), (5, 77, 13), (1, 40, 9), (5, 1000, 11), (1, 65, 4)])
def test_int8_takes_an_input_size_off_the_block(m, k, n, a8_isa):
    """int8's input size need not be a multiple of 32: the last block is partial (zero-padded codes,
    the weights read no further than the row)."""
    _check("int8", m, k, n, seed=hash((m, k, n, a8_isa, "tail")) % 2**31)


def test_codes_and_scales_are_the_reference_rounding():
    gen = torch.Generator().manual_seed(11)
    x = _x(7, 1000, gen)
    x[2, 64:96] = 0  # an all-zero block: scale 0, codes 0
    q, d = native_ops.a8_codes(x)
    want_q, want_d = a8_quantize(x)
    assert torch.equal(q, want_q) and torch.equal(d, want_d)
    assert d[2, 2] == 0 and not q[2, 2].any()
    assert not q[:, -1, 1000 - 31 * 32 :].any()  # past k: zero


def test_halves_round_to_even_in_the_c_code_and_the_reference():
    """A block whose max is 127 has d = 1, so x is its own code before rounding: ties are exact."""
    x = torch.zeros(1, 32)
    x[0, :8] = torch.tensor([127.0, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5, -127.0])
    q, d = native_ops.a8_codes(x)
    want = torch.tensor([127, 2, 4, -2, 0, 0, 2, -127], dtype=torch.int8)
    assert d[0, 0] == 1.0 and torch.equal(q[0, 0, :8], want)
    assert torch.equal(a8_quantize(x)[0][0, 0, :8], want)


def test_gaussian_activations_change_the_product_by_well_under_two_percent():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 2048, generator=gen)
    for fmt in ("int8", "int4"):
        qw = _weight(fmt, 257, 2048, gen)
        f32, a8 = native_ops.linear(x, qw), native_ops.linear(x, qw, None, "a8")
        rel = (a8 - f32).pow(2).mean().sqrt() / f32.pow(2).mean().sqrt()
        assert rel < 0.02, (fmt, rel)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_row_is_the_same_bits_alone_in_a_batch_and_on_any_thread_count(fmt, a8_isa):
    gen = torch.Generator().manual_seed(5)
    qw, x = _weight(fmt, 301, 512, gen), _x(5, 512, gen)
    batch = native_ops.linear(x, qw, None, "a8")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([native_ops.linear(x[i : i + 1], qw, None, "a8") for i in range(5)])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(batch, alone)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_the_ctypes_entry_and_the_op_agree_keeping_dtype_leading_dims_and_bias(fmt):
    gen = torch.Generator().manual_seed(9)
    qw = _weight(fmt, 48, 64, gen)
    x = torch.randn(2, 3, 64, generator=gen)
    bias = torch.randn(48, generator=gen)
    op = native_ops.linear(x, qw, bias, "a8")
    entry = native_ops.qlinear(x, qw, bias, activations="a8")
    assert op.shape == (2, 3, 48) and torch.equal(op, entry)
    torch.testing.assert_close(op.double(), a8_linear_ref(x, qw) + bias.double(), rtol=1e-5, atol=1e-5)
    half = native_ops.linear(x.bfloat16(), qw, None, "a8")
    assert half.dtype == torch.bfloat16


def test_the_op_refuses_a8_beside_a_dense_weight_and_unknown_codes():
    x, w = torch.zeros(1, 32), torch.zeros(4, 32)
    with pytest.raises(RuntimeError, match="activation format code 8"):
        torch.ops.edge_cpu.linear(x, w, None, None, 32, 4, 8)
    qw = quantize(torch.randn(4, 32), "int8")
    with pytest.raises(RuntimeError, match="activation format code 16"):
        torch.ops.edge_cpu.linear(x, qw.data, qw.scale, None, 8, 4, 16)
    with pytest.raises(ValueError, match="activations 'a4'"):
        native_ops.qlinear(x, qw, activations="a4")


def test_the_isa_cap_bounds_the_a8_path():
    """set_max_isa("scalar") leaves the scalar a8 path; "avx2" rules out AVX-512's encodings."""
    try:
        native_ops.set_max_isa("scalar")
        assert native_ops.a8_isa() == "scalar"
        native_ops.set_max_isa("avx2")
        assert native_ops.a8_isa() in ("avx2", "avx_vnni")
    finally:
        native_ops.set_max_isa("avx512")
    assert native_ops.a8_isa() == native_ops.a8_isas()[-1]


def test_the_op_runs_inside_a_full_compiled_graph():
    qw = _weight("int4", 40, 64, torch.Generator().manual_seed(2))
    x = torch.randn(3, 64)
    fn = torch.compile(lambda t: native_ops.linear(t, qw, None, "a8") * 2, fullgraph=True, dynamic=False)
    assert torch.equal(fn(x), native_ops.linear(x, qw, None, "a8") * 2)


def test_the_format_table_names_it():
    a8 = ACTIVATION["a8"]
    assert (a8.bits, a8.block, a8.code, a8.weights) == (8, 32, 8, ("int8", "int4"))
    assert DEFAULT_ACTIVATION == "f32" and ACTIVATION["f32"].code == 32
    qw = _weight("int4", 9, 64, torch.Generator().manual_seed(4))
    x = torch.randn(2, 64)
    torch.testing.assert_close(a8.reference(x, qw), a8_linear_ref(x, qw))
    want = x.double() @ dequantize(qw, torch.float64).T
    torch.testing.assert_close(ACTIVATION["f32"].reference(x, qw), want)


def test_dispatch_and_the_layer_follow_edge_cpu_activations(monkeypatch):
    gen = torch.Generator().manual_seed(6)
    q4, q8, fp8 = (_weight(f, 16, 64, gen) for f in ("int4", "int8", "fp8"))
    dense = torch.randn(16, 64, generator=gen)
    monkeypatch.delenv(dispatch.ACTIVATIONS_ENV, raising=False)
    assert dispatch.activations() == "f32" and dispatch.linear_activations(q4) == "f32"
    monkeypatch.setenv(dispatch.ACTIVATIONS_ENV, "a8")
    assert [dispatch.linear_activations(w) for w in (q4, q8, fp8, dense)] == ["a8", "a8", "f32", "f32"]
    layer = layers.Linear(q4)
    x = torch.randn(2, 64, generator=gen)
    assert layer.activations == "a8" and torch.equal(layer(x), native_ops.linear(x, q4, None, "a8"))
    monkeypatch.setenv(dispatch.ACTIVATIONS_ENV, "a4")
    with pytest.raises(ValueError, match="EDGE_CPU_ACTIVATIONS='a4'"):
        dispatch.linear_activations(q4)


# --- the fused MoE's experts (edge_cpu::fused_moe, kernels/csrc/moe.c) with 8-bit activations ---------


def _experts(fmt: str, e: int, h: int, i: int, gen: torch.Generator):
    """Stacked int8 / int4 experts: w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I]."""
    from kernels.quant import concat_out, stack

    gate, up, down = (
        stack([quantize(torch.randn(rows, cols, generator=gen) * 0.1, fmt) for _ in range(e)])
        for rows, cols in ((i, h), (i, h), (h, i))
    )
    return concat_out([gate, up]), down


def _moe_by_linear(x, weights, ids, w13, w2, acts: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused op's sum composed of edge_cpu::linear calls (already held to the reference above) and
    the C code's float32 SiLU, token by token and expert by expert, accumulated in float64; and a
    bound on what one activation code rounded the other way in the down product may move each
    output by (SiLU's exp may differ from C's expf by an ulp, which flips a code about once in 10^5)."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    slack = torch.zeros(x.shape, dtype=torch.float64)
    inter = w2.shape[-1]
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            gu = native_ops.linear(x[t : t + 1], w13[e], None, acts)
            g, u = gu[:, :inter], gu[:, inter:]
            act = g / (1.0 + torch.exp(-g)) * u
            y = native_ops.linear(act, w2[e], None, acts)
            out[t] += weights[t, j].double() * y[0].double()
            if acts == "a8":
                _, d = a8_quantize(act)
                code = d.double().max() * dequantize(w2[e], torch.float64).abs().max(dim=1).values
                slack[t] += weights[t, j].double().abs() * code
    return out, slack


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize(("experts", "hidden", "inter", "k"), [(8, 256, 96, 2), (5, 96, 64, 3)])
def test_fused_moe_in_a8_is_its_linear_products_composed(fmt, tokens, experts, hidden, inter, k, a8_isa):
    """Each token's rows of every expert's products are the a8 linear op's (a row's result does not
    depend on the rows beside it), so the fused sum is theirs up to float32 accumulation (the
    weighted sum over k experts: 4 (k + 1) 2^-24 of the sum of magnitudes) and a rare flipped code."""
    gen = torch.Generator().manual_seed(hash((fmt, tokens, experts, a8_isa, "moe")) % 2**31)
    w13, w2 = _experts(fmt, experts, hidden, inter, gen)
    x = _x(tokens, hidden, gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=gen)
    load = torch.zeros(experts, dtype=torch.long)
    got = native_ops.fused_moe(
        x, weights, ids, w13.data, w13.scale, w2.data, w2.scale, fmt, inter, load, None, "a8"
    )
    want, slack = _moe_by_linear(x, weights, ids, w13, w2, "a8")
    terms = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(tokens):
        for j, e in enumerate(ids[t].tolist()):
            gu = native_ops.linear(x[t : t + 1], w13[e], None, "a8")
            act = gu[:, :inter] / (1.0 + torch.exp(-gu[:, :inter])) * gu[:, inter:]
            terms[t] += weights[t, j].double() * native_ops.linear(act, w2[e], None, "a8")[0].double().abs()
    bound = 4 * (k + 1) * 2.0**-24 * terms + slack + 1e-30
    assert got.shape == x.shape and ((got.double() - want).abs() <= bound).all()
    assert torch.equal(load, torch.bincount(ids.reshape(-1), minlength=experts))
    # against float32 activations, on Gaussian x: within 3% RMS (two products in a row; SiLU(gate) * up
    # is heavy-tailed, so its blocks' scales are wider than a Gaussian's: about 1.2% measured)
    x = torch.randn(tokens, hidden, generator=gen)
    stored = (w13.data, w13.scale, w2.data, w2.scale, fmt, inter)
    a8 = native_ops.fused_moe(x, weights, ids, *stored, load, None, "a8")
    f32 = native_ops.fused_moe(x, weights, ids, *stored, load)
    assert (a8 - f32).pow(2).mean().sqrt() <= 0.03 * f32.pow(2).mean().sqrt()


def test_fused_moe_in_a8_skips_padding_rows_and_refuses_dense_experts():
    gen = torch.Generator().manual_seed(8)
    w13, w2 = _experts("int4", 4, 64, 32, gen)
    x = _x(6, 64, gen)
    ids = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(6)])
    weights = torch.rand(6, 2, generator=gen)
    load = torch.zeros(4, dtype=torch.long)
    args = (w13.data, w13.scale, w2.data, w2.scale, "int4", 32)
    got = native_ops.fused_moe(x, weights, ids, *args, load, torch.tensor([4]), "a8")
    assert torch.equal(got[4:], torch.zeros(2, 64))
    alone = native_ops.fused_moe(
        x[:4], weights[:4], ids[:4], *args, torch.zeros(4, dtype=torch.long), None, "a8"
    )
    assert torch.equal(got[:4], alone)
    assert torch.equal(load, torch.bincount(ids[:4].reshape(-1), minlength=4))
    dense = torch.zeros(4, 64, 64), torch.zeros(4, 64, 32)
    with pytest.raises(RuntimeError, match="activation format code 8"):
        native_ops.fused_moe(x, weights, ids, dense[0], None, dense[1], None, "f32", 32, load, None, "a8")


def test_the_moe_layer_follows_edge_cpu_activations(monkeypatch):
    from kernels.quant import rows_of

    gen = torch.Generator().manual_seed(10)
    w13, w2 = _experts("int8", 4, 64, 32, gen)
    monkeypatch.setenv(dispatch.ACTIVATIONS_ENV, "a8")
    assert dispatch.experts_activations(w13, w2, 32) == "a8"
    dense = torch.randn(4, 64, 64), torch.randn(4, 64, 32)
    assert dispatch.experts_activations(*dense, 32) == "f32"
    tensors = {}
    for e in range(4):
        gate, up = rows_of(w13, 0, 32)[e], rows_of(w13, 32, 64)[e]
        tensors.update(
            {f"x.{e}.gate_proj.weight": gate, f"x.{e}.up_proj.weight": up, f"x.{e}.down_proj.weight": w2[e]}
        )
    experts = layers.RoutedExperts(tensors, "x", 4)
    assert experts.activations == "a8" and experts.native is not None
    x = _x(3, 64, gen)
    ids = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(3)])
    weights = torch.rand(3, 2, generator=gen)
    got = experts.run_native(x, weights, ids, torch.zeros(4, dtype=torch.long), None)
    want = native_ops.fused_moe(
        x, weights, ids, *experts.native, torch.zeros(4, dtype=torch.long), None, "a8"
    )
    assert torch.equal(got, want)


def test_fused_moe_in_a8_runs_inside_a_full_compiled_graph():
    gen = torch.Generator().manual_seed(12)
    w13, w2 = _experts("int4", 4, 64, 32, gen)
    x = _x(3, 64, gen)
    ids = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(3)])
    weights = torch.rand(3, 2, generator=gen)
    stored = (w13.data, w13.scale, w2.data, w2.scale, "int4", 32)
    eager_load, graph_load = torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)

    def layer(x, weights, ids, load):
        return native_ops.fused_moe(x, weights, ids, *stored, load, None, "a8") + 1

    want = layer(x, weights, ids, eager_load)
    got = torch.compile(layer, fullgraph=True, dynamic=False)(x, weights, ids, graph_load)
    assert torch.equal(got, want) and torch.equal(graph_load, eager_load)


def test_a_compiled_step_in_a8_decodes_the_eager_steps_tokens(monkeypatch):
    """A row's a8 result does not depend on the rows beside it (padding rows included), so a compiled
    bucket and the eager model decode the same greedy tokens (int4 everywhere a8 applies: the
    miniature's experts)."""
    from engine.step.compiled_step import row_bucket
    from tests.conftest import SHIPPED_KIMI
    from tests.unit.test_compiled_step import PROMPTS, _pair, _tokens

    monkeypatch.setenv(dispatch.ACTIVATIONS_ENV, "a8")
    eager, compiled, decode = _pair(SHIPPED_KIMI, "auto", "int4", row_bucket(3))
    for llm in (eager, compiled):
        assert {layer.experts.activations for layer in llm.engine.model.moe_layers()} == {"a8"}
    before = decode.steps
    assert _tokens(compiled, PROMPTS[:3], 40) == _tokens(eager, PROMPTS[:3], 40)
    assert decode.steps - before >= 30  # the decode steps really ran compiled
