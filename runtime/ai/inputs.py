"""The request structs of the AI APIs: Workers AI text generation (`/ai/run`, `env.AI.run`) and
OpenAI Chat Completions and Completions. Every struct refuses unknown fields; the parameters the
APIs document but this runtime does not serve are refused by name in runtime.ai.refusals.

Cloudflare's Kimi and GLM entries take OpenAI's chat fields, so one set of chat fields
(`ChatFields`) serves both APIs; what differs is the defaults (Workers AI samples at 0.6 and
stops at 256 tokens unless told) and a few fields of each API's own.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

MAX_TOOLS = 128  # as OpenAI
MAX_MESSAGES = 2048
MAX_PARTS = 256  # content parts in one message
MAX_STOP = 4  # as OpenAI (the engine checks each string's length)
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # as OpenAI

Role = Literal["system", "developer", "user", "assistant", "tool"]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]


class _Strict(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ContentPart(_Strict, kw_only=True):
    """One part of a message's content. Only text parts are read: these models read no images,
    audio or files (runtime.ai.params refuses those parts by name)."""

    type: Literal["text", "image_url", "input_audio", "file", "refusal"]
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None


class CalledFunction(_Strict, kw_only=True):
    name: str
    arguments: str  # a JSON object's text, as OpenAI returns it


class MessageToolCall(_Strict, kw_only=True):
    """A call an earlier assistant turn made (the tool round trip sends it back)."""

    id: str
    function: CalledFunction
    type: Literal["function"] = "function"


class Message(_Strict, kw_only=True):
    """A chat message in OpenAI's shape: `developer` is read as `system`; an assistant turn may
    carry `tool_calls` with `content: null`; a `tool` turn answers one call by `tool_call_id`."""

    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None  # an earlier assistant refusal, sent back as it came


class FunctionSpec(_Strict, kw_only=True):
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict, kw_only=True):
    """A tool in OpenAI's shape ({"type": "function", "function": {...}}) or in Cloudflare's
    Workers AI shape ({"name", "description", "parameters"}); exactly one of the two."""

    type: Literal["function"] | None = None
    function: FunctionSpec | None = None
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Strict, kw_only=True):
    name: str


class NamedToolChoice(_Strict, kw_only=True):
    """tool_choice {"type": "function", "function": {"name": ...}}: call that function."""

    function: NamedFunction
    type: Literal["function"] = "function"


class ResponseFormat(_Strict, kw_only=True):
    """OpenAI's {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}; Workers AI's
    {"type": "json_schema", "json_schema": <the schema itself>} is read too."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class StreamOptions(_Strict, kw_only=True):
    include_usage: bool = False  # a last chunk with `choices: []` and the usage


class ChatTemplateKwargs(_Strict, kw_only=True):
    """What the chat template is rendered with: thinking on or off (runtime.ai.params.thinking_of)."""

    enable_thinking: bool | None = None


class SamplingFields(_Strict, kw_only=True):
    """What every text-generation call shares, both APIs."""

    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # wins over max_tokens
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted: an end user's id, for the caller's records
    metadata: dict[str, str] | None = None  # accepted, bounded as OpenAI bounds it
    # accepted only with their harmless values (runtime.ai.refusals refuses the rest)
    store: bool | None = None
    service_tier: str | None = None
    logit_bias: dict[str, float] | None = None
    priority: int = 0  # vLLM's: within the account, lower is scheduled first (never above its share)
    speculative: bool = True  # false: no draft tokens for this request (the model's default otherwise)


class ChatFields(SamplingFields, kw_only=True):
    """The chat fields of OpenAI's Chat Completions, which Cloudflare's Kimi and GLM entries take."""

    messages: list[Message] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    reasoning_effort: ReasoningEffort | None = None


class TextGenerationInputs(ChatFields, kw_only=True):
    """Workers AI text generation: a `prompt` or `messages`, and Workers AI's own fields:
    `guided_json` (a JSON schema the output follows), `raw` (true: the prompt reaches the model as
    written; else, as on Workers AI, it is one user message through the model's chat template),
    `model` (the model the path names)."""

    prompt: str | None = None
    model: str | None = None
    max_tokens: int | None = 256
    temperature: float = 0.6
    guided_json: dict[str, Any] | None = None
    raw: bool = False


class ChatCompletionRequest(ChatFields, kw_only=True):
    """OpenAI Chat Completions (POST .../ai/v1/chat/completions)."""

    model: str
    messages: list[Message]  # type: ignore[assignment]  # required here


class CompletionRequest(SamplingFields, kw_only=True):
    """OpenAI (legacy) Completions (POST .../ai/v1/completions). `logprobs` is an integer here:
    the likeliest tokens shown at each step (0-5)."""

    model: str
    prompt: str | list[str]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
