"""int8 and int4 weight matmuls on the CPU: ours (kernels/csrc/qlinear.c, read as stored) against float32
dense and against torch's own paths, then the engine's decode at each weight format with our kernels
and with the reference path, all from one run (interleaved rounds, medians).

    python bench/qlinear_speed.py [--rounds 5] [--no-engine] [--tokens 32] [--seqs 32] [--max-isa avx2]

1. x [m, in] @ W^T for W [out, in] at 1 and 32 rows: float32 dense (x @ W^T, MKL), our int8 and int4,
   and torch's reference paths for the same stored weights: dequantize then multiply
   (kernels.quant.linear_ref, what every compressed matmul paid before), and torch's packed CPU
   kernels (`aten._weight_int8pack_mm`, `aten._weight_int4pack_mm_for_cpu` on the same codes and
   scales). Shapes: in 1024 -> out 4096 (the issue's), the miniatures' compressed ones (a routed or
   shared expert's gate and up joined, 256x256; its down, 256x128; the dense MLP's, 1024x256 and
   256x512) and a mid-size expert's (1024x4096 down, 4096x1024 up).
2. kimi-k2-mini's decode tok/s at batch 1 and over `--seqs` sequences with experts in bf16, int8 and
   int4, each compressed format with our kernels ("ours") and with the reference path ("ref",
   dequantize then multiply: what EDGE_CPU_KERNELS=0 runs), ratios against bf16 of the same rounds.
It prints the path the kernels run on this CPU (kernels.native_ops.isa()).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kernels import native_ops  # noqa: E402
from kernels.packing import unpack_int4  # noqa: E402
from kernels.quant import linear_ref, quantize  # noqa: E402

SHAPES = [  # (out, in, what)
    (4096, 1024, "in 1024 -> out 4096 (the issue's)"),
    (256, 256, "mini expert gate+up"),
    (256, 128, "mini expert down"),
    (1024, 256, "mini dense MLP gate+up"),
    (256, 512, "mini dense MLP down"),
    (1024, 4096, "mid expert down"),
]
ROWS = (1, 32)


def _ms(fn, args: tuple, repeat: int) -> float:
    for _ in range(2):
        fn(*args)
    started = time.perf_counter()
    for _ in range(repeat):
        fn(*args)
    return (time.perf_counter() - started) / repeat * 1e3


def _torch_int4(q4):
    """Our int4 weight repacked for torch's own kernel (codes 0..15, its scale-and-zero layout)."""
    codes = (unpack_int4(q4.data) + 8).to(torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2)
    scale = q4.scale.float().T.contiguous()  # [in/32, out]
    return packed, torch.stack([scale, torch.zeros_like(scale)], dim=-1).contiguous()


