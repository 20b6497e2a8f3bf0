"""The runtime's durable state in SQLite: accounts (their settings: runtime.control.accounts) and API
tokens (stored hashed), workers, their versions and deployments, and secrets (encrypted).
Survives restarts; isolates never see this file.

Secrets at rest: AES-256-GCM under a key in `secrets.key` beside the database (32 random bytes,
mode 600, made on first use). Each value is stored as a BLOB `nonce (12 bytes) || ciphertext+tag`
with (account, worker, name) as associated data, so a ciphertext moved to another worker, account
or name fails to decrypt. Plaintext rows left by an older runtime (TEXT values) are encrypted when
the database is opened; secure_delete keeps their old bytes out of the file.

File modes under the state dir (`.edge/`): the database, its WAL and the key are 600; the state
dir and its folders are 700, the runtime's alone. Deployed bundles, `scripts/<version>` (755, files
644, see `write_bundle`), reach an isolate only as the copy its jail makes while it still holds the
runtime's identity (runtime.isolate.jail), never by a path the isolate's own uid could walk.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runtime.control.rate_limit import DEFAULT_RPM
from runtime.control.storage_errors import BUSY_TIMEOUT_S, storage_failure

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

# The accounts' settings (runtime.control.accounts), columns added by migrate_accounts to new databases and
# to ones an older runtime made alike, in this order.
ACCOUNT_COLUMNS = (
    ("rpm", f"INTEGER NOT NULL DEFAULT {DEFAULT_RPM}"),
    ("tpm", "INTEGER"),  # NULL: unlimited
    ("weight", "REAL NOT NULL DEFAULT 1.0"),
    ("kv_share", "REAL NOT NULL DEFAULT 1.0"),
)


def migrate_accounts(db: sqlite3.Connection) -> None:
    """Add the settings' columns a database made by an older runtime lacks (idempotent)."""
    have = {row[1] for row in db.execute("PRAGMA table_info(accounts)")}
    for column, declaration in ACCOUNT_COLUMNS:
        if column not in have:
            db.execute(f"ALTER TABLE accounts ADD COLUMN {column} {declaration}")


KEY_FILE = "secrets.key"
_NONCE = 12


class SecretError(Exception):
    """A stored secret cannot be decrypted (the key is missing or changed, or the row was moved)."""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _secret_aad(account_id: str, worker: str, name: str) -> bytes:
    return json.dumps(["edge-secret-v1", account_id, worker, name]).encode()


def private_file(path: Path) -> None:
    """Create `path` empty with mode 600 if it does not exist, and make it 600 if it does."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    path.chmod(0o600)


def private_dir(path: Path) -> Path:
    """A folder of the state dir (the state dir itself, scripts/, staging/), created if needed,
    mode 700: no other uid may list or walk it."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def write_bundle(folder: Path, files: dict[str, str]) -> None:
    """Write a (validated) bundle under `folder`: dirs 755 and files 644, whatever the umask, so
    the isolate can read it as another uid. `folder`'s parent must exist."""
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    for rel, source in files.items():
        path = folder / rel
        for parent in reversed(path.relative_to(folder).parents[:-1]):
            sub = folder / parent
            if not sub.is_dir():
                sub.mkdir()
                sub.chmod(0o755)
        with open(path, "x", encoding="utf-8") as f:  # "x": a clash or a duplicate is an error
            f.write(source)
        path.chmod(0o644)


def materialise_bundle(state_dir: Path, version: str, files: dict[str, str]) -> Path:
    """scripts/<version> under the state dir, written from the stored files if it is missing:
    through a staging folder renamed into place, so a half-written bundle never runs."""
    folder = state_dir / "scripts" / version
    if folder.is_dir():
        return folder
    staging = private_dir(state_dir / "staging") / uuid.uuid4().hex
    try:
        write_bundle(staging, files)
        private_dir(folder.parent)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


