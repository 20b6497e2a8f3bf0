"""R2, simulated: each object a file under `.edge/r2/<account>/<bucket>/`, named by a hash of
(account, bucket, key), never by the key itself (a key such as `../../state.db` is only a name);
metadata in SQLite (`.edge/r2/objects.sqlite`), keyed by (account, bucket, key).

Cloudflare's limits hold for keys (1024 bytes), custom metadata (2 KiB) and list (1..1000, delete
of at most 1000 keys). A value crosses from the isolate in one frame, so an object is at most what
that frame carries (2 MiB; Cloudflare allows 5 GiB in one put).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from runtime.bindings.common import (
    CALL_BYTES,
    REPLY_BYTES,
    BindingError,
    arity,
    blob,
    check_quota,
    decode_cursor,
    encode_cursor,
    integer,
    open_private_db,
    options,
    safe_component,
    text,
)
from runtime.bindings.kind import BindingKind
from runtime.control.state import private_dir

KEY_BYTES = 1024
CUSTOM_METADATA_BYTES = 2048
HTTP_FIELDS = ("contentType", "contentLanguage", "contentDisposition", "contentEncoding", "cacheControl")
HTTP_VALUE_BYTES = 1024
LIST_LIMIT = 1000
DELETE_KEYS = 1000

SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    account TEXT NOT NULL, bucket TEXT NOT NULL, key TEXT NOT NULL, file TEXT NOT NULL,
    size INTEGER NOT NULL, etag TEXT NOT NULL, version TEXT NOT NULL, uploaded REAL NOT NULL,
    http_metadata TEXT NOT NULL, custom_metadata TEXT NOT NULL,
    PRIMARY KEY (account, bucket, key));
"""
_COLUMNS = "key, size, etag, version, uploaded, http_metadata, custom_metadata"
_UNDER = "account = ? AND bucket = ? AND substr(key, 1, length(?)) = ?"  # keys under a prefix


def _meta(row: tuple) -> dict[str, Any]:
    key, size, etag, version, uploaded, http, custom = row
    return {
        "key": key,
        "size": size,
        "etag": etag,
        "version": version,
        "uploaded": uploaded,
        "httpMetadata": json.loads(http),
        "customMetadata": json.loads(custom),
    }


