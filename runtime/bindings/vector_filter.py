"""Vectorize's metadata filters: `{"genre": "drama"}` (implicit $eq), `{"year": {"$gte": 2000}}`,
`{"tag": {"$in": ["a", "b"]}}`, dotted keys for nested metadata (`"author.name"`); every key of a
filter must match. Operators: $eq, $ne, $in, $nin, $lt, $lte, $gt, $gte, as Cloudflare documents.
A filter is checked once (check_filter), then applied to each vector's metadata (matches). Nothing
here recurses over a filter or metadata: a value nested past the stack's depth cannot crash a call."""

from __future__ import annotations

import json
from typing import Any

from runtime.bindings.common import BindingError

OPERATORS = ("$eq", "$ne", "$in", "$nin", "$lt", "$lte", "$gt", "$gte")
FILTER_BYTES = 2048  # a filter's JSON, as Cloudflare bounds it
MAX_IN = 100  # values in one $in / $nin
FILTER_DEPTH = 3  # {key: {operator: [values]}}: the deepest a filter's JSON nests
_MISSING = object()


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def check_filter(what: str, given: Any) -> dict[str, dict[str, Any]]:
    """`given` as {key: {operator: value}}; BindingError saying what to change."""
    if not isinstance(given, dict):
        raise BindingError("TypeError", f"{what}: filter must be an object such as {{'genre': 'drama'}}")
    if nests_deeper(given, FILTER_DEPTH):  # before json.dumps, which recurses
        raise BindingError(
            "TypeError",
            f"{what}: filter nests objects and arrays more than {FILTER_DEPTH} deep; a filter is "
            "{key: value} or {key: {operator: value}}, each value a string, number, boolean, null "
            "or (for $in and $nin) a list of them; name a nested property with a dotted key ('author.name')",
        )
    try:
        size = len(json.dumps(given, allow_nan=False).encode())
    except (TypeError, ValueError):
        raise BindingError(
            "TypeError", f"{what}: filter must be JSON (strings, numbers, booleans, null)"
        ) from None
    if size > FILTER_BYTES:
        raise BindingError(
            "RangeError", f"{what}: filter is {size} bytes of JSON; the limit is {FILTER_BYTES}"
        )
    out: dict[str, dict[str, Any]] = {}
    for key, cond in given.items():
        if not isinstance(key, str) or not key or key.startswith("$"):
            raise BindingError("TypeError", f"{what}: filter keys are metadata property names, got {key!r}")
        ops = cond if isinstance(cond, dict) else {"$eq": cond}
        if not ops:
            raise BindingError(
                "TypeError", f"{what}: filter.{key} names no operator ({', '.join(OPERATORS)})"
            )
        for op, value in ops.items():
            if op not in OPERATORS:
                raise BindingError(
                    "TypeError",
                    f"{what}: filter.{key}: unknown operator {op!r}; use one of {', '.join(OPERATORS)}",
                )
            if op in ("$in", "$nin"):
                if not isinstance(value, list) or not all(map(_scalar, value)) or len(value) > MAX_IN:
                    raise BindingError(
                        "TypeError",
                        f"{what}: filter.{key}.{op} takes a list of at most {MAX_IN} scalar values",
                    )
            elif not _scalar(value) or (op in ("$lt", "$lte", "$gt", "$gte") and not _ordered(value)):
                kind = (
                    "a number or a string"
                    if op not in ("$eq", "$ne")
                    else "a string, number, boolean or null"
                )
                raise BindingError("TypeError", f"{what}: filter.{key}.{op} takes {kind}, got {value!r}")
        out[key] = ops
    return out


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether `value` nests dicts and lists more than `limit` deep (the outermost one is 1 deep),
    walked without recursion and stopping at the first level past `limit`."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _ordered(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _lookup(metadata: Any, key: str) -> Any:
    value = metadata
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (_number(a) and _number(b) and a == b)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _compare(have: Any, op: str, want: Any) -> bool:
    if not (_number(have) and _number(want)) and not (isinstance(have, str) and isinstance(want, str)):
        return False  # a range compares numbers with numbers and strings with strings only
    return {"$lt": have < want, "$lte": have <= want, "$gt": have > want, "$gte": have >= want}[op]


def matches(metadata: Any, checked: dict[str, dict[str, Any]]) -> bool:
    """Whether a vector's metadata meets every condition of a checked filter."""
    for key, ops in checked.items():
        have = _lookup(metadata, key)
        for op, want in ops.items():
            if op == "$eq":
                ok = have is not _MISSING and _same(have, want)
            elif op == "$ne":
                ok = have is _MISSING or not _same(have, want)
            elif op == "$in":
                ok = have is not _MISSING and any(_same(have, w) for w in want)
            elif op == "$nin":
                ok = have is _MISSING or not any(_same(have, w) for w in want)
            else:
                ok = have is not _MISSING and _compare(have, op, want)
            if not ok:
                return False
    return True
