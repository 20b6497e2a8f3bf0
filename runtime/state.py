"""The runtime's durable state in SQLite: accounts and API tokens (stored hashed), workers, their
versions and deployments, and secrets. Survives restarts; isolates never see this file."""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES accounts(id), name TEXT,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS versions (
    id TEXT PRIMARY KEY, account_id TEXT NOT NULL, worker TEXT NOT NULL, created REAL NOT NULL,
    main TEXT NOT NULL, files TEXT NOT NULL, config TEXT NOT NULL, message TEXT);
CREATE TABLE IF NOT EXISTS deployments (
    id TEXT PRIMARY KEY, account_id TEXT NOT NULL, worker TEXT NOT NULL, created REAL NOT NULL,
    strategy TEXT NOT NULL, message TEXT);
CREATE TABLE IF NOT EXISTS secrets (
    account_id TEXT NOT NULL, worker TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (account_id, worker, name));
"""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class State:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.path.chmod(0o600)  # isolates run as another user and cannot read it
        self._db.executescript("PRAGMA journal_mode=WAL;" + SCHEMA)
        self._lock = threading.Lock()

    def _q(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # --- accounts and tokens --------------------------------------------------------------------------

    def ensure_account(self, account_id: str) -> None:
        self._q("INSERT OR IGNORE INTO accounts (id, created) VALUES (?, ?)", (account_id, time.time()))

    def create_token(self, account_id: str, name: str = "default") -> str:
        """A new API token for the account; only its hash is stored, so show it once."""
        self.ensure_account(account_id)
        token = "edge_" + secrets.token_urlsafe(32)
        self._q(
            "INSERT INTO tokens (hash, account_id, name, created) VALUES (?, ?, ?, ?)",
            (token_hash(token), account_id, name, time.time()),
        )
        return token

    def add_token(self, account_id: str, token: str, name: str = "env") -> None:
        self.ensure_account(account_id)
        self._q(
            "INSERT OR IGNORE INTO tokens (hash, account_id, name, created) VALUES (?, ?, ?, ?)",
            (token_hash(token), account_id, name, time.time()),
        )

    def account_for(self, token: str) -> str | None:
        rows = self._q("SELECT account_id FROM tokens WHERE hash = ?", (token_hash(token),))
        return rows[0][0] if rows else None

    # --- versions and deployments ---------------------------------------------------------------------

    def add_version(
        self,
        account_id: str,
        worker: str,
        main: str,
        files: dict[str, str],
        config: dict,
        message: str | None = None,
    ) -> str:
        version = str(uuid.uuid4())
        self._q(
            "INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (version, account_id, worker, time.time(), main, json.dumps(files), json.dumps(config), message),
        )
        return version

    def version(self, account_id: str, version_id: str) -> dict[str, Any] | None:
        rows = self._q(
            "SELECT id, worker, created, main, files, config, message FROM versions "
            "WHERE account_id = ? AND id = ?",
            (account_id, version_id),
        )
        if not rows:
            return None
        vid, worker, created, main, files, config, message = rows[0]
        return {
            "id": vid,
            "worker": worker,
            "created": created,
            "main": main,
            "files": json.loads(files),
            "config": json.loads(config),
            "message": message,
        }

    def versions(self, account_id: str, worker: str) -> list[dict[str, Any]]:
        rows = self._q(
            "SELECT id, created, message FROM versions WHERE account_id = ? AND worker = ? "
            "ORDER BY created DESC",
            (account_id, worker),
        )
        return [{"id": r[0], "created": r[1], "message": r[2]} for r in rows]

    def deploy(
        self, account_id: str, worker: str, strategy: list[tuple[str, int]], message: str | None = None
    ) -> str:
        deployment = str(uuid.uuid4())
        self._q(
            "INSERT INTO deployments VALUES (?, ?, ?, ?, ?, ?)",
            (deployment, account_id, worker, time.time(), json.dumps(strategy), message),
        )
        return deployment

    def deployments(self, account_id: str, worker: str) -> list[dict[str, Any]]:
        rows = self._q(
            "SELECT id, created, strategy, message FROM deployments WHERE account_id = ? AND worker = ? "
            "ORDER BY created DESC",
            (account_id, worker),
        )
        return [
            {
                "id": r[0],
                "created": r[1],
                "versions": [{"version_id": v, "percentage": p} for v, p in json.loads(r[2])],
                "message": r[3],
            }
            for r in rows
        ]

    def active(self, account_id: str, worker: str) -> list[tuple[str, int]] | None:
        rows = self._q(
            "SELECT strategy FROM deployments WHERE account_id = ? AND worker = ? "
            "ORDER BY created DESC LIMIT 1",
            (account_id, worker),
        )
        return [tuple(x) for x in json.loads(rows[0][0])] if rows else None

    def workers(self) -> list[tuple[str, str]]:
        return [tuple(r) for r in self._q("SELECT DISTINCT account_id, worker FROM deployments")]

    # --- secrets --------------------------------------------------------------------------------------

    def put_secret(self, account_id: str, worker: str, name: str, value: str) -> None:
        self._q("INSERT OR REPLACE INTO secrets VALUES (?, ?, ?, ?)", (account_id, worker, name, value))

    def delete_secret(self, account_id: str, worker: str, name: str) -> bool:
        before = self.secret_names(account_id, worker)
        self._q(
            "DELETE FROM secrets WHERE account_id = ? AND worker = ? AND name = ?", (account_id, worker, name)
        )
        return name in before

    def secret_names(self, account_id: str, worker: str) -> list[str]:
        return [
            r[0]
            for r in self._q(
                "SELECT name FROM secrets WHERE account_id = ? AND worker = ? ORDER BY name",
                (account_id, worker),
            )
        ]

    def secrets(self, account_id: str, worker: str) -> dict[str, str]:
        return dict(
            self._q(
                "SELECT name, value FROM secrets WHERE account_id = ? AND worker = ?", (account_id, worker)
            )
        )