def _http_metadata(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise BindingError("TypeError", "R2 put: httpMetadata must be a dict")
    unknown = sorted(str(k) for k in value if k not in (*HTTP_FIELDS, "cacheExpiry"))
    if unknown:
        raise BindingError(
            "TypeError",
            f"R2 put: httpMetadata: unknown field(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(HTTP_FIELDS)}",
        )
    out = {
        k: text(f"R2 put: httpMetadata.{k}", v, HTTP_VALUE_BYTES)
        for k, v in value.items()
        if k in HTTP_FIELDS
    }
    if "cacheExpiry" in value:
        out["cacheExpiry"] = integer("R2 put: httpMetadata.cacheExpiry", value["cacheExpiry"], 0, 10**13)
    return out


def _custom_metadata(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BindingError("TypeError", "R2 put: customMetadata must be a dict of strings to strings")
    size = sum(
        len(k.encode("utf-8", "replace")) + len(v.encode("utf-8", "replace")) for k, v in value.items()
    )
    if size > CUSTOM_METADATA_BYTES:
        raise BindingError(
            "RangeError", f"R2 put: customMetadata is {size} bytes; the limit is {CUSTOM_METADATA_BYTES}"
        )
    return dict(value)


class R2Store:
    def __init__(self, root: Path):
        self.root = private_dir(root)
        self._db = open_private_db(root / "objects.sqlite")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def _folder(self, account: str, bucket: str) -> Path:
        return self.root / safe_component(account) / safe_component(bucket)

    @staticmethod
    def _file_name(account: str, bucket: str, key: str) -> str:
        return hashlib.sha256(json.dumps([account, bucket, key]).encode()).hexdigest()

    def call(self, account: str, bucket: str, method: str, args: list, kwargs: dict) -> Any:
        handler = {
            "put": self.put,
            "get": self.get,
            "head": self.head,
            "list": self.list,
            "delete": self.delete,
        }
        if method not in handler:
            raise BindingError("TypeError", f"R2 has no method {method!r}")
        return handler[method](account, bucket, args, kwargs)

    def put(self, account: str, bucket: str, args: list, kwargs: dict) -> dict:
        arity("R2 put", args, 2)
        key = text("R2 put: key", args[0], KEY_BYTES)
        data = blob(
            "R2 put: the value",
            args[1],
            CALL_BYTES,
            f" here (a value crosses from the isolate in one {CALL_BYTES // 2**20} MiB frame)",
        )
        opts = options("R2 put", kwargs, {"httpMetadata", "customMetadata"})
        http = _http_metadata(opts.get("httpMetadata", {}))
        custom = _custom_metadata(opts.get("customMetadata", {}))
        folder = private_dir(private_dir(self.root / safe_component(account)) / safe_component(bucket))
        name = self._file_name(account, bucket, key)
        staging = folder / f".{name}.{uuid.uuid4().hex}"
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            meta = (
                account, bucket, key, name, len(data), hashlib.md5(data).hexdigest(), uuid.uuid4().hex,
                time.time(), json.dumps(http), json.dumps(custom),
            )  # fmt: skip
            with self._lock:
                (used,) = self._db.execute(
                    "SELECT COALESCE(SUM(size), 0) FROM objects "
                    "WHERE account = ? AND NOT (bucket = ? AND key = ?)",
                    (account, bucket, key),
                ).fetchone()
                check_quota("R2", used, len(data))
                os.replace(staging, folder / name)
                self._db.execute("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", meta)
        finally:
            staging.unlink(missing_ok=True)
        return _meta((key, meta[4], meta[5], meta[6], meta[7], meta[8], meta[9]))

    def _row(self, account: str, bucket: str, key: str) -> tuple | None:
        return self._db.execute(
            f"SELECT {_COLUMNS}, file FROM objects WHERE account = ? AND bucket = ? AND key = ?",
            (account, bucket, key),
        ).fetchone()

    def head(self, account: str, bucket: str, args: list, kwargs: dict) -> dict | None:
        arity("R2 head", args, 1)
        key = text("R2 head: key", args[0], KEY_BYTES)
        options("R2 head", kwargs, set())
        with self._lock:
            row = self._row(account, bucket, key)
        return None if row is None else _meta(row[:-1])

    def get(self, account: str, bucket: str, args: list, kwargs: dict) -> dict | None:
        arity("R2 get", args, 1)
        key = text("R2 get: key", args[0], KEY_BYTES)
        options("R2 get", kwargs, set())
        with self._lock:
            row = self._row(account, bucket, key)
            if row is None:
                return None
            if row[1] > REPLY_BYTES:
                raise BindingError(
                    "R2_ERROR",
                    f"R2 get: the object is {row[1]} bytes; at most {REPLY_BYTES} cross to a worker here",
                )
            try:
                body = (self._folder(account, bucket) / row[-1]).read_bytes()
            except FileNotFoundError:
                return None
        return {"meta": _meta(row[:-1]), "body": body}

    def delete(self, account: str, bucket: str, args: list, kwargs: dict) -> None:
        arity("R2 delete", args, 1)
        options("R2 delete", kwargs, set())
        keys = args[0] if isinstance(args[0], list) else [args[0]]
        if len(keys) > DELETE_KEYS:
            raise BindingError("RangeError", f"R2 delete: {len(keys)} keys; at most {DELETE_KEYS} at once")
        keys = [text("R2 delete: key", k, KEY_BYTES) for k in keys]
        folder = self._folder(account, bucket)
        with self._lock:
            for key in keys:
                row = self._row(account, bucket, key)
                if row is None:
                    continue
                self._db.execute(
                    "DELETE FROM objects WHERE account = ? AND bucket = ? AND key = ?", (account, bucket, key)
                )
                (folder / row[-1]).unlink(missing_ok=True)

    def list(self, account: str, bucket: str, args: list, kwargs: dict) -> dict:
        arity("R2 list", args, 0)
        opts = options("R2 list", kwargs, {"prefix", "limit", "cursor", "delimiter", "startAfter"})
        prefix = text("R2 list: prefix", opts.get("prefix", ""), KEY_BYTES, allow_empty=True)
        limit = integer("R2 list: limit", opts.get("limit", LIST_LIMIT), 1, LIST_LIMIT)
        delimiter = text("R2 list: delimiter", opts["delimiter"], 64) if "delimiter" in opts else None
        after = decode_cursor("R2 list", opts["cursor"]) if "cursor" in opts else None
        if after is None and "startAfter" in opts:
            after = text("R2 list: startAfter", opts["startAfter"], KEY_BYTES)
        objects: list[dict] = []
        prefixes: list[str] = []
        last = after
        more = False
        with self._lock:
            while len(objects) + len(prefixes) < limit:
                query = f"SELECT {_COLUMNS} FROM objects WHERE {_UNDER}"
                params: list[Any] = [account, bucket, prefix, prefix]
                if last is not None:
                    query += " AND key > ?"
                    params.append(last)
                rows = self._db.execute(query + " ORDER BY key LIMIT ?", (*params, limit + 1)).fetchall()
                if not rows:
                    break
                for row in rows:
                    if len(objects) + len(prefixes) >= limit:
                        more = True
                        break
                    key = row[0]
                    cut = key.find(delimiter, len(prefix)) if delimiter else -1
                    if cut >= 0:  # grouped: skip every key under this prefix
                        group = key[: cut + len(delimiter)]
                        prefixes.append(group)
                        last = group + "\U0010ffff"
                        break
                    objects.append(_meta(row))
                    last = key
                else:
                    if len(rows) <= limit:
                        break
            if not more and len(objects) + len(prefixes) >= limit and last is not None:
                more = (
                    self._db.execute(
                        f"SELECT 1 FROM objects WHERE {_UNDER} AND key > ? LIMIT 1",
                        (account, bucket, prefix, prefix, last),
                    ).fetchone()
                    is not None
                )
        result: dict[str, Any] = {"objects": objects, "truncated": more, "delimitedPrefixes": prefixes}
        if more and last is not None:
            result["cursor"] = encode_cursor(last)
        return result

    def close(self) -> None:
        self._db.close()


class R2BucketConfig(msgspec.Struct, kw_only=True):
    """An r2_buckets entry of the wrangler config."""

    binding: str
    bucket_name: str
    preview_bucket_name: str | None = None
    jurisdiction: str | None = None


class R2BucketUpload(msgspec.Struct, forbid_unknown_fields=True):
    binding: str
    bucket_name: str


KIND = BindingKind(
    "r2", "r2_buckets", R2BucketConfig, R2BucketUpload, ("bucket_name",),
    lambda state_dir, query_s: R2Store(state_dir / "r2"), "workers.r2:R2Bucket",
)  # fmt: skip
