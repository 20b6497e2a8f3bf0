"""AI Search's durable state: one SQLite file (`.edge/ai_search.sqlite`) holding every account's
namespaces, instances (their settings as JSON), items (each document's bytes, metadata and
indexing status), chunks (text, the embedding as float32s) with an FTS5 keyword index over them
(Porter-stemmed BM25, as Cloudflare's default `porter` keyword tokenizer), and indexing jobs.

Every row carries its account, and every statement names it: another account's instance of the
same name is another instance. The methods are blocking; the service runs them in its fair pool.
One connection, its statements serialized by a lock (SQLite's own); reads of chunks for search are
cached in memory per instance (retrieve.Loaded) and reloaded when the instance's `version` moves.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from runtime.control.state import private_dir, private_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS namespaces (
    account TEXT NOT NULL, name TEXT NOT NULL, description TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL, modified REAL NOT NULL, PRIMARY KEY (account, name));
CREATE TABLE IF NOT EXISTS instances (
    account TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL, config TEXT NOT NULL,
    created REAL NOT NULL, modified REAL NOT NULL, last_activity REAL,
    version INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (account, namespace, name));
CREATE TABLE IF NOT EXISTS items (
    id TEXT PRIMARY KEY, account TEXT NOT NULL, namespace TEXT NOT NULL, instance TEXT NOT NULL,
    key TEXT NOT NULL, source_id TEXT NOT NULL, content BLOB NOT NULL, content_type TEXT NOT NULL,
    size INTEGER NOT NULL, checksum TEXT NOT NULL, metadata TEXT, status TEXT NOT NULL,
    error TEXT, chunks_count INTEGER, created REAL NOT NULL, modified REAL NOT NULL,
    last_seen REAL NOT NULL, object_time REAL NOT NULL,
    UNIQUE (account, namespace, instance, key));
CREATE INDEX IF NOT EXISTS items_status ON items (account, namespace, instance, status);
CREATE INDEX IF NOT EXISTS items_queued ON items (status, modified);
CREATE TABLE IF NOT EXISTS chunks (
    rowid INTEGER PRIMARY KEY, account TEXT NOT NULL, namespace TEXT NOT NULL,
    instance TEXT NOT NULL, item_id TEXT NOT NULL, seq INTEGER NOT NULL, text TEXT NOT NULL,
    context TEXT NOT NULL DEFAULT '', vec BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_instance ON chunks (account, namespace, instance);
CREATE INDEX IF NOT EXISTS chunks_item ON chunks (item_id, seq);
CREATE VIRTUAL TABLE IF NOT EXISTS chunk_words USING fts5(
    text, context, content='chunks', content_rowid='rowid', tokenize='porter unicode61');
CREATE TRIGGER IF NOT EXISTS chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunk_words (rowid, text, context) VALUES (new.rowid, new.text, new.context); END;
CREATE TRIGGER IF NOT EXISTS chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunk_words (chunk_words, rowid, text, context)
    VALUES ('delete', old.rowid, old.text, old.context); END;
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, account TEXT NOT NULL, namespace TEXT NOT NULL, instance TEXT NOT NULL,
    source TEXT NOT NULL, description TEXT, started REAL NOT NULL, ended REAL, end_reason TEXT,
    documents INTEGER NOT NULL DEFAULT 0, chunks INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0, skipped INTEGER NOT NULL DEFAULT 0, total INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS jobs_instance ON jobs (account, namespace, instance, started);
"""

ITEM_COLUMNS = (
    "id, key, source_id, size, checksum, metadata, status, error, chunks_count, created, "
    "modified, last_seen, object_time, namespace, content_type"
)


