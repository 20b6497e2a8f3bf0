"""OpenAI's Responses request (POST /v1/responses, and Cloudflare's `{"instructions", "input"}` shape
through /ai/run and env.AI.run) turned into the chat inputs dict that AIService.check validates:
the one place a Responses parameter is read, accepted or refused.

Refused, each with the reason in its message: a stored conversation (`previous_response_id`,
`store: true`, `conversation`: this runtime keeps no responses), `background` (nothing to poll:
the batch API is the asynchronous path here), a reasoning `summary` (the reasoning item carries
the model's reasoning whole; `reasoning.effort` switches thinking), built-in tools (web search,
file search, code interpreter...: nothing here runs them), image, file and audio inputs (the
models read text only), and every field OpenAI documents that is not served; a field no one
documents is refused as unknown.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.ai.inputs import TextGenerationInputs
from runtime.control.validation import describe
from workers import AIError

MAX_ITEMS = 512  # input items (messages, calls, call outputs) in one request
MAX_TOOLS = 128  # as OpenAI
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # as OpenAI
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the one `include` value there is something for

# Documented by OpenAI, not served here: why, in the refusal's words.
_REFUSED: dict[str, str] = {
    "previous_response_id": "no response is stored here; send the whole conversation as input items",
    "conversation": "no conversation is stored here; send the whole conversation as input items",
    "background": "responses run in the foreground; use the batch API (queueRequest) to queue work",
    "prompt": "no prompt templates are stored here; send instructions and input",
    "service_tier": "there is one service tier",
    "max_tool_calls": "not served; bound the calls with tool_choice",
    "truncation": "the input is never truncated: one that does not fit is refused",
    "prompt_cache_key": "prefix caching is automatic; route by the x-session-affinity header",
    "prompt_cache_retention": "prefix caching is automatic and not retained on request",
    "safety_identifier": "there is no safety system to identify the user to",
    "stream_options": "the stream always carries every event",
    "context_management": "the input is never compacted",
}


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The Responses parameters this runtime reads; `model` comes from the path through /ai/run."""

    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    # documented by OpenAI and refused (_REFUSED) when given a value
    previous_response_id: Any = None
    conversation: Any = None
    background: Any = None
    prompt: Any = None
    service_tier: Any = None
    max_tool_calls: Any = None
    truncation: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    safety_identifier: Any = None
    stream_options: Any = None
    context_management: Any = None


class ResponsesInputError(AIError):
    """A refused Responses parameter (5004), naming it for OpenAI's `param`."""

    def __init__(self, param: str, message: str):
        super().__init__(5004, f"{param}: {message}", param)


def bad(param: str, message: str) -> ResponsesInputError:
    return ResponsesInputError(param, message)


def decode_request(body: Any) -> ResponsesRequest:
    """A Responses body (a decoded JSON object) as the typed request, its refusals checked."""
    if not isinstance(body, dict):
        raise bad("(body)", f"must be a JSON object with 'input', got {type(body).__name__}")
    try:
        req = msgspec.convert(body, ResponsesRequest)
    except msgspec.ValidationError as exc:
        message = describe(exc)
        named = message.split("`")[1] if "field `" in message else None
        if named is not None and "unknown field" in message:
            raise bad(named, "is not a Responses parameter this API takes; remove it") from None
        if named is not None and "missing required field" in message:
            raise bad(named, "is required: give the input as text or a list of items") from None
        param, _, why = message.partition(": ")
        raise bad(param if why else "(body)", why or message) from None
    for name, why in _REFUSED.items():
        if getattr(req, name) not in (None, False, [], {}):
            raise bad(name, f"is not supported: {why}")
    if req.store:
        raise bad("store", "must be false (or left out): no response is stored here to retrieve later")
    _check_reasoning(req.reasoning)
    _check_metadata(req.metadata)
    for i, name in enumerate(req.include or []):
        if name != LOGPROBS_INCLUDE:
            raise bad(
                f"include.{i}",
                f"only {LOGPROBS_INCLUDE!r} can be included here (no reasoning, images or built-in tool "
                f"output), got {name!r}",
            )
    return req


EFFORTS = ("none", "minimal", "low", "medium", "high")


def _check_reasoning(reasoning: dict[str, Any] | None) -> None:
    """`reasoning: {"effort": ...}`: the model thinks or not (these families have no levels, so an
    effort other than "none" turns it on); `summary` is refused: the reasoning item carries the
    model's whole reasoning, never a summary of it."""
    if reasoning is None:
        return
    for key in reasoning:
        if key not in ("effort", "summary", "generate_summary"):
            raise bad(f"reasoning.{str(key)[:32]}", "is not a reasoning setting; give effort")
    if reasoning.get("effort") not in (None, *EFFORTS):
        raise bad("reasoning.effort", f"must be one of {', '.join(EFFORTS)}")
    for key in ("summary", "generate_summary"):
        if reasoning.get(key) is not None:
            raise bad(
                f"reasoning.{key}",
                "reasoning is returned whole (a reasoning item's reasoning_text), never summarised; "
                "leave it out",
            )


def wants_logprobs(req: ResponsesRequest) -> bool:
    """The output text's logprobs are asked for: by `include` (OpenAI's way) or by `top_logprobs`
    alone (OpenAI then answers an empty list; asking for alternatives means asking for logprobs)."""
    return LOGPROBS_INCLUDE in (req.include or []) or req.top_logprobs is not None


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if not metadata:
        return
    if len(metadata) > MAX_METADATA_KEYS:
        raise bad("metadata", f"holds {len(metadata)} keys; at most {MAX_METADATA_KEYS} are taken")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise bad(
                f"metadata.{key[:MAX_METADATA_KEY]}",
                f"keys are at most {MAX_METADATA_KEY} characters and values {MAX_METADATA_VALUE}",
            )


