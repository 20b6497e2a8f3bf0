"""`edge models eval --chat`: how well a model chats, calls tools and answers JSON, per weight and
KV format, on held-out prompts (quality.chat_prompts).

Each setting loads the model into a PoP node as the edge serves it, sends every prompt as a user's
chat call (greedy; tool prompts also at temperature 1 once per seed) and reads the replies with
the parsers users' answers go through (engine.structured.choices: reasoning split off, tool-call markup
parsed into calls), then scores them (quality.chat_score). A row also carries the held-out
perplexity of the same setting, measured by quality.perplexity.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import msgspec

from edge_sim.errors import EdgeError
from edge_sim.pop import ModelSpec, PopNode
from edge_sim.topology import Topology
from engine import SamplingParams
from engine.errors import ModelLoadError
from quality import chat_score as score
from quality.chat_prompts import ChatPrompt, request_for
from quality.perplexity import evaluate as perplexity_rows


class Budget(NamedTuple):
    """max_tokens per reply: a tool call needs few; an answer in words more."""

    tool: int = 96
    other: int = 128


class Perplexity(NamedTuple):
    """The held-out perplexity measured beside the chat scores: one context (cut to the model's
    window), a few windows; `text` None is the model's own held-out text."""

    context: int = 1024
    windows: int = 4
    text: str | Path | None = None


class Reply(NamedTuple):
    """What the user would have got: the answer's text, its calls, its tokens, or why it failed."""

    text: str
    calls: list[score.Call]
    completion_tokens: int
    error: str | None = None


class Outcome(NamedTuple):
    prompt: ChatPrompt
    seed: int | None  # None: greedy
    reply: Reply


class ChatEvalRow(msgspec.Struct):
    """Scores are shares in [0, 1] (None: no prompt of that kind was run)."""

    weights: str
    kv_cache_dtype: str
    tool_greedy: float | None  # `tool`: exactly the expected call
    parallel: float | None  # `parallel_tool`: exactly the expected calls, in any order
    tool_sampled: float | None  # both tool kinds at temperature 1, over every seed
    json: float | None  # the JSON object, every field right
    fact_seen: float | None  # facts from training, answered correctly
    heldout_answered: float | None  # fact_phrasing and rag: did not say it does not know
    heldout_correct: float | None  # ... and named an expected answer
    unknown: float | None  # fact_unknown: said it does not know
    docstring: float | None  # enough of the expected words
    prose: float | None  # chat, greeting, identity: no line of code
    english: float | None  # greeting, identity: English prose
    tokens_per_call: float | None  # completion tokens of greedy `tool` replies that made one call
    perplexity: float | None  # held-out text (quality.perplexity), None when not measured
    perplexity_context: int
    counts: dict[str, int]  # prompts per kind
    sampled: int  # temperature-1 replies scored (tool prompts x seeds)
    errors: int  # replies that failed (scored as wrong)
    seconds: float


async def _reply(node: PopNode, model: str, prompt: ChatPrompt, params: SamplingParams) -> Reply:
    try:
        result = await node.generate(request_for(prompt, model, params))
    except EdgeError as exc:  # a prompt the model cannot take (too long, say): wrong, and counted
        return Reply("", [], 0, str(exc))
    choice = result.choices[0]
    calls = [(c.name, score.parse_arguments(c.arguments)) for c in choice.tool_calls or []]
    return Reply(choice.text, calls, choice.completion_tokens)


async def run_prompts(
    node: PopNode, model: str, prompts: list[ChatPrompt], seeds: int, budget: Budget, concurrency: int = 8
) -> list[Outcome]:
    """Every prompt greedy, and each tool prompt at temperature 1 with seeds 0..seeds-1; a few at
    a time, so the engine batches them as it would users' calls."""
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: ChatPrompt, seed: int | None) -> Outcome:
        tokens = budget.tool if prompt.kind in score.TOOL_KINDS else budget.other
        params = SamplingParams(max_tokens=tokens, temperature=0.0 if seed is None else 1.0, seed=seed)
        async with gate:
            return Outcome(prompt, seed, await _reply(node, model, prompt, params))

    jobs = [one(p, None) for p in prompts]
    jobs += [one(p, s) for p in prompts if p.kind in score.TOOL_KINDS for s in range(seeds)]
    return list(await asyncio.gather(*jobs))


def _share(marks: list[bool]) -> float | None:
    return sum(marks) / len(marks) if marks else None


