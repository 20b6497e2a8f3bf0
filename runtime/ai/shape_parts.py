"""The parts of an AI answer that OpenAI shapes its own way: a choice's logprobs (chat and
completions differ), its tool calls (whole, and as streamed pieces), and the choices of a result
made before the engine returned them one by one."""

from __future__ import annotations

import json
from typing import Any

from edge_sim.request import GenerateResult
from engine.outputs import Logprobs, TokenLogprob
from engine.structured.choices import Choice
from engine.structured.tool_types import ToolCall, ToolCallDelta


def choices_of(result: GenerateResult) -> list[Choice]:
    """The result's choices; one made of its text and finish_reason when it lists none."""
    if result.choices:
        return sorted(result.choices, key=lambda c: c.index)
    return [
        Choice(
            index=0,
            text=result.text,
            finish_reason=result.finish_reason,
            completion_tokens=result.completion_tokens,
        )
    ]


def finish_reason(choice: Choice) -> str:
    """OpenAI's finish_reason, as the choice ended: "tool_calls" when it ended by calling tools
    (engine.structured.choices decides that: a choice cut off by max_tokens ends "length" even when calls
    it finished came before the cut)."""
    return choice.finish_reason


def _token(t: TokenLogprob) -> dict[str, Any]:
    return {"token": t.token, "logprob": t.logprob, "bytes": t.bytes}


def chat_logprobs(steps: list[Logprobs] | None) -> dict[str, Any] | None:
    """Chat Completions' logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}."""
    if steps is None:
        return None
    return {"content": [{**_token(s.chosen), "top_logprobs": [_token(t) for t in s.top]} for s in steps]}


def completion_logprobs(steps: list[Logprobs] | None, offset: int = 0) -> dict[str, Any] | None:
    """Completions' logprobs: parallel lists of tokens, their logprobs, {token: logprob} of the
    likeliest at each step, and each token's character offset in the completion (from `offset`,
    where an earlier streamed piece ended)."""
    if steps is None:
        return None
    offsets, at = [], offset
    for s in steps:
        offsets.append(at)
        at += len(s.chosen.token)
    return {
        "tokens": [s.chosen.token for s in steps],
        "token_logprobs": [s.chosen.logprob for s in steps],
        "top_logprobs": [{t.token: t.logprob for t in s.top} for s in steps],
        "text_offset": offsets,
    }


def openai_tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


def workers_ai_tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Workers AI's text-generation shape: [{"name", "arguments": <object>}], as Cloudflare's."""
    out = []
    for c in calls:
        try:
            arguments: Any = json.loads(c.arguments)
        except ValueError:
            arguments = c.arguments  # kept as the model wrote it
        out.append({"id": c.id, "name": c.name, "arguments": arguments})
    return out


def tool_call_pieces(pieces: list[ToolCallDelta]) -> list[dict[str, Any]]:
    """Streamed tool-call pieces as OpenAI's delta.tool_calls: the first piece of a call carries
    its id, type and name; every piece carries its part of the arguments."""
    out = []
    for p in pieces:
        function: dict[str, Any] = {"arguments": p.arguments}
        piece: dict[str, Any] = {"index": p.index, "function": function}
        if p.id is not None:
            piece["id"], piece["type"] = p.id, "function"
        if p.name is not None:
            function["name"] = p.name
        out.append(piece)
    return out
