"""The chat corpus: synthetic conversations (chat_examples.py) rendered exactly as the engine renders
a request (engine.structured.tool_calls.render_messages, then the family's chat template), tokenized piece by
piece so that the prompt's tokens are the ones the engine will see and only the assistant's turns
are trained on; plus English prose (the standard library's `pydoc_data/topics.py`) beside the code.

    python -m models.recipe.chat_corpus --eval models/eval/chat   # writes heldout.jsonl

Seeded; reads only files on this machine (chat_facts.py names them).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
from pathlib import Path
from typing import Any

import torch
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.structured.tool_calls import GLM45, KIMI_K2, render_messages
from engine.structured.tool_types import ToolFunction
from models.recipe import chat_examples as ex
from models.recipe.tokenizer import CHAT_TEMPLATES

FORMATS = {"kimi": KIMI_K2, "glm": GLM45}
# GLM-4.5 ends an assistant turn with the next role's marker (its config lists them as stops)
GLM_TURN_END = {"user": "<|user|>", "tool": "<|observation|>", None: "<|endoftext|>"}
THINKING_OFF_SHARE = 0.5  # GLM: the share rendered with enable_thinking false (the template's block)


def _tool_functions(tools: list[dict[str, Any]] | None) -> list[ToolFunction] | None:
    if not tools:
        return None
    return [
        ToolFunction(
            name=t["function"]["name"],
            description=t["function"].get("description", ""),
            parameters=t["function"]["parameters"],
        )
        for t in tools
    ]


@functools.cache
def _template(family: str):
    return ImmutableSandboxedEnvironment().from_string(CHAT_TEMPLATES[family])


def _render(family: str, messages: list[dict[str, Any]], tools, generation: bool, thinking) -> str:
    turns = render_messages(FORMATS[family], messages, _tool_functions(tools))
    switch = {} if thinking is None else {"enable_thinking": thinking, "thinking": thinking}
    return _template(family).render(messages=turns, add_generation_prompt=generation, **switch)


def segments(example: ex.Example, family: str, thinking: bool | None = None) -> list[tuple[str, bool]]:
    """The conversation as (text, trained) pieces: every assistant turn is trained (with what ends
    it: Kimi's <|im_end|>, GLM's next role marker), the rest is prompt."""
    out: list[tuple[str, bool]] = []
    done = ""
    msgs = example.messages
    for i, message in enumerate(msgs):
        if message["role"] != "assistant":
            continue
        prompt = _render(family, msgs[:i], example.tools, True, thinking)
        whole = _render(family, msgs[: i + 1], example.tools, False, thinking)
        if not (prompt.startswith(done) and whole.startswith(prompt)):
            raise ValueError(f"the {family} template does not render turns as a growing prefix")
        reply = whole[len(prompt) :]
        if family == "glm":
            reply += GLM_TURN_END[msgs[i + 1]["role"] if i + 1 < len(msgs) else None]
        out += [(prompt[len(done) :], False), (reply, True)]
        done = prompt + reply
    return out


def encode(pieces: list[tuple[str, bool]], tokenizer) -> tuple[list[int], list[bool]]:
    ids: list[int] = []
    mask: list[bool] = []
    for text, trained in pieces:
        got = tokenizer.encode(text, add_special_tokens=False).ids
        ids += got
        mask += [trained] * len(got)
    return ids, mask


def training_examples(
    family: str, count: int, seed: int, weights_of: dict[str, float] | None = None
) -> list[ex.Example]:
    """`count` conversations, kinds drawn by the GENERATORS weights (`weights_of` overrides some)."""
    rng = random.Random(seed)
    kinds = list(ex.GENERATORS)
    weights = [(weights_of or {}).get(k, ex.GENERATORS[k][1]) for k in kinds]
    out = []
    for kind in rng.choices(kinds, weights, k=count):
        gen = ex.GENERATORS[kind][0]
        out.append(ex.identity_example(rng, "train", family) if kind == "identity" else gen(rng, "train"))
    return out


def chat_tokens(
    tokenizer, family: str, count: int, seed: int, weights_of: dict[str, float] | None = None
) -> list[tuple[list[int], list[bool]]]:
    """`count` training conversations as (token ids, trained mask)."""
    rng = random.Random(seed + 1)
    out = []
    for example in training_examples(family, count, seed, weights_of):
        thinking = None
        if family == "glm" and rng.random() < THINKING_OFF_SHARE:
            thinking = False
        out.append(encode(segments(example, family, thinking), tokenizer))
    return out


def parse_weights(text: str) -> dict[str, float]:
    """`tool=40,json=20`: kinds of GENERATORS and their weights; an unknown kind is refused."""
    out = {}
    for item in filter(None, text.split(",")):
        kind, _, value = item.partition("=")
        if kind not in ex.GENERATORS:
            raise ValueError(f"--chat-weights: unknown kind {kind!r} (known: {', '.join(ex.GENERATORS)})")
        try:
            out[kind] = float(value)
        except ValueError:
            raise ValueError(f"--chat-weights: {item!r} needs a number after '=' (say {kind}=10)") from None
    return out


def prose_text() -> str:
    """English prose the machine ships: the Python docs' topic pages (pydoc_data)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def prose_tokens(tokenizer) -> torch.Tensor:
    ids = tokenizer.encode(prose_text(), add_special_tokens=False).ids
    return torch.tensor(ids, dtype=torch.int32)


# the held-out evaluation set: (kind-generator, split, count)
EVAL_PLAN = [
    (ex.tool_example, "heldout", 90),
    (ex.tool_example, "phrasing", 30),
    (ex.json_example, "heldout", 30),
    (ex.json_example, "phrasing", 10),
    (ex.capital_example, "train", 20),
    (ex.currency_example, "train", 10),
    (ex.zone_example, "train", 5),
    (ex.language_example, "train", 5),
    (ex.capital_example, "phrasing", 20),
    (ex.currency_example, "phrasing", 10),
    (ex.zone_example, "phrasing", 5),
    (ex.language_example, "phrasing", 5),
    (ex.unknown_example, "phrasing", 20),
    (ex.docstring_example, "heldout", 20),
    (ex.everyday_example, "heldout", 8),
    (ex.greeting_example, "phrasing", 6),
    (ex.identity_example, "phrasing", 6),
    (ex.rag_example, "heldout", 30),
]


def eval_lines(seed: int = 4321) -> list[dict[str, Any]]:
    """The held-out prompts (no answer turn), each once."""
    rng = random.Random(seed)
    lines, seen = [], set()
    for gen, split, count in EVAL_PLAN:
        made = 0
        for _ in range(count * 50):
            if made == count:
                break
            e = gen(rng, split)
            messages = [m for m in e.messages if m["role"] != "assistant"]
            key = json.dumps(messages, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            line: dict[str, Any] = {"id": f"{e.kind}-{split}-{made}", "kind": e.kind, "split": split}
            line.update(messages=messages, expect=e.expect)
            if e.tools:
                line["tools"] = e.tools
            if e.response_format:
                line["response_format"] = e.response_format
            lines.append(line)
            made += 1
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--eval", type=Path, required=True, help="folder to write heldout.jsonl into")
    args = parser.parse_args()
    args.eval.mkdir(parents=True, exist_ok=True)
    lines = eval_lines()
    (args.eval / "heldout.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
    counts: dict[str, int] = {}
    for line in lines:
        counts[line["kind"]] = counts.get(line["kind"], 0) + 1
    print(f"wrote {args.eval / 'heldout.jsonl'}: {len(lines)} prompts, {counts}")


if __name__ == "__main__":
    main()
