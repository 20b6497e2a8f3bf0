"""AI Gateway's state in one SQLite database under the state dir (`.edge/ai-gateway.db`): the response
cache, the request logs and the gateways of every account. Every row is keyed by account, so no
account reaches another's entries, whatever gateway id it names. Blocking: the runtime calls it
through its fair binding pool (runtime.control.fair_pool), never on the event loop.

Bounds, since any account may make gateways on first use: a cached answer is at most
CACHE_ENTRY_BYTES (a larger one is not cached) and an account's entries ACCOUNT_CACHE_BYTES in all
(the soonest to expire go first); a gateway keeps its newest LOG_ROWS log rows (or its own
`log_management`, at most ACCOUNT_LOG_ROWS; or it stops taking rows when full) and an account
ACCOUNT_LOG_ROWS over all its gateways (older ones are dropped as new ones come). A row keeps its
request's and its answer's bodies, each up to LOG_BODY_BYTES (a larger one's head, with its whole
size), and an account's kept bodies are at most ACCOUNT_LOG_BODY_BYTES: the oldest rows' bodies go
first, their rows stay.

Log rows are written in batches: `log` queues the row and returns, and the queue is written in one
transaction when it holds FLUSH_ROWS rows, FLUSH_S after its first row, before any read of the logs
(so a row is readable as soon as its call returns) and at close. Each row is numbered within its
gateway and its account, so the caps trim a range of numbers by index (a row per insert took two
`NOT IN (SELECT ... LIMIT n)` scans and a commit of its own: 4 ms at first, 25 ms by 8,000 rows).

The fields the log list filters and orders by are columns beside the row's JSON (FIELDS, written
from it by every write), so a list is a WHERE and an index walk (runtime.ai.gateway_log_query). The
gateways' table is read and written by runtime.ai.gateway_registry, through `read` and `write`."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger("edge.ai.gateway")
T = TypeVar("T")

CACHE_ENTRY_BYTES = 4 * 1024 * 1024
ACCOUNT_CACHE_BYTES = 64 * 1024 * 1024
LOG_ROWS = 10_000
ACCOUNT_LOG_ROWS = 20_000
FLUSH_ROWS = 256  # log rows written in one transaction
FLUSH_S = 0.05  # the longest a queued log row waits to be written (unless the database fails)
# a body is kept whole up to 64 KiB (a chat's request, a long answer's event stream), so that a row
# says what was asked and answered; of a larger one its head; 64 MiB an account over all its rows
LOG_BODY_BYTES = 64 * 1024
ACCOUNT_LOG_BODY_BYTES = 64 * 1024 * 1024
HEAD_BYTES = 1024  # a log's request_head / response_head: its body's first KiB

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cache (
    account TEXT NOT NULL, gateway TEXT NOT NULL, key TEXT NOT NULL,
    kind TEXT NOT NULL,            -- "json" (a body) or "sse" (an event stream, replayed as it came)
    body BLOB NOT NULL, expires REAL NOT NULL,
    PRIMARY KEY (account, gateway, key)
);
CREATE TABLE IF NOT EXISTS logs (
    id TEXT PRIMARY KEY, account TEXT NOT NULL, gateway TEXT NOT NULL, created REAL NOT NULL,
    row TEXT NOT NULL,             -- the log entry as JSON
    gateway_seq INTEGER NOT NULL   -- 1, 2, 3... within its account's gateway: the gateway's cap trims by it
);
CREATE TABLE IF NOT EXISTS gateways (
    account TEXT NOT NULL, id TEXT NOT NULL, created REAL NOT NULL, modified REAL NOT NULL,
    settings TEXT,                 -- set through the API, as JSON; NULL: made on first use, or declared
    PRIMARY KEY (account, id)
);
"""
# rows come in rowid order (a new row's rowid is past every other's: rows go from the oldest end only)
_INDEXES = """
CREATE INDEX IF NOT EXISTS logs_by_gateway_seq ON logs (account, gateway, gateway_seq);
CREATE INDEX IF NOT EXISTS logs_by_account_rowid ON logs (account);
CREATE INDEX IF NOT EXISTS logs_by_created ON logs (account, gateway, created, id);
CREATE INDEX IF NOT EXISTS logs_with_bodies ON logs (account) WHERE body_bytes > 0;
"""
# the row's fields copied to columns of their own, for the log list: the row's key, the column's type
FIELDS = {
    "success": "INTEGER", "cached": "INTEGER", "provider": "TEXT", "model": "TEXT",
    "model_type": "TEXT", "cost": "REAL", "tokens_in": "INTEGER", "tokens_out": "INTEGER",
    "duration": "REAL", "feedback": "INTEGER", "event_id": "TEXT", "metadata": "TEXT",
    "status_code": "INTEGER", "request_type": "TEXT", "request_content_type": "TEXT",
    "response_content_type": "TEXT",
}  # fmt: skip
# then the bodies, last in the row, so a list's reads never reach their pages
BODY_COLUMNS = {
    "request_size": "INTEGER", "response_size": "INTEGER", "body_bytes": "INTEGER NOT NULL DEFAULT 0",
    "request_body": "BLOB", "response_body": "BLOB",
}  # fmt: skip
_SET_FIELDS = ", ".join(f"{f}=?" for f in FIELDS)


