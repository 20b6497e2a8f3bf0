"""A tool's argument schema as calls are held to it: objects take no keys the schema never named
unless it says they may (`closed`, as OpenAI's strict mode has every object say), and the small
check of a call's arguments against it that the edge applies where no grammar made them (an
upstream's calls: parsed, never trusted).

`check` knows the keywords tool schemas use (type, enum, const, properties, required,
additionalProperties, items, prefixItems, the length and range bounds, pattern, anyOf/oneOf/allOf
and local $refs); a keyword it does not know constrains nothing here (the grammar still holds it
where our engine generated the call).
"""

from __future__ import annotations

import math
import re
from typing import Any

from engine.structured.guide import map_subschemas

MAX_DEPTH = 64  # a schema or a value nested deeper than this is refused by `check`

_NESTED_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else")
_NESTED_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_NESTED_MAP = ("properties", "$defs", "definitions", "patternProperties")


def closed(schema: Any, depth: int = 0) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that names its properties
    and says nothing of others (one with patternProperties, or its own additionalProperties, keeps
    what it says; one naming no properties at all stays a free-form object)."""
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return schema
    out = dict(schema)
    for key in _NESTED_ONE:
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key], depth + 1)
    if isinstance(out.get("items"), list):  # (the old tuple form)
        out["items"] = [closed(s, depth + 1) for s in out["items"]]
    for key in _NESTED_LIST:
        if isinstance(out.get(key), list):
            out[key] = [closed(s, depth + 1) for s in out[key]]
    for key in _NESTED_MAP:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(s, depth + 1) for k, s in out[key].items()}
    if (
        isinstance(out.get("properties"), dict)
        and "additionalProperties" not in out
        and "patternProperties" not in out
        and "unevaluatedProperties" not in out
    ):
        out["additionalProperties"] = False
    return out


def extras_allowed(schema: dict[str, Any]) -> bool:
    """Whether an object schema lets keys it does not name in (after `closed`)."""
    return schema.get("additionalProperties", True) is not False


_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _same(a: Any, b: Any) -> bool:
    """JSON equality (1 == 1.0, but True is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def check(value: Any, schema: Any, root: Any = None, where: str = "arguments", depth: int = 0) -> str | None:
    """Why `value` breaks `schema` (None when it follows it as far as these keywords go)."""
    root = schema if root is None else root
    if depth > MAX_DEPTH:
        return f"{where}: nested too deep"
    if schema is True or schema is None or not isinstance(schema, dict):
        return None if schema is not False else f"{where}: not allowed"
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _resolve(ref, root)
        if target is None:
            return None  # (a remote or unknown $ref constrains nothing here)
        err = check(value, target, root, where, depth + 1)
        if err:
            return err
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else None
    if kinds is not None and not any(_TYPES.get(k, lambda v: True)(value) for k in kinds):
        return f"{where}: {value!r:.40} is not of type {kind}"
    if "enum" in schema and isinstance(schema["enum"], list):
        if not any(_same(value, e) for e in schema["enum"]):
            return f"{where}: {value!r:.40} is not one of {schema['enum']!r:.80}"
    if "const" in schema and not _same(value, schema["const"]):
        return f"{where}: {value!r:.40} is not {schema['const']!r:.40}"
    for key in ("allOf",):
        for sub in schema.get(key) or []:
            if err := check(value, sub, root, where, depth + 1):
                return err
    for key in ("anyOf", "oneOf"):
        subs = schema.get(key)
        if isinstance(subs, list) and subs:
            if all(check(value, sub, root, where, depth + 1) for sub in subs):
                return f"{where}: matches none of its {key}"
    if isinstance(value, dict):
        return _object(value, schema, root, where, depth)
    if isinstance(value, list):
        return _array(value, schema, root, where, depth)
    if isinstance(value, str):
        return _string(value, schema, where)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number(value, schema, where)
    return None


def _resolve(ref: str, root: Any) -> Any:
    if not ref.startswith("#"):
        return None
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _object(value: dict, schema: dict, root: Any, where: str, depth: int) -> str | None:
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    for key in schema.get("required") or []:
        if key not in value:
            return f"{where}: {key!r} is required"
    patterns = schema.get("patternProperties") if isinstance(schema.get("patternProperties"), dict) else {}
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        at = f"{where}.{key}"
        if key in props:
            if err := check(item, props[key], root, at, depth + 1):
                return err
            continue
        matched = [s for p, s in patterns.items() if _search(p, key)]
        for sub in matched:
            if err := check(item, sub, root, at, depth + 1):
                return err
        if not matched:
            if extra is False:
                return f"{where}: {key!r} is not a declared argument"
            if isinstance(extra, dict) and (err := check(item, extra, root, at, depth + 1)):
                return err
    for bound, ok in (("minProperties", len(value).__ge__), ("maxProperties", len(value).__le__)):
        if isinstance(schema.get(bound), int) and not ok(schema[bound]):
            return f"{where}: {len(value)} keys break {bound} {schema[bound]}"
    return None


def _array(value: list, schema: dict, root: Any, where: str, depth: int) -> str | None:
    prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
    items = schema.get("items")
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else items if isinstance(items, (dict, bool)) else None
        if sub is not None and (err := check(item, sub, root, f"{where}[{i}]", depth + 1)):
            return err
    for bound, ok in (("minItems", len(value).__ge__), ("maxItems", len(value).__le__)):
        if isinstance(schema.get(bound), int) and not ok(schema[bound]):
            return f"{where}: {len(value)} items break {bound} {schema[bound]}"
    return None


def _string(value: str, schema: dict, where: str) -> str | None:
    n = len(value)
    for bound, ok in (("minLength", n.__ge__), ("maxLength", n.__le__)):
        if isinstance(schema.get(bound), int) and not ok(schema[bound]):
            return f"{where}: {n} characters break {bound} {schema[bound]}"
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and not _search(pattern, value):
        return f"{where}: {value!r:.40} does not match {pattern!r:.40}"
    return None


def _number(value: float, schema: dict, where: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: not a finite number"
    for bound, ok in (
        ("minimum", lambda b: value >= b),
        ("maximum", lambda b: value <= b),
        ("exclusiveMinimum", lambda b: value > b),
        ("exclusiveMaximum", lambda b: value < b),
    ):
        limit = schema.get(bound)
        if isinstance(limit, (int, float)) and not isinstance(limit, bool) and not ok(limit):
            return f"{where}: {value} breaks {bound} {limit}"
    step = schema.get("multipleOf")
    if isinstance(step, (int, float)) and step > 0 and not math.isclose(value / step, round(value / step)):
        return f"{where}: {value} is not a multiple of {step}"
    return None


def _search(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return True  # (a pattern Python cannot read constrains nothing here)


# --- text that must not spell a marker --------------------------------------------------------------

# the $defs entry a schema's any-value subschemas become (a JSON value whose strings hold no marker)
ANY_VALUE_DEF = "edge_value_without_markers"
# an untyped subschema constrains only through these; one with none of them takes any value
_CONSTRAINING = {
    "type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf", "not", "if", "properties",
    "patternProperties", "additionalProperties", "items", "prefixItems", "required", "pattern",
    "format", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minItems", "maxItems", "uniqueItems", "contains", "minProperties", "maxProperties",
}  # fmt: skip


def _class(chars: set[str], negate: bool = False) -> str:
    """A regex character class of `chars`, read alike by Rust's regex crate (which llguidance uses)
    and Python's: only what is special inside a class is escaped (never `<` or `>`, which Rust reads
    escaped as word boundaries)."""
    inner = "".join("\\" + c if c in "\\[]^-&~" else c for c in sorted(chars))
    return f"[{'^' if negate else ''}{inner}]"


def excluding_pattern(markers: list[str]) -> str:
    """A JSON-schema `pattern` (a plain regex: llguidance has no look-ahead) matching exactly the
    strings that contain none of `markers`. Each marker starts with `<` and holds no other `<`, so
    a string holds one iff the text after one of its `<` starts with that marker's rest: the string
    is `<`-free text, then pieces `<` + text, where no piece's text starts with a marker's rest
    (a trie of the rests, left before any of them is whole)."""
    if not markers or any(not m.startswith("<") or "<" in m[1:] or len(m) < 2 for m in markers):
        raise ValueError("each marker starts with '<' and holds no other '<'")
    trie: dict = {}
    for marker in markers:
        node = trie
        for ch in marker[1:]:
            node = node.setdefault(ch, {})
        node[""] = True  # a marker's rest ends here: the text may not reach this node

    def rest(node: dict) -> str:
        # the text after a `<` from this trie node: it ends here, leaves the trie (a character no
        # branch takes, then any `<`-free text) or follows a branch that no marker ends on
        children = {ch: sub for ch, sub in node.items() if ch}
        options = ["", _class({"<", *children}, negate=True) + "[^<]*"]
        options += [_class({ch}) + rest(sub) for ch, sub in sorted(children.items()) if "" not in sub]
        return "(?:" + "|".join(options) + ")"

    return f"^[^<]*(?:<{rest(trie)})*$"


def _any_value(pattern: str) -> dict[str, Any]:
    """Any JSON value whose strings (at any depth) match `pattern`; its object keys are free (the
    grammar engine reads no propertyNames)."""
    ref = {"$ref": f"#/$defs/{ANY_VALUE_DEF}"}
    return {
        "anyOf": [
            {"type": "string", "pattern": pattern},
            {"type": ["number", "boolean", "null"]},
            {"type": "array", "items": ref},
            {"type": "object", "additionalProperties": ref},
        ]
    }


def without_markers(schema: dict[str, Any], markers: list[str]) -> dict[str, Any]:
    """`schema` (a copy) with every string it lets the model write held to not contain `markers`
    (excluding_pattern): a tool call's argument must not spell its own format's markup, which would
    end the call early or start another inside it for the parser. Strings the schema itself names
    (enum, const) are the client's own and left as they are; so are undeclared keys."""
    pattern = excluding_pattern(markers)
    used = []

    def change(node: dict[str, Any]) -> dict[str, Any]:
        if "enum" in node or "const" in node:
            return node
        if not (set(node) & _CONSTRAINING):  # any value
            used.append(True)
            return {"$ref": f"#/$defs/{ANY_VALUE_DEF}"}
        types = node.get("type")
        strings = types == "string" or (isinstance(types, list) and "string" in types)
        if not strings:
            return node
        if isinstance(types, list) and len(types) > 1:  # the pattern holds strings only: split them off
            others = {**node, "type": [t for t in types if t != "string"]}
            return {"anyOf": [change({**node, "type": "string"}), others]}
        if "pattern" in node or "format" in node:  # its own too: both must hold
            return {"allOf": [node, {"type": "string", "pattern": pattern}]}
        return {**node, "pattern": pattern}

    out = map_subschemas(schema, change)
    if used:
        out["$defs"] = {**(out.get("$defs") or {}), ANY_VALUE_DEF: _any_value(pattern)}
    return out
