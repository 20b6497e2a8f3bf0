"""What every binding store shares: the error a worker sees, argument checks for what an isolate
sends (it is hostile: every value is checked for type and size before use), safe file names, and
SQLite files made private (600, folders 700) as runtime/control/state.py makes its own."""

from __future__ import annotations

import base64
import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Any

from runtime.control.state import private_dir, private_file
from runtime.isolate import ipc

# a reply to the isolate must fit one frame of ipc.TO_ISOLATE bytes, with room for the envelope
REPLY_BYTES = ipc.TO_ISOLATE - 64 * 1024
# what one call from the isolate can carry at most (its frame is at most ipc.FROM_ISOLATE bytes)
CALL_BYTES = ipc.FROM_ISOLATE

_SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


class BindingError(Exception):
    """A call refused or failed; `type` is what the worker's exception says ("KV_ERROR",
    "D1_ERROR", "R2_ERROR", "TypeError", "RangeError"), the message says what to change."""

    def __init__(self, type: str, message: str):  # noqa: A002
        super().__init__(message)
        self.type = type


# What one account may keep in each store here: a hostile script could otherwise fill the disk
# one frame at a time (D1 has SQLite's own max_page_count per database).
ACCOUNT_QUOTA_BYTES = {
    "KV": 256 * 2**20,
    "R2": 1024 * 2**20,
    "Queues": 64 * 2**20,
    "Workflows": 256 * 2**20,
    "Vectorize": 1024 * 2**20,
}


def check_quota(store: str, used: int, adding: int) -> None:
    """Refuse a write that would take the account's `store` past its quota."""
    quota = ACCOUNT_QUOTA_BYTES[store]
    if used + adding > quota:
        raise BindingError(
            "RangeError",
            f"{store}: this account would hold {(used + adding) / 2**20:.1f} MiB here, over the "
            f"{quota // 2**20} MiB one account may keep in the local {store}; delete something first",
        )


def safe_component(name: str) -> str:
    """`name` as one file-name component: itself when it is plain ([A-Za-z0-9_][A-Za-z0-9._-]*,
    at most 128 characters), else a hash of it; never a path, never `.` or `..`."""
    if _SAFE.match(name) and ".." not in name:
        return name
    return "h-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def open_private_db(path: Path, **kwargs: Any) -> sqlite3.Connection:
    """A SQLite connection on `path`, the file (and its WAL/SHM) 600 and its folder 700."""
    private_dir(path.parent)
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if p == path or p.exists():
            private_file(p)
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, **kwargs)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA busy_timeout=5000")
    for p in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if p.exists():
            p.chmod(0o600)
    return conn


def arity(what: str, args: list, n: int) -> None:
    if not isinstance(args, list) or len(args) != n:
        raise BindingError("TypeError", f"{what}: expected {n} argument(s)")


def text(what: str, value: Any, max_bytes: int, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise BindingError("TypeError", f"{what} must be a string, got {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise BindingError("TypeError", f"{what} is not valid Unicode text") from None
    if size > max_bytes:
        raise BindingError("RangeError", f"{what} is {size} bytes; the limit is {max_bytes}")
    if not value and not allow_empty:
        raise BindingError("TypeError", f"{what} must not be empty")
    return value


def blob(what: str, value: Any, max_bytes: int, note: str = "") -> bytes:
    if not isinstance(value, bytes):
        raise BindingError("TypeError", f"{what} must be bytes, got {type(value).__name__}")
    if len(value) > max_bytes:
        raise BindingError("RangeError", f"{what} is {len(value)} bytes; the limit is {max_bytes}{note}")
    return value


def integer(what: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BindingError("TypeError", f"{what} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise BindingError("RangeError", f"{what} must be between {lo} and {hi}, got {value}")
    return value


def options(what: str, kwargs: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(kwargs, dict):
        raise BindingError("TypeError", f"{what}: options must be a dict")
    unknown = sorted(str(k) for k in kwargs if k not in allowed)
    if unknown:
        raise BindingError(
            "TypeError",
            f"{what}: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(allowed))}",
        )
    return {k: v for k, v in kwargs.items() if v is not None}


def encode_cursor(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(what: str, cursor: Any) -> str:
    """The key a cursor made by encode_cursor stands for; a forged one is at worst another key."""
    text(f"{what}: cursor", cursor, 4096)
    try:
        return base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True).decode(
            "utf-8"
        )
    except (ValueError, UnicodeDecodeError):
        raise BindingError(
            "TypeError", f"{what}: invalid cursor; pass the cursor a list call returned"
        ) from None
