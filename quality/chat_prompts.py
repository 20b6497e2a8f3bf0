"""The prompts of `edge models eval --chat`, read from JSON lines, and the GenerateRequest each
becomes: what a user's OpenAI chat call would send the edge (its tools, tool_choice "auto", its
response_format as a guide), so the evaluation scores the path users are served by.

One prompt a line: {"id", "kind", "split", "messages": [OpenAI chat messages], "tools": [OpenAI
tools] (optional), "response_format": {...} (optional), "thinking": bool (optional), "expect": {...}}
(the `expect` of each kind: quality.chat_score).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from edge_sim.request import GenerateRequest
from engine import SamplingParams
from engine.structured.guide import Guide
from engine.structured.tool_types import ToolFunction
from quality.chat_score import KINDS


class ChatPrompt(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    kind: str
    messages: list[dict[str, Any]]
    expect: dict[str, Any]
    split: str = ""
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None
    thinking: bool | None = None


def load_prompts(paths: list[str | Path], per_kind: int | None = None) -> list[ChatPrompt]:
    """Every prompt of the files, in order; `per_kind`: only the first that many of each kind.
    A file that is missing or a line that is not a prompt is refused, naming the file and line."""
    prompts: list[ChatPrompt] = []
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such prompts file")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                prompt = msgspec.json.decode(line, type=ChatPrompt)
                tool_functions(prompt.tools or [])
                guide_of(prompt.response_format)
            except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
                raise ValueError(f"{path}:{number}: {exc}") from None
            if prompt.kind not in KINDS:
                raise ValueError(f"{path}:{number}: unknown kind {prompt.kind!r} (known: {', '.join(KINDS)})")
            prompts.append(prompt)
    if per_kind is None:
        return prompts
    seen: Counter[str] = Counter()
    kept = []
    for prompt in prompts:
        seen[prompt.kind] += 1
        if seen[prompt.kind] <= per_kind:
            kept.append(prompt)
    return kept


def tool_functions(tools: list[dict[str, Any]]) -> list[ToolFunction]:
    """OpenAI's {"type": "function", "function": {...}} (or the flat Workers AI shape) as the
    engine's ToolFunction."""
    out = []
    for tool in tools:
        spec = tool.get("function", tool)
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ValueError(f"a tool needs a function name: {tool!r}")
        fields = {k: spec[k] for k in ("name", "description", "parameters", "strict") if k in spec}
        out.append(msgspec.convert(fields, ToolFunction))
    return out


def guide_of(response_format: dict[str, Any] | None) -> Guide | None:
    """The guide runtime.ai.params.guide makes of an OpenAI response_format (edge_sim cannot import
    the runtime): json_object is any JSON object, json_schema its schema (OpenAI's wrapper or bare)."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return Guide(kind="json")
    if kind != "json_schema":
        raise ValueError(f"response_format type {kind!r}: give text, json_object or json_schema")
    schema = response_format.get("json_schema") or {}  # type: ignore[union-attr]  # not None here
    if set(schema) <= {"name", "schema", "strict", "description"}:
        schema = schema.get("schema")
    if not isinstance(schema, dict) or not schema:
        raise ValueError("a json_schema response_format needs its schema")
    return Guide(kind="json_schema", schema=schema)


def request_for(prompt: ChatPrompt, model: str, params: SamplingParams) -> GenerateRequest:
    """The request a user's chat call with this prompt becomes (tool_choice "auto": the model
    chooses whether to call)."""
    guide = guide_of(prompt.response_format)
    if guide is not None:
        params = msgspec.structs.replace(params, guide=guide)
    return GenerateRequest(
        model=model,
        messages=prompt.messages,
        params=params,
        tools=tool_functions(prompt.tools) if prompt.tools else None,
        tool_choice="auto",
        thinking=prompt.thinking,
        tenant="chat-eval",
    )