class State:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        private_dir(self.path.parent)
        # 600 before SQLite opens it (it gives its -wal and -shm files the database's mode)
        for p in (self.path, *(self.path.with_name(self.path.name + x) for x in ("-wal", "-shm"))):
            if p == self.path or p.exists():
                private_file(p)
        self._db = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None
        )
        self._db.executescript("PRAGMA journal_mode=WAL; PRAGMA secure_delete=ON;" + SCHEMA)
        migrate_accounts(self._db)
        self._lock = threading.Lock()
        # the request path's reads (a token's account, the active deployment, a version) have a
        # connection of their own: in WAL mode a reader is not blocked by a writer, so a write that
        # waits out another process's lock (up to the busy timeout) does not hold up serving
        self._reader = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None
        )
        self._read_lock = threading.Lock()
        self._key_path = self.path.parent / KEY_FILE
        self._aead: AESGCM | None = None
        self._encrypt_plaintext_rows()

    def close(self) -> None:
        with self._lock, self._read_lock:
            self._db.close()
            self._reader.close()

    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        """One statement, its rows (runtime.control.accounts keeps its tables' SQL beside its logic)."""
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.OperationalError as exc:  # locked by another process, or the disk full
                raise (storage_failure(exc, "the state database") or exc) from exc

    _q = query

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        """One read on the request path's own connection (see __init__)."""
        with self._read_lock:
            try:
                return self._reader.execute(sql, args).fetchall()
            except sqlite3.OperationalError as exc:
                raise (storage_failure(exc, "the state database") or exc) from exc

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
        rows = self._read("SELECT account_id FROM tokens WHERE hash = ?", (token_hash(token),))
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

    def version(self, account_id: str, worker: str, version_id: str) -> dict[str, Any] | None:
        """A version of this worker (None for an unknown id, or one of another worker)."""
        rows = self._read(
            "SELECT id, worker, created, main, files, config, message FROM versions "
            "WHERE account_id = ? AND worker = ? AND id = ?",
            (account_id, worker, version_id),
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
        rows = self._read(
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
        rows = self._read(
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
        rows = self._read(
            "SELECT strategy FROM deployments WHERE account_id = ? AND worker = ? "
            "ORDER BY created DESC LIMIT 1",
            (account_id, worker),
        )
        return [tuple(x) for x in json.loads(rows[0][0])] if rows else None

    def workers(self) -> list[tuple[str, str]]:
        return [tuple(r) for r in self._q("SELECT DISTINCT account_id, worker FROM deployments")]

    # --- secrets --------------------------------------------------------------------------------------

    def _cipher(self) -> AESGCM:
        """The secrets key, read from secrets.key or made there (mode 600) on first use."""
        if self._aead is not None:
            return self._aead
        try:
            fd = os.open(self._key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            self._key_path.chmod(0o600)
            key = self._key_path.read_bytes()
            if len(key) != 32:
                raise SecretError(
                    f"{self._key_path}: expected a 32-byte key, found {len(key)} bytes; restore the "
                    "key file (or delete it together with the secrets in the database)"
                ) from None
        else:
            if self._q("SELECT 1 FROM secrets WHERE typeof(value) = 'blob' LIMIT 1"):
                os.close(fd)
                self._key_path.unlink()
                raise SecretError(
                    f"{self._key_path} is missing but {self.path} holds encrypted secrets; restore "
                    "the key file, or delete and put the secrets again"
                )
            key = AESGCM.generate_key(bit_length=256)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
        self._aead = AESGCM(key)
        return self._aead

    def _seal(self, account_id: str, worker: str, name: str, value: str) -> bytes:
        nonce = os.urandom(_NONCE)
        aad = _secret_aad(account_id, worker, name)
        return nonce + self._cipher().encrypt(nonce, value.encode(), aad)

    def _open(self, account_id: str, worker: str, name: str, blob: bytes) -> str:
        if not isinstance(blob, bytes):  # written in plain text by an older runtime since we opened
            raise SecretError(f"secret {name!r} of worker {worker!r} is not encrypted; restart the runtime")
        try:
            plain = self._cipher().decrypt(
                blob[:_NONCE], blob[_NONCE:], _secret_aad(account_id, worker, name)
            )
            return plain.decode()
        except InvalidTag:
            raise SecretError(
                f"secret {name!r} of worker {worker!r} (account {account_id!r}) does not decrypt: it "
                "was not stored for this worker, or secrets.key changed; put it again"
            ) from None

    def _encrypt_plaintext_rows(self) -> None:
        """Rows an older runtime stored as plain text: encrypt them in place."""
        rows = self._q("SELECT account_id, worker, name, value FROM secrets WHERE typeof(value) != 'blob'")
        for account_id, worker, name, value in rows:
            self._q(
                "UPDATE secrets SET value = ? WHERE account_id = ? AND worker = ? AND name = ?",
                (self._seal(account_id, worker, name, str(value)), account_id, worker, name),
            )
        if rows:
            self._q("PRAGMA wal_checkpoint(TRUNCATE)")

    def put_secret(self, account_id: str, worker: str, name: str, value: str) -> None:
        sealed = self._seal(account_id, worker, name, value)
        self._q("INSERT OR REPLACE INTO secrets VALUES (?, ?, ?, ?)", (account_id, worker, name, sealed))

    def delete_secret(self, account_id: str, worker: str, name: str) -> bool:
        before = self.secret_names(account_id, worker)
        self._q(
            "DELETE FROM secrets WHERE account_id = ? AND worker = ? AND name = ?", (account_id, worker, name)
        )
        return name in before

    def secret_names(self, account_id: str, worker: str) -> list[str]:
        return [
            r[0]
            for r in self._read(
                "SELECT name FROM secrets WHERE account_id = ? AND worker = ? ORDER BY name",
                (account_id, worker),
            )
        ]

    def secrets(self, account_id: str, worker: str) -> dict[str, str]:
        """The worker's secrets, decrypted (for its env only; never log them)."""
        rows = self._q(
            "SELECT name, value FROM secrets WHERE account_id = ? AND worker = ?", (account_id, worker)
        )
        return {name: self._open(account_id, worker, name, blob) for name, blob in rows}