def matmul_table(rounds: int) -> None:
    print(f"\n## Matmuls: ms per call, median of {rounds} interleaved rounds\n")
    print(
        "| W [out, in] | m | f32 dense | int8 ours | int4 ours | int8 deq+mm | int4 deq+mm | "
        "torch int8pack | torch int4pack | f32/int8 | f32/int4 | deq+mm/int4 | int4pack/int4 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    gen = torch.Generator().manual_seed(0)
    for n, k, what in SHAPES:
        w = torch.randn(n, k, generator=gen)
        wt = w.t().contiguous()
        q8, q4 = quantize(w, "int8"), quantize(w, "int4")
        p4, sz4 = _torch_int4(q4)
        for m in ROWS:
            x = torch.randn(m, k, generator=gen)
            runs = {
                "f32": (torch.matmul, (x, wt)),
                "int8": (native_ops.qlinear, (x, q8)),
                "int4": (native_ops.qlinear, (x, q4)),
                "deq8": (linear_ref, (x, q8)),
                "deq4": (linear_ref, (x, q4)),
                "tp8": (torch.ops.aten._weight_int8pack_mm, (x, q8.data, q8.scale)),
                "tp4": (torch.ops.aten._weight_int4pack_mm_for_cpu, (x, p4, 32, sz4)),
            }
            repeat = max(3, min(2000, int(3e6 / (n * k * max(m, 4)))))
            times: dict[str, list[float]] = {key: [] for key in runs}
            for _ in range(rounds):
                for key, (fn, args) in runs.items():
                    times[key].append(_ms(fn, args, repeat))
            t = {key: statistics.median(v) for key, v in times.items()}
            print(
                f"| {n}x{k} ({what}) | {m} | {t['f32']:.4f} | {t['int8']:.4f} | {t['int4']:.4f} | "
                f"{t['deq8']:.4f} | {t['deq4']:.4f} | {t['tp8']:.4f} | {t['tp4']:.4f} | "
                f"{t['f32'] / t['int8']:.2f}x | {t['f32'] / t['int4']:.2f}x | {t['deq4'] / t['int4']:.1f}x | "
                f"{t['tp4'] / t['int4']:.1f}x |"
            )


def engine_table(rounds: int, tokens: int, seqs: int, model: Path) -> None:
    from bench.engine_runs import concurrent_tok_s, decode_tok_s
    from engine import LLM

    llms = {fmt: LLM(model, weights=fmt, device="cpu") for fmt in ("bf16", "int8", "int4")}
    prompt = llms["bf16"].encode("def fibonacci(n):\n    ")
    prompts = [llms["bf16"].encode(f"# task {i}\ndef solve_{i}(x):\n    ") for i in range(seqs)]
    variants = [("bf16", "bf16", True), ("int8", "int8 ref", False), ("int8", "int8 ours", True),
                ("int4", "int4 ref", False), ("int4", "int4 ours", True)]  # fmt: skip
    one: dict[str, list[float]] = {v[1]: [] for v in variants}
    many: dict[str, list[float]] = {v[1]: [] for v in variants}
    real_supports = native_ops.supports
    try:
        for _ in range(rounds):
            for fmt, label, ours in variants:
                native_ops.supports = (
                    real_supports if ours else (lambda x, w: False)
                )  # ref: dequantize, multiply
                one[label].append(decode_tok_s(llms[fmt], prompt, tokens))
                many[label].append(concurrent_tok_s(llms[fmt], prompts, tokens))
    finally:
        native_ops.supports = real_supports
    print(f"\n## {model.name} decode tok/s, experts by format (median of {rounds}; x: against bf16)\n")
    print(f"| experts | matmul path | batch 1 | x bf16 | {seqs} sequences | x bf16 |")
    print("|---|---|---:|---:|---:|---:|")
    base1, base_n = statistics.median(one["bf16"]), statistics.median(many["bf16"])
    for _, label, ours in variants:
        a, b = statistics.median(one[label]), statistics.median(many[label])
        path = "dense (torch)" if label == "bf16" else ("ours (qlinear)" if ours else "dequantize + mm")
        print(f"| {label.split()[0]} | {path} | {a:.1f} | {a / base1:.2f}x | {b:.1f} | {b / base_n:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--no-engine", action="store_true")
    parser.add_argument("--no-matmuls", action="store_true")
    parser.add_argument("--model", type=Path, default=REPO / "models" / "kimi-k2-mini")
    parser.add_argument(
        "--max-isa",
        choices=native_ops.ISAS,
        help="cap our kernels' path (avx2: what an AVX2-only host runs)",
    )
    args = parser.parse_args()
    if args.max_isa:
        native_ops.set_max_isa(args.max_isa)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"with {torch.get_num_threads()} threads, load average {load:.2f} at start; our kernels: "
        f"{native_ops.isa()} "
        f"(paths here: {', '.join(native_ops.isas()) or 'none'}; {native_ops.problem() or 'built'})"
    )
    if not args.no_matmuls:
        matmul_table(args.rounds)
    if not args.no_engine:
        engine_table(args.rounds, args.tokens, args.seqs, args.model)


if __name__ == "__main__":
    main()
