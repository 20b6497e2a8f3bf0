"""Our engine side by side with llama.cpp on the CPU, same run, same checkpoints (issue 17).

    python bench/engine_vs_llamacpp.py [--rounds 3] [--threads 2] [--quick]

1. Builds llama.cpp once from the llama-cpp-python sdist (pinned: bench/llamacpp_build.py; about ten
   minutes on 2 cores, cached under bench/out/llama.cpp/<version>/).
2. Converts both shipped miniatures to GGUF f32 with that build's convert_hf_to_gguf.py
   (bench/llamacpp_gguf.py says which conversion facts it handles and how).
3. Greedy parity: the same prompt, 64 greedy tokens from both at f32 (ours through engine.LLM, the
   CPU's float32 weights; theirs llama-simple), the completions compared as text.
4. Speed, interleaved over --rounds rounds (which engine goes first alternates), --threads each, medians:
   decode at batch 1 (`llama-bench -p 0 -n 64 -d 64`: 64 decode steps after an untimed 64-token
   prompt), 1/8/32 concurrent sequences (`llama-batched-bench -npp 64 -ntg 64 -npl 1,8,32`: generated
   tokens over the whole run, prompt processing included; ours: every request submitted at once to
   the continuous batcher), prefill of 512 tokens (`llama-bench -p 512 -n 0`). The machine's load
   average is printed at each round: the machine is shared, so read ratios, not absolute rates.
5. N-gram speculation on code prompts (bench/speculative.py's, which repeat their context), greedy,
   --lookup-tokens each: ours with prompt-lookup drafts of up to 5 tokens against llama.cpp's own
   (`llama-lookup --spec-draft-n-max 5`), each against its plain decode of the same prompts
   (ours without drafts; theirs `llama-lookup --spec-draft-n-max 0`, the same loop and timer), and
   ours speculating against theirs plain (the issue's stretch row). Prompt encoding is not timed.
6. KV quantization quality on models/eval/heldout.txt: `llama-perplexity --no-escape -c 1024
   -ctk/-ctv f16|q8_0|q4_0 -fa on` (second half of each window scored) against ours at auto|int8|int4
   scored on the same windows' second halves (bench/engine_runs.py); the change of each against f16
   (theirs) and auto (ours).

Needs, besides the project's venv: cmake and a C++ compiler; the converter runs from the sdist's own
gguf-py (on sys.path, not installed) with numpy, pyyaml, tqdm and transformers, already in the venv,
so nothing was added to it.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import engine_runs as ours  # noqa: E402
from bench.llamacpp_build import build  # noqa: E402
from bench.llamacpp_gguf import convert  # noqa: E402
from bench.llamacpp_runs import LlamaTools  # noqa: E402
from bench.speculative import CODE_PROMPTS  # noqa: E402

MODELS = ["kimi-k2-mini", "glm-4.5-mini"]
HELDOUT = REPO / "models" / "eval" / "heldout.txt"
# the goals per row, as a ratio ours / llama.cpp (None: no goal set)
SPEED_GOALS = {"decode": 0.5, "seq 32": 1.0, "prefill": 1.0}
KV_PAIRS = [("int8", "q8_0"), ("int4", "q4_0")]  # ours, theirs
# the int4 goals: below llama.cpp's q4_0 change on both, and kimi's under +0.4%
INT4_CEILING = {"kimi-k2-mini": 0.4}


@dataclass
class Measures:
    """Per model, per row, one tok/s per round for each engine."""

    ours: dict[str, list[float]] = field(default_factory=dict)
    theirs: dict[str, list[float]] = field(default_factory=dict)

    def add(self, side: dict[str, list[float]], row: str, value: float) -> None:
        side.setdefault(row, []).append(value)


def heldout_prompts(tokenizer, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """`count` different `length`-token prompts cut from the held-out text."""
    ids = tokenizer.encode(HELDOUT.read_text(encoding="utf-8"))
    rng = random.Random(seed)
    starts = [rng.randrange(0, len(ids) - length) for _ in range(count)]
    return [ids[s : s + length] for s in starts]


def best_of(repeats: int, fn) -> float:
    return statistics.median(fn() for _ in range(repeats))


def round_ours(llm, args, m: Measures) -> None:
    prompt = heldout_prompts(llm.tokenizer, 1, args.prompt)[0]
    m.add(m.ours, "decode", best_of(args.repeats, lambda: ours.decode_tok_s(llm, prompt, args.tokens)))
    for n in args.sequences:
        prompts = heldout_prompts(llm.tokenizer, n, args.prompt, seed=n)
        m.add(m.ours, f"seq {n}", ours.concurrent_tok_s(llm, prompts, args.tokens))
    long = heldout_prompts(llm.tokenizer, 1, args.prefill, seed=1)[0]
    m.add(m.ours, "prefill", best_of(args.repeats, lambda: ours.prefill_tok_s(llm, long)))


def round_theirs(tools: LlamaTools, args, m: Measures) -> None:
    decode = tools.bench(prompt=0, gen=args.tokens, depth=args.prompt, repetitions=args.repeats)
    m.add(m.theirs, "decode", decode.tok_s)
    for row in tools.batched(args.prompt, args.tokens, args.sequences):
        m.add(m.theirs, f"seq {row.sequences}", row.generated_tok_s)
    prefill = tools.bench(prompt=args.prefill, gen=0, depth=0, repetitions=args.repeats)
    m.add(m.theirs, "prefill", prefill.tok_s)


# n-gram draft tokens per step at most, both engines (vLLM's and our catalog's default)
LOOKUP_DRAFT = 5


@dataclass
class Lookup:
    """Per side and run (plain or n-gram), per round: tokens/s over all code prompts, and the
    drafted and accepted token counts."""

    rates: dict[str, list[float]] = field(default_factory=dict)
    drafted: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)

    def add(self, run: str, tokens: int, seconds: float, drafted: int = 0, accepted: int = 0) -> None:
        self.rates.setdefault(run, []).append(tokens / seconds)
        self.drafted[run] = self.drafted.get(run, 0) + drafted
        self.accepted[run] = self.accepted.get(run, 0) + accepted

    def rate(self, run: str) -> float:
        return statistics.median(self.rates[run])

    def kept(self, run: str) -> str:
        drafted = self.drafted.get(run, 0)
        return f"{self.accepted[run] / drafted:.0%} of {drafted}" if drafted else "-"


def lookup_ours(plain, speculating, tokens: int, m: Lookup) -> None:
    for run, llm in (("ours plain", plain), ("ours n-gram", speculating)):
        engine, seconds = llm.engine, 0.0
        drafted, accepted = engine.draft_tokens, engine.accepted_tokens
        for prompt in CODE_PROMPTS.values():
            seconds += tokens / ours.decode_tok_s(llm, llm.encode(prompt), tokens)
        m.add(
            run,
            tokens * len(CODE_PROMPTS),
            seconds,
            engine.draft_tokens - drafted,
            engine.accepted_tokens - accepted,
        )


def lookup_theirs(tools: LlamaTools, tokens: int, m: Lookup) -> None:
    for run, draft in (("llama.cpp plain", 0), ("llama-lookup", LOOKUP_DRAFT)):
        got = [tools.lookup(prompt, tokens, draft) for prompt in CODE_PROMPTS.values()]
        m.add(
            run,
            sum(g.decoded for g in got),
            sum(g.decode_s for g in got),
            sum(g.drafted for g in got),
            sum(g.accepted for g in got),
        )


def lookup_table(name: str, m: Lookup, args) -> str:
    plain, lookup = m.rate("llama.cpp plain"), m.rate("llama-lookup")
    mine, mine_plain = m.rate("ours n-gram"), m.rate("ours plain")
    lines = [
        f"### {name}: n-gram speculation, {len(CODE_PROMPTS)} code prompts, {args.lookup_tokens} greedy "
        f"tokens each, drafts of up to {LOOKUP_DRAFT}",
        "",
        "| | tok/s | drafts kept | speed-up over its own plain decode |",
        "|---|---:|---:|---:|",
        f"| ours plain | {mine_plain:.0f} | - | 1.00x |",
        f"| ours n-gram | {mine:.0f} | {m.kept('ours n-gram')} | {mine / mine_plain:.2f}x |",
        f"| llama.cpp plain (llama-lookup, 0 drafts) | {plain:.0f} | - | 1.00x |",
        f"| llama-lookup | {lookup:.0f} | {m.kept('llama-lookup')} | {lookup / plain:.2f}x |",
        "",
        f"ours n-gram / llama-lookup: {mine / lookup:.2f}x; ours n-gram / llama.cpp plain (stretch row): "
        f"{mine / plain:.2f}x",
    ]
    return "\n".join(lines)


def parity(llm, tools: LlamaTools, tokens: int) -> str:
    prompt_ids = heldout_prompts(llm.tokenizer, 1, 64, seed=7)[0]
    text = llm.tokenizer.decode(prompt_ids)
    mine = llm.tokenizer.decode(ours.greedy(llm, llm.encode(text), tokens))
    theirs = tools.greedy(text, tokens)
    if mine == theirs:
        return f"identical ({tokens} greedy tokens, {len(mine)} characters)"
    same = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
    return f"DIFFERENT from character {same}: ours {mine[:80]!r} / theirs {theirs[:80]!r}"


def row_label(row: str, args) -> str:
    if row == "decode":
        return f"decode tok/s, batch 1 ({args.prompt}-token context)"
    if row == "prefill":
        return f"prefill {args.prefill} tokens, tok/s"
    n = int(row.split()[1])
    return f"{n} sequence{'s' if n > 1 else ''}, generated tok/s"


def speed_table(name: str, m: Measures, args) -> str:
    lines = [f"### {name}", "", "| | ours tok/s | llama.cpp f32 tok/s | ratio | goal |"]
    lines.append("|---|---:|---:|---:|---|")
    for row in m.ours:
        a, b = statistics.median(m.ours[row]), statistics.median(m.theirs[row])
        ratio, goal = a / b, SPEED_GOALS.get(row)
        verdict = ""
        if goal is not None:
            verdict = f">= {goal:.1f}x: " + ("met" if ratio >= goal else f"missed by {goal - ratio:.2f}x")
        lines.append(f"| {row_label(row, args)} | {a:.0f} | {b:.0f} | {ratio:.2f}x | {verdict} |")
    return "\n".join(lines)


def _under(value: float, limit: float) -> str:
    return "met" if value < limit else f"missed by {value - limit:.2f} points"


def int4_goal(name: str, ours_pct: float, theirs_pct: float) -> str:
    verdicts = [f"below q4_0: {_under(ours_pct, theirs_pct)}"]
    if (ceiling := INT4_CEILING.get(name)) is not None:
        verdicts.append(f"< +{ceiling:.1f}%: {_under(ours_pct, ceiling)}")
    return "; ".join(verdicts)


def quality_table(name: str, llm_for, tools: LlamaTools, args) -> str:
    text = HELDOUT.read_text(encoding="utf-8")
    theirs = {kv: tools.perplexity(HELDOUT, args.context, kv, args.chunks) for kv in ["f16", "q8_0", "q4_0"]}
    mine = {}
    for kv in ["auto", "int8", "int4"]:
        llm = llm_for(kv)
        mine[kv] = ours.second_half_perplexity(llm, llm.encode(text), args.context, args.chunks)
    base_ours, base_theirs = mine["auto"], theirs["f16"].value
    chunks = theirs["f16"].chunks
    lines = [
        f"### {name}: KV cache quantization, perplexity on held-out text ({chunks} windows of "
        f"{args.context}, second halves scored)",
        "",
        "| ours KV | ours ppl | change | llama.cpp KV | llama.cpp ppl | change | goal |",
        "|---|---:|---:|---|---:|---:|---|",
        f"| auto (f32) | {base_ours:.3f} | | f16 | {base_theirs:.3f} | | |",
    ]
    for mine_kv, their_kv in KV_PAIRS:
        a = (mine[mine_kv] / base_ours - 1) * 100
        b = (theirs[their_kv].value / base_theirs - 1) * 100
        lines.append(
            f"| {mine_kv} | {mine[mine_kv]:.3f} | {a:+.2f}% | {their_kv} | {theirs[their_kv].value:.3f} "
            f"| {b:+.2f}% | {int4_goal(name, a, b) if mine_kv == 'int4' else ''} |"
        )
    return "\n".join(lines)


def machine(threads: int) -> str:
    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {threads} threads each, torch {torch.__version__}"


def warm_compiled(llm, sequences: list[int]) -> str:
    """Compile the decode-step buckets the rows use (engine.step.compiled_step); says which path runs."""
    from engine.step.compiled_step import row_bucket

    decoder = llm.engine.compiled_decode
    if decoder is None:
        return "eager"
    buckets = sorted({b for b in (row_bucket(n) for n in [1, *sequences]) if b is not None})
    decoder.warm_up(buckets)
    if decoder.failed:
        return f"eager (compiling failed: {decoder.failed})"
    took = sum(decoder.compile_seconds.values())
    return f"compiled, buckets {sorted(decoder.ready)} (warm-up {took:.0f} s)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="runs per round of decode and prefill")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--sequences", default="1,8,32")
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--chunks", type=int, default=None, help="perplexity windows (default: all)")
    parser.add_argument("--no-quality", action="store_true", help="skip the KV perplexity tables")
    parser.add_argument("--lookup-tokens", type=int, default=96, help="tokens per code prompt (n-gram rows)")
    parser.add_argument("--no-lookup", action="store_true", help="skip the n-gram speculation rows")
    parser.add_argument("--quick", action="store_true", help="1 round, 1 and 8 sequences, 4 windows")
    parser.add_argument(
        "--eager",
        action="store_true",
        help="our decode steps eager (default: the compiled step, warmed first)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.repeats, args.sequences, args.chunks = 1, 1, "1,8", args.chunks or 4
    args.sequences = [int(n) for n in args.sequences.split(",")]
    args.models = args.models.split(",")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from engine import LLM
    from engine.speculation import SpeculativeConfig

    made = build()
    print(
        f"llama.cpp from llama-cpp-python {made.version} (vendored commit {made.commit}), CPU build "
        f"(GGML_NATIVE=ON, Release) took {made.build_seconds:.0f} s; machine: {machine(args.threads)}",
        flush=True,
    )
    engines, tools, speculating = {}, {}, {}
    for name in args.models:
        path = REPO / "models" / name
        gguf = convert(path, made.src, made.root)
        tools[name] = LlamaTools(made.root / "build" / "bin", gguf, args.threads)
        engines[name] = LLM(
            path, device="cpu", prefix_caching=False, compile=not args.eager, speculative=None
        )
        print(f"{name}: our decode step: {warm_compiled(engines[name], args.sequences)}", flush=True)
        if not args.no_lookup:
            ngram = SpeculativeConfig(num_tokens=LOOKUP_DRAFT, method="ngram")
            speculating[name] = LLM(
                path, device="cpu", prefix_caching=False, compile=not args.eager, speculative=ngram
            )
            warm_compiled(speculating[name], [1 + LOOKUP_DRAFT])  # a verify step's rows
        print(f"{name}: greedy parity at f32: {parity(engines[name], tools[name], 64)}", flush=True)
        ours.decode_tok_s(engines[name], heldout_prompts(engines[name].tokenizer, 1, 64)[0], 16)  # warm-up

    measures = {name: Measures() for name in args.models}
    lookups = {name: Lookup() for name in args.models}
    for r in range(args.rounds):
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"round {r + 1}/{args.rounds}: load average {load}", flush=True)
        for name in args.models:
            first_ours = r % 2 == 0  # which engine goes first alternates between rounds
            for side in [first_ours, not first_ours]:
                if side:
                    round_ours(engines[name], args, measures[name])
                    if name in speculating:
                        lookup_ours(engines[name], speculating[name], args.lookup_tokens, lookups[name])
                else:
                    round_theirs(tools[name], args, measures[name])
                    if name in speculating:
                        lookup_theirs(tools[name], args.lookup_tokens, lookups[name])
    print(f"\nmedians of {args.rounds} interleaved rounds, {args.threads} threads each, greedy, f32\n")
    for name in args.models:
        print(speed_table(name, measures[name], args) + "\n", flush=True)
        if name in speculating:
            print(lookup_table(name, lookups[name], args) + "\n", flush=True)
    if args.no_quality:
        return
    for name in args.models:
        path = REPO / "models" / name

        def llm_for(kv: str, path: Path = path):
            return LLM(path, device="cpu", kv_cache_dtype=kv, prefix_caching=False)

        print(quality_table(name, llm_for, tools[name], args) + "\n", flush=True)


if __name__ == "__main__":
    main()