# --- input items -> chat messages ------------------------------------------------------------------

_TEXT_PARTS = ("input_text", "output_text", "text")


def _content(content: Any, where: str) -> str:
    """A message's content (a string or text parts) as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(where, "must be a string or a list of input_text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_file", "input_audio"):
            raise bad(f"{where}.{j}", f"is {kind}: these models read text only; send input_text")
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad(f"{where}.{j}", "must be {'type': 'input_text', 'text': '...'}")
        texts.append(part["text"])
    return "\n".join(texts)


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise bad(f"{where}.role", f"must be user, system, developer or assistant, got {role!r}")
    return {
        "role": "system" if role == "developer" else role,
        "content": _content(item.get("content"), where + ".content"),
    }


def _call(item: dict[str, Any], where: str) -> dict[str, Any]:
    for field in ("call_id", "name", "arguments"):
        if not isinstance(item.get(field), str):
            raise bad(f"{where}.{field}", "a function_call item needs call_id, name and arguments (strings)")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def _call_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(item.get("call_id"), str):
        raise bad(f"{where}.call_id", "a function_call_output item needs the call_id it answers")
    return {
        "role": "tool",
        "tool_call_id": item["call_id"],
        "content": _content(item.get("output"), where + ".output"),
    }


def messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The conversation as chat messages: instructions first (as the system message), then the
    items; consecutive function calls join one assistant message, as chat completions carry them."""
    out: list[dict[str, Any]] = []
    if req.instructions is not None:
        out.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*out, {"role": "user", "content": req.input}]
    if not req.input:
        raise bad("input", "must not be empty")
    if len(req.input) > MAX_ITEMS:
        raise bad("input", f"holds {len(req.input)} items; at most {MAX_ITEMS} are taken")
    for i, item in enumerate(req.input):
        where = f"input.{i}"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(_call(item, where))
            elif last is not None and last["role"] == "assistant":
                last["tool_calls"] = [_call(item, where)]
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [_call(item, where)]})
        elif kind == "function_call_output":
            out.append(_call_output(item, where))
        else:
            raise bad(
                f"{where}.type",
                f"{kind!r} items are not served: give message, function_call or function_call_output items",
            )
    return out


# --- tools, tool choice, text format -------------------------------------------------------------


def _tool(tool: Any, where: str) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise bad(
            f"{where}.type",
            f"{kind!r} tools are not served here (nothing runs built-in tools); give function tools",
        )
    if not isinstance(tool.get("name"), str) or set(tool) - {
        "type",
        "name",
        "description",
        "parameters",
        "strict",
    }:
        raise bad(where, "a function tool is {type: 'function', name, description?, parameters?, strict?}")
    function = {
        k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None
    }
    return {"type": "function", "function": function}


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad("tool_choice", f"must be auto, none, required or a function, got {choice!r}")
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise bad(
            "tool_choice",
            "a forced tool is {'type': 'function', 'name': NAME} (built-in tools are not served)",
        )
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(text: dict[str, Any]) -> dict[str, Any] | None:
    if set(text) - {"format", "verbosity"} or text.get("verbosity") not in (None, "medium"):
        raise bad("text", "takes only format ({type: text | json_object | json_schema, ...})")
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict) or not isinstance(fmt.get("name"), str):
            raise bad("text.format", "a json_schema format needs a name and a schema (an object)")
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": spec}
    raise bad("text.format.type", f"must be text, json_object or json_schema, got {kind!r}")


# what prepare must understand for a translated key to be honoured; the Responses name it came from
_NEEDS = {
    "tools": "tools",
    "tool_choice": "tool_choice",
    "parallel_tool_calls": "parallel_tool_calls",
    "response_format": "text.format",
}


def chat_inputs(req: ResponsesRequest) -> dict[str, Any]:
    """The chat inputs dict for AIService.check. A parameter the chat inputs cannot carry yet
    (TextGenerationInputs lacks it) is refused rather than dropped."""
    inputs: dict[str, Any] = {"messages": messages(req)}
    for name, value in (
        ("max_tokens", req.max_output_tokens),
        ("temperature", req.temperature),
        ("top_p", req.top_p),
    ):
        if value is not None:
            inputs[name] = value
    if req.tools:
        if len(req.tools) > MAX_TOOLS:
            raise bad("tools", f"holds {len(req.tools)} tools; at most {MAX_TOOLS} are taken")
        inputs["tools"] = [_tool(tool, f"tools.{i}") for i, tool in enumerate(req.tools)]
        if req.parallel_tool_calls is not None:
            inputs["parallel_tool_calls"] = req.parallel_tool_calls
    if req.tool_choice not in (None, "auto"):
        choice = _tool_choice(req.tool_choice)
        if req.tools:
            inputs["tool_choice"] = choice
        elif choice != "none":
            raise bad("tool_choice", "asks for a tool call, but no tools are given")
    if wants_logprobs(req):  # (chat's checks bound top_logprobs to 0-20)
        inputs["logprobs"], inputs["top_logprobs"] = True, req.top_logprobs or 0
    if req.text is not None and (fmt := _response_format(req.text)) is not None:
        inputs["response_format"] = fmt
    if req.reasoning and req.reasoning.get("effort") is not None:
        inputs["reasoning_effort"] = req.reasoning["effort"]
    known = TextGenerationInputs.__struct_fields__
    for key, param in _NEEDS.items():
        if key in inputs and key not in known:
            raise bad(param, "is not served by this runtime's models yet; leave it out")
    return inputs
