"""The compiled decode step against the eager one: decode tok/s of both miniatures at several
batch sizes in one run (interleaved rounds, medians), whether both produced the same greedy tokens,
and what each bucket cost to compile; then where a decode step's time goes, phase by phase
(engine.engine.StepStats: schedule, prepare, forward, sample, emit) and between two forwards.

    python bench/compiled_step.py [--rounds 3] [--tokens 64] [--batches 1,4,16,32] \
        [--kv auto] [--weights auto] [--threads 2 | 1,2] [--model models/kimi-k2-mini ...]

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

from engine.llm import LLM  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.step.compiled_step import row_bucket  # noqa: E402


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


def phase_row(name: str, batch: int, threads: int, mode: str, steps: list) -> str:
    """Mean ms per decode step of each phase (StepStats), the whole step, and the time between
    two forwards (the step less its forward: Python on the critical path)."""
    n = max(len(steps), 1)
    means = [sum(getattr(s, f"{p}_ms") for s in steps) / n for p in PHASES]
    total = sum(s.duration_ms for s in steps) / n
    paths = ",".join(sorted({s.forward_path for s in steps}))
    cells = " | ".join(f"{m:.3f}" for m in means)
    between = total - means[2]
    return f"| {name} | {batch} | {threads} | {mode} ({paths}) | {cells} | {total:.3f} | {between:.3f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,4,16,32")
    ap.add_argument("--kv", default="auto")
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--threads", default="2", help="torch threads; several (1,2) alternate within each round")
    ap.add_argument("--model", nargs="*", default=["models/kimi-k2-mini", "models/glm-4.5-mini"])
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    torch.set_num_threads(max(threads))
    batches = [int(b) for b in args.batches.split(",")]
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
        f" (threads {args.threads}), load {os.getloadavg()[0]:.2f}, kv {args.kv}, weights {args.weights}"
    )
    phases: list[str] = []
    print("| model | batch | threads | eager tok/s | compiled tok/s | compiled / eager | same | compile s |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
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
            rates: dict[tuple[int, str], list[float]] = {
                (t, m): [] for t in threads for m in ("eager", "compiled")
            }
            same = True
            last: dict[tuple[int, str], list] = {}
            for _ in range(args.rounds):
                for t in threads:  # thread counts alternate within a round: the same load for each
                    torch.set_num_threads(t)
                    e_rate, e_out, last[t, "eager"] = decode(eager, work, args.tokens)
                    c_rate, c_out, last[t, "compiled"] = decode(compiled, work, args.tokens)
                    rates[t, "eager"].append(e_rate)
                    rates[t, "compiled"].append(c_rate)
                    same &= e_out == c_out
            secs = decoder.compile_seconds[row_bucket(b)]
            for t in threads:
                phases.append(
                    phase_row(Path(model).name, b, t, "eager", last[t, "eager"])
                )  # the last round's
                phases.append(phase_row(Path(model).name, b, t, "compiled", last[t, "compiled"]))
                e, c = statistics.median(rates[t, "eager"]), statistics.median(rates[t, "compiled"])
                cells = f"{e:.1f} | {c:.1f} | {c / e:.2f}x | {same} | {secs:.1f}"
                print(f"| {Path(model).name} | {b} | {t} | {cells} |", flush=True)
            torch.set_num_threads(max(threads))

    print("\nWhere a decode step's time goes (ms per step, the last round; StepStats' phases):\n")
    print(f"| model | batch | threads | forward | {' | '.join(PHASES)} | step | between forwards |")
    print("|---|---:|---:|---|" + "---:|" * (len(PHASES) + 2))
    print("\n".join(phases))


if __name__ == "__main__":
    main()
