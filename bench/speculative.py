"""N-gram speculative decoding against one token a step: greedy decode tok/s of both miniatures on
prompts that repeat their context (code) and on one that does not, in one run (interleaved rounds,
medians), with the share of draft tokens accepted and a check that both runs produced the same
tokens.

    python bench/speculative.py [--rounds 3] [--tokens 96] [--k 5] [--temperature 0]
                                [--model models/kimi-k2-mini ...]

With --temperature > 0 both runs sample with the same seed: speculative rejection sampling draws
the sequence's generator once per emitted token, so the tokens must still be the same.

Batch 1: the regime where a decode step is overhead-bound, so verifying k + 1 positions costs
little more than one. Both engines are built once; each round runs every prompt on both.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.llm import LLM  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.speculation import SpeculativeConfig  # noqa: E402

PROMPTS = {
    "repeating code": "def parse(text):\n    " + "value = text.strip().split(',')\n    " * 6,
    "class body": "class Stack:\n    def __init__(self):\n        self.items = []\n"
    "    def push(self, x):\n        self.items.append(x)\n    def pop(self):\n",
    "short prompt": "def fib(n):",
}


def run(llm: LLM, prompt: str, tokens: int, temperature: float = 0.0) -> tuple[float, list[int]]:
    params = SamplingParams(temperature=temperature, seed=7, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate([prompt], params)[0]
    return len(out.token_ids) / (time.perf_counter() - start), out.token_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=5, help="draft tokens per step at most")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else seeded sampling")
    ap.add_argument("--model", nargs="*", default=["models/kimi-k2-mini", "models/glm-4.5-mini"])
    args = ap.parse_args()
    print(
        f"# {platform.processor() or platform.machine()}, batch 1, temperature {args.temperature:g}, "
        f"{args.tokens} tokens, k={args.k}"
    )
    print("| model | prompt | one token a step tok/s | n-gram tok/s | ratio | accepted | same tokens |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for path in args.model:
        plain = LLM(REPO / path, device="cpu", speculative=None)
        spec = LLM(REPO / path, device="cpu", speculative=SpeculativeConfig(num_tokens=args.k))
        for name, prompt in PROMPTS.items():
            run(plain, prompt, 8), run(spec, prompt, 8)  # warm
            base, fast, same = [], [], True
            drafted0, accepted0 = spec.engine.draft_tokens, spec.engine.accepted_tokens
            for _ in range(args.rounds):
                b, ref = run(plain, prompt, args.tokens, args.temperature)
                f, got = run(spec, prompt, args.tokens, args.temperature)
                base.append(b), fast.append(f)
                same = same and got == ref
            drafted = spec.engine.draft_tokens - drafted0
            accepted = spec.engine.accepted_tokens - accepted0
            b, f = statistics.median(base), statistics.median(fast)
            share = f"{accepted / drafted:.0%} of {drafted // args.rounds}" if drafted else "no drafts"
            print(f"| {Path(path).name} | {name} | {b:.0f} | {f:.0f} | {f / b:.2f}x | {share} | {same} |")


if __name__ == "__main__":
    main()
