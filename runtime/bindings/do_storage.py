"""A Durable Object's storage, simulated: one SQLite file per object,
`.edge/do/<account>/<script>/<class>/<id>.sqlite` (each name a safe_component), run by the
runtime and reached only as the object's own `ctx.storage` (the runtime names the object, never
the isolate).

The SQL API (`ctx.storage.sql.exec`) meets D1's guard (runtime.bindings.d1.D1Database: the same
authorizer, progress handler, SQLite limits and size cap), and may not touch the table that holds
the key-value API's data (`__cf_kv`, as Cloudflare names it). Key-value values are JSON-like
(what RPC carries), kept msgpack-encoded.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import msgspec

from runtime.bindings.common import BindingError, arity, options, safe_component, text
from runtime.bindings.d1 import QUERY_S, RESULT_BYTES, SQL_BYTES, D1Database, _params, split_statements
from runtime.control.state import private_dir
from workers.durable_objects import check_rpc_value

KEY_BYTES = 2048  # Cloudflare: a key is at most 2 KiB
VALUE_BYTES = 128 * 1024  # a stored value, encoded
KEYS_PER_CALL = 128  # Cloudflare: get/put/delete take at most 128 keys at once
OPEN_OBJECTS = 64  # SQLite files kept open at once; the least recently used is closed past it
KV_TABLE = "__cf_kv"

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class ObjectStorage(D1Database):
    """One object's file: D1's guarded SQL, plus the key-value table only the runtime touches."""

    def __init__(self, path: Path, query_s: float = QUERY_S):
        super().__init__(path, query_s)
        self._internal_sql(
            f"CREATE TABLE IF NOT EXISTS {KV_TABLE} (key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID"
        )

    def _authorize(self, action: int, arg1: Any, arg2: Any, dbname: Any, source: Any) -> int:
        if not self._internal and KV_TABLE in (str(arg1 or "").lower(), str(arg2 or "").lower()):
            return sqlite3.SQLITE_DENY
        return super()._authorize(action, arg1, arg2, dbname, source)

    def _kv(self, sql: str, params: list[Any]) -> tuple[list[tuple], int]:
        with self._lock:
            self._internal = True
            try:
                before = self._db.total_changes
                rows = self._db.execute(sql, params).fetchall()
                return rows, self._db.total_changes - before
            except sqlite3.Error as exc:
                raise BindingError("Error", f"storage: {exc}") from None
            finally:
                self._internal = False

    # --- the key-value API ----------------------------------------------------------------------------

    def get(self, keys: list[str]) -> dict[str, Any]:
        marks = ",".join("?" * len(keys))
        rows, _ = self._kv(f"SELECT key, value FROM {KV_TABLE} WHERE key IN ({marks})", keys)
        found = dict(rows)
        return {k: _decoder.decode(found[k]) for k in keys if k in found}

    def put(self, entries: dict[str, bytes]) -> None:
        with self._lock:
            self._internal = True
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany(
                        f"INSERT INTO {KV_TABLE} (key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        list(entries.items()),
                    )
                except BaseException:
                    if self._db.in_transaction:  # SQLite ends it itself on a full disk
                        self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise BindingError("Error", f"storage.put: {exc}") from None
            finally:
                self._internal = False

    def delete(self, keys: list[str]) -> int:
        marks = ",".join("?" * len(keys))
        _, changes = self._kv(f"DELETE FROM {KV_TABLE} WHERE key IN ({marks})", keys)
        return changes

    def delete_all(self) -> None:
        self._kv(f"DELETE FROM {KV_TABLE}", [])

    def list(self, prefix: str | None, start: str | None, after: str | None, end: str | None,
             limit: int | None, reverse: bool) -> dict[str, Any]:  # fmt: skip
        where, params = [], []
        if prefix:
            where.append("substr(key, 1, ?) = ?")
            params += [len(prefix), prefix]
        if start is not None:
            where.append("key >= ?")
            params.append(start)
        if after is not None:
            where.append("key > ?")
            params.append(after)
        if end is not None:
            where.append("key < ?")
            params.append(end)
        sql = f"SELECT key, value FROM {KV_TABLE}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY key {'DESC' if reverse else 'ASC'}"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        rows, _ = self._kv(sql, params)
        if sum(len(k) + len(v) for k, v in rows) > RESULT_BYTES:
            raise BindingError(
                "RangeError", f"storage.list: the result is over {RESULT_BYTES // 2**20} MiB; pass a limit"
            )
        return {k: _decoder.decode(v) for k, v in rows}

    # --- the SQL API --------------------------------------------------------------------------------

    def sql(self, query: str, params: list[Any]) -> dict[str, Any]:
        """The last statement's rows, as a cursor shows them; several statements only without
        bindings (as Cloudflare's exec)."""
        statements = [query] if params else (split_statements(query) or [query])
        try:
            with self._lock:
                budget = [RESULT_BYTES]
                out = [self._one(stmt, params, budget=budget) for stmt in statements]
        except BindingError as exc:
            message = str(exc).replace("D1_ERROR: ", "").replace("D1_TYPE_ERROR: ", "")
            message = message.replace("use batch()", "one statement at a time")
            raise BindingError("Error", f"SQL: {message}") from None
        last = out[-1]
        return {
            "columns": last["columns"],
            "rows": last["rows"],
            "rowsRead": sum(r["meta"]["rows_read"] for r in out),
            "rowsWritten": sum(r["meta"]["rows_written"] for r in out),
        }


def _key(what: str, value: Any) -> str:
    return text(what, value, KEY_BYTES, allow_empty=True)


def _keys(what: str, value: Any) -> tuple[list[str], bool]:
    """(keys, one): a key, or a list of at most KEYS_PER_CALL keys."""
    if isinstance(value, list):
        if len(value) > KEYS_PER_CALL:
            raise BindingError(
                "RangeError", f"{what}: at most {KEYS_PER_CALL} keys per call, got {len(value)}"
            )
        return [_key(f"{what}: a key", k) for k in value], False
    return [_key(f"{what}: the key", value)], True


def _value(what: str, value: Any) -> bytes:
    try:
        check_rpc_value(value, what)
    except TypeError as exc:
        raise BindingError("TypeError", str(exc)) from None
    data = _encoder.encode(value)
    if len(data) > VALUE_BYTES:
        raise BindingError("RangeError", f"{what} is {len(data)} bytes encoded; the limit is {VALUE_BYTES}")
    return data


def _optional_key(what: str, opts: dict, name: str) -> str | None:
    return _key(f"{what}: {name}", opts[name]) if name in opts else None


class ObjectStorageStore:
    """Every object's storage under `root`, opened on first use (at most OPEN_OBJECTS at once)."""

    def __init__(self, root: Path, query_s: float = QUERY_S):
        self.root = private_dir(root)
        self.query_s = query_s
        self._open: OrderedDict[tuple[str, ...], ObjectStorage] = OrderedDict()
        self._lock = threading.Lock()

    def path(self, account: str, script: str, class_name: str, object_id: str) -> Path:
        folder = self.root
        for part in (account, script, class_name):
            folder = private_dir(folder / safe_component(part))
        return folder / f"{safe_component(object_id)}.sqlite"

    def storage(self, account: str, script: str, class_name: str, object_id: str) -> ObjectStorage:
        key = (account, script, class_name, object_id)
        with self._lock:
            db = self._open.get(key)
            if db is None:
                db = self._open[key] = ObjectStorage(self.path(*key), self.query_s)
                while len(self._open) > OPEN_OBJECTS:
                    _, oldest = self._open.popitem(last=False)
                    oldest.close()
            self._open.move_to_end(key)
            return db

    def call(
        self, account: str, script: str, class_name: str, object_id: str, method: str, args: Any, kwargs: Any
    ) -> Any:
        if not isinstance(method, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
            raise BindingError("TypeError", "a storage call is a method name, a list of arguments and a dict")
        db = self.storage(account, script, class_name, object_id)
        if method in ("get", "put", "delete", "deleteAll"):
            options(f"storage.{method}", kwargs, set())
        if method == "get":
            arity("storage.get", args, 1)
            keys, one = _keys("storage.get", args[0])
            found = db.get(keys)
            return found.get(keys[0]) if one else found
        if method == "put":
            if len(args) == 2:
                entries = {_key("storage.put: the key", args[0]): _value("storage.put: the value", args[1])}
            else:
                arity("storage.put", args, 1)
                if not isinstance(args[0], dict) or len(args[0]) > KEYS_PER_CALL:
                    raise BindingError(
                        "TypeError",
                        f"storage.put: pass a key and a value, or a dict of at most {KEYS_PER_CALL}",
                    )
                entries = {
                    _key("storage.put: a key", k): _value(f"storage.put: {k}", v) for k, v in args[0].items()
                }
            db.put(entries)
            return None
        if method == "delete":
            arity("storage.delete", args, 1)
            keys, one = _keys("storage.delete", args[0])
            deleted = db.delete(keys)
            return deleted > 0 if one else deleted
        if method == "deleteAll":
            arity("storage.deleteAll", args, 0)
            db.delete_all()
            return None
        if method == "list":
            arity("storage.list", args, 0)
            what = "storage.list"
            opts = options(what, kwargs, {"prefix", "start", "startAfter", "end", "limit", "reverse"})
            limit = opts.get("limit")
            if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
                raise BindingError("TypeError", f"{what}: limit must be a non-negative integer")
            return db.list(
                _optional_key(what, opts, "prefix"),
                _optional_key(what, opts, "start"),
                _optional_key(what, opts, "startAfter"),
                _optional_key(what, opts, "end"),
                limit,
                bool(opts.get("reverse", False)),
            )
        if method == "sql.exec":
            arity("sql.exec", args, 2)
            options("sql.exec", kwargs, set())
            query = text("sql.exec: the query", args[0], 10 * SQL_BYTES)
            try:
                params = _params("sql.exec", args[1])
            except BindingError as exc:
                raise BindingError("TypeError", str(exc).replace("D1_TYPE_ERROR: ", "")) from None
            return db.sql(query, params)
        raise BindingError("TypeError", f"ctx.storage has no method {method!r}")

    def close(self) -> None:
        with self._lock:
            for db in self._open.values():
                db.close()
            self._open.clear()
