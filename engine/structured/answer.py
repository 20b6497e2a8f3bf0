"""The parts of one answer a client sees, as the choices assembler makes them from a request's
events (engine.structured.choices): pieces streamed per choice (text, tool-call pieces, reasoning,
logprobs) and each choice whole at the end (its text with tool-call markup removed, its calls)."""

from __future__ import annotations

import msgspec

from engine.outputs import Logprobs
from engine.structured.tool_types import ToolCall


class ToolCallDelta(msgspec.Struct, kw_only=True):
    """A piece of a streamed tool call, as OpenAI streams it: the first piece of call `index`
    carries its id and name, the rest pieces of its arguments' text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class Delta(msgspec.Struct, kw_only=True):
    """A piece of a streamed answer for choice `index`: text, its tokens' logprobs (when asked
    for), and pieces of tool calls parsed from the model's tool-call format."""

    text: str = ""
    index: int = 0
    logprobs: list[Logprobs] | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning: str = ""  # a piece of the model's reasoning (engine.structured.reasoning_parser)


class Choice(msgspec.Struct, kw_only=True):
    """One of a request's n answers: its text (tool-call markup removed), how it ended, its tokens,
    their logprobs when asked for, and the tool calls it made (finish_reason "tool_calls")."""

    index: int = 0
    text: str
    finish_reason: str
    completion_tokens: int
    logprobs: list[Logprobs] | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning: str = ""  # what it thought before answering ("" when it did not, or cannot)
    reasoning_tokens: int = 0  # of completion_tokens, those spent thinking
