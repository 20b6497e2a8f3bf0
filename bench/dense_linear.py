"""Dense float32 products on the CPU: MKL (torch.matmul, both weight layouts) against the C kernel
(edge_cpu::linear, kernels/csrc/qlinear.c), with the weights streamed from memory as a decode step
streams them: each timing cycles through `--weights` distinct matrices (more than the caches hold), so
no product finds its weight in cache.

    python bench/dense_linear.py [--weights 24] [--rounds 3] [--threads 2]

Shapes: a mid-size model's MLA projections and LM head, and the miniatures' (W is [out, in]).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from kernels import native_ops  # noqa: E402

SHAPES = [(1024, 4896), (4096, 1024), (1024, 1536), (1024, 4128), (256, 512), (256, 4128)]  # (in, out)
ROWS = (1, 4, 32)


def streamed_us(fn, weights: list, rounds: int) -> float:
    """Mean us per product over `rounds` passes through every weight (one warm pass first)."""
    for w in weights:
        fn(w)
    started = time.perf_counter()
    for _ in range(rounds):
        for w in weights:
            fn(w)
    return (time.perf_counter() - started) / (rounds * len(weights)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not native_ops.available():
        sys.exit(f"the fused ops are not built: {native_ops.problem()}")
    print(f"# {platform.machine()}, torch {torch.__version__}, {args.threads} threads, {native_ops.isa()}")
    print("| rows | in | out | MKL [in, out] us | MKL [out, in]^T us | ours us | ours / MKL [in, out] |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for k, n in SHAPES:
        ws = [torch.randn(n, k) for _ in range(args.weights)]
        pairs = [(w, w.t().contiguous()) for w in ws]
        for m in ROWS:
            x = torch.randn(m, k)
            mkl = streamed_us(lambda p, x=x: torch.matmul(x, p[1]), pairs, args.rounds)
            view = streamed_us(lambda p, x=x: torch.matmul(x, p[0].t()), pairs, args.rounds)
            ours = streamed_us(lambda p, x=x: native_ops.linear_dense(x, p[0]), pairs, args.rounds)
            cells = f"{mkl:.0f} | {view:.0f} | {ours:.0f} | {mkl / ours:.2f}x"
            print(f"| {m} | {k} | {n} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
