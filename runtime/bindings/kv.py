"""Workers KV, simulated: one SQLite file (`.edge/kv.sqlite`) holding every namespace of every
account, each row keyed by (account, namespace id, key), so the same namespace id in two accounts
names two different stores.

Cloudflare's limits hold: keys at most 512 bytes (not "", "." or ".."), metadata at most 1024
bytes of JSON, expirationTtl at least 60 s, list limit 1..1000. Values may be 25 MiB there; here a
value crosses from the isolate in one frame, so it is at most what that frame can carry (2 MiB).
Expired keys are invisible to get and list, and deleted as puts come.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from runtime.bindings.common import (
    CALL_BYTES,
    BindingError,
    arity,
    blob,
    check_quota,
    decode_cursor,
    encode_cursor,
    integer,
    open_private_db,
    options,
    text,
)
from runtime.bindings.kind import BindingKind

KEY_BYTES = 512
VALUE_BYTES = 25 * 1024 * 1024  # Cloudflare's; the frame from the isolate caps it lower
METADATA_BYTES = 1024
MIN_TTL_S = 60
LIST_LIMIT = 1000

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    account TEXT NOT NULL, namespace TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,
    expiration INTEGER, metadata TEXT, PRIMARY KEY (account, namespace, key));
"""


def _key(what: str, key: Any) -> str:
    text(f"{what}: key", key, KEY_BYTES)
    if key in (".", ".."):
        raise BindingError("TypeError", f"{what}: the key must not be {key!r}")
    return key


class KVStore:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        self._db = open_private_db(path)
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self.clock = clock

    def call(self, account: str, namespace: str, method: str, args: list, kwargs: dict) -> Any:
        handler = {"get": self.get, "put": self.put, "delete": self.delete, "list": self.list}.get(method)
        if handler is None:
            raise BindingError("TypeError", f"KV has no method {method!r}")
        return handler(account, namespace, args, kwargs)

    def get(self, account: str, namespace: str, args: list, kwargs: dict) -> dict | None:
        arity("KV get", args, 1)
        key = _key("KV get", args[0])
        options("KV get", kwargs, set())
        with self._lock:
            row = self._db.execute(
                "SELECT value, metadata FROM kv WHERE account = ? AND namespace = ? AND key = ?"
                " AND (expiration IS NULL OR expiration > ?)",
                (account, namespace, key, self.clock()),
            ).fetchone()
        if row is None:
            return None
        return {"value": row[0], "metadata": json.loads(row[1]) if row[1] is not None else None}

    def put(self, account: str, namespace: str, args: list, kwargs: dict) -> None:
        arity("KV put", args, 2)
        key = _key("KV put", args[0])
        value = blob(
            "KV put: the value",
            args[1],
            min(VALUE_BYTES, CALL_BYTES),
            f" here (Cloudflare allows {VALUE_BYTES // 2**20} MiB; a value crosses from the isolate "
            f"in one {CALL_BYTES // 2**20} MiB frame)",
        )
        opts = options("KV put", kwargs, {"expirationTtl", "expiration", "metadata"})
        now = self.clock()
        expiration = None
        if "expirationTtl" in opts:
            ttl = integer("KV put: expirationTtl", opts["expirationTtl"], MIN_TTL_S, 10**10)
            expiration = int(now) + ttl
        if "expiration" in opts:
            expiration = integer("KV put: expiration", opts["expiration"], int(now) + MIN_TTL_S, 10**11)
        metadata = None
        if "metadata" in opts:
            try:
                metadata = json.dumps(opts["metadata"], ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError):
                raise BindingError(
                    "TypeError", "KV put: metadata must be JSON (dicts, lists, strings, numbers)"
                ) from None
            if len(metadata.encode()) > METADATA_BYTES:
                raise BindingError(
                    "RangeError",
                    f"KV put: metadata is {len(metadata.encode())} bytes of JSON; "
                    f"the limit is {METADATA_BYTES}",
                )
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "DELETE FROM kv WHERE account = ? AND namespace = ? AND expiration <= ?",
                    (account, namespace, now),
                )
                (used,) = self._db.execute(
                    "SELECT COALESCE(SUM(LENGTH(key) + LENGTH(value)), 0) FROM kv "
                    "WHERE account = ? AND NOT (namespace = ? AND key = ?)",
                    (account, namespace, key),
                ).fetchone()
                check_quota("KV", used, len(key.encode()) + len(value))
                self._db.execute(
                    "INSERT OR REPLACE INTO kv VALUES (?, ?, ?, ?, ?, ?)",
                    (account, namespace, key, value, expiration, metadata),
                )
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite ends it itself on a full disk
                    self._db.execute("ROLLBACK")
                raise

    def delete(self, account: str, namespace: str, args: list, kwargs: dict) -> None:
        arity("KV delete", args, 1)
        key = _key("KV delete", args[0])
        options("KV delete", kwargs, set())
        with self._lock:
            self._db.execute(
                "DELETE FROM kv WHERE account = ? AND namespace = ? AND key = ?", (account, namespace, key)
            )

    def list(self, account: str, namespace: str, args: list, kwargs: dict) -> dict:
        arity("KV list", args, 0)
        opts = options("KV list", kwargs, {"prefix", "limit", "cursor"})
        prefix = text("KV list: prefix", opts.get("prefix", ""), KEY_BYTES, allow_empty=True)
        limit = integer("KV list: limit", opts.get("limit", LIST_LIMIT), 1, LIST_LIMIT)
        after = decode_cursor("KV list", opts["cursor"]) if "cursor" in opts else None
        query = (
            "SELECT key, expiration, metadata FROM kv WHERE account = ? AND namespace = ?"
            " AND substr(key, 1, length(?)) = ? AND (expiration IS NULL OR expiration > ?)"
        )
        params: list[Any] = [account, namespace, prefix, prefix, self.clock()]
        if after is not None:
            query += " AND key > ?"
            params.append(after)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY key LIMIT ?", (*params, limit + 1)).fetchall()
        complete = len(rows) <= limit
        keys = []
        for name, expiration, metadata in rows[:limit]:
            entry: dict[str, Any] = {"name": name}
            if expiration is not None:
                entry["expiration"] = expiration
            if metadata is not None:
                entry["metadata"] = json.loads(metadata)
            keys.append(entry)
        result: dict[str, Any] = {"keys": keys, "list_complete": complete}
        if not complete:
            result["cursor"] = encode_cursor(keys[-1]["name"])
        return result

    def close(self) -> None:
        self._db.close()


class KVNamespaceConfig(msgspec.Struct, kw_only=True):
    """A kv_namespaces entry of the wrangler config."""

    binding: str
    id: str
    preview_id: str | None = None


class KVNamespaceUpload(msgspec.Struct, forbid_unknown_fields=True):
    binding: str
    id: str


KIND = BindingKind(
    "kv", "kv_namespaces", KVNamespaceConfig, KVNamespaceUpload, ("id", "binding"),
    lambda state_dir, query_s: KVStore(state_dir / "kv.sqlite"), "workers.kv:KVNamespace",
)  # fmt: skip
