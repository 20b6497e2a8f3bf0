"""The HTTP shapes of an AI answer, made from the one typed result (edge_sim.request.GenerateResult):
Workers AI text generation, OpenAI ChatCompletion and Completion, and their server-sent event streams.
Nothing below the HTTP edge builds these dicts.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import msgspec

from edge_sim.request import Delta, GenerateResult
from workers import AIError

Schema = Literal["text-generation", "chat-completions"]
Items = AsyncIterator[Delta | GenerateResult]  # deltas, then the result; failures raise AIError


def usage(result: GenerateResult) -> dict[str, Any]:
    """Token counts as OpenAI gives them (Workers AI's usage is the same object): the prompt tokens
    served from the prefix cache under `prompt_tokens_details.cached_tokens`."""
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.total_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }


def quantization(result: GenerateResult) -> dict[str, Any]:
    f = result.formats
    return {"weights": f.weights, "weights_by_part": f.weights_by_part, "kv_cache": f.kv_cache}


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


def _openai_body(model: str, result: GenerateResult, chat: bool) -> dict[str, Any]:
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "finish_reason": result.finish_reason,
        }
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(result),
        **_extras(model, result),
    }


def shape_result(schema: Schema, model: str, result: GenerateResult) -> dict[str, Any]:
    """The answer in the model's catalog schema: Workers AI text generation, or OpenAI ChatCompletion
    (as Cloudflare's Kimi and GLM entries answer); both carry timing and quantization."""
    if schema == "chat-completions":
        return _openai_body(model, result, chat=True)
    return {
        "response": result.text,
        "usage": usage(result),
        "finish_reason": result.finish_reason,
        "model": model,
        **_extras(model, result),
    }


def text_completion(model: str, result: GenerateResult) -> dict[str, Any]:
    """OpenAI's (legacy) Completion object."""
    return _openai_body(model, result, chat=False)


# --- streams ----------------------------------------------------------------------------------------


def sse(data: Any) -> bytes:
    """One server-sent event carrying JSON (or the literal [DONE])."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


class Chunks:
    """The OpenAI streaming chunks of one answer: chat.completion.chunk or text_completion."""

    def __init__(self, model: str, chat: bool):
        self.model, self.chat = model, chat
        self.ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def _event(self, choice: dict[str, Any], **extra: Any) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return sse(
            {
                "id": self.ident,
                "object": kind,
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                **extra,
            }
        )

    def role(self) -> bytes:
        return self._event({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})

    def chunk(self, text: str | None, finish: str | None, **extra: Any) -> bytes:
        if self.chat:
            delta = {} if text is None else {"content": text}
            return self._event({"index": 0, "delta": delta, "finish_reason": finish}, **extra)
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return self._event(choice, **extra)


async def workers_ai_events(items: Items, model: str, chat: bool) -> AsyncIterator[bytes]:
    """Workers AI streaming: `data: {"response": ...}` events, one with an empty response and the
    usage (and timing), then `data: [DONE]`; chat-completions models stream OpenAI chunks."""
    chunks = Chunks(model, chat=True)
    try:
        async for item in items:
            if isinstance(item, Delta):
                yield chunks.chunk(item.text, None) if chat else sse({"response": item.text})
                continue
            final = {
                "usage": usage(item),
                "timing": timing(item),
                "quantization": quantization(item),
                "served_by": served_by(model, item),
            }
            yield chunks.chunk(None, item.finish_reason, **final) if chat else sse({"response": "", **final})
    except AIError as exc:
        yield sse({"error": str(exc), "code": exc.code})
    yield sse("[DONE]")


async def openai_events(
    items: Items, model: str, chat: bool, on_result: Callable[[GenerateResult], None]
) -> AsyncIterator[bytes]:
    """OpenAI streaming (chat or completion chunks), the last with usage, timing and served_by;
    `on_result` sees the whole result (for metrics) before its chunk goes out."""
    chunks = Chunks(model, chat)
    if chat:
        yield chunks.role()
    try:
        async for item in items:
            if isinstance(item, Delta):
                yield chunks.chunk(item.text, None)
                continue
            on_result(item)
            yield chunks.chunk(
                None,
                item.finish_reason,
                usage=usage(item),
                timing=timing(item),
                served_by=served_by(model, item),
            )
    except AIError as exc:
        yield sse({"error": {"message": exc.detail, "code": exc.code}})
    yield sse("[DONE]")
