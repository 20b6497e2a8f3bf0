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

import contextlib
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import msgspec

from runtime.bindings.common import BindingError, arity, options, safe_component, text
from runtime.bindings.d1 import (
    CALL_S,
    QUERY_S,
    RESULT_BYTES,
    SQL_BYTES,
    D1Database,
    _params,
    split_statements,
)
from runtime.control.state import private_dir
from workers.durable_objects import check_rpc_value

KEY_BYTES = 2048  # Cloudflare: a key is at most 2 KiB
VALUE_BYTES = 128 * 1024  # a stored value, encoded
KEYS_PER_CALL = 128  # Cloudflare: get/put/delete take at most 128 keys at once
OPEN_OBJECTS = 64  # SQLite files kept open at once; the least recently used is closed past it
KV_TABLE = "__cf_kv"
# the object's one alarm: its time, its retries so far, whether its handler runs now, and the
# object's own address (so that a scan of the files after a restart knows whom to wake)
ALARM_TABLE = "__cf_alarm"
ALARM_MS_MAX = 2**53
ALARM_RETRIES = 6  # Cloudflare's: a failing alarm handler is retried up to 6 times
ALARM_BACKOFF_S = 2.0  # ... with exponential backoff from 2 s
ALARM_SCAN_FILES = 100_000  # object files read for alarms when edge dev starts
Address = tuple[str, str, str, str]  # (account, script, class, id)

log = logging.getLogger("edge.objects")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class ObjectStorage(D1Database):
    """One object's file: D1's guarded SQL, plus the key-value table only the runtime touches."""

    def __init__(self, path: Path, query_s: float = QUERY_S):
        super().__init__(path, query_s)
        self._internal_sql(
            f"CREATE TABLE IF NOT EXISTS {KV_TABLE} (key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID"
        )
        self._internal_sql(
            f"CREATE TABLE IF NOT EXISTS {ALARM_TABLE} (one INTEGER PRIMARY KEY CHECK (one = 1), "
            "time_ms INTEGER NOT NULL, retries INTEGER NOT NULL DEFAULT 0, running INTEGER NOT NULL "
            "DEFAULT 0, account TEXT NOT NULL, script TEXT NOT NULL, class_name TEXT NOT NULL, "
            "object_id TEXT NOT NULL)"
        )

    def _authorize(self, action: int, arg1: Any, arg2: Any, dbname: Any, source: Any) -> int:
        names = (str(arg1 or "").lower(), str(arg2 or "").lower())
        if not self._internal and (KV_TABLE in names or ALARM_TABLE in names):
            return sqlite3.SQLITE_DENY
        return super()._authorize(action, arg1, arg2, dbname, source)

    def _kv(self, sql: str, params: list[Any]) -> tuple[list[tuple], int]:
        with self._lock:
            # the progress handler stops a statement past its deadline: each one gets its own (a
            # stale one from an earlier statement interrupted any KV call over 1000 VM steps)
            self._deadline = time.monotonic() + self.query_s
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
            self._deadline = time.monotonic() + self.query_s
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

    # --- the alarm -------------------------------------------------------------------------------------

    def get_alarm(self) -> int | None:
        """The alarm's time as the object sees it: None while its handler runs (unless it set
        a new one)."""
        rows, _ = self._kv(f"SELECT time_ms, running FROM {ALARM_TABLE}", [])
        return rows[0][0] if rows and not rows[0][1] else None

    def set_alarm(self, address: Address, time_ms: int) -> None:
        self._kv(
            f"INSERT OR REPLACE INTO {ALARM_TABLE} (one, time_ms, retries, running, account, script, "
            "class_name, object_id) VALUES (1, ?, 0, 0, ?, ?, ?, ?)",
            [time_ms, *address],
        )

    def delete_alarm(self) -> None:
        self._kv(f"DELETE FROM {ALARM_TABLE}", [])

    def begin_alarm(self, time_ms: int) -> int | None:
        """The alarm due at `time_ms` starts: its retries so far, or None when it has moved or
        gone since (the scheduler then follows the new one)."""
        rows, _ = self._kv(
            f"UPDATE {ALARM_TABLE} SET running = 1 WHERE time_ms = ? AND running = 0 RETURNING retries",
            [time_ms],
        )
        return rows[0][0] if rows else None

    def end_alarm(self, succeeded: bool, now_ms: int) -> int | None:
        """The handler ended. An alarm it set meanwhile stays; else on success the alarm is gone,
        on failure it is retried with backoff until ALARM_RETRIES. Returns the next time, or None."""
        rows, _ = self._kv(f"SELECT time_ms, retries, running FROM {ALARM_TABLE}", [])
        if not rows:
            return None
        time_ms, retries, running = rows[0]
        if not running:  # set again by the handler: that one stands
            return time_ms
        if succeeded or retries >= ALARM_RETRIES:
            self.delete_alarm()
            return None
        due = now_ms + int(ALARM_BACKOFF_S * 1000 * 2**retries)
        self._kv(f"UPDATE {ALARM_TABLE} SET time_ms = ?, retries = ?, running = 0", [due, retries + 1])
        return due

    # --- the SQL API --------------------------------------------------------------------------------

    def sql(self, query: str, params: list[Any]) -> dict[str, Any]:
        """The last statement's rows, as a cursor shows them; several statements only without
        bindings (as Cloudflare's exec)."""
        statements = [query] if params else (split_statements(query) or [query])
        deadline = time.monotonic() + CALL_S  # the whole call's, as a D1 exec's
        try:
            with self._lock:
                budget = [RESULT_BYTES]
                out = [self._one(stmt, params, budget=budget, call_deadline=deadline) for stmt in statements]
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


