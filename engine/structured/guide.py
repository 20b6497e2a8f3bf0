"""A constraint on what one sequence may generate (JSON, a JSON schema, a regex, a Lark grammar),
applied by the sampler as a token mask at every step.

`Guide` is the declarative spec that travels in SamplingParams (over the wire to a remote PoP
too); the PoP's engine compiles it against its own tokenizer.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from engine.errors import InvalidRequestError

GuideKind = Literal["json", "json_schema", "regex", "lark"]
MAX_GUIDE_CHARS = 64 * 1024  # a schema, regex or grammar larger than this is refused where it enters
# JSON is generated with compact, fixed separators: free whitespace lets a model wander into spaces and
# newlines until max_tokens ends it mid-object (a schema may turn it back on with its own "x-guidance")
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


# an integer a schema leaves unbounded is held to 15 digits: below 2**53, so every JSON parser keeps
# it exact (JavaScript's and most others read numbers as doubles), and a sampled answer cannot run
# its digits on until max_tokens cuts it; a schema's own minimum or maximum wins on its side
MAX_EXACT_INTEGER = 10**15 - 1
# the keywords whose values are one subschema, a list of them, or a name -> subschema map
_ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames")
_ONE += ("unevaluatedProperties", "unevaluatedItems", "additionalItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


MAX_SCHEMA_DEPTH = 64  # subschemas nested deeper than this are left as they are (no recursion limit hit)


def map_subschemas(schema: Any, change: Any, depth: int = 0) -> Any:
    """A copy of `schema` with `change(subschema)` applied to it and to every subschema below it
    (bottom up, to MAX_SCHEMA_DEPTH); `schema` itself is not changed. A `true` subschema is read as
    `{}` (the same schema); other values are kept as they are."""
    if schema is True and depth:
        schema = {}
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH:
        return schema
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict) or out.get(key) is True:
            out[key] = map_subschemas(out[key], change, depth + 1)
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [map_subschemas(s, change, depth + 1) for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: map_subschemas(s, change, depth + 1) for name, s in out[key].items()}
    return change(out)


def _bound_integer(schema: dict[str, Any]) -> dict[str, Any]:
    types = schema.get("type")
    if types != "integer" and not (isinstance(types, list) and "integer" in types):
        return schema
    if "minimum" not in schema and "exclusiveMinimum" not in schema:
        schema["minimum"] = -MAX_EXACT_INTEGER
    if "maximum" not in schema and "exclusiveMaximum" not in schema:
        schema["maximum"] = MAX_EXACT_INTEGER
    return schema


def bounded_integers(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with every integer it leaves unbounded held to +-MAX_EXACT_INTEGER (a copy)."""
    return map_subschemas(schema, _bound_integer)


def with_json_options(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with the compact-JSON options as llguidance reads them inside a Lark `%json{...}`
    (its own "x-guidance" options win)."""
    own = schema.get("x-guidance")
    return {**schema, "x-guidance": {**JSON_OPTIONS, **(own if isinstance(own, dict) else {})}}


class CallFormat(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """What a tool-call guide's sequence needs to close its calls within max_tokens
    (engine.structured.tool_close.CallTracker): the format, the callable functions, their declared argument
    names, the GLM-4.5 arguments written raw ("*": undeclared ones too), and whether the reply must
    start with the calls. Built by engine.structured.tool_calls.guide_for, never taken from a client."""

    fmt: str
    names: list[str]
    keys: dict[str, list[str]] = msgspec.field(default_factory=dict)
    raw: dict[str, list[str]] = msgspec.field(default_factory=dict)
    opened: bool = False


class Guide(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """`json`: any JSON object; `json_schema`: JSON matching `schema`; `regex`: text matching
    `pattern`; `lark`: text in `grammar` (llguidance's Lark dialect, which may embed
    `%json{...}` schemas). `calls`: the grammar is a tool-call format's, whose calls the engine
    closes within the budget."""

    kind: GuideKind
    schema: dict[str, Any] | None = None
    pattern: str | None = None
    grammar: str | None = None
    calls: CallFormat | None = None

    def validate(self, param: str = "guide") -> None:
        """The spec's shape (that it compiles is checked by the engine that runs it)."""
        needs = {"json": None, "json_schema": "schema", "regex": "pattern", "lark": "grammar"}[self.kind]
        given = [name for name in ("schema", "pattern", "grammar") if getattr(self, name) is not None]
        if given != ([needs] if needs else []):
            want = f"'{needs}'" if needs else "nothing else"
            raise InvalidRequestError(param, f"a {self.kind} guide takes {want}, got {given or 'none'}")
        if self.calls is not None and self.kind != "lark":
            raise InvalidRequestError(param, "only a lark guide closes tool calls")
        size = len(msgspec.json.encode(self.schema)) if self.schema is not None else 0
        size += len(self.pattern or "") + len(self.grammar or "")
        if size > MAX_GUIDE_CHARS:
            raise InvalidRequestError(param, f"is {size} characters; at most {MAX_GUIDE_CHARS} are taken")
