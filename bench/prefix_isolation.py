"""The cost of isolating the prefix cache by account: N accounts that send the same system prompt.

    python bench/prefix_isolation.py [--tenants 1,2,4,8] [--system 1024] [--requests 4] [--repeats 3]

Each account sends `--requests` requests of the same system prompt plus a message of its own; all
are queued at once on one engine (float32, the CPU). Two ways, in the same run: salted (the
default: each account's blocks are named under its own salt, so accounts never share) and one
salt for everyone (a single-tenant cache: what sharing across accounts would save). Reported: the
prefill tokens the steps ran, the wall time, and their ratios salted / shared. With one account
both are the same work (the salt costs nothing: expected 1.0x); with N accounts the salted cache
computes the system prompt N times (N-fold duplicate prefill: the price of never letting one
account hit, or time, another's prompt).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run(llm, prompts: list[tuple[str, list[int]]], max_tokens: int) -> tuple[int, float]:
    """Queue every (tenant, prompt) and step to the end; (prefill tokens run, wall seconds)."""
    from engine import SamplingParams

    eng = llm.engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    first = eng.total_prompt_tokens  # prompt tokens the steps ran (cache hits are not run)
    started = time.perf_counter()
    for tenant, ids in prompts:
        eng.add_request(ids, params, tenant=tenant)
    while eng.has_unfinished():
        eng.step()
    wall = time.perf_counter() - started
    return eng.total_prompt_tokens - first, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "models" / "kimi-k2-mini"))
    ap.add_argument("--tenants", default="1,2,4,8")
    ap.add_argument("--system", type=int, default=1024, help="system prompt tokens")
    ap.add_argument("--user", type=int, default=32, help="each request's own tokens")
    ap.add_argument("--requests", type=int, default=4, help="requests per account")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch

    from engine import LLM

    torch.manual_seed(0)
    rng = random.Random(1)
    vocab = 1000
    system = [rng.randrange(10, vocab) for _ in range(args.system)]
    cpu = platform.processor() or platform.machine()
    threads = torch.get_num_threads()
    print(f"CPU: {cpu}, {os.cpu_count()} cores, {threads} threads; python {platform.python_version()}")
    print(
        f"{Path(args.model).name}: a {args.system}-token system prompt shared by every request, "
        f"{args.user} tokens of its own, {args.requests} requests per account, {args.max_tokens} tokens out; "
        f"best of {args.repeats}"
    )
    print()
    run(LLM(args.model, device="cpu"), [("warm", system[:64])], 2)  # one-off costs out of the table
    print("| accounts | prefill tokens salted | shared | ratio | wall s salted | shared | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in (int(x) for x in args.tenants.split(",")):
        prompts = [
            (f"acct{t}", system + [rng.randrange(10, vocab) for _ in range(args.user)])
            for t in range(n)
            for _ in range(args.requests)
        ]
        best: dict[str, tuple[int, float]] = {}
        for _ in range(args.repeats):
            for mode in ("salted", "shared"):
                llm = LLM(args.model, device="cpu")  # a cold cache each time
                asked = prompts if mode == "salted" else [("everyone", ids) for _, ids in prompts]
                tokens, wall = run(llm, asked, args.max_tokens)
                if mode not in best or wall < best[mode][1]:
                    best[mode] = (tokens, wall)
        (ts, ws), (tu, wu) = best["salted"], best["shared"]
        print(f"| {n} | {ts:,} | {tu:,} | {ts / tu:.2f}x | {ws:.2f} | {wu:.2f} | {ws / wu:.2f}x |")


if __name__ == "__main__":
    main()
