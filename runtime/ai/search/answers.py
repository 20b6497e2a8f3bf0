"""What a search is asked and how its answers are shaped: the query from `query` or `messages`,
the prompts given to the local models (the rewrite, the answer with the chunks as its documents),
and the results in Cloudflare's shapes: a `chat.completion` with the `chunks` it used (streamed:
an `event: chunks` first, then `chat.completion.chunk` events, then `[DONE]`), and the legacy
AutoRAG page (`vector_store.search_results.page`)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from runtime.ai.search.errors import INVALID, AISearchError

GENERATION_OPTIONS = frozenset({"model", "stream", "temperature", "max_tokens", "top_p", "seed"})
MAX_QUERY = 8192
DOCUMENT_CHARS = 4000  # of each chunk given to the model

SYSTEM_PROMPT = (
    "You answer questions using only the documents below. Quote the sentence of a document that "
    "answers the question, and name the document's key. If the documents do not answer the "
    "question, say that you do not know."
)
REWRITE_PROMPT = (
    "Rewrite the user's question as a short search query of its key words. Answer with the query only."
)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def query_of(body: dict) -> str:
    """The text searched: `query`, or the last user message of `messages` (text parts joined)."""
    has_query, has_messages = "query" in body, "messages" in body
    if has_query == has_messages:
        raise AISearchError(
            INVALID, "send either query (a string) or messages (a list), not both nor neither"
        )
    if has_query:
        query = body["query"]
        if not isinstance(query, str) or not query.strip():
            raise AISearchError(INVALID, "query: a non-empty string")
    else:
        messages = body["messages"]
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise AISearchError(INVALID, "messages: a non-empty list of {role, content}")
        for i, m in enumerate(messages):
            if m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
                raise AISearchError(INVALID, f"messages.{i}.role: system, developer, user, assistant or tool")
        users = [_text_of(m.get("content")) for m in messages if m.get("role") == "user"]
        query = next((u for u in reversed(users) if u.strip()), "")
        if not query.strip():
            raise AISearchError(INVALID, "messages: no user message with text to search for")
    if len(query) > MAX_QUERY:
        raise AISearchError(INVALID, f"the query is {len(query)} characters; at most {MAX_QUERY}")
    return query


def rewrite_messages(query: str, prompt: str | None) -> list[dict]:
    return [{"role": "system", "content": prompt or REWRITE_PROMPT}, {"role": "user", "content": query}]


def documents_block(chunks: list[dict]) -> str:
    parts = [
        f"<document key={json.dumps(c['item']['key'])}>\n{c['text'][:DOCUMENT_CHARS]}\n</document>"
        for c in chunks
    ]
    return "\n".join(parts) if parts else "(no document matched the question)"


def answer_messages(body: dict, chunks: list[dict], system_prompt: str | None) -> list[dict]:
    """The conversation the model answers: the system prompt with the documents, then the
    caller's messages (its own system messages kept after ours), or its query as one user turn."""
    system = f"{system_prompt or SYSTEM_PROMPT}\n\n{documents_block(chunks)}"
    if "messages" in body:
        return [{"role": "system", "content": system}, *body["messages"]]
    return [{"role": "system", "content": system}, {"role": "user", "content": body["query"]}]


def answer_text(answer: Any) -> str:
    """A generation's text in either shape a model answers: Workers AI's `response`, or the
    OpenAI chat completion's `choices[0].message.content` (the GLM and Kimi families' own)."""
    if not isinstance(answer, dict):
        return ""
    if answer.get("response") is not None:
        return str(answer["response"])
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message") or {}
        return str(message.get("content") or "") if isinstance(message, dict) else ""
    return ""


def _delta_text(event: dict) -> str:
    """A streamed event's text: Workers AI's `response`, or an OpenAI chunk's delta content."""
    if event.get("response"):
        return str(event["response"])
    choices = event.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        delta = choices[0].get("delta") or {}
        return str(delta.get("content") or "") if isinstance(delta, dict) else ""
    return ""


def chat_completion(answer: Any, model: str, chunks: list[dict]) -> dict:
    answer = answer if isinstance(answer, dict) else {}
    usage = answer.get("usage") or {}
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": answer_text(answer)},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
        },
        "chunks": chunks,
    }


async def _pieces(stream: Any) -> AsyncIterator[dict]:
    """The JSON events of a Workers AI event stream (`data: {...}` lines, `[DONE]` last)."""
    buffer = b""
    async for part in stream:
        buffer += part if isinstance(part, bytes) else str(part).encode()
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def stream_chat(stream: Any, model: str, chunks: list[dict]) -> AsyncIterator[bytes]:
    """`event: chunks` (the retrieved chunks), then OpenAI chat.completion.chunk events."""
    ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    yield _sse(chunks, "chunks")
    try:
        async for event in _pieces(stream):
            text = _delta_text(event)
            if text:
                yield _sse(
                    {
                        "id": ident,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
                    }
                )
        yield _sse(
            {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            }
        )
        yield b"data: [DONE]\n\n"
    finally:
        if hasattr(stream, "aclose"):
            await stream.aclose()


async def stream_legacy(stream: Any) -> AsyncIterator[bytes]:
    """aiSearch's stream: Workers AI's events (`{"response": text}`), whichever shape the model
    streams in."""
    try:
        async for event in _pieces(stream):
            text = _delta_text(event)
            if text:
                yield _sse({"response": text})
        yield b"data: [DONE]\n\n"
    finally:
        if hasattr(stream, "aclose"):
            await stream.aclose()


def legacy_page(found: dict) -> dict:
    return {
        "object": "vector_store.search_results.page",
        "search_query": found["search_query"],
        "data": [
            {
                "file_id": c["id"].rsplit("-", 1)[0],
                "filename": c["item"]["key"],
                "score": c["score"],
                "attributes": {
                    "timestamp": int(c["item"]["timestamp"] * 1000),
                    "folder": c["item"]["key"].rsplit("/", 1)[0] + "/" if "/" in c["item"]["key"] else "",
                    "filename": c["item"]["key"],
                    **(c["item"].get("metadata") or {}),
                },
                "content": [{"type": "text", "text": c["text"]}],
            }
            for c in found["chunks"]
        ],
        "has_more": False,
        "next_page": None,
    }
