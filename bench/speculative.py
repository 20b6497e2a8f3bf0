"""Speculative decoding against one token a step, in one run: decode tok/s of both miniatures with
n-gram drafts and with MTP drafts (the checkpoint's multi-token-prediction layer), the share of
draft tokens accepted, the speed-up bound they imply, and whether every run produced the same tokens.

    python bench/speculative.py [--method ngram mtp] [--prompts code heldout guided] [--rounds 3]
                                [--tokens 96] [--k 5] [--mtp-k 1] [--temperature 0]
                                [--concurrency 1] [--model models/kimi-k2-mini ...]

Prompts: "code" repeats its context (what n-gram drafts are for); "heldout" are four windows of
the held-out text (models/eval/heldout.txt, Python's asyncio sources, never trained on); "guided"
(not in the default set) decodes under a grammar: a JSON schema whose rows the prompt already shows,
and a tool call in the model's own format (drafts checked against the mask, engine.structured.guided).

The bound: a speculating decode step emits `tokens/step` tokens (1 + accepted drafts) and costs
`step cost` times a plain step (its verify over k + 1 positions plus, for MTP, the draft layer's
rows), so it can be at most tokens/step / step cost times faster; the ratio actually measured is
lower by what the steps do not account for (prefill, the first token, steps that do not draft).
Step costs are medians of the engines' own decode-step timings in the same rounds.

--concurrency N runs N copies of each prompt at once (the back-off regime: past `max_decoders`
decoding sequences no step speculates). With --temperature > 0 both runs sample with the same
seed: the tokens must still be the same.

Interleaved rounds, medians; each engine is built once. Compiled decode steps on both sides
(engine.step.compiled_step: a plain step's rows, a verify step's rows and the MTP layer's rows each
run through their bucket's graph; prefill runs eagerly); --eager runs every step eagerly.
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

from engine.llm import LLM  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.speculation import SpeculativeConfig  # noqa: E402
from engine.step.compiled_step import DEFAULT_MAX_ROWS, ROW_BUCKETS, row_bucket  # noqa: E402
from engine.structured.guide import Guide  # noqa: E402
from engine.structured.tool_calls import format_for, guide_for, render_messages  # noqa: E402
from engine.structured.tool_types import ToolFunction  # noqa: E402

CODE_PROMPTS = {
    "repeating code": "def parse(text):\n    " + "value = text.strip().split(',')\n    " * 6,
    "class body": "class Stack:\n    def __init__(self):\n        self.items = []\n"
    "    def push(self, x):\n        self.items.append(x)\n    def pop(self):\n",
    "short prompt": "def fib(n):",
}
HELDOUT = REPO / "models" / "eval" / "heldout.txt"
# $EDGE_BENCH_UNSIGNED=1 also runs an unsigned checkpoint (one being trained)
OPTIONS = dict(device="cpu", allow_unsigned=os.environ.get("EDGE_BENCH_UNSIGNED") == "1")


def heldout_prompts(count: int = 4, chars: int = 1200) -> dict[str, str]:
    """`count` windows of the held-out text, each ending at a line break, spread over the file."""
    text = HELDOUT.read_text()
    out = {}
    for i in range(count):
        start = (i + 1) * len(text) // (count + 1)
        start = text.index("\n", start) + 1
        end = text.rindex("\n", start, start + chars) + 1
        out[f"held-out {i + 1}"] = text[start:end]
    return out


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "city": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "city", "age"],
    "additionalProperties": False,
}
PERSON_ROWS = (
    "People as JSON, one per line:\n" + '{"name": "Ada Lovelace", "city": "London", "age": 36}\n' * 4
)
WEATHER = ToolFunction(
    name="get_weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def guided_prompts(llm: LLM) -> dict[str, tuple[str, Guide]]:
    """Prompts decoded under a grammar: a schema the prompt's rows already follow, a tool call."""
    fmt = format_for(llm.config.model_type)
    ask = [{"role": "user", "content": "Weather in Seoul? Then Seoul again."}]
    tool_prompt = llm.tokenizer.apply_chat_template(render_messages(fmt, ask, [WEATHER]))
    return {
        "JSON schema rows": (PERSON_ROWS, Guide(kind="json_schema", schema=PERSON)),
        "tool call": (tool_prompt, guide_for(fmt, [WEATHER], "required")),
    }


