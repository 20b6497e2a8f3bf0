"""bf16 weights kept as bf16 on the CPU (kernels.dispatch.keeps_bf16, EDGE_CPU_BF16): edge_cpu::linear's
and edge_cpu::fused_moe's bf16 rows (kernels/csrc/qlinear.c) against float64 references on fresh random
inputs, on every path this CPU has: widened in registers ("scalar", "avx2", "avx512", float32
activations) and vdpbf16ps ("avx512_bf16", the "bf16x2" activations); then the shipped miniatures
loaded with their bf16 matrices kept against the same checkpoints widened to float32 at load.

Tolerances:
- float32 activations: widening a bf16 is exact and the sums are the float32 path's, in its order and
  with its horizontal sums, so the result is the same bits as edge_cpu::linear on the weights widened
  to float32 (and so within 2 K 2^-24 sum_i |x_i w_i| of float64, the dense op's own bound).
- bf16x2: the float64 reference of the same split (kernels.activation_quant.bf16x2_linear_ref) is
  exact; the C code rounds only in its float32 sums (two per pair of weights), so it is within
  4 K 2^-24 sum_i |hi_i + lo_i| |w_i| of it; and since |x - hi - lo| <= 2^-16 |x| (bf16 rounds to
  8 significant bits, twice), within 2^-16 sum_i |x_i w_i| more of the exact product.
- the fused MoE: float32 activations, the same bits as on the experts widened to float32; bf16x2,
  each output within 2^-14 (max |exact| + |exact|) (x moved by at most 2^-16 |x| in each of the
  two products) plus the dense bound of test_native_ops.
- the miniatures: with float32 activations every projection and expert is the same bits as the
  float32 path and only the LM head sums in another order (the C kernel, not torch's matmul), so the
  greedy tokens are the same on the prompts below and the logits within 1e-5 of max |logit|; with
  bf16x2 within 1e-4. Their matrices' resident bytes at most 0.6x the float32 path's (kimi about
  0.56: MLA's absorbed projections are formed at load and stay float32, issue 55 item 4; glm 0.50).
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models import layers
from kernels import dispatch, native_ops
from kernels.activation_quant import bf16x2_linear_ref, bf16x2_split
from kernels.formats import ACTIVATION
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not native_ops.available(), reason=f"not built: {native_ops.problem()}")

HAS_DP = "avx512_bf16" in native_ops.bf16_isas()
PATHS = [*native_ops.isas(), *(["avx512_bf16"] if HAS_DP else [])] or ["none"]


@pytest.fixture(params=PATHS)
def path(request):
    """Each bf16 path the CPU has, as (path, activations): the widening ones under set_max_isa's cap,
    vdpbf16ps under "avx512" with the bf16x2 activations."""
    name = request.param
    native_ops.set_max_isa(name if name in native_ops.ISAS else "avx512")
    acts = "bf16x2" if name == "avx512_bf16" else "f32"
    assert native_ops.bf16_isa(acts) == name
    yield name, acts
    native_ops.set_max_isa(native_ops.ISAS[-1])


def _weight(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    # rows of different sizes, as a model's
    return (torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen) * 0.2).to(torch.bfloat16)


def _x(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 4
    return torch.where(torch.rand(m, k, generator=gen) < 0.01, x * 20, x)  # a few outliers


# m: batch 1 (the direct rows), 2 and 3 (the direct rows' widest passes), 4, 5 and 33 (the tile path,
# vdpbf16ps's four-row pass and its remainders); k off every vector width; n off the four-row block
SHAPES = [
    (1, 256, 77), (2, 100, 9), (3, 7, 5), (4, 33, 4), (5, 1000, 33), (1, 4096, 130), (33, 96, 130), (1, 1, 3)
]  # fmt: skip


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_the_bf16_op_against_float64(m, k, n, path):
    name, acts = path
    gen = torch.Generator().manual_seed(hash((m, k, n, name)) % 2**31)
    w, x = _weight(n, k, gen), _x(m, k, gen)
    got = native_ops.linear_dense(x, w, None, acts)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    exact = x.double() @ w.double().T
    mags = x.double().abs() @ w.double().abs().T
    if acts == "f32":
        assert torch.equal(got, native_ops.linear_dense(x, w.float()))  # the float32 path's bits
        assert ((got.double() - exact).abs() <= 2 * k * 2.0**-24 * mags + 1e-30).all()
        return
    split = bf16x2_linear_ref(x, w)
    hi, lo = bf16x2_split(x)
    carried = (hi.double() + lo.double()).abs() @ w.double().abs().T
    assert ((got.double() - split).abs() <= 4 * k * 2.0**-24 * carried + 1e-30).all()
    assert ((got.double() - exact).abs() <= (2.0**-16 + 4 * k * 2.0**-24) * mags + 1e-30).all()


def test_the_split_keeps_sixteen_bits():
    gen = torch.Generator().manual_seed(1)
    x = _x(4, 1000, gen)
    hi, lo = bf16x2_split(x)
    assert ((hi.double() + lo.double() - x.double()).abs() <= 2.0**-16 * x.double().abs()).all()
    assert ACTIVATION["bf16x2"].weights == ("bf16",) and ACTIVATION["bf16x2"].code == 16


@pytest.mark.skipif(not HAS_DP, reason="no AVX-512 BF16 on this CPU")
def test_the_c_split_is_the_reference_split():
    """The C code's hi / lo (vcvtneps2bf16) are torch's round-to-nearest-even: on x with exact halves
    (its product with a one-hot W reads each x back as hi + lo, exactly in float32)."""
    gen = torch.Generator().manual_seed(2)
    x = _x(3, 64, gen)
    eye = torch.eye(64).to(torch.bfloat16)
    hi, lo = bf16x2_split(x)
    assert torch.equal(native_ops.linear_dense(x, eye, None, "bf16x2"), hi.float() + lo.float())


def test_a_row_is_the_same_bits_alone_in_a_batch_and_on_any_thread_count(path):
    _, acts = path
    gen = torch.Generator().manual_seed(5)
    w, x = _weight(301, 520, gen), _x(9, 520, gen)
    batch = native_ops.linear_dense(x, w, None, acts)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([native_ops.linear_dense(x[i : i + 1], w, None, acts) for i in range(9)])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(batch, alone)
    for m in (2, 3, 4, 5):
        assert torch.equal(native_ops.linear_dense(x[:m], w, None, acts), batch[:m]), m


def _routing(tokens: int, experts: int, k: int, gen: torch.Generator):
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    return torch.rand(tokens, k, generator=gen), ids


@pytest.mark.parametrize("tokens", [1, 3, 9])
def test_the_fused_moe_on_bf16_experts(tokens, path):
    _, acts = path
    gen = torch.Generator().manual_seed(hash((tokens, acts)) % 2**31)
    e, h, i, k = 6, 96, 64, 2
    w13 = (torch.randn(e, 2 * i, h, generator=gen) * 0.1).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=gen) * 0.1).to(torch.bfloat16)
    x = torch.randn(tokens, h, generator=gen)
    weights, ids = _routing(tokens, e, k, gen)
    load = torch.zeros(e, dtype=torch.long)
    got = native_ops.fused_moe(x, weights, ids, w13, None, w2, None, "bf16", i, load, activations=acts)
    wide = native_ops.fused_moe(x, weights, ids, w13.float(), None, w2.float(), None, "f32", i, load)
    if acts == "f32":
        assert torch.equal(got, wide)
        return
    exact = torch.zeros(tokens, h, dtype=torch.float64)
    for t in range(tokens):
        for j, ex in enumerate(ids[t].tolist()):
            gu = w13[ex].double() @ x[t].double()
            act = torch.nn.functional.silu(gu[:i]) * gu[i:]
            exact[t] += weights[t, j].double() * (w2[ex].double() @ act)
    bound = (2.0**-14 + 4 * (h + i) * 2.0**-24) * (exact.abs().max() + exact.abs())
    assert ((got.double() - exact).abs() <= bound).all()


def test_the_op_refuses_bf16x2_beside_another_weight_format():
    x = torch.zeros(1, 32)
    with pytest.raises(RuntimeError, match="activation format code 16"):
        torch.ops.edge_cpu.linear(x, torch.zeros(4, 32), None, None, 32, 4, 16)


def test_dispatch_keeps_bf16_and_picks_its_activations(monkeypatch):
    gen = torch.Generator().manual_seed(6)
    bf16, f32 = _weight(16, 64, gen), torch.randn(16, 64, generator=gen)
    monkeypatch.delenv(dispatch.BF16_ENV, raising=False)
    monkeypatch.delenv(dispatch.ACTIVATIONS_ENV, raising=False)
    cpu = torch.device("cpu")
    assert dispatch.keeps_bf16(cpu) and not dispatch.keeps_bf16(torch.device("meta"))
    assert dispatch.linear_op(bf16) == dispatch.NATIVE_LINEAR and dispatch.linear_activations(bf16) == "f32"
    monkeypatch.setenv(dispatch.BF16_ENV, "f32")
    assert not dispatch.keeps_bf16(cpu)
    monkeypatch.setenv(dispatch.BF16_ENV, "f16")
    with pytest.raises(ValueError, match="EDGE_CPU_BF16='f16'"):
        dispatch.keeps_bf16(cpu)
    monkeypatch.setenv(dispatch.ACTIVATIONS_ENV, "a8,bf16x2")
    q4 = layers.Linear(__import__("kernels.quant", fromlist=["quantize"]).quantize(f32, "int4"))
    assert q4.activations == "a8" and dispatch.linear_activations(f32) == "f32"
    want = "bf16x2" if HAS_DP else "f32"  # without AVX-512 BF16 the op widens: it says so
    layer = layers.Linear(bf16)
    assert layer.activations == want and layer.rows.dtype == torch.bfloat16
    x = torch.randn(3, 64, generator=gen)
    assert torch.equal(layer(x), native_ops.linear_dense(x, bf16, None, want))


def _matrix_bytes(llm: LLM) -> int:
    """Bytes of every distinct tensor storage the model holds (its weights: the KV cache is the
    engine's), walked through the model's own objects."""
    seen: set[int] = set()
    total = 0

    def visit(obj, depth: int = 0) -> None:
        nonlocal total
        if depth > 12:
            return
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(obj, list | tuple):
            for item in obj:
                visit(item, depth + 1)
        elif isinstance(obj, dict):
            for item in obj.values():
                visit(item, depth + 1)
        elif type(obj).__module__.startswith(("engine.", "kernels.")) and hasattr(obj, "__dict__"):
            for item in vars(obj).values():
                visit(item, depth + 1)

    visit(llm.model)
    return total


PROMPTS = ["def fibonacci(n):\n", "What is the capital of France?", "import os\nimport sys\n"]
TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


@pytest.mark.parametrize("model", ["kimi-k2-mini", "glm-4.5-mini"])
def test_a_shipped_model_keeps_bf16_and_decodes_the_f32_paths_tokens(model, monkeypatch):
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    monkeypatch.delenv(dispatch.ACTIVATIONS_ENV, raising=False)
    monkeypatch.setenv(dispatch.BF16_ENV, "f32")
    wide = LLM(REPO / "models" / model, device="cpu", compile=False)
    monkeypatch.setenv(dispatch.BF16_ENV, "bf16")
    kept = LLM(REPO / "models" / model, device="cpu", compile=False)
    assert wide.dense_path == "f32 (widened at load)"
    assert kept.dense_path == f"bf16 (edge_cpu, {native_ops.bf16_isa()})"
    assert kept.weights_label == wide.weights_label == "bf16"
    m = kept.model
    assert m.embed.dtype == torch.bfloat16 and m.lm_head.rows.dtype == torch.bfloat16
    assert all(layer.experts.w13.dtype == torch.bfloat16 for layer in m.moe_layers())
    assert m.norm.weight.dtype == torch.float32  # norms, biases, the router: float32 as before
    assert _matrix_bytes(kept) <= 0.6 * _matrix_bytes(wide)
    want = [g.token_ids for g in wide.generate(PROMPTS, params)]
    assert [g.token_ids for g in kept.generate(PROMPTS, params)] == want
    ids = wide.encode(TEXT)
    ref = wide.logits(ids)
    assert (kept.logits(ids) - ref).abs().max() <= 1e-5 * ref.abs().max()
    if HAS_DP:
        monkeypatch.setenv(dispatch.ACTIVATIONS_ENV, "bf16x2")
        dp = LLM(REPO / "models" / model, device="cpu", compile=False)
        assert dp.dense_path == "bf16 (edge_cpu, avx512_bf16, bf16x2 activations)"
        assert (dp.logits(ids) - ref).abs().max() <= 1e-4 * ref.abs().max()
        assert [g.token_ids for g in dp.generate(PROMPTS, params)] == want