class GatewayStore:
    def __init__(self, path: Path, clock=time.time):
        self.path, self.clock = Path(path), clock
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        # log rows accepted, not yet written: _Queued tuples
        self._queue: list[tuple[Any, ...]] = []
        self._queued = threading.Condition(self._lock)  # the writer waits on it
        self._writer: threading.Thread | None = None
        self._closing = False
        self._counts: dict[str, int] = {}  # log rows per account, counted once, then kept up to date
        self._bodies: dict[str, int] = {}  # body bytes kept per account, likewise

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # WAL's NORMAL: a commit survives the runtime crashing, not the machine losing power (the
            # last commits may go, the database stays whole); FULL's sync per commit made each read
            # that writes the queue first (getLog after each call) cost milliseconds
            self._db.execute("PRAGMA synchronous=NORMAL")
            _number_old_logs(self._db)
            had_gateways = _has_table(self._db, "gateways")
            self._db.executescript(_SCHEMA)
            _add_columns(self._db)
            self._db.executescript(_INDEXES)
            if not had_gateways:  # a database from before gateways were kept: those its logs name
                self._db.execute(
                    "INSERT OR IGNORE INTO gateways (account, id, created, modified) "
                    "SELECT account, gateway, MIN(created), MIN(created) FROM logs GROUP BY account, gateway"
                )
        return self._db

    def close(self) -> None:
        """Write what is queued and close (a later call opens the database again)."""
        with self._lock:
            self._closing = True
            self._queued.notify()
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.join()
        with self._lock:
            self._closing = False
            try:
                self._flush()
            except sqlite3.Error:
                log.exception("AI Gateway: %d log rows could not be written at close", len(self._queue))
                self._queue = []
            if self._db is not None:
                self._db.close()
                self._db = None
                self._counts.clear()
                self._bodies.clear()

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn(connection)` once the queued rows are written (the log list, the gateways' reads)."""
        with self._lock:
            self._flush()
            return fn(self._conn())

    def write(self, fn: Callable[[sqlite3.Connection], T], *, recount: bool = False) -> T:
        """`fn(connection)` in one transaction, after the queued rows (the gateways' writes);
        `recount`: it may drop log rows, so each account's rows and bodies are counted again."""
        with self._lock:
            self._flush()
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(db)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            finally:
                if recount:
                    self._counts.clear()
                    self._bodies.clear()
            return out

    # --- the cache --------------------------------------------------------------------------------

    def cached(self, account: str, gateway: str, key: str) -> tuple[str, bytes] | None:
        """(kind, body) of an entry still fresh, or None."""
        with self._lock:
            row = (
                self._conn()
                .execute(
                    "SELECT kind, body FROM cache WHERE account=? AND gateway=? AND key=? AND expires>?",
                    (account, gateway, key, self.clock()),
                )
                .fetchone()
            )
        return (row[0], bytes(row[1])) if row else None

    def cache(self, account: str, gateway: str, key: str, kind: str, body: bytes, ttl_s: float) -> bool:
        """Keep an answer for `ttl_s` seconds (False: too large to keep)."""
        if len(body) > CACHE_ENTRY_BYTES:
            return False
        with self._lock:
            db = self._conn()
            now = self.clock()
            db.execute("DELETE FROM cache WHERE expires<=?", (now,))
            db.execute(
                "INSERT OR REPLACE INTO cache (account, gateway, key, kind, body, expires) "
                "VALUES (?,?,?,?,?,?)",
                (account, gateway, key, kind, body, now + ttl_s),
            )
            # the account's entries past ACCOUNT_CACHE_BYTES: the soonest to expire go first
            rows = db.execute(
                "SELECT gateway, key, length(body) FROM cache WHERE account=? ORDER BY expires DESC",
                (account,),
            ).fetchall()
            total = 0
            for gw, k, size in rows:
                total += size
                if total > ACCOUNT_CACHE_BYTES:
                    db.execute("DELETE FROM cache WHERE account=? AND gateway=? AND key=?", (account, gw, k))
        return True

    # --- the logs ---------------------------------------------------------------------------------

    def log(
        self,
        account: str,
        gateway: str,
        entry: dict[str, Any],
        request: bytes | None = None,
        response: bytes | None = None,
        *,
        keep: int | None = None,
        stop_when_full: bool = False,
    ) -> None:
        """Queue a log row (written within FLUSH_S, or by the next read) with its request's and
        answer's bodies (None: none). `keep`: the gateway's rows kept (LOG_ROWS unless it says);
        `stop_when_full`: past them the new row is dropped instead of the oldest. When the queue is
        full and cannot be written, the row is refused with the database's error, as a write was."""
        created = entry.get("created_at")
        created = created if isinstance(created, int | float) else self.clock()
        bodies = _bodies(request, response)
        row = (entry["id"], account, gateway, created, json.dumps(entry), _fields(entry), *bodies)
        row += (keep, stop_when_full)
        with self._lock:
            if len(self._queue) >= FLUSH_ROWS:
                self._flush()
            self._queue.append(row)
            if len(self._queue) == 1:
                self._queued.notify()
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_soon, name="gateway-logs", daemon=True)
                self._writer.start()

    def _write_soon(self) -> None:
        """The writer: the queue is written FLUSH_S after its first row (a batch that fills first,
        or a read, writes it sooner); a database that fails is retried a second later."""
        with self._lock:
            while not self._closing:
                if not self._queue:
                    self._queued.wait()
                    continue
                self._queued.wait(FLUSH_S)
                if self._closing:
                    return
                try:
                    self._flush()
                except sqlite3.Error:
                    log.exception("AI Gateway: %d log rows not written yet; retrying", len(self._queue))
                    self._queued.wait(1.0)

    def _flush(self) -> None:
        """Write the queue in one transaction, each row numbered within its gateway; then drop each
        gateway's rows past its cap by number, each account's oldest past ACCOUNT_LOG_ROWS, and its
        oldest rows' bodies past ACCOUNT_LOG_BODY_BYTES (the lock is held). A gateway's rows only ever
        go from its oldest end, so its numbers left are a range; an account's are not (its gateways'
        caps leave gaps), so it keeps a count of its rows (and of its bodies' bytes) and drops its
        oldest by rowid, as many as it is over."""
        rows = self._queue
        if not rows:
            return
        db = self._conn()
        counts, bodies = self._counts, self._bodies
        last: dict[tuple[str, str], int] = {}  # the last number given in each gateway
        caps: dict[tuple[str, str], int] = {}  # each gateway's rows kept, as its newest row said
        full: dict[tuple[str, str], int] = {}  # rows a gateway that stops when full may still take
        numbered = []
        db.execute("BEGIN IMMEDIATE")
        try:
            for log_id, account, gateway, created, text, fields, *kept, keep, stop in rows:
                n = last.get((account, gateway))
                if n is None:
                    n = (
                        db.execute(
                            "SELECT MAX(gateway_seq) FROM logs WHERE account=? AND gateway=?",
                            (account, gateway),
                        ).fetchone()[0]
                        or 0
                    )
                    if account not in counts:
                        counts[account] = _count(db, account)
                    if account not in bodies:
                        bodies[account] = _body_bytes(db, account)
                cap = min(keep or LOG_ROWS, ACCOUNT_LOG_ROWS)
                caps[account, gateway] = cap
                if stop:
                    if (account, gateway) not in full:
                        full[account, gateway] = cap - _gateway_count(db, account, gateway)
                    if full[account, gateway] <= 0:
                        continue  # full, and it keeps its oldest: the row is not kept
                    full[account, gateway] -= 1
                last[account, gateway] = n + 1
                numbered.append((log_id, account, gateway, created, text, n + 1, *fields, *kept))
            # ids are the runtime's (uuid4); a repeated one is dropped, not the whole batch with it
            columns = ", ".join(["id", "account", "gateway", "created", "row", "gateway_seq", *FIELDS])
            columns += ", " + ", ".join(BODY_COLUMNS)
            marks = ",".join("?" * (6 + len(FIELDS) + len(BODY_COLUMNS)))
            written = db.executemany(
                f"INSERT OR IGNORE INTO logs ({columns}) VALUES ({marks})", numbered
            ).rowcount
            for row in numbered:
                counts[row[1]] += 1
                bodies[row[1]] += row[-3]  # its body_bytes
            if written != len(numbered):
                for account in {r[1] for r in numbered}:
                    counts[account], bodies[account] = _count(db, account), _body_bytes(db, account)
            for (account, gateway), n in last.items():
                where = "account=? AND gateway=? AND gateway_seq<=?"
                past = (account, gateway, n - caps[account, gateway])
                bodies[account] -= db.execute(
                    f"SELECT COALESCE(SUM(body_bytes), 0) FROM logs WHERE {where}", past
                ).fetchone()[0]
                counts[account] -= db.execute(f"DELETE FROM logs WHERE {where}", past).rowcount
            for account in {account for account, _ in last}:
                over = counts[account] - ACCOUNT_LOG_ROWS
                if over > 0:
                    oldest = "SELECT rowid FROM logs WHERE account=? ORDER BY rowid LIMIT ?"
                    bodies[account] -= db.execute(
                        f"SELECT COALESCE(SUM(body_bytes), 0) FROM logs WHERE rowid IN ({oldest})",
                        (account, over),
                    ).fetchone()[0]
                    counts[account] -= db.execute(
                        f"DELETE FROM logs WHERE rowid IN ({oldest})", (account, over)
                    ).rowcount
                if bodies[account] > ACCOUNT_LOG_BODY_BYTES:
                    bodies[account] -= _drop_bodies(db, account, bodies[account] - ACCOUNT_LOG_BODY_BYTES)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            counts.clear()  # counted again from the database
            bodies.clear()
            raise  # the rows stay queued
        self._queue = []

    def get_log(self, account: str, gateway: str, log_id: str) -> dict[str, Any] | None:
        with self._lock:
            self._flush()
            row = (
                self._conn()
                .execute(
                    "SELECT row FROM logs WHERE id=? AND account=? AND gateway=?", (log_id, account, gateway)
                )
                .fetchone()
            )
        return json.loads(row[0]) if row else None

    def log_detail(self, account: str, gateway: str, log_id: str) -> dict[str, Any] | None:
        """A log row with what it kept of its bodies: request_size, request_head (the first
        HEAD_BYTES), request_head_complete (the head is the whole body), the same of the response."""
        heads = (
            "request_size, substr(request_body, 1, ?), length(request_body), "
            "response_size, substr(response_body, 1, ?), length(response_body)"
        )
        with self._lock:
            self._flush()
            found = (
                self._conn()
                .execute(
                    f"SELECT row, {heads} FROM logs WHERE id=? AND account=? AND gateway=?",
                    (HEAD_BYTES, HEAD_BYTES, log_id, account, gateway),
                )
                .fetchone()
            )
        if found is None:
            return None
        entry = json.loads(found[0])
        for i, which in ((1, "request"), (4, "response")):
            size, head, kept = found[i : i + 3]
            entry[f"{which}_size"] = size
            entry[f"{which}_head"] = None if head is None else bytes(head).decode("utf-8", "replace")
            entry[f"{which}_head_complete"] = head is not None and kept == size and size <= HEAD_BYTES
        return entry

    def log_body(
        self, account: str, gateway: str, log_id: str, which: str
    ) -> tuple[bytes | None, int | None, str]:
        """(what is kept of the request's or the answer's body, its whole size, its content type);
        LookupError when the account's gateway holds no such row."""
        assert which in ("request", "response")
        with self._lock:
            self._flush()
            found = (
                self._conn()
                .execute(
                    f"SELECT {which}_body, {which}_size, {which}_content_type FROM logs "
                    "WHERE id=? AND account=? AND gateway=?",
                    (log_id, account, gateway),
                )
                .fetchone()
            )
        if found is None:
            raise LookupError(log_id)
        body, size, kind = found
        return (None if body is None else bytes(body)), size, kind or "application/json"

    def patch_log(
        self, account: str, gateway: str, log_id: str, patch: dict[str, Any], response: bytes | None = None
    ) -> bool:
        """Fields of a log row replaced (patchLog's, or a stream's outcome when it ended, with the
        answer's body as it streamed: `response`); False when the account's gateway holds no such row."""
        with self._lock:
            self._flush()
            db = self._conn()
            row = db.execute(
                "SELECT row, body_bytes FROM logs WHERE id=? AND account=? AND gateway=?",
                (log_id, account, gateway),
            ).fetchone()
            if row is None:
                return False
            entry = {**json.loads(row[0]), **patch}  # a field given replaces the logged one
            db.execute(
                f"UPDATE logs SET row=?, {_SET_FIELDS} WHERE id=? AND account=?",
                (json.dumps(entry), *_fields(entry), log_id, account),
            )
            if response is not None:
                kept = response[:LOG_BODY_BYTES]
                db.execute(
                    "UPDATE logs SET response_body=?, response_size=?, body_bytes=body_bytes+? "
                    "WHERE id=? AND account=?",
                    (kept, len(response), len(kept), log_id, account),
                )
                if account in self._bodies:
                    self._bodies[account] += len(kept)
        return True

    def logs(self, account: str, gateway: str, limit: int = 50) -> list[dict[str, Any]]:
        """The gateway's newest `limit` log rows, newest first."""
        with self._lock:
            self._flush()
            rows = (
                self._conn()
                .execute(
                    "SELECT row FROM logs WHERE account=? AND gateway=? ORDER BY gateway_seq DESC LIMIT ?",
                    (account, gateway, limit),
                )
                .fetchall()
            )
        return [json.loads(r[0]) for r in rows]


def _fields(entry: dict[str, Any]) -> tuple[Any, ...]:
    """The row's FIELDS as their columns hold them: booleans as 0 / 1, metadata as JSON text (None
    when it has no entry)."""
    out = []
    for name in FIELDS:
        value = entry.get(name)
        if name == "metadata":
            value = json.dumps(value) if value else None
        elif isinstance(value, bool):
            value = int(value)
        elif value is not None and not isinstance(value, int | float | str):
            value = str(value)
        out.append(value)
    return tuple(out)


def _bodies(request: bytes | None, response: bytes | None) -> tuple[Any, ...]:
    """BODY_COLUMNS' values: the sizes, the bytes kept, the bodies (each up to LOG_BODY_BYTES)."""
    req = None if request is None else request[:LOG_BODY_BYTES]
    resp = None if response is None else response[:LOG_BODY_BYTES]
    kept = len(req or b"") + len(resp or b"")
    return (
        None if request is None else len(request),
        None if response is None else len(response),
        kept,
        req,
        resp,
    )


def _count(db: sqlite3.Connection, account: str) -> int:
    return db.execute("SELECT COUNT(*) FROM logs WHERE account=?", (account,)).fetchone()[0]


def _gateway_count(db: sqlite3.Connection, account: str, gateway: str) -> int:
    return db.execute(
        "SELECT COUNT(*) FROM logs WHERE account=? AND gateway=?", (account, gateway)
    ).fetchone()[0]


def _body_bytes(db: sqlite3.Connection, account: str) -> int:
    return db.execute(
        "SELECT COALESCE(SUM(body_bytes), 0) FROM logs WHERE account=? AND body_bytes > 0", (account,)
    ).fetchone()[0]


def _drop_bodies(db: sqlite3.Connection, account: str, over: int) -> int:
    """The oldest rows' bodies dropped until `over` bytes are gone (their rows stay); the bytes dropped."""
    dropped, rowids = 0, []
    for rowid, size in db.execute(
        "SELECT rowid, body_bytes FROM logs WHERE account=? AND body_bytes > 0 ORDER BY rowid", (account,)
    ):
        rowids.append(rowid)
        dropped += size
        if dropped >= over:
            break
    db.executemany(
        "UPDATE logs SET request_body=NULL, response_body=NULL, body_bytes=0 WHERE rowid=?",
        [(r,) for r in rowids],
    )
    return dropped


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    return (
        db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone()
        is not None
    )


def _add_columns(db: sqlite3.Connection) -> None:
    """A database from before the log list's columns: add them, filled from each row's JSON."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(logs)")}
    missing = [c for c in [*FIELDS, *BODY_COLUMNS] if c not in columns]
    if not missing:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        for name in missing:
            kind = {**FIELDS, **BODY_COLUMNS}[name]
            db.execute(f"ALTER TABLE logs ADD COLUMN {name} {kind}")
        fills = [f"{f}=json_extract(row, '$.{f}')" for f in FIELDS if f in missing and f != "metadata"]
        if "metadata" in missing:  # the object as JSON text, none when empty
            fills.append(
                "metadata=CASE WHEN json_extract(row, '$.metadata') IN ('{}', NULL) THEN NULL "
                "ELSE json_extract(row, '$.metadata') END"
            )
        if fills:
            db.execute(f"UPDATE logs SET {', '.join(fills)}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _number_old_logs(db: sqlite3.Connection) -> None:
    """A database from before the rows were numbered: number each gateway's rows in the order they
    came, and drop the indexes the caps' scans used."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(logs)")}
    if not columns or "gateway_seq" in columns:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("ALTER TABLE logs ADD COLUMN gateway_seq INTEGER NOT NULL DEFAULT 0")
        last: dict[tuple[str, str], int] = {}
        numbers = []
        for rowid, account, gateway in db.execute(
            "SELECT rowid, account, gateway FROM logs ORDER BY created, rowid"
        ).fetchall():
            last[account, gateway] = last.get((account, gateway), 0) + 1
            numbers.append((last[account, gateway], rowid))
        db.executemany("UPDATE logs SET gateway_seq=? WHERE rowid=?", numbers)
        db.execute("DROP INDEX IF EXISTS logs_by_gateway")
        db.execute("DROP INDEX IF EXISTS logs_by_account")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
