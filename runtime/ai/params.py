"""From a decoded request (runtime.ai.inputs) to the one typed request that flows down to the PoP
(edge_sim.request.GenerateRequest): messages in OpenAI's shape, tools, the grammar the output
follows (engine.structured.guide.Guide) and the sampling parameters. Each refusal names its parameter.

`generate_request` is the one mapping every API uses (Workers AI, OpenAI, and the Responses and
batch APIs that build these structs); `chat_request` decodes a Workers AI inputs dict first.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from edge_sim.request import GenerateRequest
from engine import InvalidRequestError, SamplingParams
from engine.sampling import MAX_LOGIT_BIAS, MAX_LOGPROBS
from engine.sched.fair_queue import TenantShare
from engine.structured.guide import MAX_GUIDE_CHARS, Guide
from engine.structured.tool_types import ToolFunction
from runtime.ai.inputs import (
    MAX_MESSAGES,
    MAX_METADATA_KEY,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE,
    MAX_PARTS,
    MAX_STOP,
    MAX_TOOLS,
    ChatFields,
    CompletionRequest,
    Message,
    TextGenerationInputs,
    Tool,
)
from runtime.ai.refusals import InputError, decode_inputs
from workers import AIError

MAX_COMPLETION_LOGPROBS = 5  # OpenAI's Completions range is 0-5
MAX_TOKEN_ID_DIGITS = 9  # a logit_bias key: no vocabulary has a billion tokens
MAX_USER_CHARS = 256
DEFAULT_MAX_TOKENS = 256  # Workers AI's default; OpenAI chat without a limit gets it too
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # as OpenAI
JSON_MODE_STREAMING = "JSON Mode is not supported with streaming"  # Cloudflare's words
JSON_MODE_UNMET = "JSON Mode couldn't be met"  # Cloudflare's words for a generation that broke its schema

Inputs = TextGenerationInputs | ChatFields | CompletionRequest


def chat_request(inputs: Any, *, model: str, **where: Any) -> GenerateRequest:
    """A Workers AI inputs dict (as `/ai/run` and env.AI.run take it) as the typed request;
    `where`: tenant, share and session, as generate_request takes them. Raises InputError."""
    return generate_request(decode_inputs(inputs, TextGenerationInputs, "Workers AI"), model=model, **where)


def generate_request(
    inputs: Inputs,
    *,
    model: str,
    tenant: str = "local",
    share: TenantShare | None = None,
    session: str | None = None,
) -> GenerateRequest:
    """The typed request for decoded `inputs` to `model` (the catalog name that serves it);
    raises InputError naming the parameter for anything it cannot serve as asked."""
    _check_common(inputs)
    messages, prompt = None, None
    tools: list[ToolFunction] | None = None
    choice, parallel = "auto", True
    thinking: bool | None = None
    if isinstance(inputs, CompletionRequest):
        prompt = _completion_prompt(inputs)
    else:
        if (inputs.messages is None) == (getattr(inputs, "prompt", None) is None):
            raise InputError("messages", "give exactly one of 'prompt' (a string) or 'messages' (a list)")
        raw = getattr(inputs, "raw", False)
        if raw and inputs.messages is not None:
            raise InputError("raw", "raw takes a prompt: messages always go through the chat template")
        if raw and inputs.tools and inputs.tool_choice != "none":
            raise InputError(
                "raw", "a raw prompt has no chat template to declare tools in; send raw: false or no tools"
            )
        if getattr(inputs, "prompt", None) == "":  # Cloudflare's schema: minLength 1
            raise InputError("prompt", "must not be empty")
        thinking = thinking_of(inputs)
        if inputs.messages is not None:
            messages = chat_messages(inputs.messages)
        elif raw:
            prompt = inputs.prompt  # type: ignore[union-attr]  # raw: the text as written, no template
        else:
            # as Workers AI does: a prompt is one user turn through the model's chat template (a chat
            # model fed bare text continues it instead of answering it); `raw: true` opts out
            messages = [{"role": "user", "content": inputs.prompt}]  # type: ignore[union-attr]
        tools = tool_functions(inputs.tools) if inputs.tools else None
        choice = tool_choice(inputs.tool_choice, tools)
        parallel = inputs.parallel_tool_calls
    params = sampling_params(inputs)
    try:
        params.validate()
    except InvalidRequestError as exc:
        raise InputError(exc.param, str(exc).split(": ", 1)[1]) from None
    return GenerateRequest(
        model=model,
        prompt=prompt,
        messages=messages,
        params=params,
        tenant=tenant,
        share=share or TenantShare(),
        session=session,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        thinking=thinking,
    )


def sampling_params(inputs: Inputs) -> SamplingParams:
    """The engine's parameters (max_completion_tokens wins over max_tokens)."""
    limit = inputs.max_tokens if inputs.max_completion_tokens is None else inputs.max_completion_tokens
    stop = [inputs.stop] if isinstance(inputs.stop, str) else list(inputs.stop or [])
    return SamplingParams(
        max_tokens=DEFAULT_MAX_TOKENS if limit is None else limit,
        temperature=inputs.temperature,
        top_p=inputs.top_p,
        top_k=inputs.top_k,
        min_p=inputs.min_p,
        seed=inputs.seed,
        repetition_penalty=inputs.repetition_penalty,
        frequency_penalty=inputs.frequency_penalty,
        presence_penalty=inputs.presence_penalty,
        stop=stop,
        n=inputs.n,
        logprobs=_logprobs(inputs),
        logit_bias=_logit_bias(inputs.logit_bias),
        priority=inputs.priority,
        speculative=inputs.speculative,
        guide=None if isinstance(inputs, CompletionRequest) else guide(inputs),
    )


