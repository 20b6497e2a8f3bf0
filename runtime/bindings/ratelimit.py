"""The Rate Limiting binding, simulated: `await env.LIMITER.limit({"key": k})` -> `{"success": bool}`.

Configured as wrangler writes it:

    [[ratelimits]]
    name = "LIMITER"
    namespace_id = "1001"
    simple = { limit = 100, period = 60 }

Counters live in one SQLite file (`.edge/ratelimits.sqlite`), keyed by (account, namespace, key),
so they survive a restart and two workers of one account that name the same namespace share them
(as on Cloudflare), while another account's namespace "1001" is another counter. Each key counts
in fixed windows of `period` seconds aligned to the epoch (Cloudflare's limiter is approximate and
per location; locally there is one location, so this count is exact). Cloudflare's bounds hold:
`period` 10 or 60 s; keys here are at most 1024 bytes, and an account holds at most MAX_KEYS keys
at once (a worker looping over fresh keys gets a clear RangeError, never a full disk).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from runtime.bindings.common import BindingError, open_private_db, options, text
from runtime.bindings.kind import BindingKind, field

PERIODS = (10, 60)  # seconds, as Cloudflare allows
MAX_LIMIT = 1_000_000_000
KEY_BYTES = 1024
MAX_KEYS = 100_000  # live keys per account, all its namespaces together

SCHEMA = """
CREATE TABLE IF NOT EXISTS hits (
    account TEXT NOT NULL, namespace TEXT NOT NULL, key TEXT NOT NULL,
    window INTEGER NOT NULL, count INTEGER NOT NULL, expires REAL NOT NULL,
    PRIMARY KEY (account, namespace, key));
CREATE INDEX IF NOT EXISTS hits_expiry ON hits (expires);
"""


class RateLimitSimple(msgspec.Struct, forbid_unknown_fields=True):
    limit: int
    period: int

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not 1 <= self.limit <= MAX_LIMIT:
            raise ValueError(f"simple.limit must be between 1 and {MAX_LIMIT}, got {self.limit}")
        if self.period not in PERIODS:
            raise ValueError(f"simple.period must be 10 or 60 (seconds), got {self.period}")


class RateLimitConfig(msgspec.Struct, kw_only=True):
    """A ratelimits entry of the wrangler config (its env name is `name`)."""

    binding: str = msgspec.field(name="name")
    namespace_id: str
    simple: RateLimitSimple


class RateLimitUpload(msgspec.Struct, forbid_unknown_fields=True):
    binding: str = msgspec.field(name="name")
    namespace_id: str
    simple: RateLimitSimple


def _ident(entry: Any) -> str | None:
    """A limiter is its namespace under its policy: "1001/100/60" (the runtime's, never the script's)."""
    namespace, simple = field(entry, "namespace_id"), field(entry, "simple")
    if not isinstance(namespace, str) or not namespace or "/" in namespace:
        return None
    return f"{namespace}/{field(simple, 'limit')}/{field(simple, 'period')}"


class RateLimitStore:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        self._db = open_private_db(path)
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self.clock = clock
        self._next_sweep = 0.0
        self._rows: dict[str, int] = {}  # rows each account has in the file, recounted at each sweep

    def call(self, account: str, ident: str, method: str, args: list, kwargs: dict) -> Any:
        if method != "limit":
            raise BindingError("TypeError", f"a rate limiter has only limit(), not {method!r}")
        given = args[0] if len(args) == 1 and isinstance(args[0], dict) else None
        if len(args) > 1 or (args and given is None):
            raise BindingError("TypeError", 'limit: pass one options dict, limit({"key": ...})')
        opts = options("limit", {**(given or {}), **kwargs}, {"key"})
        key = text("limit: key", opts.get("key"), KEY_BYTES)
        namespace, limit, period = ident.rsplit("/", 2)
        return {"success": self._hit(account, namespace, key, int(limit), int(period))}

    def _hit(self, account: str, namespace: str, key: str, limit: int, period: int) -> bool:
        now = self.clock()
        window = int(now // period)
        with self._lock:
            if now >= self._next_sweep:  # expired windows go, so the file holds only live keys
                self._db.execute("DELETE FROM hits WHERE expires <= ?", (now,))
                self._rows = dict(self._db.execute("SELECT account, count(*) FROM hits GROUP BY account"))
                self._next_sweep = now + 10
            row = self._db.execute(
                "SELECT window, count FROM hits WHERE account = ? AND namespace = ? AND key = ?",
                (account, namespace, key),
            ).fetchone()
            if row is None:
                # counted from memory, not by a scan of the account's keys per new key; rows whose
                # window ended since the last sweep still count, for at most 10 s
                if self._rows.get(account, 0) >= MAX_KEYS:
                    raise BindingError(
                        "RangeError",
                        f"limit: this account's rate limiters count {MAX_KEYS} keys at once; "
                        "reuse keys (a user or client id), or wait for their windows to end",
                    )
                self._rows[account] = self._rows.get(account, 0) + 1
            count = row[1] + 1 if row is not None and row[0] == window else 1
            self._db.execute(
                "INSERT INTO hits (account, namespace, key, window, count, expires) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (account, namespace, key) DO UPDATE SET"
                " window = excluded.window, count = excluded.count, expires = excluded.expires",
                (account, namespace, key, window, count, (window + 1) * period),
            )
        return count <= limit

    def close(self) -> None:
        self._db.close()


KIND = BindingKind(
    "ratelimit", "ratelimits", RateLimitConfig, RateLimitUpload, ("namespace_id",),
    lambda state_dir, query_s: RateLimitStore(state_dir / "ratelimits.sqlite"), "workers.ratelimit:RateLimit",
    env_key="name", ident=_ident,
)  # fmt: skip
