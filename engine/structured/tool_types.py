"""Tool (function) calling, as the model's output carries it: the declared tools and the calls
parsed from a model's own tool-call format (engine.structured.tool_calls)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class ToolFunction(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """A function the model may call: its name, description and JSON-schema parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False


class ToolCall(msgspec.Struct, kw_only=True):
    """One call the model made: `arguments` is a JSON object's text, as OpenAI returns it."""

    id: str
    name: str
    arguments: str
    type: Literal["function"] = "function"


# "auto": text or calls; "none": text only; "required": at least one call; a name: that function
ToolChoice = str


class ToolCallDelta(msgspec.Struct, kw_only=True):
    """A piece of a streamed tool call, as OpenAI streams it: the first piece of call `index`
    carries its id and name, the rest pieces of its arguments' text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