def open_db(path: Path) -> sqlite3.Connection:
    """The file, private to the runtime's user (600, its folder 700), in WAL mode so that the CLI
    and a running edge dev share it."""
    private_dir(path.parent)
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    private_file(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(SCHEMA)
    return conn


def item_row(row: tuple) -> dict[str, Any]:
    """An items row (ITEM_COLUMNS) as a dict."""
    names = [c.strip() for c in ITEM_COLUMNS.split(",")]
    out = dict(zip(names, row, strict=True))
    out["metadata"] = json.loads(out["metadata"]) if out["metadata"] else {}
    return out


class SearchStore:
    def __init__(self, path: Path):
        self.path = path
        self.db = open_db(path)
        self.lock = threading.RLock()

    def close(self) -> None:
        with self.lock:
            self.db.close()

    def execute(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self.lock:
            return self.db.execute(sql, args).fetchall()

    def one(self, sql: str, args: tuple = ()) -> tuple | None:
        with self.lock:
            return self.db.execute(sql, args).fetchone()

    def transaction(self):
        """`with store.transaction() as db:` one write transaction under the lock."""
        return _Transaction(self)

    # --- namespaces -------------------------------------------------------------------------------

    def namespace(self, account: str, name: str) -> dict | None:
        row = self.one(
            "SELECT name, description, created, modified FROM namespaces WHERE account = ? AND name = ?",
            (account, name),
        )
        return None if row is None else _namespace(row)

    def namespaces(self, account: str) -> list[dict]:
        rows = self.execute(
            "SELECT name, description, created, modified FROM namespaces WHERE account = ? ORDER BY name",
            (account,),
        )
        return [_namespace(r) for r in rows]

    def ensure_namespace(self, account: str, name: str, description: str = "") -> None:
        now = time.time()
        self.execute(
            "INSERT OR IGNORE INTO namespaces (account, name, description, created, modified) "
            "VALUES (?, ?, ?, ?, ?)",
            (account, name, description, now, now),
        )

    # --- instances --------------------------------------------------------------------------------

    def instance(self, account: str, ns: str, name: str) -> dict | None:
        row = self.one(
            "SELECT name, config, created, modified, last_activity, version, bytes, namespace, account "
            "FROM instances WHERE account = ? AND namespace = ? AND name = ?",
            (account, ns, name),
        )
        return None if row is None else _instance(row)

    def instances(self, account: str, ns: str | None = None) -> list[dict]:
        if ns is None:
            rows = self.execute(
                "SELECT name, config, created, modified, last_activity, version, bytes, namespace, account "
                "FROM instances WHERE account = ? ORDER BY namespace, name",
                (account,),
            )
        else:
            rows = self.execute(
                "SELECT name, config, created, modified, last_activity, version, bytes, namespace, account "
                "FROM instances WHERE account = ? AND namespace = ? ORDER BY name",
                (account, ns),
            )
        return [_instance(r) for r in rows]

    def bump(self, db: sqlite3.Connection, account: str, ns: str, name: str, added_bytes: int = 0) -> None:
        db.execute(
            "UPDATE instances SET version = version + 1, last_activity = ?, bytes = bytes + ? "
            "WHERE account = ? AND namespace = ? AND name = ?",
            (time.time(), added_bytes, account, ns, name),
        )

    # --- items ------------------------------------------------------------------------------------

    def item(self, account: str, ns: str, instance: str, item_id: str) -> dict | None:
        row = self.one(
            f"SELECT {ITEM_COLUMNS} FROM items WHERE account = ? AND namespace = ? AND instance = ? "
            "AND id = ?",
            (account, ns, instance, item_id),
        )
        return None if row is None else item_row(row)

    def item_by_key(self, account: str, ns: str, instance: str, key: str) -> dict | None:
        row = self.one(
            f"SELECT {ITEM_COLUMNS} FROM items WHERE account = ? AND namespace = ? AND instance = ? "
            "AND key = ?",
            (account, ns, instance, key),
        )
        return None if row is None else item_row(row)

    def content(self, item_id: str) -> bytes | None:
        row = self.one("SELECT content FROM items WHERE id = ?", (item_id,))
        return None if row is None else bytes(row[0])

    def counts(self, account: str, ns: str, instance: str) -> dict[str, int]:
        rows = self.execute(
            "SELECT status, count(*) FROM items WHERE account = ? AND namespace = ? AND instance = ? "
            "GROUP BY status",
            (account, ns, instance),
        )
        return {status: n for status, n in rows}

    def chunk_count(self, account: str, ns: str, instance: str) -> int:
        row = self.one(
            "SELECT count(*) FROM chunks WHERE account = ? AND namespace = ? AND instance = ?",
            (account, ns, instance),
        )
        return int(row[0]) if row else 0


class _Transaction:
    def __init__(self, store: SearchStore):
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store.lock.acquire()
        self.store.db.execute("BEGIN IMMEDIATE")
        return self.store.db

    def __exit__(self, kind, exc, tb) -> None:
        try:
            self.store.db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self.store.lock.release()


def _namespace(row: tuple) -> dict:
    name, description, created, modified = row
    return {"name": name, "description": description, "created": created, "modified": modified}


def _instance(row: tuple) -> dict:
    name, config, created, modified, last_activity, version, size, namespace, account = row
    return {
        "name": name,
        "namespace": namespace,
        "account": account,
        "config": json.loads(config),
        "created": created,
        "modified": modified,
        "last_activity": last_activity,
        "version": version,
        "bytes": size,
    }
