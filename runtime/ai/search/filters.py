"""Metadata filters of a search, in both of Cloudflare's formats, checked once and applied to each
chunk's attributes before ranking (a filtered-out chunk is never a candidate).

- AI Search's: `{"folder": "docs/", "timestamp": {"$gte": 1735689600}, "category": {"$in": [...]}}`:
  each key an attribute, its value a literal (implicit $eq) or one object of operators ($eq, $ne,
  $in, $nin, $lt, $lte, $gt, $gte), all keys ANDed; `$and` / `$or` take lists of such objects.
- AutoRAG's (legacy): `{"type": "eq", "key": "folder", "value": "a/"}` with eq, ne, gt, gte, lt,
  lte, and `{"type": "and" | "or", "filters": [...]}`.

Attributes: `filename` (the item's key), `folder` (its key up to the last "/", with the slash),
`timestamp` (the item's last change, in ms; a comparison rounds both sides down to seconds, as
Cloudflare's does, and takes seconds or ms) and the item's custom metadata fields.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.ai.search.errors import INVALID, AISearchError

OPERATORS = ("$eq", "$ne", "$in", "$nin", "$lt", "$lte", "$gt", "$gte")
LEGACY = ("eq", "ne", "gt", "gte", "lt", "lte")
MAX_DEPTH = 4
MAX_TERMS = 64
Check = Callable[[dict[str, Any]], bool]


def _bad(why: str) -> AISearchError:
    return AISearchError(INVALID, f"ai_search_options.retrieval.filters: {why}")


def _scalar(value: Any, where: str) -> Any:
    if isinstance(value, bool) or isinstance(value, int | float | str):
        return value
    raise _bad(f"{where}: compare with a string, a number or a boolean, got {type(value).__name__}")


def _seconds(value: Any) -> Any:
    """A timestamp in ms or s, as whole seconds (Cloudflare rounds comparisons down to seconds)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value
    return int(number // 1000) if number >= 1e11 else int(number)


def _compare(op: str, key: str, target: Any) -> Check:
    def check(attrs: dict[str, Any]) -> bool:
        value = attrs.get(key)
        want = target
        if key == "timestamp":
            value = _seconds(value)
            want = [_seconds(t) for t in target] if isinstance(target, list) else _seconds(target)
        if op in ("$in", "$nin"):
            hit = value in want
            return hit if op == "$in" else not hit
        if op == "$eq":
            return value == want
        if op == "$ne":
            return value != want
        if value is None or isinstance(value, bool) != isinstance(want, bool):
            return False
        try:
            if op == "$lt":
                return value < want
            if op == "$lte":
                return value <= want
            if op == "$gt":
                return value > want
            return value >= want
        except TypeError:  # a string against a number: no match, as a typed index answers
            return False

    return check


def _field(key: str, spec: Any) -> list[Check]:
    if not isinstance(spec, dict):
        return [_compare("$eq", key, _scalar(spec, key))]
    if not spec:
        raise _bad(f"{key}: an empty condition; use {{'$eq': value}} or one of {', '.join(OPERATORS)}")
    checks = []
    for op, target in spec.items():
        if op not in OPERATORS:
            raise _bad(f"{key}: unknown operator {str(op)[:32]!r}; use one of {', '.join(OPERATORS)}")
        if op in ("$in", "$nin"):
            if not isinstance(target, list) or not target or len(target) > MAX_TERMS:
                raise _bad(f"{key}.{op}: a list of 1 to {MAX_TERMS} values")
            target = [_scalar(t, f"{key}.{op}") for t in target]
        else:
            target = _scalar(target, f"{key}.{op}")
        checks.append(_compare(op, key, target))
    return checks


def _modern(spec: dict, depth: int) -> Check:
    if depth > MAX_DEPTH:
        raise _bad(f"nested deeper than {MAX_DEPTH}")
    checks: list[Check] = []
    for key, value in spec.items():
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value or len(value) > MAX_TERMS:
                raise _bad(f"{key}: a list of 1 to {MAX_TERMS} filter objects")
            subs = [_modern(_object(v, key), depth + 1) for v in value]
            checks.append(
                (lambda s: lambda a: all(c(a) for c in s))(subs)
                if key == "$and"
                else (lambda s: lambda a: any(c(a) for c in s))(subs)
            )
        elif not isinstance(key, str) or not key or key.startswith("$"):
            raise _bad(f"{str(key)[:32]!r}: a metadata attribute name, or $and / $or")
        else:
            checks.extend(_field(key, value))
    return lambda attrs: all(c(attrs) for c in checks)


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise _bad(f"{where}: each entry is a filter object")
    return value


def _legacy(spec: dict, depth: int) -> Check:
    kind = spec.get("type")
    if kind in ("and", "or"):
        if depth > MAX_DEPTH:
            raise _bad(f"nested deeper than {MAX_DEPTH}")
        subs = spec.get("filters")
        if not isinstance(subs, list) or not subs or len(subs) > MAX_TERMS:
            raise _bad(f"a compound filter's `filters` is a list of 1 to {MAX_TERMS} filters")
        checks = [_legacy(_object(s, "filters"), depth + 1) for s in subs]
        return (
            (lambda a: all(c(a) for c in checks)) if kind == "and" else (lambda a: any(c(a) for c in checks))
        )
    if kind not in LEGACY:
        raise _bad(f"type {str(kind)[:32]!r}: use one of {', '.join(LEGACY)}, and, or")
    key = spec.get("key")
    if not isinstance(key, str) or not key:
        raise _bad("a comparison filter names its attribute in `key`")
    if "value" not in spec:
        raise _bad(f"{key}: a comparison filter gives `value`")
    return _compare("$" + kind, key, _scalar(spec["value"], key))


def compile_filter(spec: Any) -> Check | None:
    """The check a filter makes (None: no filter); AISearchError 7001 naming what is wrong."""
    if spec is None or spec == {}:
        return None
    if not isinstance(spec, dict):
        raise _bad("an object of attribute conditions, e.g. {'folder': 'docs/'}")
    if "type" in spec and ("key" in spec or "filters" in spec):
        return _legacy(spec, 0)
    return _modern(spec, 0)


def attributes(key: str, object_time_s: float, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """A chunk's attributes as filters and boosts read them."""
    folder = key.rsplit("/", 1)[0] + "/" if "/" in key else ""
    return {**(metadata or {}), "filename": key, "folder": folder, "timestamp": int(object_time_s * 1000)}
