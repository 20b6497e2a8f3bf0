"""The HTTP shapes of an AI answer, made from the one typed result (edge_sim.request.GenerateResult):
Workers AI text generation, OpenAI ChatCompletion and Completion, and their server-sent event streams.
Nothing below the HTTP edge builds these dicts.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import msgspec

from edge_sim.request import GenerateResult
from engine.structured.choices import Choice, Delta
from runtime.ai.params import JSON_MODE_UNMET
from runtime.ai.shape_parts import (
    chat_logprobs,
    choices_of,
    completion_logprobs,
    finish_reason,
    openai_tool_calls,
    tool_call_pieces,
    workers_ai_tool_calls,
)
from workers import AIError

Schema = Literal["text-generation", "chat-completions"]
# text deltas (Delta; a bare str is read as choice 0's text), then the result; failures raise AIError
Items = AsyncIterator[str | Delta | GenerateResult]


def usage(result: GenerateResult) -> dict[str, Any]:
    """Token counts as OpenAI gives them (Workers AI's usage is the same object): the prompt tokens
    served from the prefix cache under `prompt_tokens_details.cached_tokens`."""
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.total_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }


def quantization_label(result: GenerateResult) -> str:
    """The formats that served an answer in one line, for the x-edge-quantization header."""
    q = quantization(result)
    return ", ".join(
        [*(f"{part}={f}" for part, f in q["weights_by_part"].items()), f"kv_cache={q['kv_cache']}"]
    )


def quantization(result: GenerateResult) -> dict[str, Any]:
    """The formats that served an answer; `dense_path` (how the uncompressed matrices were held and
    multiplied: "bf16 (edge_cpu, avx512_bf16)" for bf16 read as bf16) where the PoP says."""
    f = result.formats
    out = {"weights": f.weights, "weights_by_part": f.weights_by_part, "kv_cache": f.kv_cache}
    if f.dense_path:
        out["dense_path"] = f.dense_path
    return out


def served_by(model: str, result: GenerateResult) -> dict[str, Any]:
    """Which model really answered a call to `model`, in which formats: under an alias
    (`@cf/moonshotai/kimi-k2.6`), a miniature stand-in."""
    f = result.formats
    return {
        "model": result.model,
        "stand_in": result.model != model,
        "weights": f.weights,
        "kv_cache": f.kv_cache,
    }


def timing(result: GenerateResult) -> dict[str, Any]:
    return msgspec.to_builtins(result.timing)


def _extras(model: str, result: GenerateResult) -> dict[str, Any]:
    return {
        "quantization": quantization(result),
        "timing": timing(result),
        "served_by": served_by(model, result),
    }


def reasoning_fields(text: str) -> dict[str, str]:
    """A thinking model's reasoning under both names clients read: `reasoning_content` (vLLM's
    first name, Workers AI's) and `reasoning` (vLLM's since 2026); nothing when there is none."""
    return {"reasoning_content": text, "reasoning": text} if text else {}


def _chat_choice(choice: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": choice.text,
        "refusal": None,  # OpenAI's and Cloudflare's ChatCompletionResponseMessage require it (null)
        **reasoning_fields(choice.reasoning),
    }
    if choice.tool_calls:
        message["content"] = choice.text or None
        message["tool_calls"] = openai_tool_calls(choice.tool_calls)
    return {
        "index": choice.index,
        "message": message,
        "logprobs": chat_logprobs(choice.logprobs),
        "finish_reason": finish_reason(choice),
    }


def _text_choice(choice: Choice) -> dict[str, Any]:
    return {
        "index": choice.index,
        "text": choice.text,
        "logprobs": completion_logprobs(choice.logprobs),
        "finish_reason": choice.finish_reason,
    }


def _openai_body(model: str, result: GenerateResult, chat: bool) -> dict[str, Any]:
    shape = _chat_choice if chat else _text_choice
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [shape(c) for c in choices_of(result)],
        "usage": usage(result),
        **_extras(model, result),
    }


def shape_result(
    schema: Schema, model: str, result: GenerateResult, json_mode: bool = False
) -> dict[str, Any]:
    """The answer in the model's catalog schema: Workers AI text generation (with `tool_calls`
    when the model called tools, as Cloudflare's), or OpenAI ChatCompletion (as Cloudflare's Kimi
    and GLM entries answer); both carry timing and quantization. `json_mode`: the call asked for
    JSON (response_format json_object / json_schema, guided_json), so Workers AI's `response` is the
    parsed value, as Cloudflare's JSON Mode answers (OpenAI's `content` stays a string)."""
    if schema == "chat-completions":
        return _openai_body(model, result, chat=True)
    first = choices_of(result)[0]
    calls = {"tool_calls": workers_ai_tool_calls(first.tool_calls)} if first.tool_calls else {}
    return {
        "response": _parsed(first.text) if json_mode else first.text,
        **reasoning_fields(first.reasoning),
        **calls,
        "usage": usage(result),
        "finish_reason": finish_reason(first),
        "model": model,
        **_extras(model, result),
    }


def _parsed(text: str) -> Any:
    """JSON mode's answer as a value: the grammar and its closing within max_tokens
    (engine.structured.json_close) make it whole JSON; one that still is not is Cloudflare's
    "JSON Mode couldn't be met", never a string passed off as the object."""
    try:
        return json.loads(text)
    except ValueError:
        raise AIError(5004, f"{JSON_MODE_UNMET}: the answer is not whole JSON ({text[:80]!r})") from None


def text_completion(model: str, result: GenerateResult) -> dict[str, Any]:
    """OpenAI's (legacy) Completion object."""
    return _openai_body(model, result, chat=False)