def run(
    llm: LLM, prompt: str, tokens: int, temperature: float, copies: int, guide: Guide | None = None
) -> tuple[float, list]:
    params = SamplingParams(temperature=temperature, seed=7, max_tokens=tokens, ignore_eos=True, guide=guide)
    start = time.perf_counter()
    outs = llm.generate([prompt] * copies, params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start), [o.token_ids for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", nargs="*", default=["ngram", "mtp"], choices=["ngram", "mtp"])
    ap.add_argument(
        "--prompts", nargs="*", default=["code", "heldout"], choices=["code", "heldout", "guided"]
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=5, help="n-gram draft tokens per step at most")
    ap.add_argument("--mtp-k", type=int, default=1, help="MTP draft tokens per step (chained past 1)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else seeded sampling")
    ap.add_argument("--concurrency", type=int, default=1, help="copies of each prompt decoded at once")
    ap.add_argument("--model", nargs="*", default=["models/kimi-k2-mini", "models/glm-4.5-mini"])
    ap.add_argument("--eager", action="store_true", help="eager steps on both sides (default: compiled)")
    args = ap.parse_args()
    OPTIONS["compile"] = not args.eager
    prompts: dict[str, tuple[str, Guide | None]] = {}
    if "code" in args.prompts:
        prompts.update({name: (text, None) for name, text in CODE_PROMPTS.items()})
    if "heldout" in args.prompts:
        prompts.update({name: (text, None) for name, text in heldout_prompts().items()})
    print(
        f"# {platform.processor() or platform.machine()}, {args.concurrency} sequence(s) at once, "
        f"temperature {args.temperature:g}, {args.tokens} tokens, n-gram k={args.k}, MTP k={args.mtp_k}, "
        f"{args.rounds} rounds (medians), {'eager' if args.eager else 'compiled'} steps"
    )
    print(
        "| model | method | prompt | plain tok/s | speculative tok/s | ratio | accepted | tokens/step "
        "| step cost | bound | ratio / bound | same tokens |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for path in args.model:
        plain = LLM(REPO / path, speculative=None, **OPTIONS)
        specs = {}
        for method in args.method:
            k = args.k if method == "ngram" else args.mtp_k
            config = SpeculativeConfig(num_tokens=k, method=method)
            specs[method] = LLM(REPO / path, speculative=config, **OPTIONS)
        for llm in (plain, *specs.values()):  # both sides' buckets compiled before timing
            decoder, spec_config = llm.engine.compiled_decode, llm.engine.speculative
            if decoder is not None:
                rows = args.concurrency * (1 + (spec_config.num_tokens if spec_config else 0))
                top = row_bucket(min(rows, DEFAULT_MAX_ROWS)) or DEFAULT_MAX_ROWS
                decoder.warm_up([b for b in ROW_BUCKETS if b <= top])
        model_prompts = dict(prompts)
        if "guided" in args.prompts:
            model_prompts.update(guided_prompts(plain))
        for name, (prompt, guide) in model_prompts.items():
            for llm in (plain, *specs.values()):
                run(llm, prompt, 8, 0.0, 1, guide)  # warm
            for method, spec in specs.items():
                base, fast, same = [], [], True
                plain_ms, spec_ms, emitted, spec_steps = [], [], 0, 0
                drafted0, accepted0 = spec.engine.draft_tokens, spec.engine.accepted_tokens
                for _ in range(args.rounds):
                    plain.engine.steps.clear(), spec.engine.steps.clear()
                    b, ref = run(plain, prompt, args.tokens, args.temperature, args.concurrency, guide)
                    f, got = run(spec, prompt, args.tokens, args.temperature, args.concurrency, guide)
                    base.append(b), fast.append(f)
                    same = same and got == ref
                    plain_steps = [s for s in plain.engine.steps if s.prefill_tokens == 0]
                    steps = [s for s in spec.engine.steps if s.prefill_tokens == 0]
                    plain_ms += [s.duration_ms for s in plain_steps]
                    spec_ms += [s.duration_ms for s in steps]
                    emitted += sum(s.decode_tokens - s.draft_tokens + s.accepted_tokens for s in steps)
                    spec_steps += sum(s.batch_size for s in steps)
                drafted = spec.engine.draft_tokens - drafted0
                accepted = spec.engine.accepted_tokens - accepted0
                b, f = statistics.median(base), statistics.median(fast)
                per_step = emitted / spec_steps if spec_steps else 1.0  # per sequence per step
                cost = statistics.median(spec_ms) / statistics.median(plain_ms)
                bound = per_step / cost
                share = f"{accepted / drafted:.0%} of {drafted // args.rounds}" if drafted else "no drafts"
                print(
                    f"| {Path(path).name} | {method} | {name} | {b:.0f} | {f:.0f} | {f / b:.2f}x | {share} "
                    f"| {per_step:.2f} | {cost:.2f} | {bound:.2f}x | {f / b / bound:.0%} | {same} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