def _check_common(inputs: Inputs) -> None:
    stop = inputs.stop
    if isinstance(stop, list) and len(stop) > MAX_STOP:
        raise InputError("stop", f"give at most {MAX_STOP} stop sequences, got {len(stop)}")
    if inputs.user is not None and len(inputs.user) > MAX_USER_CHARS:
        raise InputError("user", f"is {len(inputs.user)} characters; at most {MAX_USER_CHARS} are taken")
    meta = inputs.metadata or {}
    if len(meta) > MAX_METADATA_KEYS:
        raise InputError("metadata", f"give at most {MAX_METADATA_KEYS} keys, got {len(meta)}")
    for key, value in meta.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            limits = f"keys of at most {MAX_METADATA_KEY} characters, values of at most {MAX_METADATA_VALUE}"
            raise InputError(f"metadata.{key[:MAX_METADATA_KEY]}", f"takes {limits}")


def thinking_of(inputs: ChatFields) -> bool | None:
    """Whether the model is asked to think: `chat_template_kwargs.enable_thinking` (vLLM's and
    Workers AI's switch), else `reasoning_effort` ("none" off; "minimal", "low", "medium", "high" on:
    these families think or not, with no levels, so an effort only turns it on); both given must
    agree. None: the model's default. A model that does not think takes either and answers with no
    reasoning."""
    kwargs = inputs.chat_template_kwargs
    switch = kwargs.enable_thinking if kwargs is not None else None
    effort = inputs.reasoning_effort
    by_effort = None if effort is None else effort != "none"
    if switch is not None and by_effort is not None and switch != by_effort:
        raise InputError(
            "reasoning_effort",
            f"{effort!r} disagrees with chat_template_kwargs.enable_thinking={str(switch).lower()}; "
            "send one of them",
        )
    return switch if switch is not None else by_effort


