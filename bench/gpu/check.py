"""GPU check of the Triton kernels: correctness at real layer shapes, then timings.

    bench/gpu/check.sh            # on a CUDA machine, about 5 minutes
    bench/gpu/check.sh --dry-run  # tiny shapes through the Triton interpreter on a CPU

Correctness: each kernel against its torch reference at GLM-4.5 shapes (hidden 5120, 96 query and
8 KV heads of 128, 160 experts of 1536, 8 active) and Kimi K2 shapes (hidden 7168, MLA latent 512
plus rope 64, 384 experts of 2048, 8 active). Timings: triton.testing.do_bench medians, printed
against the device-to-device copy bandwidth measured in the same run and against the torch
reference. Goals: dequantizing matmul at decode shapes >= 70% of copy bandwidth; int4-KV decode
attention >= 1.6x faster than 16-bit KV at 32k context; fused MoE >= 3x the per-expert torch loop
at 64 tokens. Results go to $OUT/gpu_check.json (or bench/out/) and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU interpreter")
    args = parser.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from kernels import paged_kv
    from kernels.dequant_matmul import dequant_matmul_ref, dequant_matmul_triton
    from kernels.moe import fused_moe_ref, fused_moe_triton
    from kernels.paged_kv import KVStore
    from kernels.paged_kv_triton import decode_write_triton, gqa_decode_triton, mla_decode_triton
    from kernels.quant import quantize

    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("no CUDA device; run with --dry-run to exercise the script on a CPU", file=sys.stderr)
        return 2
    dev = torch.device("cpu" if dry else "cuda")
    act = torch.float32 if dry else torch.bfloat16
    torch.manual_seed(0)
    results: dict = {
        "device": "cpu (interpreter)" if dry else torch.cuda.get_device_name(),
        "dry_run": dry,
        "date": time.strftime("%Y-%m-%d"),
        "correctness": [],
        "timings": [],
    }
    failures: list[str] = []

    def bench(fn) -> float:
        if dry:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1000
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")

    def check(name: str, got, want, rtol: float) -> None:
        err = ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp(min=1e-6)).item()
        ok = bool(torch.isfinite(got).all()) and err < rtol
        results["correctness"].append({"kernel": name, "rel_err": err, "tolerance": rtol, "ok": ok})
        print(
            f"{'ok  ' if ok else 'FAIL'} {name}: max error {err:.2e} of the output scale (tolerance {rtol})"
        )
        if not ok:
            failures.append(name)

    # --- device-to-device copy bandwidth (the roofline for memory-bound kernels) ---------------------
    n_copy = (1 << 20) if dry else (1 << 30)
    src = torch.empty(n_copy, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    copy_gbs = 2 * n_copy / ms / 1e6
    results["copy_gb_s"] = copy_gbs
    print(f"device copy bandwidth: {copy_gbs:.0f} GB/s (read + write)")

    # --- dequantizing matmul: decode shapes, int4 / int8 / fp8 ----------------------------------------
    shapes = (
        [(1, 64, 64)] if dry else [(1, 7168, 7168), (4, 2 * 2048, 7168), (8, 5120, 5120), (1, 1536 * 2, 5120)]
    )
    for fmt in ("int4", "int8", "fp8"):
        for m, n, k in shapes:
            w = quantize(torch.randn(n, k, device=dev) * 0.02, fmt)
            x = torch.randn(m, k, device=dev, dtype=act)
            check(
                f"dequant_matmul {fmt} {m}x{n}x{k}",
                dequant_matmul_triton(x, w),
                dequant_matmul_ref(x.float(), w),
                2e-2,
            )
            t = bench(lambda x=x, w=w: dequant_matmul_triton(x, w))
            t_ref = bench(lambda x=x, w=w: dequant_matmul_ref(x, w))
            gbs = w.nbytes() / t / 1e6
            row = {
                "kernel": "dequant_matmul",
                "format": fmt,
                "shape": [m, n, k],
                "ms": t,
                "ref_ms": t_ref,
                "gb_s": gbs,
                "of_copy_bw": gbs / (copy_gbs / 2),
                "goal": ">= 0.70 of copy bandwidth",
            }
            results["timings"].append(row)
            print(
                f"dequant_matmul {fmt} {m}x{n}x{k}: {t:.3f} ms, {gbs:.0f} GB/s = "
                f"{row['of_copy_bw']:.0%} of copy read bandwidth; torch reference {t_ref:.3f} ms"
            )

    # --- paged decode attention: GLM-4.5 GQA and Kimi K2 MLA, 16-bit vs int4 KV ---------------------
    def random_store(fmt: str, style: str, blocks: int, heads: int, dim: int, slots: int) -> KVStore:
        staged = fmt == "fp8" or (fmt == "int4" and style == "key")
        store = KVStore(
            fmt,
            style,
            act,
            None,
            None,
            torch.randn(slots, 16, heads, dim, device=dev, dtype=act) if staged else None,
        )
        values = torch.randn(blocks, 16, heads, dim, device=dev) * 0.5
        if fmt == "bf16" or fmt == "auto":
            store.data = values.to(act)
        elif fmt == "int4" and style == "key":
            from kernels.kv_quant import int4_quantize_channel

            store.data, store.scale = int4_quantize_channel(values)
        elif fmt == "int4":
            from kernels.kv_quant import int4_quantize_group

            store.data, store.scale = int4_quantize_group(values)
        return store

    batch, context = (2, 40) if dry else (8, 32768)
    blocks_per_seq = -(-context // 16)
    tables = torch.arange(batch * blocks_per_seq, device=dev).view(batch, blocks_per_seq)
    lengths = torch.full((batch,), context, device=dev)
    slots = torch.arange(batch, device=dev)
    gqa = (4, 2, 32) if dry else (96, 8, 128)
    mla = (4, 64, 32) if dry else (64, 512, 64)
    timings = {}
    for fmt in ("bf16", "int4"):
        k = random_store(fmt, "key", batch * blocks_per_seq, gqa[1], gqa[2], batch)
        v = random_store(fmt, "value", batch * blocks_per_seq, gqa[1], gqa[2], batch)
        q = torch.randn(batch, gqa[0], gqa[2], device=dev, dtype=act)
        args_ = (k, v, tables, lengths, slots, gqa[2] ** -0.5)
        check(
            f"gqa decode attention {fmt} KV, {context} tokens",
            gqa_decode_triton(q, *args_),
            paged_kv.gqa_decode_ref(q, *args_),
            2e-2,
        )
        timings[("gqa", fmt)] = bench(lambda q=q, a=args_: gqa_decode_triton(q, *a))
        lat = random_store(fmt, "value", batch * blocks_per_seq, 1, mla[1], batch)
        rot = random_store(fmt, "key", batch * blocks_per_seq, 1, mla[2], batch)
        ql = torch.randn(batch, mla[0], mla[1], device=dev, dtype=act)
        qr = torch.randn(batch, mla[0], mla[2], device=dev, dtype=act)
        margs = (lat, rot, tables, lengths, slots, (128 + 64) ** -0.5)
        check(
            f"mla decode attention {fmt} KV, {context} tokens",
            mla_decode_triton(ql, qr, *margs),
            paged_kv.mla_decode_ref(ql, qr, *margs),
            2e-2,
        )
        timings[("mla", fmt)] = bench(lambda ql=ql, qr=qr, a=margs: mla_decode_triton(ql, qr, *a))
        new = torch.randn(batch, gqa[1], gqa[2], device=dev, dtype=act)
        decode_write_triton(k, tables, lengths - 1, slots, new)  # smoke: the write kernel at real shapes
    for arch in ("gqa", "mla"):
        speedup = timings[(arch, "bf16")] / timings[(arch, "int4")]
        results["timings"].append(
            {
                "kernel": f"{arch} decode attention",
                "context": context,
                "batch": batch,
                "bf16_ms": timings[(arch, "bf16")],
                "int4_ms": timings[(arch, "int4")],
                "int4_speedup": speedup,
                "goal": ">= 1.6x at 32k",
            }
        )
        bf16_ms, int4_ms = timings[(arch, "bf16")], timings[(arch, "int4")]
        print(
            f"{arch} decode attention, {batch} x {context} tokens: 16-bit KV {bf16_ms:.3f} ms, "
            f"int4 KV {int4_ms:.3f} ms ({speedup:.2f}x)"
        )

    # --- fused MoE at 64 tokens --------------------------------------------------------------------
    for name, (e, h, i) in {"glm-4.5": (160, 5120, 1536), "kimi-k2": (384, 7168, 2048)}.items():
        if dry:
            e, h, i = 8, 64, 32
        tokens, top_k = (5 if dry else 64), (2 if dry else 8)
        x = torch.randn(tokens, h, device=dev, dtype=act)
        ids = torch.stack([torch.randperm(e, device=dev)[:top_k] for _ in range(tokens)])
        weights = torch.rand(tokens, top_k, device=dev)
        dense = [
            torch.randn(e, i, h, device=dev, dtype=act) * 0.02,
            torch.randn(e, i, h, device=dev, dtype=act) * 0.02,
            torch.randn(e, h, i, device=dev, dtype=act) * 0.02,
        ]
        packed = [quantize(w, "int4") for w in dense]
        check(
            f"fused moe {name} int4",
            fused_moe_triton(x, weights, ids, *packed),
            fused_moe_ref(x.float(), weights, ids, *packed),
            2e-2,
        )
        run = (x, weights, ids)
        t_fused = bench(lambda r=run, w=dense: fused_moe_triton(*r, *w))
        t_fused_int4 = bench(lambda r=run, w=packed: fused_moe_triton(*r, *w))
        t_loop = bench(lambda r=run, w=dense: fused_moe_ref(*r, *w))
        results["timings"].append(
            {
                "kernel": "fused moe",
                "model": name,
                "tokens": tokens,
                "bf16_ms": t_fused,
                "int4_ms": t_fused_int4,
                "per_expert_loop_ms": t_loop,
                "speedup_vs_loop": t_loop / t_fused,
                "goal": ">= 3x the per-expert loop",
            }
        )
        print(
            f"fused moe {name}, {tokens} tokens: {t_fused:.3f} ms bf16, {t_fused_int4:.3f} ms int4; "
            f"per-expert torch loop {t_loop:.3f} ms ({t_loop / t_fused:.2f}x)"
        )

    out_dir = Path(os.environ.get("OUT") or REPO / "bench" / "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_check.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out_dir / 'gpu_check.json'}; {len(failures)} correctness failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
