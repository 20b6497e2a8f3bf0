"""The query of AI Gateway's log list (GET .../ai-gateway/gateways/{id}/logs), checked once and run
in SQL: Cloudflare's parameters as the `cloudflare` SDK's LogListParams sends them, each refused by
name with what to send instead (QueryError). What each reads is a column of the store's `logs`
table (runtime.ai.gateway_store), so a filter is a WHERE term and the page an index walk, never
rows decoded in Python.

- `page` (from 1) and `per_page` (1 to 50, default 20, as Cloudflare's docs bound it; the SDK's
  types give no bound): a page past the last is empty, which is how the SDK's auto-pagination stops;
- `order_by` (created_at, provider, model, model_type, success, cached: the SDK's list) and
  `order_by_direction` (or the older `direction`), newest first by default; ties broken by the
  row's id in the same direction, so the order is total and a row appears on one page only;
- `success`, `cached`, `feedback` (-1, 0, 1: the SDK's literal names 0 and 1, and patchLog also
  writes -1), `model`, `model_type`, `provider`, `request_content_type`, `response_content_type`:
  equal to; `start_date` / `end_date` (ISO-8601; no zone is UTC): created at or after / before or at;
  `min_*` / `max_*` of cost, duration (ms), tokens_in, tokens_out, total_tokens: bounds, inclusive;
  `search`: the text in the row's metadata (the SDK: "free-text search over log metadata");
  `meta_info`: the page's result_info also gives the min and max of those five over every row
  matched, as Cloudflare's result_info does;
- `filters`: {key, operator, value[]}, operator eq (any value), neq (none of them), contains (text
  keys), lt and gt (one value; numbers and created_at). The SDK drops a null value from the query,
  so a filter that arrives with no value compares with null: eq is "not set", neq "set". The SDK's
  query loses which value is whose when several filters come (its HTTP client groups the pairs by
  name): then each filter takes one value (_sdk_filters), or `filters` comes as one JSON list.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

PER_PAGE, MAX_PER_PAGE = 20, 50
MAX_PAGE = 1_000_000_000  # past any row; keeps OFFSET inside SQLite's integers
MAX_FILTERS, MAX_VALUES, MAX_TEXT = 20, 50, 256

# order_by: the column each sorts on
ORDER_BY = {
    "created_at": "created",
    "provider": "provider",
    "model": "model",
    "model_type": "model_type",
    "success": "success",
    "cached": "cached",
}
DIRECTIONS = ("asc", "desc")
TEXT, NUMBER, BOOL, DATE = "text", "number", "boolean", "date"
# each filter key: the SQL expression it reads, of what kind. Keys this edge records nothing for read
# a constant: every door here takes the account's token (authentication), nothing is billed through
# a gateway (wholesale), no DLP runs (dlp_action) and no user agent is kept.
FILTER_KEYS: dict[str, tuple[str, str]] = {
    "id": ("id", TEXT),
    "created_at": ("created", DATE),
    "request_content_type": ("request_content_type", TEXT),
    "response_content_type": ("response_content_type", TEXT),
    "request_type": ("request_type", TEXT),
    "success": ("success", BOOL),
    "cached": ("cached", BOOL),
    "provider": ("provider", TEXT),
    "model": ("model", TEXT),
    "model_type": ("model_type", TEXT),
    "cost": ("cost", NUMBER),
    "tokens": ("(coalesce(tokens_in, 0) + coalesce(tokens_out, 0))", NUMBER),
    "tokens_in": ("tokens_in", NUMBER),
    "tokens_out": ("tokens_out", NUMBER),
    "duration": ("duration", NUMBER),
    "feedback": ("feedback", NUMBER),
    "event_id": ("event_id", TEXT),
    "metadata.key": ("key", TEXT),  # of an entry of the row's metadata (json_each)
    "metadata.value": ("value", TEXT),
    "authentication": ("1", BOOL),
    "wholesale": ("0", BOOL),
    "compatibilityMode": ("(request_type = 'compat')", BOOL),
    "dlp_action": ("NULL", TEXT),
    "user_agent": ("NULL", TEXT),
}
OPERATORS = {TEXT: ("eq", "neq", "contains"), NUMBER: ("eq", "neq", "lt", "gt"), BOOL: ("eq", "neq")}
OPERATORS[DATE] = OPERATORS[NUMBER]
# min_/max_ bounds and meta_info's aggregates: the column each reads
RANGES = {
    "cost": "cost",
    "duration": "duration",
    "tokens_in": "tokens_in",
    "tokens_out": "tokens_out",
    "total_tokens": "(coalesce(tokens_in, 0) + coalesce(tokens_out, 0))",
}
EQUALS = {  # parameter: (column, kind)
    "success": ("success", BOOL),
    "cached": ("cached", BOOL),
    "feedback": ("feedback", NUMBER),
    "model": ("model", TEXT),
    "model_type": ("model_type", TEXT),
    "provider": ("provider", TEXT),
    "request_content_type": ("request_content_type", TEXT),
    "response_content_type": ("response_content_type", TEXT),
}
SCALARS = (
    {"page", "per_page", "order_by", "order_by_direction", "direction", "search", "meta_info"}
    | {"start_date", "end_date"}
    | set(EQUALS)
    | {f"{end}_{name}" for end in ("min", "max") for name in RANGES}
)


class QueryError(ValueError):
    """A parameter that does not read: `param` names it, the message says what to send."""

    def __init__(self, param: str, why: str):
        super().__init__(f"{param}: {why}")
        self.param = param


@dataclass(frozen=True)
class LogQuery:
    """A checked log list query: its page, its order, and the WHERE terms (with their `?` values,
    in order) that select its rows within one account's gateway."""

    page: int = 1
    per_page: int = PER_PAGE
    order_by: str = "created_at"
    descending: bool = True
    meta_info: bool = False
    terms: tuple[str, ...] = ()
    values: tuple[Any, ...] = field(default=())

    @classmethod
    def parse(cls, items: Iterable[tuple[str, str]]) -> LogQuery:
        """The query of a request's (key, value) pairs, in their order; QueryError naming the first
        parameter that does not read."""
        scalars: dict[str, str] = {}
        filters: list[dict[str, Any]] = []
        parts: dict[str, list[str]] = {"filters.key": [], "filters.operator": [], "filters.value": []}
        for key, value in items:
            if key in SCALARS:
                scalars[key] = value  # a repeated one: the last, as a plain query string reads
            elif key == "filters":  # a JSON list of filters (curl's way), beside the SDK's
                filters.extend(_json_filters(value))
            elif key in parts:
                parts[key].append(value)
            else:
                known = ", ".join(sorted(SCALARS | {"filters"}))
                raise QueryError(key[:64], f"no such parameter; the log list takes {known}")
        filters.extend(_sdk_filters(parts))
        if len(filters) > MAX_FILTERS:
            raise QueryError("filters", f"at most {MAX_FILTERS} filters")
        terms: list[str] = []
        values: list[Any] = []
        for name, (column, kind) in EQUALS.items():
            if name in scalars:
                terms.append(f"{column} = ?")
                values.append(_value(name, kind, scalars[name], feedback=name == "feedback"))
        for end, op in (("start_date", ">="), ("end_date", "<=")):
            if end in scalars:
                terms.append(f"created {op} ?")
                values.append(_value(end, DATE, scalars[end]))
        for name, column in RANGES.items():
            for end, op in (("min", ">="), ("max", "<=")):
                if f"{end}_{name}" in scalars:
                    terms.append(f"{column} {op} ?")
                    values.append(_value(f"{end}_{name}", NUMBER, scalars[f"{end}_{name}"]))
        if "search" in scalars:
            terms.append("metadata LIKE ? ESCAPE '\\'")
            values.append(_like(_text("search", scalars["search"])))
        for i, spec in enumerate(filters):
            term, more = _filter(i, spec)
            terms.append(term)
            values.extend(more)
        order_by = scalars.get("order_by", "created_at")
        if order_by not in ORDER_BY:
            raise QueryError("order_by", f"{order_by[:64]!r} is not one of {', '.join(ORDER_BY)}")
        direction = scalars.get("order_by_direction", scalars.get("direction", "desc"))
        if direction not in DIRECTIONS:
            which = "order_by_direction" if "order_by_direction" in scalars else "direction"
            raise QueryError(which, f'{direction[:64]!r}: give "asc" or "desc"')
        return cls(
            page=integer("page", scalars.get("page", "1"), 1, MAX_PAGE),
            per_page=integer("per_page", scalars.get("per_page", str(PER_PAGE)), 1, MAX_PER_PAGE),
            order_by=order_by,
            descending=direction == "desc",
            meta_info=_value("meta_info", BOOL, scalars["meta_info"]) if "meta_info" in scalars else False,
            terms=tuple(terms),
            values=tuple(values),
        )

    def where(self) -> str:
        """The terms joined, each in parentheses (an empty query: TRUE)."""
        return " AND ".join(f"({t})" for t in self.terms) or "1"

    def order(self) -> str:
        """ORDER BY the chosen column, then the row's id the same way: a total order, so pages
        neither repeat nor skip a row."""
        direction = "DESC" if self.descending else "ASC"
        return f"ORDER BY {ORDER_BY[self.order_by]} {direction}, id {direction}"

    def offset(self) -> int:
        return (self.page - 1) * self.per_page

    @staticmethod
    def aggregates() -> str:
        """meta_info's min and max of each range, in RANGES' order (min, max, min, max, ...)."""
        return ", ".join(f"MIN({c}), MAX({c})" for c in RANGES.values())

    @staticmethod
    def meta(row: tuple[Any, ...]) -> dict[str, Any]:
        """The aggregates' row as result_info's min_* and max_* (None where no row has one)."""
        out: dict[str, Any] = {}
        for i, name in enumerate(RANGES):
            for end, value in (("min", row[2 * i]), ("max", row[2 * i + 1])):
                # the counts and milliseconds whole, as a row gives them; cost a number
                whole = value is not None and name != "cost"
                out[f"{end}_{name}"] = round(value) if whole else value
        return out