def _logit_bias(raw: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's logit_bias, {"token id": bias}, with integer ids (the engine bounds the rest)."""
    if raw is not None and len(raw) > MAX_LOGIT_BIAS:
        raise InputError("logit_bias", f"give at most {MAX_LOGIT_BIAS} tokens, got {len(raw)}")
    bias = {}
    for key, value in (raw or {}).items():
        if not (key.isascii() and key.isdigit() and len(key) <= MAX_TOKEN_ID_DIGITS):
            raise InputError(
                "logit_bias", f"keys are token ids (decimal integers as strings), got {key[:32]!r}"
            )
        bias[int(key)] = value
    return bias


def _logprobs(inputs: Inputs) -> int | None:
    """SamplingParams.logprobs: None for none, else how many likeliest tokens to show."""
    if isinstance(inputs, CompletionRequest):
        if inputs.logprobs is not None and not 0 <= inputs.logprobs <= MAX_COMPLETION_LOGPROBS:
            raise InputError("logprobs", f"must be in [0, {MAX_COMPLETION_LOGPROBS}], got {inputs.logprobs}")
        return inputs.logprobs
    if inputs.top_logprobs is not None and not 0 <= inputs.top_logprobs <= MAX_LOGPROBS:
        raise InputError("top_logprobs", f"must be in [0, {MAX_LOGPROBS}], got {inputs.top_logprobs}")
    if inputs.top_logprobs is not None and not inputs.logprobs:
        raise InputError("top_logprobs", "needs logprobs: true")
    return (inputs.top_logprobs or 0) if inputs.logprobs else None


def _completion_prompt(inputs: CompletionRequest) -> str:
    if inputs.echo:
        raise InputError("echo", "the answer never repeats the prompt here; send echo: false")
    if inputs.suffix is not None:
        raise InputError("suffix", "insertion (text after the completion) is not supported; remove 'suffix'")
    if inputs.best_of not in (None, inputs.n):
        raise InputError("best_of", "is not supported (every sampled choice is returned): use n instead")
    if isinstance(inputs.prompt, str):
        return inputs.prompt
    if len(inputs.prompt) != 1:
        raise InputError(
            "prompt", f"send one prompt per request, got {len(inputs.prompt)} (n samples it n times)"
        )
    return inputs.prompt[0]


# --- messages and tools ---------------------------------------------------------------------------


def _text(content: Any, where: str) -> str | None:
    """A message's content as text: a string, or its text parts joined (other parts refused)."""
    if content is None or isinstance(content, str):
        return content
    if len(content) > MAX_PARTS:
        raise InputError(where, f"give at most {MAX_PARTS} content parts, got {len(content)}")
    texts = []
    for i, part in enumerate(content):
        if part.type in ("image_url", "input_audio", "file"):
            raise InputError(
                f"{where}.{i}",
                f"these models read no images, audio or files; send text parts only (got {part.type!r})",
            )
        text = part.text if part.type == "text" else part.refusal
        if text is None:
            raise InputError(f"{where}.{i}", f"a {part.type} part needs its {part.type!r} field")
        texts.append(text)
    return "\n".join(texts)


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The messages in OpenAI's shape, as the PoP renders them: content as text, `developer` as
    `system`, an assistant's tool calls and a tool answer's tool_call_id kept."""
    if not messages:
        raise InputError("messages", "must not be empty")
    if len(messages) > MAX_MESSAGES:
        raise InputError("messages", f"give at most {MAX_MESSAGES} messages, got {len(messages)}")
    out = []
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        content = _text(m.content, f"{where}.content")
        if m.tool_calls is not None and m.role != "assistant":
            raise InputError(f"{where}.tool_calls", "only an assistant message carries tool calls")
        if m.role == "tool" and not m.tool_call_id:
            raise InputError(
                f"{where}.tool_call_id", "a tool message answers a call: name it by tool_call_id"
            )
        if content is None and m.refusal is not None:
            content = m.refusal
        if content is None and not (m.role == "assistant" and m.tool_calls):
            raise InputError(
                f"{where}.content", "is required (null only on an assistant message with tool_calls)"
            )
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.name is not None:
            message["name"] = m.name
        if m.tool_calls:
            message["tool_calls"] = [msgspec.to_builtins(call) for call in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def _tool_function(tool: Tool, where: str) -> ToolFunction:
    openai_shape = tool.function is not None
    flat = tool.name is not None or tool.parameters is not None or tool.description is not None
    if openai_shape == flat:
        raise InputError(
            where,
            'give {"type": "function", "function": {"name", ...}} (OpenAI) or {"name", "description", '
            '"parameters"} (Workers AI), one of the two',
        )
    spec = tool.function
    name = spec.name if spec is not None else tool.name
    if not TOOL_NAME.match(name or ""):
        raise InputError(f"{where}.name", "must be 1-64 letters, digits, '_' or '-'")
    parameters = (spec.parameters if spec is not None else tool.parameters) or {
        "type": "object",
        "properties": {},
    }
    if len(msgspec.json.encode(parameters)) > MAX_GUIDE_CHARS:
        raise InputError(f"{where}.parameters", f"is over {MAX_GUIDE_CHARS} characters of JSON schema")
    return ToolFunction(
        name=name,  # type: ignore[arg-type]  # matched above
        description=(spec.description if spec is not None else tool.description) or "",
        parameters=parameters,
        strict=bool(spec.strict if spec is not None else tool.strict),
    )


def tool_functions(tools: list[Tool]) -> list[ToolFunction]:
    if len(tools) > MAX_TOOLS:
        raise InputError("tools", f"give at most {MAX_TOOLS} tools, got {len(tools)}")
    out = [_tool_function(tool, f"tools.{i}") for i, tool in enumerate(tools)]
    names = [t.name for t in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InputError("tools", f"each tool needs its own name; given more than once: {', '.join(twice)}")
    return out


def tool_choice(choice: Any, tools: list[ToolFunction] | None) -> str:
    """ "auto", "none", "required" or the one function's name (engine.structured.tool_types.ToolChoice)."""
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise InputError(
                "tool_choice", f"must be 'auto', 'none', 'required' or a named function, got {choice!r}"
            )
        if choice == "required" and not tools:
            raise InputError("tool_choice", "'required' needs tools to call: give 'tools'")
        return choice
    name = choice.function.name
    if name not in [t.name for t in tools or []]:
        raise InputError("tool_choice", f"names {name!r}, which is not in 'tools'")
    return name


# --- structured output ------------------------------------------------------------------------------


def _schema_of(json_schema: dict[str, Any] | None) -> dict[str, Any]:
    """The schema in OpenAI's {"name", "schema", "strict"} or Workers AI's bare schema."""
    if not json_schema:
        raise InputError("response_format.json_schema", "a json_schema response format needs its schema")
    wrapper = {"name", "schema", "strict", "description"}
    if set(json_schema) <= wrapper:
        if not isinstance(json_schema.get("schema"), dict):
            raise InputError("response_format.json_schema.schema", "must be a JSON schema object")
        return json_schema["schema"]
    return json_schema


def guide(inputs: ChatFields) -> Guide | None:
    """The grammar the output follows: response_format (json_object, json_schema) or Workers
    AI's guided_json (a schema). Refused with tools the model may call (the two formats clash)
    and, on Workers AI, with streaming (as Cloudflare refuses it)."""
    fmt = inputs.response_format
    guided = getattr(inputs, "guided_json", None)
    if guided is not None and fmt is not None and fmt.type != "text":
        raise InputError("guided_json", "give guided_json or response_format, not both")
    if guided is not None:
        spec, param = Guide(kind="json_schema", schema=guided), "guided_json"
    elif fmt is None or fmt.type == "text":
        if fmt is not None and fmt.json_schema is not None:
            raise InputError("response_format.json_schema", "goes with type 'json_schema' only")
        return None
    elif fmt.type == "json_object":
        spec, param = Guide(kind="json"), "response_format"
    else:
        spec, param = Guide(kind="json_schema", schema=_schema_of(fmt.json_schema)), "response_format"
    if inputs.tools and inputs.tool_choice != "none":
        raise InputError(
            param,
            "cannot be combined with tools the model may call (its tool-call format is not JSON of "
            "your schema); send tool_choice: 'none' or leave one of the two out",
        )
    if isinstance(inputs, TextGenerationInputs) and inputs.stream:
        raise InputError(param, f"{JSON_MODE_STREAMING}; send stream: false")
    try:
        spec.validate(param)
    except InvalidRequestError as exc:
        raise InputError(exc.param, str(exc).split(": ", 1)[1]) from None
    return spec


def json_mode_failure(req: GenerateRequest, exc: AIError) -> AIError:
    """A guided generation that failed (its grammar could not continue) as Cloudflare words it;
    any other failure as it came."""
    if req.params.guide is None or exc.code != 5004 or JSON_MODE_UNMET in exc.detail:
        return exc
    return AIError(exc.code, f"{JSON_MODE_UNMET}: {exc.detail}")
