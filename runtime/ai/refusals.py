"""Nothing silently ignored: the parameters the OpenAI and Workers AI APIs document that this
runtime does not serve, each refused by name with why, and the decoding of a request body into
its struct (runtime.ai.inputs) that refuses unknown fields the same way.

Every refusal is an InputError: Workers AI code 5004 with the parameter first in the message, and
the parameter's name for OpenAI's `error.param`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from runtime.control.validation import describe
from workers import AIError

T = TypeVar("T", bound=msgspec.Struct)


class InputError(AIError):
    """An input refused before any work is queued: 5004, naming `param` (OpenAI's error.param)."""

    def __init__(self, param: str, message: str):
        super().__init__(5004, f"{param}: {message}", param)


def _given(value: Any) -> bool:
    return value is not None


def _not_text_only(value: Any) -> bool:
    return value is not None and value != ["text"]


def _true(value: Any) -> bool:
    return value is True


def _other_tier(value: Any) -> bool:
    return value not in (None, "auto", "default")


# name -> (is this value refused?, why, what to do); those that are no field of the structs are
# dropped once they pass (a null `audio`, `modalities: ["text"]`)
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "audio": (_given, "these models produce text only; remove 'audio'"),
    "modalities": (_not_text_only, 'these models produce text only; send ["text"] or leave it out'),
    "prediction": (_given, "predicted outputs are not supported here; remove 'prediction'"),
    "web_search_options": (_given, "no web search is served here; remove 'web_search_options'"),
    "functions": (_given, "deprecated by OpenAI and not served: send 'tools' instead"),
    "function_call": (_given, "deprecated by OpenAI and not served: send 'tool_choice' instead"),
    "lora": (_given, "no LoRA adapters are served here; remove 'lora'"),
    "image": (_given, "these models read no images; send text only"),
    "store": (_true, "completions are not stored here; send store: false or leave it out"),
    "service_tier": (
        _other_tier,
        "one tier serves every call here: send 'auto' or 'default', or leave it out",
    ),
}


def refuse_documented(raw: dict[str, Any]) -> None:
    """Refuse the first documented-but-unserved parameter `raw` gives a value it cannot take."""
    for name, (refused, why) in REFUSED.items():
        if name in raw and refused(raw[name]):
            raise InputError(name, why)


def decode_inputs(raw: Any, kind: type[T], api: str) -> T:
    """`raw` (a decoded JSON body or env.AI.run's inputs) as `kind`, refusing what is documented
    but unserved (REFUSED), unknown top-level fields (with the nearest known name), and values
    of the wrong type (naming where); `api` names the API in the messages."""
    if not isinstance(raw, dict):
        raise InputError("inputs", f"must be an object such as {{'prompt': '...'}}, got {type(raw).__name__}")
    refuse_documented(raw)
    fields = set(kind.__struct_fields__)
    for name in raw:
        if name not in fields and name not in REFUSED:
            near = difflib.get_close_matches(str(name), sorted(fields), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise InputError(
                str(name),
                f"unknown parameter: {api} takes no {name!r}{hint} (the README lists every parameter)",
            )
    body = {k: v for k, v in raw.items() if k in fields}
    try:
        return msgspec.convert(body, kind)
    except msgspec.ValidationError as exc:
        where, _, text = describe(exc).partition(": ")  # "messages.0.role: expected ..."
        raise InputError(where if text else "inputs", text or where) from None
