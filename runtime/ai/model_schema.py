"""What `GET /ai/models/schema?model=...` answers (the `cloudflare` SDK's `ai.models.schema.get`): a
model's input and output as JSON Schema, made from what this runtime really reads and answers, never
written beside it by hand where it can be derived:

- a text-generation model's input is the schema of runtime.ai.inputs.TextGenerationInputs, the struct
  that decodes its calls (msgspec writes it, so a field added there shows here);
- its output is Workers AI's text-generation object (`response`, `tool_calls`, `usage`) or OpenAI's
  ChatCompletion, by the model's catalog schema (runtime.ai.shapes answers in that shape), or, with
  `stream: true`, an event stream;
- an embedding name's input and output are those runtime.ai.embeddings reads and answers.

The model's task and authors (`ai.tasks.list`, `ai.authors.list`) are read off the same catalog view.
"""

from __future__ import annotations

import uuid
from functools import cache
from typing import Any

import msgspec

from runtime.ai.embeddings import MAX_CHARS, MAX_TEXTS, POOLING
from runtime.ai.inputs import TextGenerationInputs

_STREAM = {
    "type": "string",
    "contentType": "text/event-stream",
    "format": "binary",
    "description": "with stream: true, server-sent events, each `data: {...}` a delta, then `data: [DONE]`",
}
_USAGE = {
    "type": "object",
    "description": "tokens counted for the call",
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
    },
}
_TEXT_GENERATION = {
    "type": "object",
    "contentType": "application/json",
    "properties": {
        "response": {
            "description": "the answer; under JSON mode (response_format json_object or json_schema, "
            "guided_json) the parsed JSON value",
        },
        "tool_calls": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}},
                "required": ["name", "arguments"],
            },
        },
        "usage": _USAGE,
    },
    "required": ["response"],
}
_CHAT_COMPLETION = {
    "type": "object",
    "contentType": "application/json",
    "description": "OpenAI's ChatCompletion object",
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "const": "chat.completion"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "index": {"type": "integer"},
                    "message": {
                        "type": "object",
                        "properties": {
                            "role": {"type": "string"},
                            "content": {"type": ["string", "null"]},
                            "tool_calls": {"type": "array"},
                        },
                    },
                    "finish_reason": {"type": "string"},
                },
            },
        },
        "usage": _USAGE,
    },
    "required": ["id", "object", "choices"],
}


def model_schema(entry: dict[str, Any]) -> dict[str, Any]:
    """`{input, output}` for one catalog view entry (runtime.ai.catalog.catalog_view), each with the
    `type`, `description` and `additionalProperties` the SDK's SchemaGetResponse reads."""
    name = entry["name"]
    if entry.get("schema") == "text-embeddings":
        return {"input": _embedding_input(name), "output": _embedding_output(name)}
    answers = _CHAT_COMPLETION if entry.get("schema") == "chat-completions" else _TEXT_GENERATION
    return {
        "input": {**_text_generation_input(), "description": f"{name}'s inputs: a prompt or messages"},
        "output": {
            "type": "object",
            "description": f"{name}'s answer",
            "additionalProperties": True,
            "oneOf": [answers, _STREAM],
        },
    }


@cache
def _text_generation_input() -> dict[str, Any]:
    """TextGenerationInputs as JSON Schema, its own definition at the top (the SDK reads `type`
    there) and the ones it refers to under `$defs`."""
    schema = msgspec.json.schema(TextGenerationInputs)
    defs = dict(schema["$defs"])
    top = defs.pop(schema["$ref"].rsplit("/", 1)[1])
    return {**top, "additionalProperties": False, "$defs": defs}


def _embedding_input(name: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"{name}'s inputs: one text or a list of them",
        "additionalProperties": False,
        "properties": {
            "text": {
                "oneOf": [
                    {"type": "string", "minLength": 1, "maxLength": MAX_CHARS},
                    {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1, "maxLength": MAX_CHARS},
                        "minItems": 1,
                        "maxItems": MAX_TEXTS,
                    },
                ]
            },
            "pooling": {"type": "string", "enum": list(POOLING), "default": "mean"},
        },
        "required": ["text"],
    }


def _embedding_output(name: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"{name}'s vectors, one per text",
        "additionalProperties": True,
        "contentType": "application/json",
        "properties": {
            "shape": {"type": "array", "items": {"type": "integer"}},
            "data": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
            "pooling": {"type": "string", "enum": list(POOLING)},
        },
        "required": ["shape", "data"],
    }


def tasks(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tasks of the models listed (Cloudflare's `ai/tasks/search`: id, name, description), each
    once, its id stable across restarts (derived from its name)."""
    names = sorted({m["task"]["name"] for m in models})
    return [
        {
            "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"edge-workers/task/{name}")),
            "name": name,
            "description": f"{sum(m['task']['name'] == name for m in models)} model(s) here: "
            + ", ".join(sorted(m["name"] for m in models if m["task"]["name"] == name))[:500],
        }
        for name in names
    ]


def authors(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The authors of the models listed (Cloudflare's `ai/authors/search`): a name's second part,
    `@cf/<author>/...`, as Model Search's `author` filter reads it."""
    found: dict[str, int] = {}
    for m in models:
        parts = m["name"].split("/")
        if len(parts) >= 3:
            found[parts[1]] = found.get(parts[1], 0) + 1
    return [
        {
            "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"edge-workers/author/{name}")),
            "name": name,
            "description": f"{count} model(s) here",
        }
        for name, count in sorted(found.items())
    ]