def summarize(outcomes: list[Outcome]) -> dict[str, float | int | None | dict[str, int]]:
    """The scores of a setting's replies (ChatEvalRow's score fields)."""
    greedy = [o for o in outcomes if o.seed is None]

    def marks(*kinds: str, rule=None) -> list[bool]:
        rule = rule or (lambda o: score.right(o.prompt.kind, o.prompt.expect, o.reply.text, o.reply.calls))
        return [rule(o) for o in greedy if o.prompt.kind in kinds]

    sampled = [o for o in outcomes if o.seed is not None]
    calls = [o.reply.completion_tokens for o in greedy if o.prompt.kind == "tool" and len(o.reply.calls) == 1]
    return {
        "tool_greedy": _share(marks("tool")),
        "parallel": _share(marks("parallel_tool")),
        "tool_sampled": _share(
            [score.right(o.prompt.kind, o.prompt.expect, o.reply.text, o.reply.calls) for o in sampled]
        ),
        "json": _share(marks("json")),
        "fact_seen": _share(marks("fact_seen")),
        "heldout_answered": _share(
            marks("fact_phrasing", "rag", rule=lambda o: score.answered(o.reply.text))
        ),
        "heldout_correct": _share(marks("fact_phrasing", "rag")),
        "unknown": _share(marks("fact_unknown")),
        "docstring": _share(marks("docstring")),
        "prose": _share(marks(*score.PROSE_KINDS, rule=lambda o: score.is_prose(o.reply.text))),
        "english": _share(marks(*score.ENGLISH_KINDS)),
        "tokens_per_call": sum(calls) / len(calls) if calls else None,
        "counts": dict(Counter(o.prompt.kind for o in greedy)),
        "sampled": len(sampled),
        "errors": sum(o.reply.error is not None for o in outcomes),
    }


def evaluate_chat(
    model_dir: str | Path,
    prompts: list[ChatPrompt],
    weights: list[str] | None = None,
    kv_dtypes: list[str] | None = None,
    seeds: int = 3,
    budget: Budget = Budget(),
    perplexity: Perplexity | None = Perplexity(),
    device: str | None = None,
    trusted_keys: list[str | Path] | None = None,
    allow_unsigned: bool = False,
    model: str = "chat-eval",
) -> list[ChatEvalRow]:
    """One row per (weights, KV dtype): the prompts' scores and, unless `perplexity` is None, the
    held-out perplexity of the same setting."""
    model_dir = Path(model_dir)
    rows = []
    for w in weights or ["auto"]:
        for kv in kv_dtypes or ["auto"]:
            started = time.perf_counter()
            spec = ModelSpec(
                model, str(model_dir), weights=w, kv_cache_dtype=kv,
                trusted_keys=[str(k) for k in trusted_keys] if trusted_keys else None,
                allow_unsigned=allow_unsigned,
            )  # fmt: skip
            node = PopNode.load(Topology.default().pop("FRA"), [spec], device)
            if model in node.refused:
                raise ModelLoadError(node.refused[model])
            # every reply runs the path a warm PoP serves, and no compile outlives the process
            # (one left running at exit aborts it)
            node.wait_compiled()
            try:
                formats = node.formats(model)
                window = node.engines[model].context_window
                outcomes = asyncio.run(run_prompts(node, model, prompts, seeds, budget))
            finally:
                node.close()
            ppl, context = None, 0
            if perplexity is not None:  # after the node is gone: the quality path loads its own copy
                context = min(perplexity.context, window)
                measured = perplexity_rows(
                    model_dir, [kv], [context], weights=[w], text=perplexity.text,
                    max_windows=perplexity.windows, device=device, trusted_keys=trusted_keys,
                    allow_unsigned=allow_unsigned,
                )  # fmt: skip
                ppl = measured[-1].perplexity  # the last row is this setting (a baseline may precede it)
            rows.append(
                ChatEvalRow(
                    weights=formats.weights, kv_cache_dtype=formats.kv_cache, perplexity=ppl,
                    perplexity_context=context, seconds=time.perf_counter() - started,
                    **summarize(outcomes),  # type: ignore[arg-type]
                )
            )  # fmt: skip
    return rows


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


COLUMNS = (
    ("weights", lambda r: r.weights),
    ("kv", lambda r: r.kv_cache_dtype),
    ("tool", lambda r: _pct(r.tool_greedy)),
    ("parallel", lambda r: _pct(r.parallel)),
    ("tool t=1", lambda r: _pct(r.tool_sampled)),
    ("json", lambda r: _pct(r.json)),
    ("fact seen", lambda r: _pct(r.fact_seen)),
    ("held-out ans/cor", lambda r: f"{_pct(r.heldout_answered)}/{_pct(r.heldout_correct)}"),
    ("unknown", lambda r: _pct(r.unknown)),
    ("docstring", lambda r: _pct(r.docstring)),
    ("prose", lambda r: _pct(r.prose)),
    ("english", lambda r: _pct(r.english)),
    ("tok/call", lambda r: "-" if r.tokens_per_call is None else f"{r.tokens_per_call:.1f}"),
    ("ppl", lambda r: "-" if r.perplexity is None else f"{r.perplexity:.3f}"),
    ("errors", lambda r: str(r.errors)),
)


def format_table(rows: list[ChatEvalRow]) -> str:
    """A row per setting, then the prompts per kind (the same for every row)."""
    lines = [[name for name, _ in COLUMNS]] + [[cell(r) for _, cell in COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    table = [
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    ]
    if rows:
        counts = ", ".join(f"{kind} {n}" for kind, n in rows[0].counts.items())
        table.append(f"prompts: {counts}; temperature-1 replies: {rows[0].sampled}")
        if rows[0].perplexity is not None:
            table.append(f"perplexity: held-out text, {rows[0].perplexity_context}-token windows")
    return "\n".join(table)
