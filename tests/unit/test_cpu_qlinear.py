"""The CPU kernels of compressed weights (kernels.native_ops) against the reference
(dequantize, then multiply in float64) on fresh random inputs, on every path this CPU has (AVX-512,
AVX2 + FMA, the portable one), at 1, 7 and 32 rows and widths off every vector, tile and
micro-kernel size; and the reference path they fall back to (EDGE_CPU_KERNELS=0, no compiler).

Tolerance: a float32 dot product of length K is within gamma_K = K * 2^-24 (times a small constant)
of the exact one, relative to sum |x_i w_i| (Higham's bound); the test allows 2 K 2^-24 of it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from kernels import native_ops
from kernels.quant import dequantize, quantize

pytestmark = pytest.mark.skipif(not native_ops.available(), reason=f"not built: {native_ops.problem()}")


def _check(fmt: str, m: int, k: int, n: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen) * 3
    x = torch.randn(m, k, generator=gen)
    qw = quantize(w, fmt)
    dense = dequantize(qw, torch.float64)
    exact = x.double() @ dense.T
    bound = 2 * k * 2.0**-24 * (x.double().abs() @ dense.abs().T) + 1e-30
    got = native_ops.qlinear(x, qw)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    assert ((got.double() - exact).abs() <= bound).all(), (got.double() - exact).abs().max()


SHAPES = [(1, 256, 512), (2, 96, 7), (5, 512, 1001), (33, 64, 130), (1, 4096, 64)]


ISAS = native_ops.isas() or ("none",)


@pytest.fixture(params=ISAS)
def isa(request):
    """Each path the CPU has, capped for the test (a CI host with AVX2 only runs two of three)."""
    native_ops.set_max_isa(request.param)
    assert native_ops.isa() == request.param
    yield request.param
    native_ops.set_max_isa("avx512")


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_matches_the_dequantized_product(fmt, m, k, n, isa):
    _check(fmt, m, k, n, seed=hash((fmt, m, k, n, isa)) % 2**31)


# rows: one (the GEMV path), 7 (a micro-kernel of 4 or 2 rows plus a tail), 32; in sizes a multiple of
# the int4 group but not of 64 (two groups a pass) or off every vector width (int8); out sizes off
# the tile of 4 rows and the thread split
ROWS = [1, 7, 32]
IN_OUT = {
    "int8": [(256, 128), (200, 77), (33, 5), (1000, 131)],
    "int4": [(256, 128), (96, 77), (160, 5), (1056, 131)],
}


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize(("fmt", "k", "n"), [(f, k, n) for f, shapes in IN_OUT.items() for k, n in shapes])
def test_rows_1_7_32_at_sizes_off_the_simd_width_and_group(fmt, m, k, n, isa):
    _check(fmt, m, k, n, seed=hash((fmt, m, k, n, isa, "rows")) % 2**31)


def test_every_path_this_cpu_has_is_the_one_it_runs_by_default():
    assert native_ops.isa() == native_ops.isas()[-1]
    assert native_ops.isas()[0] == "scalar"


def test_an_int8_width_off_the_vector_width_is_served_too():
    _check("int8", 3, 77, 9, seed=1)  # K not a multiple of 8: the portable loops take it
    _check("int8", 1, 40, 5, seed=2)  # one row, K not a multiple of 16: the dot's scalar tail


def test_kernels_linear_uses_it_on_the_cpu_keeping_dtype_leading_dims_and_bias(monkeypatch):
    qw = quantize(torch.randn(48, 64), "int4")
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    bias = torch.randn(48)

    def no_reference(*args, **kwargs):
        raise AssertionError("the dense reference ran")

    monkeypatch.setattr(kernels, "linear_ref", no_reference)
    y = kernels.linear(x, qw, bias)
    assert y.shape == (2, 3, 48) and y.dtype == torch.bfloat16
    want = x.float() @ dequantize(qw).T + bias
    torch.testing.assert_close(y.float(), want, rtol=1e-2, atol=1e-2)  # bf16 output rounding


def test_fp8_and_gpu_shapes_keep_the_reference():
    assert not native_ops.supports(torch.randn(1, 64), quantize(torch.randn(8, 64), "fp8"))
    stacked = quantize(torch.randn(2, 8, 64), "int4")  # [E, out, in]: one expert at a time
    assert not native_ops.supports(torch.randn(1, 64), stacked)
    assert native_ops.supports(torch.randn(1, 64), stacked[1])


def test_stored_tensors_off_their_shape_never_reach_the_c_code():
    """The C code trusts its sizes: a weight whose bytes or scales are not what its shape says (a
    malformed checkpoint) is refused by qlinear and left to the reference by kernels.linear."""
    from kernels.formats import QuantizedWeight

    good = quantize(torch.randn(16, 64), "int4")
    short = QuantizedWeight("int4", good.data[:, :16], good.scale, good.shape)
    wrong_scale = QuantizedWeight("int4", good.data, good.scale.float(), good.shape)
    x = torch.randn(1, 64)
    for bad in (short, wrong_scale):
        assert not native_ops.supports(x, bad)
        with pytest.raises(ValueError, match="does not take"):
            native_ops.qlinear(x, bad)
    assert not native_ops.supports(torch.randn(1, 32), good)  # x's width is not W's


def test_many_threads_and_one_give_the_same_sums():
    """Threads split output rows, never a dot product: the result does not depend on their count."""
    gen = torch.Generator().manual_seed(5)
    qw = quantize(torch.randn(1024, 512, generator=gen), "int4")
    x = torch.randn(32, 512, generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native_ops.qlinear(x, qw)
        torch.set_num_threads(max(2, threads))
        many = native_ops.qlinear(x, qw)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


FALLBACK = """
import sys, torch, kernels
from kernels import native_ops
from kernels.quant import dequantize, quantize
qw = quantize(torch.randn(48, 64), "{fmt}")
x = torch.randn(3, 64)
for _ in range(3):
    y = kernels.linear(x, qw)
