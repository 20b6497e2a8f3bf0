"""int8 / int4 products at batch 1 on the CPU with float32 activations (kernels/csrc/qlinear.c: each
weight widened to float32) against 8-bit activations on integer units (qlinear_a8.c, the "a8"
activation format), both through edge_cpu::linear, in one run (interleaved rounds, best of them).

    python bench/int_dot_linear.py [--rounds 3] [--threads 2] [--rows 1] [--stream-mb 128]

Two rows per weight: "cached", one matrix over and over (in L2 / L3: what the arithmetic costs), and
"streamed", cycling through enough copies (`--stream-mb` of weights, more than L3) that every
product reads its weight from memory, as a decode step does. GB/s: the weight's bytes (codes and
scales) per second. It prints the CPU, its ISA flags and the path each product ran. int8 has a third
column, "a8 r4": the a8 product on the weight repacked at load four rows to a stream
(kernels.native_ops.RepackedInt8, what a model's int8 layers run with EDGE_CPU_ACTIVATIONS=a8).
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
from kernels.formats import QuantizedWeight  # noqa: E402
from kernels.quant import quantize  # noqa: E402

SHAPES = [(2048, 2048), (5632, 2048)]  # W [out, in]: a mid-size attention projection, an MLP's up
ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")


def cpu() -> str:
    """The CPU's model name and which of the ISA flags that matter here it has (Linux /proc/cpuinfo)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in reversed(lines) if ":" in line)  # the first CPU's
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    have = [f for f in ISA_FLAGS if f in fields.get("flags", "").split()]
    return f"{fields.get('model name', '?')}; flags: {' '.join(have) or 'none of ' + ', '.join(ISA_FLAGS)}"


def per_call_us(x: torch.Tensor, weights: list, act: str, calls: int) -> float:
    """Mean us per product over `calls` products cycling through `weights`."""
    act = "a8" if act == "a8 r4" else act
    started = time.perf_counter()
    for i in range(calls):
        native_ops.linear(x, weights[i % len(weights)], None, act)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1, help="rows of x (1: a decode step at batch 1)")
    ap.add_argument("--stream-mb", type=int, default=128, help="weights cycled through in the streamed rows")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not native_ops.available():
        sys.exit(f"the CPU ops are not built: {native_ops.problem()}")
    print(f"# {cpu()}")
    print(
        f"# torch {torch.__version__}, {args.threads} threads, {args.rows} row(s) of x; paths: f32 "
        f"{native_ops.isa()}, a8 {native_ops.a8_isa()}; best of {args.rounds} interleaved rounds"
    )
    print(
        "| W [out, in] | format | weights | f32 acts us | a8 us | a8 r4 us | f32 / a8 | a8 / a8 r4 "
        "| f32 GB/s | a8 GB/s | a8 r4 GB/s |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    gen = torch.Generator().manual_seed(0)
    for n, k in SHAPES:
        w = torch.randn(n, k, generator=gen)
        x = torch.randn(args.rows, k, generator=gen)
        for fmt in ("int8", "int4"):
            q = quantize(w, fmt)
            copies = max(2, args.stream_mb * 2**20 // q.nbytes())
            streamed = [QuantizedWeight(fmt, q.data.clone(), q.scale.clone(), q.shape) for _ in range(copies)]
            for label, weights, calls in (("cached", [q], 200), ("streamed", streamed, 2 * copies)):
                runs = {"f32": weights, "a8": weights}
                if fmt == "int8":
                    runs["a8 r4"] = [native_ops.repack_int8(c) for c in weights]
                best = dict.fromkeys(runs, float("inf"))
                for act, ws in runs.items():  # warm: pages touched, caches as the timed pass finds them
                    per_call_us(x, ws, act, len(ws))
                for _ in range(args.rounds):
                    for act, ws in runs.items():
                        best[act] = min(best[act], per_call_us(x, ws, act, calls))
                f32, a8, r4 = best["f32"], best["a8"], best.get("a8 r4")
                gbs = [q.nbytes() / us / 1e3 for us in (f32, a8)]
                ratio = f"{f32 / a8:.2f}x"
                r4_cells = f"{r4:.0f} | {ratio} | {a8 / r4:.2f}x" if r4 else f"- | {ratio} | -"
                r4_rate = f"{q.nbytes() / r4 / 1e3:.1f}" if r4 else "-"
                print(
                    f"| {n}x{k} | {fmt} | {label} | {f32:.0f} | {a8:.0f} | {r4_cells} "
                    f"| {gbs[0]:.1f} | {gbs[1]:.1f} | {r4_rate} |",
                    flush=True,
                )
                del runs


if __name__ == "__main__":
    main()
