"""D1, simulated: one SQLite file per database, `.edge/d1/<account>/<database id>.sqlite`, run by
the runtime (never by the isolate) with every value bound as a parameter.

A hostile script's SQL meets: an authorizer that refuses ATTACH/DETACH (and so `VACUUM INTO` a
file), every PRAGMA but a read-only few, `load_extension` and the file functions, transactions
(batch() is the transaction), and virtual tables but FTS and R-Tree; a progress handler that stops
a statement after QUERY_S seconds (a `WITH RECURSIVE` that never ends); SQLite's own limits set to
D1's (100 KB of SQL, 100 bound parameters, 2 MB per value, 100 columns); a database size cap; and
a cap on the bytes a result may carry back to the isolate.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from runtime.bindings.common import (
    REPLY_BYTES,
    BindingError,
    arity,
    open_private_db,
    options,
    safe_component,
    text,
)
from runtime.bindings.kind import BindingKind
from runtime.control.fair_pool import run_inline
from runtime.control.state import private_dir

QUERY_S = 5.0  # one statement's wall time (Cloudflare allows 30 s; here the runtime's thread waits)
CALL_S = 30.0  # one whole call (an exec script, a batch): every statement of it, as D1's 30 s query limit
SQL_BYTES = 100_000  # D1: maximum SQL statement length
PARAMS = 100  # D1: bound parameters per query
VALUE_BYTES = 2_000_000  # D1: maximum string, BLOB or row size
COLUMNS = 100  # D1: columns per table
DATABASE_BYTES = 500 * 1024 * 1024  # D1 (free plan): database size
RESULT_BYTES = min(8 * 1024 * 1024, REPLY_BYTES)  # rows one call may carry back
BATCH_STATEMENTS = 1000

# read-only introspection: everything else (journal_mode, writable_schema, ...) is refused
SAFE_PRAGMAS = frozenset(
    {
        "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
        "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check", "collation_list",
        "function_list", "module_list", "pragma_list", "compile_options", "data_version",
        "page_count", "freelist_count",
    }
)  # fmt: skip
UNSAFE_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
SAFE_MODULES = frozenset({"fts3", "fts4", "fts5", "rtree", "rtree_i32"})


class _Interrupted(Exception):
    pass


class D1Database:
    """One database file; calls are serialized by a lock and run off the event loop."""

    def __init__(self, path: Path, query_s: float = QUERY_S):
        self.path = path
        self.query_s = query_s
        self._lock = threading.Lock()
        self._internal = False  # the runtime's own statements (BEGIN/COMMIT, page_count)
        self._deadline = 0.0
        self._db = open_private_db(path)
        self._db.execute(f"PRAGMA max_page_count = {DATABASE_BYTES // 4096}")
        for limit, value in (
            (sqlite3.SQLITE_LIMIT_SQL_LENGTH, SQL_BYTES),
            (sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, PARAMS),
            (sqlite3.SQLITE_LIMIT_LENGTH, VALUE_BYTES),
            (sqlite3.SQLITE_LIMIT_COLUMN, COLUMNS),
            (sqlite3.SQLITE_LIMIT_ATTACHED, 0),
        ):
            self._db.setlimit(limit, value)
        self._db.set_authorizer(self._authorize)
        # checked every 10,000 VM steps (about 0.1 ms): a Python call per step costs the event loop the GIL
        self._db.set_progress_handler(self._progress, 10_000)

    # --- what the SQL may do ------------------------------------------------------------------------

    def _authorize(self, action: int, arg1: Any, arg2: Any, dbname: Any, source: Any) -> int:
        if self._internal:
            return sqlite3.SQLITE_OK
        if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            return sqlite3.SQLITE_DENY
        if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_PRAGMA:
            # pragma_x(...) table-valued functions are checked here too; only pragmas that never set pass
            name = (arg1 or "").lower()
            return sqlite3.SQLITE_OK if name in SAFE_PRAGMAS else sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in UNSAFE_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        if action in (sqlite3.SQLITE_CREATE_VTABLE, sqlite3.SQLITE_DROP_VTABLE):
            return sqlite3.SQLITE_OK if (arg2 or "").lower() in SAFE_MODULES else sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def _progress(self) -> int:
        return 1 if time.monotonic() > self._deadline else 0

    def _internal_sql(self, sql: str) -> Any:
        self._internal = True
        try:
            return self._db.execute(sql).fetchall()
        finally:
            self._internal = False

    # --- running SQL ----------------------------------------------------------------------------------

    def _one(
        self,
        sql: str,
        params: list[Any],
        first: bool = False,
        budget: list[int] | None = None,
        call_deadline: float | None = None,
        call_s: float = CALL_S,
    ) -> dict:
        """One statement; its rows (only the first when `first`), columns and meta. It stops at
        query_s, or at `call_deadline` (the whole call's) when that comes first."""
        budget = budget if budget is not None else [RESULT_BYTES]
        started = time.monotonic()
        if call_deadline is not None and started >= call_deadline:
            raise _call_over(call_s)
        self._deadline = min(started + self.query_s, call_deadline or float("inf"))
        before = self._db.total_changes
        try:
            cursor = self._db.execute(sql, params)
            rows: list[list[Any]] = []
            while True:
                batch = cursor.fetchmany(1 if first else 256)
                for row in batch:
                    budget[0] -= sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row) + 8
                    if budget[0] < 0:
                        raise BindingError(
                            "D1_ERROR",
                            f"D1_ERROR: the result is over {RESULT_BYTES // 2**20} MiB; select fewer rows "
                            "or columns (LIMIT, a cursor on the key)",
                        )
                    rows.append(list(row))
                if not batch or (first and rows):
                    break
            columns = [d[0] for d in cursor.description] if cursor.description else []
            last_row_id = cursor.lastrowid or 0
            cursor.close()
        except sqlite3.Error as exc:
            now = time.monotonic()
            if call_deadline is not None and now > call_deadline:
                raise _call_over(call_s) from None
            raise _d1_error(exc, now > self._deadline, self.query_s) from None
        except (OverflowError, ValueError, TypeError) as exc:  # a value SQLite cannot bind
            raise BindingError("D1_TYPE_ERROR", f"D1_TYPE_ERROR: {exc}") from None
        changes = self._db.total_changes - before
        return {
            "columns": columns,
            "rows": rows,
            "meta": {
                "served_by": "edge-local",
                "duration": round((time.monotonic() - started) * 1000, 3),
                "changes": changes,
                "last_row_id": last_row_id,
                "changed_db": changes > 0,
                "size_after": self._size(),
                "rows_read": len(rows),  # an approximation: SQLite does not count rows scanned for us
                "rows_written": changes,
            },
        }

    def _size(self) -> int:
        ((pages,),) = self._internal_sql("PRAGMA page_count")
        ((size,),) = self._internal_sql("PRAGMA page_size")
        return pages * size

    def query(self, sql: str, params: list[Any], first: bool = False) -> dict:
        with self._lock:
            return self._one(sql, params, first)

    def interrupt(self) -> None:
        """Stop the statement running now (from any thread): its call ended or the runtime stops."""
        self._db.interrupt()

    def batch(self, statements: list[tuple[str, list[Any]]]) -> list[dict]:
        """All statements in one transaction: an error rolls every one of them back."""
        return run_inline(self.batch_slices(statements))

    def script(self, sql: str, atomic: bool = False) -> list[dict]:
        """Each statement of `sql` in turn (no parameters), with its result; stops at the first
        error. The statements before it stay applied (as D1's exec), unless `atomic`."""
        return run_inline(self.script_slices(sql, atomic))

    def batch_slices(self, statements: list[tuple[str, list[Any]]], call_s: float | None = None):
        """batch() a statement a slice (runtime.control.fair_pool): each yield hands back the hook
        that interrupts the next statement; closed between slices, the transaction rolls back."""
        return self._slices(statements, True, call_s)

    def script_slices(self, sql: str, atomic: bool = False, call_s: float | None = None):
        """script() a statement a slice, as batch_slices."""
        return self._slices([(stmt, []) for stmt in split_statements(sql)], atomic, call_s)

    def _slices(self, statements: list[tuple[str, list[Any]]], atomic: bool, call_s: float | None):
        call_s = CALL_S if call_s is None else call_s
        deadline = time.monotonic() + call_s
        yield self.interrupt
        with self._lock:  # held across the slices: one call at a time on this file
            budget = [RESULT_BYTES]
            out: list[dict] = []
            if atomic:
                self._internal_sql("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    out.append(self._one(sql, params, budget=budget, call_deadline=deadline, call_s=call_s))
                    yield self.interrupt
            except BaseException:
                if atomic and self._db.in_transaction:
                    self._internal_sql("ROLLBACK")
                raise
            if atomic:
                self._internal_sql("COMMIT")
            return out

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _call_over(call_s: float) -> BindingError:
    return BindingError(
        "D1_ERROR",
        f"D1_ERROR: this call ran past {call_s:g} s in all and was stopped (the statements before the "
        "one running stay applied, unless it was a batch); split the work over several calls",
    )


def split_statements(sql: str) -> list[str]:
    """`sql` cut into complete statements (string literals, comments and trigger bodies respected)."""
    out, start = [], 0
    at = sql.find(";")
    while at != -1:
        candidate = sql[start : at + 1]
        if sqlite3.complete_statement(candidate):
            if _has_code(candidate):
                out.append(candidate.strip())
            start = at + 1
        at = sql.find(";", at + 1)
    if _has_code(sql[start:]):
        out.append(sql[start:].strip())
    return out


def _has_code(sql: str) -> bool:
    lines = [ln.split("--", 1)[0].strip(" \t\r;") for ln in sql.splitlines()]
    return any(lines)


def _d1_error(exc: sqlite3.Error, timed_out: bool, query_s: float) -> BindingError:
    if timed_out or str(exc) == "interrupted":
        return BindingError(
            "D1_ERROR", f"D1_ERROR: the statement ran past {query_s:g} s and was stopped; make it cheaper"
        )
    if str(exc) in ("not authorized", "authorization denied"):
        return BindingError(
            "D1_ERROR",
            "D1_ERROR: not authorized: ATTACH, DETACH, transactions (use batch()), load_extension and "
            "PRAGMAs other than read-only introspection are not allowed",
        )
    return BindingError("D1_ERROR", f"D1_ERROR: {exc}")


def _params(what: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise BindingError("TypeError", f"{what}: parameters must be a list")
    if len(value) > PARAMS:
        raise BindingError("RangeError", f"{what}: {len(value)} parameters; D1 binds at most {PARAMS}")
    for v in value:
        if v is not None and not isinstance(v, (bool, int, float, str, bytes)):
            raise BindingError(
                "D1_TYPE_ERROR",
                f"D1_TYPE_ERROR: type {type(v).__name__!r} not supported: "
                "bind None, bool, int, float, str or bytes",
            )
    return [int(v) if isinstance(v, bool) else v for v in value]


def _statement(what: str, value: Any) -> tuple[str, list[Any]]:
    if not isinstance(value, list) or len(value) != 2:
        raise BindingError("TypeError", f"{what}: a statement is [sql, parameters]")
    return text(f"{what}: the query", value[0], SQL_BYTES), _params(what, value[1])


class D1Store:
    """Every account's D1 databases, opened on first use."""

    def __init__(self, root: Path, query_s: float = QUERY_S):
        self.root = private_dir(root)
        self.query_s = query_s
        self._open: dict[tuple[str, str], D1Database] = {}
        self._lock = threading.Lock()

    def path(self, account: str, database: str) -> Path:
        return private_dir(self.root / safe_component(account)) / f"{safe_component(database)}.sqlite"

    def database(self, account: str, database: str) -> D1Database:
        with self._lock:
            db = self._open.get((account, database))
            if db is None:
                db = self._open[(account, database)] = D1Database(self.path(account, database), self.query_s)
            return db

    def call(self, account: str, database: str, method: str, args: list, kwargs: dict) -> Any:
        if method == "query":
            arity("D1 query", args, 2)
            sql, params = _statement("D1 query", args)
            first = bool(options("D1 query", kwargs, {"first"}).get("first", False))
            return self.database(account, database).query(sql, params, first)
        if method == "batch":
            arity("D1 batch", args, 1)
            options("D1 batch", kwargs, set())
            if not isinstance(args[0], list) or len(args[0]) > BATCH_STATEMENTS:
                raise BindingError(
                    "TypeError", f"D1 batch: pass a list of at most {BATCH_STATEMENTS} statements"
                )
            statements = [_statement(f"D1 batch: statement {i}", s) for i, s in enumerate(args[0])]
            return self.database(account, database).batch_slices(statements)
        if method == "exec":
            arity("D1 exec", args, 1)
            options("D1 exec", kwargs, set())
            sql = text("D1 exec: the query", args[0], 10 * SQL_BYTES)
            return _counted(self.database(account, database).script_slices(sql))
        raise BindingError("TypeError", f"D1 has no method {method!r}")

    def close(self) -> None:
        with self._lock:
            for db in self._open.values():
                db.close()
            self._open.clear()


def _counted(slices):
    """exec's answer ({count, duration}) over a script's slices, sliced as they are."""
    started = time.monotonic()
    results = yield from slices
    return {"count": len(results), "duration": round((time.monotonic() - started) * 1000, 3)}


class D1DatabaseConfig(msgspec.Struct, kw_only=True):
    """A d1_databases entry of the wrangler config."""

    binding: str
    database_name: str
    database_id: str
    preview_database_id: str | None = None
    migrations_dir: str | None = None  # wrangler's default: "migrations", relative to the config
    migrations_table: str | None = None


class D1DatabaseUpload(msgspec.Struct, forbid_unknown_fields=True):
    binding: str
    database_name: str
    database_id: str | None = None


KIND = BindingKind(
    "d1", "d1_databases", D1DatabaseConfig, D1DatabaseUpload, ("database_id", "database_name", "binding"),
    lambda state_dir, query_s: D1Store(state_dir / "d1", query_s), "workers.d1:D1Database",
    one_call_at_a_time=True,
)  # fmt: skip
