"""Output tokens per second: this engine against transformers `generate()`, same checkpoint, same run.

    python bench/engine_vs_hf.py [--model models/kimi-k2-mini] [--tokens 64] [--concurrency 1,32]

Greedy, float32 on the CPU, EOS ignored so both produce exactly --tokens tokens per request.
Batch 1: one prompt. Concurrency N: N prompts of different lengths, all submitted at once; here
continuously batched, there one left-padded batch. Median of --repeats runs after a warm-up.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def prompts_for(n: int, tokenizer, seed: int = 0) -> list[list[int]]:
    text = (REPO / "models" / "eval" / "heldout.txt").read_text()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = rng.randrange(0, len(text) - 2000)
        ids = tokenizer.encode(text[start : start + 2000])
        out.append(ids[: rng.randrange(16, 96)])
    return out


def run_ours(llm, prompts: list[list[int]], tokens: int) -> tuple[float, list[list[int]]]:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    started = time.perf_counter()
    ids = [llm.engine.add_request(p, params) for p in prompts]
    out = {r: [] for r in ids}
    while llm.engine.has_unfinished():
        for e in llm.engine.step():
            out[e.request_id].append(e.token_id)
    return time.perf_counter() - started, [out[r] for r in ids]


def run_hf(model, prompts: list[list[int]], tokens: int) -> tuple[float, list[list[int]]]:
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding, as generate() expects for decoder-only models
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    started = time.perf_counter()
    with torch.no_grad():
        gen = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return time.perf_counter() - started, gen[:, width:].tolist()


def median_time(fn, repeats: int):
    fn()  # warm-up
    results = [fn() for _ in range(repeats)]
    return statistics.median(r[0] for r in results), results[-1][1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=REPO / "models" / "kimi-k2-mini")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from engine import LLM

    # the same prompts run repeatedly: a prefix cache would skip their prefill after the first
    # repeat, which transformers cannot; the comparison is of the computation
    llm = LLM(args.model, device="cpu", prefix_caching=False)
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    print(
        f"model {args.model.name}, greedy, {args.tokens} output tokens per request, float32, "
        f"{args.threads} threads, median of {args.repeats}\n"
    )
    print("| concurrency | transformers generate() tok/s (baseline) | edge-workers tok/s | ratio | same |")
    print("|---:|---:|---:|---:|---:|")
    for n in [int(c) for c in args.concurrency.split(",")]:
        prompts = prompts_for(n, llm.tokenizer)
        ours_s, ours_tokens = median_time(lambda p=prompts: run_ours(llm, p, args.tokens), args.repeats)
        hf_s, hf_tokens = median_time(lambda p=prompts: run_hf(hf, p, args.tokens), args.repeats)
        total = n * args.tokens
        same = sum(
            a == b for x, y in zip(ours_tokens, hf_tokens, strict=True) for a, b in zip(x, y, strict=True)
        )
        ratio = hf_s / ours_s
        print(
            f"| {n} | {total / hf_s:.1f} | {total / ours_s:.1f} | {ratio:.2f}x | {same / total:.1%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
