"""AI Gateway's state in one SQLite database under the state dir (`.edge/ai-gateway.db`): the response
cache and the request logs of every account's gateways. Every row is keyed by account, so no
account reaches another's entries, whatever gateway id it names. Blocking: the runtime calls it
through its fair binding pool (runtime.control.fair_pool), never on the event loop.

Bounds, since any account may make gateways on first use: a cached answer is at most
CACHE_ENTRY_BYTES (a larger one is not cached) and an account's entries ACCOUNT_CACHE_BYTES in all
(the soonest to expire go first); a gateway keeps its newest LOG_ROWS log rows and an account
ACCOUNT_LOG_ROWS over all its gateways (older ones are dropped as new ones come).

Log rows are written in batches: `log` queues the row and returns, and the queue is written in one
transaction when it holds FLUSH_ROWS rows, FLUSH_S after its first row, before any read of the logs
(so a row is readable as soon as its call returns) and at close. Each row is numbered within its
gateway and its account, so the caps trim a range of numbers by index (a row per insert took two
`NOT IN (SELECT ... LIMIT n)` scans and a commit of its own: 4 ms at first, 25 ms by 8,000 rows)."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("edge.ai.gateway")

CACHE_ENTRY_BYTES = 4 * 1024 * 1024
ACCOUNT_CACHE_BYTES = 64 * 1024 * 1024
LOG_ROWS = 10_000
ACCOUNT_LOG_ROWS = 20_000
FLUSH_ROWS = 256  # log rows written in one transaction
FLUSH_S = 0.05  # the longest a queued log row waits to be written (unless the database fails)

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
"""
# rows come in rowid order (a new row's rowid is past every other's: rows go from the oldest end only)
_INDEXES = """
CREATE INDEX IF NOT EXISTS logs_by_gateway_seq ON logs (account, gateway, gateway_seq);
CREATE INDEX IF NOT EXISTS logs_by_account_rowid ON logs (account);
"""


class GatewayStore:
    def __init__(self, path: Path, clock=time.time):
        self.path, self.clock = Path(path), clock
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        # log rows accepted, not yet written: (id, account, gateway, created, row as JSON)
        self._queue: list[tuple[str, str, str, float, str]] = []
        self._queued = threading.Condition(self._lock)  # the writer waits on it
        self._writer: threading.Thread | None = None
        self._closing = False
        self._counts: dict[str, int] = {}  # log rows per account, counted once, then kept up to date

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
            self._db.executescript(_SCHEMA + _INDEXES)
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

    def log(self, account: str, gateway: str, entry: dict[str, Any]) -> None:
        """Queue a log row (written within FLUSH_S, or by the next read). When the queue is full
        and cannot be written, the row is refused with the database's error, as a write was."""
        row = (entry["id"], account, gateway, self.clock(), json.dumps(entry))
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
        gateway's rows past LOG_ROWS by number, and each account's oldest past ACCOUNT_LOG_ROWS (the
        lock is held). A gateway's rows only ever go from its oldest end, so its numbers left are a
        range; an account's are not (its gateways' caps leave gaps), so it keeps a count of its
        rows and drops its oldest by rowid, as many as it is over."""
        rows = self._queue
        if not rows:
            return
        db = self._conn()
        counts = self._counts
        last: dict[tuple[str, str], int] = {}  # the last number given in each gateway
        numbered = []
        db.execute("BEGIN IMMEDIATE")
        try:
            for log_id, account, gateway, created, text in rows:
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
                last[account, gateway] = n + 1
                numbered.append((log_id, account, gateway, created, text, n + 1))
            # ids are the runtime's (uuid4); a repeated one is dropped, not the whole batch with it
            written = db.executemany(
                "INSERT OR IGNORE INTO logs (id, account, gateway, created, row, gateway_seq) "
                "VALUES (?,?,?,?,?,?)",
                numbered,
            ).rowcount
            for _, account, *_rest in numbered:
                counts[account] += 1
            if written != len(numbered):
                for account in {r[1] for r in numbered}:
                    counts[account] = _count(db, account)
            for (account, gateway), n in last.items():
                dropped = db.execute(
                    "DELETE FROM logs WHERE account=? AND gateway=? AND gateway_seq<=?",
                    (account, gateway, n - LOG_ROWS),
                ).rowcount
                counts[account] -= dropped
            for account in {account for account, _ in last}:
                over = counts[account] - ACCOUNT_LOG_ROWS
                if over > 0:
                    counts[account] -= db.execute(
                        "DELETE FROM logs WHERE rowid IN "
                        "(SELECT rowid FROM logs WHERE account=? ORDER BY rowid LIMIT ?)",
                        (account, over),
                    ).rowcount
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            counts.clear()  # counted again from the database
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

    def patch_log(self, account: str, gateway: str, log_id: str, patch: dict[str, Any]) -> bool:
        """Fields of a log row replaced (patchLog's, or a stream's outcome when it ended); False
        when the account's gateway holds no such row."""
        with self._lock:
            self._flush()
            db = self._conn()
            row = db.execute(
                "SELECT row FROM logs WHERE id=? AND account=? AND gateway=?", (log_id, account, gateway)
            ).fetchone()
            if row is None:
                return False
            entry = {**json.loads(row[0]), **patch}  # a field given replaces the logged one
            db.execute("UPDATE logs SET row=? WHERE id=? AND account=?", (json.dumps(entry), log_id, account))
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


def _count(db: sqlite3.Connection, account: str) -> int:
    return db.execute("SELECT COUNT(*) FROM logs WHERE account=?", (account,)).fetchone()[0]


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
