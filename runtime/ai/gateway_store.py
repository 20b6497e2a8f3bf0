"""AI Gateway's state in one SQLite database under the state dir (`.edge/ai-gateway.db`): the response
cache and the request logs of every account's gateways. Every row is keyed by account, so no
account reaches another's entries, whatever gateway id it names. Blocking: the runtime calls it
through its fair binding pool (runtime.control.fair_pool), never on the event loop.

Bounds, since any account may make gateways on first use: a cached answer is at most
CACHE_ENTRY_BYTES (a larger one is not cached) and an account's entries ACCOUNT_CACHE_BYTES in all
(the soonest to expire go first); a gateway keeps its newest LOG_ROWS log rows and an account
ACCOUNT_LOG_ROWS over all its gateways (older ones are dropped as new ones come)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

CACHE_ENTRY_BYTES = 4 * 1024 * 1024
ACCOUNT_CACHE_BYTES = 64 * 1024 * 1024
LOG_ROWS = 10_000
ACCOUNT_LOG_ROWS = 20_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cache (
    account TEXT NOT NULL, gateway TEXT NOT NULL, key TEXT NOT NULL,
    kind TEXT NOT NULL,            -- "json" (a body) or "sse" (an event stream, replayed as it came)
    body BLOB NOT NULL, expires REAL NOT NULL,
    PRIMARY KEY (account, gateway, key)
);
CREATE TABLE IF NOT EXISTS logs (
    id TEXT PRIMARY KEY, account TEXT NOT NULL, gateway TEXT NOT NULL, created REAL NOT NULL,
    row TEXT NOT NULL              -- the log entry as JSON
);
CREATE INDEX IF NOT EXISTS logs_by_gateway ON logs (account, gateway, created);
CREATE INDEX IF NOT EXISTS logs_by_account ON logs (account, created);
"""


class GatewayStore:
    def __init__(self, path: Path, clock=time.time):
        self.path, self.clock = Path(path), clock
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        return self._db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

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
        with self._lock:
            db = self._conn()
            db.execute(
                "INSERT INTO logs (id, account, gateway, created, row) VALUES (?,?,?,?,?)",
                (entry["id"], account, gateway, self.clock(), json.dumps(entry)),
            )
            db.execute(
                "DELETE FROM logs WHERE account=? AND gateway=? AND id NOT IN (SELECT id FROM logs "
                "WHERE account=? AND gateway=? ORDER BY created DESC, rowid DESC LIMIT ?)",
                (account, gateway, account, gateway, LOG_ROWS),
            )
            db.execute(
                "DELETE FROM logs WHERE account=? AND id NOT IN (SELECT id FROM logs "
                "WHERE account=? ORDER BY created DESC, rowid DESC LIMIT ?)",
                (account, account, ACCOUNT_LOG_ROWS),
            )

    def get_log(self, account: str, gateway: str, log_id: str) -> dict[str, Any] | None:
        with self._lock:
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
            rows = (
                self._conn()
                .execute(
                    "SELECT row FROM logs WHERE account=? AND gateway=? "
                    "ORDER BY created DESC, rowid DESC LIMIT ?",
                    (account, gateway, limit),
                )
                .fetchall()
            )
        return [json.loads(r[0]) for r in rows]
