"""bf16 weights kept as bf16 on the CPU against the same weights widened to float32 at load, both
through edge_cpu::linear (kernels/csrc/qlinear.c): the f32 rows, and the bf16 rows on each path this
CPU has (widened in registers on "avx512" / "avx2" with float32 activations; vdpbf16ps on
"avx512_bf16", the "bf16x2" activations of EDGE_CPU_ACTIVATIONS), in one run (interleaved rounds,
best of them).

    python bench/bf16_linear.py [--rounds 3] [--threads 2] [--rows 1 4 32] [--stream-mb 128]

Two rows per shape: "cached", one matrix over and over (in L2 / L3: what the arithmetic costs), and
"streamed", cycling through enough copies (`--stream-mb` of bf16 weights, more than L3) that every
product reads its weight from memory, as a decode step does. GB/s: the weight's bytes per second
(4 a weight for f32, 2 for bf16). It prints the CPU and its ISA flags.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.int_dot_linear import cpu  # noqa: E402
from kernels import native_ops  # noqa: E402

SHAPES = [(2048, 2048), (5632, 2048), (4128, 256)]  # W [out, in]: attention, an MLP's up, a miniature's head


def per_call_us(x: torch.Tensor, weights: list[torch.Tensor], calls: int, acts: str) -> float:
    started = time.perf_counter()
    for i in range(calls):
        native_ops.linear_dense(x, weights[i % len(weights)], None, acts)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1], help="rows of x (1: a decode step, batch 1)")
    ap.add_argument("--stream-mb", type=int, default=128, help="bf16 weights cycled through when streamed")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not native_ops.available():
        sys.exit(f"the CPU ops are not built: {native_ops.problem()}")
    paths = [p for p in native_ops.bf16_isas() if p in ("avx2", "avx512", "avx512_bf16")]
    print(f"# {cpu()}")
    head = f"torch {torch.__version__}, {args.threads} threads, f32 path {native_ops.isa()}"
    print(f"# {head}, best of {args.rounds} rounds")
    cols = " | ".join(f"bf16 {p} us" for p in paths)
    gbs = " | ".join(f"{p} GB/s" for p in paths)
    print(f"| W [out, in] | rows | weights | f32 us | {cols} | f32 / best bf16 | f32 GB/s | {gbs} |")
    print("|---|---:|---|" + "---:|" * (3 + 2 * len(paths)))
    gen = torch.Generator().manual_seed(0)
    try:
        for n, k in SHAPES:
            w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
            copies = max(2, args.stream_mb * 2**20 // (2 * n * k))
            for m in args.rows:
                x = torch.randn(m, k, generator=gen)
                for label, count in (("cached", 1), ("streamed", copies)):
                    bf16 = [w.clone() for _ in range(count)]
                    f32 = [b.float() for b in bf16]
                    calls = 200 if label == "cached" else 2 * count
                    runs = [("f32", f32, native_ops.isas()[-1])] + [(p, bf16, p) for p in paths]
                    best = dict.fromkeys((name for name, _, _ in runs), float("inf"))
                    for _ in range(args.rounds + 1):  # the first round warms (pages touched)
                        for name, weights, path in runs:
                            native_ops.set_max_isa(path if path in native_ops.ISAS else "avx512")
                            acts = "bf16x2" if path == "avx512_bf16" else "f32"
                            us = per_call_us(x, weights, calls, acts)
                            best[name] = min(best[name], us) if _ else best[name]
                    times = [best[p] for p in paths]
                    rates = [2 * n * k / us / 1e3 for us in times]
                    print(
                        f"| {n}x{k} | {m} | {label} | {best['f32']:.0f} | "
                        + " | ".join(f"{t:.0f}" for t in times)
                        + f" | {best['f32'] / min(times):.2f}x | {4 * n * k / best['f32'] / 1e3:.1f} | "
                        + " | ".join(f"{r:.1f}" for r in rates)
                        + " |",
                        flush=True,
                    )
                    del bf16, f32
    finally:
        native_ops.set_max_isa(native_ops.ISAS[-1])


if __name__ == "__main__":
    main()
