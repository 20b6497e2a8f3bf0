"""`env.DB`: a D1 database binding (prepare, bind, all / first / run / raw, batch, exec)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from workers.binding_values import (
    BindingError,
    JsObject,
    Transport,
    merge_options,
)


def _params(values: Iterable[Any]) -> list[Any]:
    out = []
    for v in values:
        if isinstance(v, (bytearray, memoryview)):
            v = bytes(v)
        if v is not None and not isinstance(v, (bool, int, float, str, bytes)):
            raise TypeError(
                f"D1_TYPE_ERROR: type {type(v).__name__!r} not supported for value {v!r}: "
                "bind None, bool, int, float, str or bytes"
            )
        out.append(v)
    return out


def _d1_result(raw: dict, rows: bool = True) -> JsObject:
    columns = raw["columns"]
    results = [JsObject(zip(columns, row, strict=True)) for row in raw["rows"]] if rows else []
    return JsObject(success=True, meta=JsObject(raw["meta"]), results=results)


class D1PreparedStatement:
    """`env.DB.prepare(sql)`: `.bind(*values)` returns a bound copy; `all`, `first`, `run`, `raw`."""

    def __init__(self, transport: Transport, sql: str, params: list[Any] | None = None):
        if not isinstance(sql, str):
            raise TypeError(f"D1 prepare: the query must be a string, got {type(sql).__name__}")
        self._call, self.sql, self.params = transport, sql, params or []

    def bind(self, *values: Any) -> D1PreparedStatement:
        return D1PreparedStatement(self._call, self.sql, _params(values))

    def _wire(self) -> list[Any]:
        return [self.sql, self.params]

    async def all(self) -> JsObject:
        """`{"results": [row dicts], "success": True, "meta": {...}}`."""
        return _d1_result(await self._call("query", self._wire(), {}))

    async def run(self) -> JsObject:
        """As all(): Cloudflare's run returns the same D1Result."""
        return _d1_result(await self._call("query", self._wire(), {}))

    async def first(self, column: str | None = None, /, **kwargs: Any) -> Any:
        """The first row (a dict), or that row's `column`; None when there is no row."""
        column = column if column is not None else kwargs.get("colName", kwargs.get("column"))
        raw = await self._call("query", self._wire(), {"first": True})
        if not raw["rows"]:
            return None
        row = JsObject(zip(raw["columns"], raw["rows"][0], strict=True))
        if column is None:
            return row
        if column not in row:
            raise BindingError("D1_COLUMN_NOTFOUND", f"D1_COLUMN_NOTFOUND: column not found ({column})")
        return row[column]

    async def raw(self, options: dict[str, Any] | None = None, *, columnNames: bool = False) -> list[list]:  # noqa: N803
        """Rows as lists; with columnNames=True the first list is the column names."""
        names = bool(
            merge_options(options, {"columnNames": columnNames or None}, "D1 raw").get("columnNames")
        )
        raw = await self._call("query", self._wire(), {})
        rows = [list(r) for r in raw["rows"]]
        return [list(raw["columns"]), *rows] if names else rows

    def __repr__(self) -> str:
        return f"D1PreparedStatement({self.sql!r}, {len(self.params)} parameter(s))"


class D1Database:
    """`env.DB`: prepare / batch / exec, as D1. The runtime runs the SQL (never the isolate)."""

    def __init__(self, transport: Transport):
        self._call = transport

    def prepare(self, query: str) -> D1PreparedStatement:
        return D1PreparedStatement(self._call, query)

    async def batch(self, statements: list[D1PreparedStatement]) -> list[JsObject]:
        """Run the statements in order in one transaction: all succeed, or none is applied."""
        if not all(isinstance(s, D1PreparedStatement) for s in statements):
            raise TypeError("D1 batch: pass a list of statements made by env.DB.prepare(...)")
        raw = await self._call("batch", [[s._wire() for s in statements]], {})
        return [_d1_result(r) for r in raw]

    async def exec(self, query: str) -> JsObject:
        """Run one or more statements (no parameters): `{"count", "duration"}`."""
        if not isinstance(query, str):
            raise TypeError(f"D1 exec: the query must be a string, got {type(query).__name__}")
        return JsObject(await self._call("exec", [query], {}))

    async def dump(self) -> bytes:
        raise BindingError("D1_ERROR", "D1_ERROR: dump() is not supported here; use `edge d1 execute`")