assert not native_ops.available() and native_ops.isa() == "none" and not native_ops.isas()
assert torch.equal(y, x @ dequantize(qw).T), "the fallback is the reference itself"
print(native_ops.problem())
"""


def _run_fallback(fmt: str, **env: str) -> subprocess.CompletedProcess:
    repo = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-c", FALLBACK.format(fmt=fmt)],
        cwd=repo,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_edge_cpu_kernels_0_takes_the_reference_and_says_so_once_on_stderr(fmt):
    done = _run_fallback(fmt, EDGE_CPU_KERNELS="0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "EDGE_CPU_KERNELS=0"
    said = [line for line in done.stderr.splitlines() if "dequantize-then-multiply" in line]
    assert len(said) == 1 and "EDGE_CPU_KERNELS=0" in said[0], done.stderr


def test_without_a_compiler_it_falls_back_saying_why(tmp_path):
    """No cached build and no compiler (CC names none; the cache is a fresh folder): the reference
    path, once said. The checkout's own .native/ is bypassed by building from a copy of the package."""
    import shutil

    repo = Path(__file__).resolve().parents[2]
    copy = tmp_path / "pkg"
    shutil.copytree(repo / "kernels", copy / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-c", FALLBACK.format(fmt="int4")],
        cwd=copy,  # no pyproject.toml there: it builds into XDG_CACHE_HOME only
        env={
            **os.environ,
            "CC": str(tmp_path / "no-such-cc"),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PYTHONPATH": str(copy),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "dequantize-then-multiply" in line]
    assert len(said) == 1 and "no-such-cc" in said[0], done.stderr


def test_reset_and_reload_serves_the_kernels_again(monkeypatch):
    """_reset forgets a decision: a process that set EDGE_CPU_KERNELS=0 and cleared it gets them back."""
    monkeypatch.setenv("EDGE_CPU_KERNELS", "0")
    native_ops._reset()
    try:
        assert not native_ops.available() and native_ops.problem() == "EDGE_CPU_KERNELS=0"
        qw = quantize(torch.randn(8, 64), "int8")
        assert not native_ops.supports(torch.randn(1, 64), qw)
    finally:
        monkeypatch.delenv("EDGE_CPU_KERNELS")
        native_ops._reset()
    assert native_ops.available()


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_gate_and_up_as_one_weight_give_the_same_values_as_two(fmt):
    """kernels.quant.concat_out (gate and up rows joined, one call): every output is the same dot
    product in the same order, so the joined call is bitwise the two separate ones."""
    from kernels.quant import concat_out, rows_of

    gen = torch.Generator().manual_seed(9)
    gate, up = (
        quantize(torch.randn(128, 256, generator=gen), fmt),
        quantize(torch.randn(128, 256, generator=gen), fmt),
    )
    joined = concat_out([gate, up])
    assert joined is not None and joined.shape == (256, 256)
    for m in (1, 7, 32):
        x = torch.randn(m, 256, generator=gen)
        both = kernels.linear(x, joined)
        assert torch.equal(both[:, :128], kernels.linear(x, gate))
        assert torch.equal(both[:, 128:], kernels.linear(x, up))
    assert torch.equal(dequantize(rows_of(joined, 128, 256)), dequantize(up))
    assert concat_out([quantize(torch.randn(128, 256), "fp8")] * 2) is None  # block scales span rows


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_greedy_tokens_are_the_reference_paths(fmt, monkeypatch):
    """The shipped miniature with compressed experts decodes the same greedy tokens on these kernels
    as on the reference (dequantize, then multiply), batch 1 and 3 sequences together."""
    from engine import LLM
    from engine.sampling import SamplingParams

    repo = Path(__file__).resolve().parents[2]
    llm = LLM(repo / "models" / "kimi-k2-mini", weights=fmt, device="cpu")
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = ["def fibonacci(n):\n    ", "import os\nclass Config:\n", "# sort a list\n"]

    def tokens():
        return [list(r.token_ids) for r in llm.generate(prompts, params)] + [
            list(llm.generate(prompts[0], params)[0].token_ids)
        ]

    ours = tokens()
    monkeypatch.setattr(native_ops, "supports", lambda x, w: False)
    assert ours == tokens()