# --- streams ----------------------------------------------------------------------------------------


def sse(data: Any) -> bytes:
    """One server-sent event carrying JSON (or the literal [DONE])."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


def _delta(item: str | Delta) -> Delta:
    return Delta(text=item) if isinstance(item, str) else item


class Chunks:
    """The OpenAI streaming chunks of one answer: chat.completion.chunk or text_completion.
    `include_usage` (stream_options): every chunk carries `usage: null` and a last one with
    `choices: []` carries the usage, as OpenAI streams it."""

    def __init__(self, model: str, chat: bool, include_usage: bool = False):
        self.model, self.chat, self.include_usage = model, chat, include_usage
        self.ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.offsets: dict[int, int] = {}  # completions' text_offset so far, per choice

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        if self.include_usage:
            extra = {"usage": None, **extra}
        return sse(
            {
                "id": self.ident,
                "object": kind,
                "created": self.created,
                "model": self.model,
                "choices": choices,
                **extra,
            }
        )

    def roles(self, n: int) -> bytes:
        """The first chunk: each choice's role."""
        return self._event(
            [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                for i in range(n)
            ]
        )

    def delta(self, item: Delta) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {"content": item.text, **reasoning_fields(item.reasoning)}
            if item.tool_calls:
                delta["tool_calls"] = tool_call_pieces(item.tool_calls)
            choice = {"index": item.index, "delta": delta, "logprobs": chat_logprobs(item.logprobs)}
        else:
            at = self.offsets.get(item.index, 0)
            self.offsets[item.index] = at + len(item.text)
            choice = {
                "index": item.index,
                "text": item.text,
                "logprobs": completion_logprobs(item.logprobs, at),
            }
        return self._event([{**choice, "finish_reason": None}])

    def finish(self, model: str, result: GenerateResult) -> list[bytes]:
        """Each choice's finish_reason; the usage, timing and served_by on the last chunk, or on
        a chunk of their own with `choices: []` when include_usage asked for it."""
        extras = {
            "usage": usage(result),
            "timing": timing(result),
            "quantization": quantization(result),
            "served_by": served_by(model, result),
        }
        ends = [
            {"index": c.index, "delta": {}, "finish_reason": finish_reason(c)}
            if self.chat
            else {"index": c.index, "text": "", "logprobs": None, "finish_reason": c.finish_reason}
            for c in choices_of(result)
        ]
        if self.include_usage:
            return [self._event(ends), self._event([], **extras)]
        return (
            [self._event(ends[:-1]), self._event(ends[-1:], **extras)]
            if len(ends) > 1
            else [self._event(ends, **extras)]
        )


async def workers_ai_events(items: Items, model: str, chat: bool) -> AsyncIterator[bytes]:
    """Workers AI streaming: `data: {"response": ...}` events, one with an empty response and the
    usage (and timing, and the tool calls made), then `data: [DONE]`; chat-completions models
    stream OpenAI chunks."""
    chunks = Chunks(model, chat=True)
    try:
        async for item in items:
            if not isinstance(item, GenerateResult):
                piece = _delta(item)
                if chat:
                    yield chunks.delta(piece)
                else:
                    yield sse({"response": piece.text, **reasoning_fields(piece.reasoning)})
                continue
            if chat:
                for event in chunks.finish(model, item):
                    yield event
                continue
            first = choices_of(item)[0]
            calls = {"tool_calls": workers_ai_tool_calls(first.tool_calls)} if first.tool_calls else {}
            final = {
                "usage": usage(item),
                "timing": timing(item),
                "quantization": quantization(item),
                "served_by": served_by(model, item),
            }
            yield sse({"response": "", **calls, **final})
    except AIError as exc:
        yield sse({"error": str(exc), "code": exc.code})
    yield sse("[DONE]")


async def openai_events(
    items: Items,
    model: str,
    chat: bool,
    include_usage: bool = False,
    n: int = 1,
) -> AsyncIterator[bytes]:
    """OpenAI streaming (chat or completion chunks) of `n` choices, then each one's end, with
    usage, timing and served_by (Chunks.finish)."""
    chunks = Chunks(model, chat, include_usage)
    if chat:
        yield chunks.roles(n)
    try:
        async for item in items:
            if not isinstance(item, GenerateResult):
                yield chunks.delta(_delta(item))
                continue
            for event in chunks.finish(model, item):
                yield event
    except AIError as exc:
        yield sse({"error": {"message": exc.detail, "code": exc.code}})
    yield sse("[DONE]")
