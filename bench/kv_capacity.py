"""How many 2,048-token sequences a fixed KV byte budget admits per KV dtype, and the decode
throughput at that concurrency.

    python bench/kv_capacity.py [--model models/kimi-k2-mini] [--budget-mib 24] [--kv auto,bf16,int4]

Each dtype gets the same budget. Sequences of 2,040 prompt tokens and 8 output tokens (128 blocks
either way) are all submitted at once and admitted in one step; the count is how many run together
(checked against the cache's own arithmetic), and the throughput is measured over their decode
steps. The baseline for the ratio is 16-bit KV (bf16); `auto` on the CPU is float32.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
CONTEXT, OUTPUT = 2048, 8


def measure(model: Path, kv: str, budget: int) -> dict:
    from engine import LLM, SamplingParams

    llm = LLM(
        model,
        device="cpu",
        kv_cache_dtype=kv,
        kv_cache_bytes=budget,
        max_num_seqs=1024,
        max_num_batched_tokens=CONTEXT * 1024,  # admit everything that fits in one step
    )
    eng, cache = llm.engine, llm.engine.cache
    per_seq = cache.blocks_for(CONTEXT) + cache.staging_blocks
    expected = cache.num_blocks // per_seq
    ids = llm.encode((REPO / "models" / "eval" / "heldout.txt").read_text())
    params = SamplingParams(max_tokens=OUTPUT, temperature=0, ignore_eos=True)
    for i in range(expected + 2):  # more than fit: the scheduler must hold the rest back
        start = (i * 997) % (len(ids) - CONTEXT)
        eng.add_request(ids[start : start + CONTEXT - OUTPUT], params)
    sched = eng.scheduler

    def settled() -> bool:  # everything that fits is admitted and prefilled
        if not sched.running or any(s.remaining > 1 for s in sched.running):
            return False
        return not sched.waiting or not cache.pool.can_grow(sched.waiting[0].kv, CONTEXT - OUTPUT)

    while not settled():
        eng.step()
    concurrent = len(eng.scheduler.running)
    tokens, started = 0, time.perf_counter()
    for _ in range(OUTPUT - 2):
        tokens += sum(1 for e in eng.step() if e.token_id is not None)
    elapsed = time.perf_counter() - started
    return {
        "kv": kv,
        "bytes_per_token": cache.bytes_per_token(),
        "concurrent": concurrent,
        "expected": expected,
        "decode_tok_s": tokens / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=REPO / "models" / "kimi-k2-mini")
    parser.add_argument("--budget-mib", type=float, default=24)
    parser.add_argument("--kv", default="auto,bf16,fp8,int8,int4")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    budget = int(args.budget_mib * 2**20)
    rows = [measure(args.model, kv, budget) for kv in args.kv.split(",")]
    base = next((r for r in rows if r["kv"] == "bf16"), rows[0])
    print(
        f"model {args.model.name}, KV budget {args.budget_mib} MiB, {CONTEXT}-token sequences, "
        f"{args.threads} threads\n"
    )
    print(
        "| KV dtype | bytes/token (all layers) | sequences admitted | vs bf16 | decode tok/s at that load |"
    )
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        assert r["concurrent"] == r["expected"], r
        print(
            f"| {r['kv']} | {r['bytes_per_token']:.1f} | {r['concurrent']} | "
            f"{r['concurrent'] / base['concurrent']:.2f}x | {r['decode_tok_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
