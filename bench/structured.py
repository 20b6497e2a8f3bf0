"""What a JSON-schema guide costs in decode speed, against unconstrained decoding, in one run.

    python bench/structured.py [--models kimi-k2-mini glm-4.5-mini] [--batches 1 32] [--reps 3]

Per model and batch size: `batch` requests with a realistic schema (an object with typed fields, an
enum and an array) at temperature 1, no ignore_eos: each ends when its JSON closes (or at
--max-tokens). Then the same prompts unconstrained, each with max_tokens set to the length its
guided twin produced (ignore_eos so it produces exactly that many): the two runs have the same batch
shape step for step, so the difference is what the grammar costs (mask fill, its wait, the masking
and the matcher's bookkeeping), not a different batch occupancy. Decode tok/s is decode tokens over
the time of the steps that ran no prefill (StepStats), over tokens really produced. Repeated
--reps times, alternating, the best of each kept (the machine is shared: the best is the least
disturbed). The goal: guided at most 10% slower.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "maxLength": 32},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    },
    "required": ["name", "age", "email", "role", "active", "tags"],
    "additionalProperties": False,
}
PROMPT = "Return the user record as JSON. The user is"


def decode_rate(llm, prompts: list[list[int]], params: list) -> tuple[float, list[int]]:
    """Run the requests together; (decode tok/s over prefill-free steps, tokens each produced)."""
    eng = llm.engine
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    produced = dict.fromkeys(ids, 0)
    steps = []
    while eng.has_unfinished():
        for event in eng.step():
            produced[event.request_id] += event.token_id is not None
        steps.append(eng.steps[-1])
    decode = [s for s in steps if s.prefill_tokens == 0]
    seconds = sum(s.duration_ms for s in decode) / 1000
    return sum(s.decode_tokens for s in decode) / seconds, [produced[r] for r in ids]


def measure(model: str, batch: int, reps: int, max_tokens: int) -> dict:
    from engine import LLM, SamplingParams
    from engine.structured.guide import Guide

    llm = LLM(REPO / "models" / model, device="cpu")
    compile_started = time.perf_counter()
    llm.engine.check_request([1], SamplingParams(guide=Guide(kind="json_schema", schema=SCHEMA)))
    compile_ms = (time.perf_counter() - compile_started) * 1000  # the tokenizer and first compile
    prompts = [llm.encode(f"{PROMPT} number {i}:") for i in range(batch)]
    guide = Guide(kind="json_schema", schema=SCHEMA)
    best_guided = best_plain = 0.0
    closed = produced = 0
    for rep in range(reps):
        guided = [
            SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=rep * batch + i, guide=guide)
            for i in range(batch)
        ]
        rate, lengths = decode_rate(llm, prompts, guided)
        best_guided = max(best_guided, rate)
        closed += sum(n < max_tokens for n in lengths)
        produced += sum(lengths)
        plain = [
            SamplingParams(max_tokens=n, temperature=1.0, seed=rep * batch + i, ignore_eos=True)
            for i, n in enumerate(lengths)
        ]
        best_plain = max(best_plain, decode_rate(llm, prompts, plain)[0])
    return {
        "model": model,
        "batch": batch,
        "plain": best_plain,
        "guided": best_guided,
        "ratio": best_guided / best_plain,
        "closed": f"{closed}/{reps * batch}",
        "mean_tokens": produced / (reps * batch),
        "compile_ms": compile_ms,
    }


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["kimi-k2-mini", "glm-4.5-mini"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [measure(m, b, args.reps, args.max_tokens) for m in args.models for b in args.batches]
    head = ["model", "batch", "unconstrained tok/s", "JSON schema tok/s", "guided / unconstrained"]
    print("| " + " | ".join(head + ["JSON closed", "mean tokens"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['batch']} | {r['plain']:.0f} | {r['guided']:.0f} | {r['ratio']:.2f} "
            f"| {r['closed']} | {r['mean_tokens']:.0f} |"
        )
    print("tokenizer + first compile (ms):", {r["model"]: round(r["compile_ms"], 1) for r in rows})


if __name__ == "__main__":
    main()