def read_alarm(path: Path) -> tuple[Address, int] | None:
    """The alarm kept in one object's file, if any, for the scan at start (a handler that was
    running when the runtime stopped runs again)."""
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=1.0)) as db:
            row = db.execute(
                f"SELECT account, script, class_name, object_id, time_ms FROM {ALARM_TABLE}"
            ).fetchone()
    except sqlite3.Error:  # no alarm table (a file from before alarms), or unreadable: no alarm
        return None
    if row is None or not all(isinstance(v, str) for v in row[:4]) or not isinstance(row[4], int):
        return None
    return (row[0], row[1], row[2], row[3]), row[4]


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
        if method == "getAlarm":
            arity("storage.getAlarm", args, 0)
            return db.get_alarm()
        if method == "setAlarm":
            arity("storage.setAlarm", args, 1)
            when = args[0]
            if not isinstance(when, int) or isinstance(when, bool) or not 0 <= when < ALARM_MS_MAX:
                raise BindingError("TypeError", "storage.setAlarm: the time must be ms since the epoch")
            db.set_alarm((account, script, class_name, object_id), when)
            return None
        if method == "deleteAlarm":
            arity("storage.deleteAlarm", args, 0)
            db.delete_alarm()
            return None
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

    # --- alarms, for the runtime's scheduler (runtime.events.alarms) -----------------------------------

    def begin_alarm(self, address: Address, time_ms: int) -> int | None:
        return self.storage(*address).begin_alarm(time_ms)

    def end_alarm(self, address: Address, succeeded: bool, now_ms: int) -> int | None:
        return self.storage(*address).end_alarm(succeeded, now_ms)

    def drop_alarm(self, address: Address) -> None:
        self.storage(*address).delete_alarm()

    def scan_alarms(self, limit: int = ALARM_SCAN_FILES) -> list[tuple[Address, int]]:
        """Every alarm kept under the root (at most `limit` files read): what a restart resumes."""
        found, files = [], 0
        for path in sorted(self.root.rglob("*.sqlite")):
            files += 1
            if files > limit:
                log.warning("Durable Object alarms: more than %d object files; the rest not read", limit)
                break
            alarm = read_alarm(path)
            if alarm is not None and self.path(*alarm[0]) == path:
                found.append(alarm)  # its address names this very file: no file speaks for another
        return found

    def close(self) -> None:
        with self._lock:
            for db in self._open.values():
                db.close()
            self._open.clear()
