"""The compiled decode step against the eager one: decode tok/s of both miniatures at several
batch sizes in one run (interleaved rounds, medians), whether both produced the same greedy tokens,
and what each bucket cost to compile; then where a decode step's time goes, phase by phase
(engine.engine.StepStats: schedule, prepare, forward, sample, emit) and between two forwards.

    python bench/compiled_step.py [--rounds 3] [--tokens 64] [--batches 1,4,16,32] \
        [--kv auto] [--weights auto] [--model models/kimi-k2-mini ...]

One engine per mode, built once (the compiled one warms every bucket it needs first, timed: a cold
compile when inductor's cache under ~/.cache/edge-workers is empty, else a warm one). Each round
decodes the same prompts on both: at batch B, B prompts submitted at once, generated tokens over the
decode steps only (the prefill step is untimed), as bench/engine_runs.py's decode measure.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from engine.compiled_step import row_bucket  # noqa: E402
from engine.llm import LLM  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402


def prompts(llm: LLM, batch: int) -> list[list[int]]:
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n"
    ids = llm.tokenizer.encode(text)
    return [ids[: 8 + (i * 5) % len(ids)] + [i + 3] for i in range(batch)]


PHASES = ("schedule", "prepare", "forward", "sample", "emit")


def decode(llm: LLM, batch: list[list[int]], tokens: int) -> tuple[float, list[list[int]], list]:
    """Decode tok/s, each prompt's tokens, and the decode steps' StepStats."""
    engine = llm.engine
    rids = [
        engine.add_request(p, SamplingParams(max_tokens=tokens + 1, temperature=0, ignore_eos=True))
        for p in batch
    ]
    out: dict[str, list[int]] = {r: [] for r in rids}
    for e in engine.step():  # the prefill step: untimed
        if e.token_id is not None:
            out[e.request_id].append(e.token_id)
    started, generated, steps = time.perf_counter(), 0, 0
    while engine.has_unfinished():
        steps += 1
        for e in engine.step():
            if e.token_id is not None:
                out[e.request_id].append(e.token_id)
                generated += 1
    rate = generated / (time.perf_counter() - started)
    return rate, [out[r] for r in rids], engine.recent_steps(steps)


def phase_row(name: str, batch: int, mode: str, steps: list) -> str:
    """Mean ms per decode step of each phase (StepStats), the whole step, and the time between
    two forwards (the step less its forward: Python on the critical path)."""
    n = max(len(steps), 1)
    means = [sum(getattr(s, f"{p}_ms") for s in steps) / n for p in PHASES]
    total = sum(s.duration_ms for s in steps) / n
    paths = ",".join(sorted({s.forward_path for s in steps}))
    cells = " | ".join(f"{m:.3f}" for m in means)
    return f"| {name} | {batch} | {mode} ({paths}) | {cells} | {total:.3f} | {total - means[2]:.3f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,4,16,32")
    ap.add_argument("--kv", default="auto")
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", nargs="*", default=["models/kimi-k2-mini", "models/glm-4.5-mini"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
        f" ({args.threads} threads), load {os.getloadavg()[0]:.2f}, kv {args.kv}, weights {args.weights}"
    )
    phases: list[str] = []
    print("| model | batch | eager tok/s | compiled tok/s | compiled / eager | same tokens | compile s |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for model in args.model:
        kw = dict(device="cpu", kv_cache_dtype=args.kv, weights=args.weights, speculative=None)
        eager = LLM(REPO / model, compile=False, **kw)
        compiled = LLM(REPO / model, compile=True, **kw)
        decoder = compiled.engine.compiled_decode
        buckets = sorted({row_bucket(b) for b in batches})
        decoder.warm_up(buckets)
        if decoder.failed:
            sys.exit(f"compiling failed: {decoder.failed}")
        for b in batches:
            work = prompts(eager, b)
            rates: dict[str, list[float]] = {"eager": [], "compiled": []}
            same = True
            for _ in range(args.rounds):
                e_rate, e_out, e_steps = decode(eager, work, args.tokens)
                c_rate, c_out, c_steps = decode(compiled, work, args.tokens)
                rates["eager"].append(e_rate)
                rates["compiled"].append(c_rate)
                same &= e_out == c_out
            phases.append(phase_row(Path(model).name, b, "eager", e_steps))  # the last round's steps
            phases.append(phase_row(Path(model).name, b, "compiled", c_steps))
            e, c = statistics.median(rates["eager"]), statistics.median(rates["compiled"])
            secs = decoder.compile_seconds[row_bucket(b)]
            print(
                f"| {Path(model).name} | {b} | {e:.1f} | {c:.1f} | {c / e:.2f}x | {same} | {secs:.1f} |",
                flush=True,
            )

    print("\nWhere a decode step's time goes (ms per step, the last round; StepStats' phases):\n")
    print(f"| model | batch | forward | {' | '.join(PHASES)} | step | between forwards |")
    print("|---|---:|---|" + "---:|" * (len(PHASES) + 2))
    print("\n".join(phases))


if __name__ == "__main__":
    main()