def _sdk_filters(parts: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The SDK's filters: it writes each filter's key, operator and values under `filters.key`,
    `filters.operator` and `filters.value`, and its HTTP client groups a query's pairs by name, so
    what arrives is every key, then every operator, then every value, in order. The n-th key and
    operator are a filter's; the values are the one filter's, or the n-th value the n-th filter's
    when each has one. Any other split cannot be read back: QueryError, asking for one value a
    filter (or the JSON list)."""
    keys, operators, values = parts["filters.key"], parts["filters.operator"], parts["filters.value"]
    if not keys:
        if operators or values:
            raise QueryError("filters.key", "each filter needs its key")
        return []
    if len(operators) != len(keys):
        raise QueryError("filters.operator", f"{len(keys)} filters need {len(keys)} operators")
    if len(keys) == 1:
        return [{"key": keys[0], "operator": operators[0], "value": values}]
    if len(values) != len(keys):
        raise QueryError(
            "filters.value",
            f"{len(values)} values for {len(keys)} filters: the query cannot say whose each is; give each "
            'filter one value (a filter of several values alone), or send filters=[{"key", "operator", '
            '"value"}, ...] as JSON',
        )
    return [{"key": k, "operator": o, "value": [v]} for k, o, v in zip(keys, operators, values, strict=True)]


def _json_filters(text: str) -> list[dict[str, Any]]:
    try:
        filters = json.loads(text)
    except ValueError:
        raise QueryError(
            "filters", "a JSON list of {key, operator, value}, or the SDK's filters.key=.."
        ) from None
    if not isinstance(filters, list) or not all(isinstance(f, dict) for f in filters):
        raise QueryError("filters", "a JSON list of {key, operator, value}")
    out = []
    for f in filters:
        value = f.get("value", [])
        value = value if isinstance(value, list) else [value]
        # JSON's own types written as the query writes them (true, 1.5), null dropped as the SDK drops it
        written = [json.dumps(v) if isinstance(v, bool) else str(v) for v in value if v is not None]
        out.append({**f, "value": written})
    return out


def _filter(i: int, spec: dict[str, Any]) -> tuple[str, list[Any]]:
    """One filter as a WHERE term and its values."""
    key, operator, raw = spec.get("key"), spec.get("operator"), spec.get("value", [])
    if not isinstance(key, str) or key not in FILTER_KEYS:
        raise QueryError(f"filters.{i}.key", f"{str(key)[:64]!r} is not one of {', '.join(FILTER_KEYS)}")
    expr, kind = FILTER_KEYS[key]
    if not isinstance(operator, str) or operator not in OPERATORS[kind]:
        ops = ", ".join(OPERATORS[kind])
        raise QueryError(f"filters.{i}.operator", f"{str(operator)[:16]!r}: {key} takes {ops}")
    where = f"filters.{i}.value"
    if len(raw) > MAX_VALUES:
        raise QueryError(where, f"at most {MAX_VALUES} values")
    values = [_value(where, kind, v, feedback=key == "feedback") for v in raw]
    if operator in ("lt", "gt") and len(values) != 1:
        raise QueryError(where, f"{operator} compares with one value")
    if operator == "contains" and not values:
        raise QueryError(where, "contains needs a value")
    if not key.startswith("metadata."):
        return _compare(expr, operator, values), values
    # an entry of the row's metadata matches (eq, contains), or none does (neq)
    if not values:
        raise QueryError(where, f"{key} needs a value")
    if key == "metadata.value":  # booleans as the query writes them, numbers as their text
        expr = "CASE type WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' ELSE CAST(value AS TEXT) END"
    term = _compare(expr, "eq" if operator == "neq" else operator, values)
    exists = f"EXISTS (SELECT 1 FROM json_each(logs.metadata) WHERE {term})"
    return (f"NOT {exists}" if operator == "neq" else exists), values


def _compare(expr: str, operator: str, values: list[Any]) -> str:
    if operator in ("lt", "gt"):
        return f"{expr} {'<' if operator == 'lt' else '>'} ?"
    if operator == "contains":
        values[:] = [_like(v) for v in values]
        return " OR ".join(f"{expr} LIKE ? ESCAPE '\\'" for _ in values)
    if not values:  # the SDK's null, dropped from the query: compare with null
        return f"{expr} IS NULL" if operator == "eq" else f"{expr} IS NOT NULL"
    marks = ",".join("?" * len(values))
    return f"{expr} IN ({marks})" if operator == "eq" else f"{expr} IS NULL OR {expr} NOT IN ({marks})"


def _value(param: str, kind: str, raw: str, feedback: bool = False) -> Any:
    if kind == BOOL:
        if raw not in ("true", "false"):
            raise QueryError(param, f"{raw[:32]!r}: give true or false")
        return 1 if raw == "true" else 0
    if kind == NUMBER:
        try:
            number = float(raw)
        except ValueError:
            raise QueryError(param, f"{raw[:32]!r} is not a number") from None
        if not math.isfinite(number):
            raise QueryError(param, "give a finite number")
        if feedback and number not in (-1, 0, 1):
            raise QueryError(param, f"{raw[:32]!r}: feedback is -1, 0 or 1")
        return number
    if kind == DATE:
        try:
            when = datetime.fromisoformat(raw)
        except ValueError:
            raise QueryError(
                param, f"{raw[:40]!r}: give an ISO-8601 date-time (2026-01-31T12:00:00Z)"
            ) from None
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    return _text(param, raw)


def _text(param: str, raw: str) -> str:
    if len(raw) > MAX_TEXT:
        raise QueryError(param, f"at most {MAX_TEXT} characters")
    try:
        raw.encode()
    except UnicodeEncodeError:  # half a surrogate pair (JSON's "\ud800"): no database takes it
        raise QueryError(param, "holds half a UTF-16 surrogate pair; send whole characters") from None
    return raw


def _like(text: str) -> str:
    """A LIKE pattern for text anywhere (its own % and _ matched as themselves)."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def integer(param: str, raw: str, low: int, high: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise QueryError(param, f"{raw[:32]!r}: give an integer from {low} to {high}")
    return value


def list_page(
    db: sqlite3.Connection, account: str, gateway: str, query: LogQuery
) -> tuple[list[str], int, dict[str, Any]]:
    """The page's rows (their JSON, in order), how many rows match in all, and meta_info's min and
    max (empty unless asked): a count and a walk of the (account, gateway, created, id) index."""
    where = f"account=? AND gateway=? AND {query.where()}"
    args = (account, gateway, *query.values)
    # the page's rowids first, then its rows: an order no index holds sorts the sort keys and rowids
    # of the rows before the page, not their JSON (4x less time a page, by model over 20,000 rows)
    rows = db.execute(
        f"SELECT row FROM logs WHERE rowid IN (SELECT rowid FROM logs WHERE {where} {query.order()} "
        f"LIMIT ? OFFSET ?) {query.order()}",
        (*args, query.per_page, query.offset()),
    ).fetchall()
    if query.meta_info:
        found = db.execute(f"SELECT COUNT(*), {query.aggregates()} FROM logs WHERE {where}", args).fetchone()
        return [r[0] for r in rows], found[0], query.meta(found[1:])
    return (
        [r[0] for r in rows],
        db.execute(f"SELECT COUNT(*) FROM logs WHERE {where}", args).fetchone()[0],
        {},
    )
