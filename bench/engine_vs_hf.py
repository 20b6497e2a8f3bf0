"""Output tokens per second: this engine against transformers `generate()`, same checkpoint, same run.

    python bench/engine_vs_hf.py [--model models/kimi-k2-mini] [--tokens 128] [--repeats 3] [--threads 2]

Batch 1, greedy, float32 on the CPU, EOS ignored so both produce exactly --tokens tokens; the
median of --repeats runs after one warm-up each. Prints a table with the baseline and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def bench_ours(model_dir: Path, prompt_ids: list[int], tokens: int, repeats: int) -> tuple[float, list[int]]:
    from engine import LLM, SamplingParams

    llm = LLM(model_dir, device="cpu")
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    out: list[int] = []
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        out = [e.token_id for e in llm.stream(prompt_ids, params)]
        if i:  # the first run warms up
            times.append(time.perf_counter() - start)
    return tokens / statistics.median(times), out


def bench_hf(model_dir: Path, prompt_ids: list[int], tokens: int, repeats: int) -> tuple[float, list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])
    out: list[int] = []
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        with torch.no_grad():
            gen = model.generate(
                ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0
            )
        if i:
            times.append(time.perf_counter() - start)
        out = gen[0, len(prompt_ids) :].tolist()
    return tokens / statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=REPO / "models" / "kimi-k2-mini")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from engine.tokenizer import TextTokenizer

    prompt_ids = TextTokenizer(args.model).encode("import os\nimport sys\n\n\ndef main(argv):\n    ")
    ours, our_tokens = bench_ours(args.model, prompt_ids, args.tokens, args.repeats)
    hf, hf_tokens = bench_hf(args.model, prompt_ids, args.tokens, args.repeats)
    same = sum(a == b for a, b in zip(our_tokens, hf_tokens, strict=True))
    print(
        f"model {args.model.name}, batch 1, greedy, {args.tokens} tokens, {args.threads} threads, "
        f"median of {args.repeats}"
    )
    print("| engine | tokens/s | ratio |\n|---|---:|---:|")
    print(f"| transformers generate() (baseline) | {hf:.1f} | 1.00x |")
    print(f"| edge-workers engine | {ours:.1f} | {ours / hf:.2f}x |")
    print(f"greedy tokens identical: {same}/{args.tokens}")


if __name__ == "__main__":
    main()
