"""The prefix cache on an agent-style workload: a long shared system prompt, multi-turn sessions.

    python bench/prefix_cache.py [--model models/kimi-k2-mini] [--system 1024] [--sessions 4] [--turns 3]

Each turn's prompt is the system prompt, the session's conversation so far (its earlier messages
and the engine's replies) and a new user message. The turns run one at a time, the sessions round
robin, on one engine (float32 on the CPU), once with the prefix cache and once without, in the same
run. Reported: TTFT p50 (arrival to first token, as the engine measures it) and the prefill tokens
the steps counted; the ratio is without / with. One account sends everything: N accounts sharing
the system prompt would each compute it once (N-fold duplicate prefill).
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def workload(ids: list[int], system: int, sessions: int, turns: int, user: int, seed: int):
    """The system prompt and, per session, its user messages (token ids cut from held-out text)."""
    rng = random.Random(seed)

    def cut(n: int) -> list[int]:
        start = rng.randrange(len(ids) - n)
        return ids[start : start + n]

    return cut(system), [[cut(user) for _ in range(turns)] for _ in range(sessions)]


def run(model: Path, caching: bool, system: list[int], messages, reply: int) -> dict:
    from engine import LLM, SamplingParams

    llm = LLM(model, device="cpu", prefix_caching=caching)
    eng = llm.engine
    params = SamplingParams(max_tokens=reply, temperature=0, ignore_eos=True)
    history = [list(system) for _ in messages]
    ttft, prefill = [], 0
    for turn in range(len(messages[0])):
        for s, session in enumerate(messages):
            prompt = history[s] + session[turn]
            rid = eng.add_request(prompt, params, tenant="agent")
            out, last = [], None
            while eng.has_unfinished():
                events = eng.step()
                prefill += eng.steps[-1].prefill_tokens
                for e in events:
                    if e.request_id == rid:
                        out.append(e.token_id)
                        last = e
            ttft.append(last.metrics.ttft_ms)
            history[s] = prompt + out
    return {"ttft_p50_ms": statistics.median(ttft), "prefill_tokens": prefill, "requests": len(ttft)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=REPO / "models" / "kimi-k2-mini")
    parser.add_argument("--system", type=int, default=1024, help="system prompt tokens")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--user", type=int, default=48, help="tokens per user message")
    parser.add_argument("--reply", type=int, default=16, help="tokens per reply")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from engine.tokenizer import TextTokenizer

    ids = TextTokenizer(args.model).encode((REPO / "models" / "eval" / "heldout.txt").read_text())
    system, messages = workload(ids, args.system, args.sessions, args.turns, args.user, args.seed)
    off = run(args.model, False, system, messages, args.reply)
    on = run(args.model, True, system, messages, args.reply)
    print(
        f"model {args.model.name}, {args.system}-token system prompt, {args.sessions} sessions x "
        f"{args.turns} turns, {args.user}-token messages, {args.reply}-token replies, float32 CPU\n"
    )
    print("| prefix cache | TTFT p50 (ms) | prefill tokens |")
    print("| --- | --- | --- |")
    for name, r in (("off (baseline)", off), ("on", on)):
        print(f"| {name} | {r['ttft_p50_ms']:.1f} | {r['prefill_tokens']} |")
    print(
        f"\nratio off / on: TTFT p50 {off['ttft_p50_ms'] / on['ttft_p50_ms']:.2f}x, "
        f"prefill tokens {off['prefill_tokens'] / max(1, on['prefill_tokens']):.2f}x"
    )


if __name__ == "__main__":
    main()
