"""JSON request bodies decoded once, at the HTTP edge, with bounds: a body is refused with a
message that says what to change when it is not JSON, when it holds half a UTF-16 surrogate pair
(a lone "\\ud800", which no model, database or pipe downstream can encode), or when it nests
deeper than MAX_DEPTH (which would exhaust the stack of whatever walks it next)."""

from __future__ import annotations

import re
from typing import Any

import msgspec

MAX_DEPTH = 64  # objects and arrays inside each other; far past any API's own shapes

# \uD800-\uDBFF not followed by \uDC00-\uDFFF, or \uDC00-\uDFFF not preceded by a high half
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


class BadJSON(ValueError):
    """The body could not be taken as JSON; the message is a sentence for the caller."""


def decode_json(body: bytes, kind: Any = Any) -> Any:
    """`body` as `kind`: BadJSON when it is not valid JSON (a lone surrogate named), too deep, or
    nested past MAX_DEPTH; msgspec.ValidationError (unchanged) when it is JSON of the wrong shape."""
    try:
        value = msgspec.json.decode(body, type=kind)
    except RecursionError:
        raise BadJSON(_too_deep()) from None
    except msgspec.ValidationError as exc:
        if kind is Any:  # untyped, only a number past a float's range fails here (1e400)
            raise BadJSON(f"the body holds a number out of range ({exc}); send one within ±1.7e308") from None
        raise
    except msgspec.DecodeError as exc:
        raise BadJSON(_not_json(body, exc)) from None
    if depth_over(value, MAX_DEPTH):
        raise BadJSON(_too_deep())
    return value


def depth_over(value: Any, limit: int) -> bool:
    """Whether `value` nests dicts and lists more than `limit` deep (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _too_deep() -> str:
    return f"the body nests JSON objects and arrays more than {MAX_DEPTH} deep; send a flatter body"


def _not_json(body: bytes, exc: msgspec.DecodeError) -> str:
    lone = _LONE_SURROGATE.search(body)
    if lone is not None:
        escape = lone.group().decode()
        return (
            f"the body is not valid JSON: {escape} at byte {lone.start()} is half of a UTF-16 surrogate "
            "pair; send valid Unicode text (the character itself, or both halves of its pair)"
        )
    return f"the body is not valid JSON ({exc})"
