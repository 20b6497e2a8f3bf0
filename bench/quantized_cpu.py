"""Compressed weights on the CPU: what int8 and int4 cost against 16 and 32 bits, as a matmul and as
the engine's decode, measured in one run (interleaved rounds, medians).

    python bench/quantized_cpu.py [--rounds 3] [--tokens 32] [--seqs 32] [--no-engine] [--no-matmuls]
    python bench/quantized_cpu.py --no-matmuls --model bench/out/mid-kimi   (after make_random_checkpoint)

1. Matmuls x [m, k] @ W^T at the miniatures' and a mid-size model's shapes: float32 and bfloat16
   dense (torch, MKL / oneDNN), the reference path for a compressed W (dequantize, then multiply:
   what every call paid before the C kernels of kernels.native_ops), and ours (int8, int4 read as stored).
2. A model's decode with its experts in bf16, int8 and int4 (engine.LLM's `weights`): tokens/s
   at batch 1 and over `--seqs` concurrent sequences (bench/engine_runs.py), each ratio against
   bf16 from the same rounds. `--model` (default kimi-k2-mini, as shipped) may name a mid-size
   random checkpoint (bench/make_random_checkpoint.py), where bandwidth rules.
It prints the kernels' path on this CPU (kernels.native_ops.isa()).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.engine_runs import concurrent_tok_s, decode_tok_s  # noqa: E402
from kernels import native_ops  # noqa: E402
from kernels.quant import linear_ref, quantize  # noqa: E402

SHAPES = [(256, 512, "miniature expert up"), (512, 256, "miniature expert down"),
          (1024, 4096, "mid-size expert up"), (4096, 1024, "mid-size expert down")]  # fmt: skip
ROWS = (1, 8, 32)


def _ms(run: tuple, repeat: int) -> float:
    fn, *args = run
    for _ in range(3):
        fn(*args)
    started = time.perf_counter()
    for _ in range(repeat):
        fn(*args)
    return (time.perf_counter() - started) / repeat * 1e3


def matmul_table(rounds: int) -> None:
    print(f"\n## Matmuls (ms per call, median of {rounds}; ratio: f32 dense / ours)\n")
    print("| W [out, in] | m | f32 | bf16 | int4 dequant+mm | int8 ours | int4 ours | f32/int4 ours |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    gen = torch.Generator().manual_seed(0)
    for n, k, what in SHAPES:
        w = torch.randn(n, k, generator=gen)
        wt, wb = w.t().contiguous(), w.t().contiguous().bfloat16()
        q8, q4 = quantize(w, "int8"), quantize(w, "int4")
        for m in ROWS:
            x = torch.randn(m, k, generator=gen)
            xb = x.bfloat16()
            runs = {  # (function, its arguments)
                "f32": (torch.matmul, x, wt),
                "bf16": (torch.matmul, xb, wb),
                "deq": (linear_ref, x, q4),
                "int8": (native_ops.qlinear, x, q8),
                "int4": (native_ops.qlinear, x, q4),
            }
            repeat = max(3, int(2e6 / (n * k * max(m, 4))))
            times = {key: [] for key in runs}
            for _ in range(rounds):  # interleaved: each round runs every variant once
                for key, run in runs.items():
                    times[key].append(_ms(run, repeat))
            med = {key: statistics.median(v) for key, v in times.items()}
            print(
                f"| {n}x{k} ({what}) | {m} | {med['f32']:.3f} | {med['bf16']:.3f} | {med['deq']:.3f} | "
                f"{med['int8']:.3f} | {med['int4']:.3f} | {med['f32'] / med['int4']:.2f}x |"
            )


def engine_table(rounds: int, tokens: int, seqs: int, model: Path, parts: str, compiled: bool) -> None:
    from engine import LLM
    from engine.step.compiled_step import row_bucket

    shipped = model.resolve().parent == (REPO / "models").resolve()
    llms = {
        fmt: LLM(
            model, weights=fmt, weight_parts=parts, device="cpu", allow_unsigned=not shipped, compile=compiled
        )
        for fmt in ("bf16", "int8", "int4")
    }
    for llm in llms.values():  # the compiled step's buckets of both rows, compiled before any timing
        if llm.engine.compiled_decode is not None:
            llm.engine.compiled_decode.warm_up(sorted({1, row_bucket(seqs) or 64}))
    prompt = llms["bf16"].encode("def fibonacci(n):\n    ")
    prompts = [llms["bf16"].encode(f"# task {i}\ndef solve_{i}(x):\n    ") for i in range(seqs)]
    one = {fmt: [] for fmt in llms}
    many = {fmt: [] for fmt in llms}
    for _ in range(rounds):
        for fmt, llm in llms.items():
            one[fmt].append(decode_tok_s(llm, prompt, tokens))
            many[fmt].append(concurrent_tok_s(llm, prompts, tokens))
    step = "compiled" if compiled else "eager"
    title = f"{model.name} decode, {parts} by format ({step} step; tok/s, median of {rounds}; x: vs bf16)"
    print(f"\n## {title}\n")
    print(f"| {parts} | batch 1 | x | {seqs} sequences | x |")
    print("|---|---:|---:|---:|---:|")
    base1, base_n = statistics.median(one["bf16"]), statistics.median(many["bf16"])
    for fmt in llms:
        a, b = statistics.median(one[fmt]), statistics.median(many[fmt])
        print(f"| {fmt} | {a:.1f} | {a / base1:.2f}x | {b:.1f} | {b / base_n:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--no-engine", action="store_true")
    parser.add_argument("--no-matmuls", action="store_true")
    parser.add_argument(
        "--model",
        type=Path,
        default=REPO / "models" / "kimi-k2-mini",
        help="the checkpoint of the engine rows (bench/make_random_checkpoint.py writes mid-size ones)",
    )
    parser.add_argument("--weight-parts", default="experts", help='what is compressed: "experts" or "all"')
    parser.add_argument(
        "--compile", action="store_true", help="the compiled decode step (buckets warmed first)"
    )
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; compressed-weight kernels: "
          f"{native_ops.isa()} ({native_ops.problem() or 'built'})")  # fmt: skip
    if not args.no_matmuls:
        matmul_table(args.rounds)
    if not args.no_engine:
        engine_table(args.rounds, args.tokens, args.seqs, args.model, args.weight_parts, args.compile)


if __name__ == "__main__":
    main()
