"""Cloudflare Queues, simulated: one SQLite file (`.edge/queues.sqlite`) holding every queue of
every account, each message keyed by (account, queue), so the same queue name in two accounts
names two queues.

Producers (`env.Q.send`, `env.Q.sendBatch`) cross as ipc.BindingCall; the body is checked and
encoded here by its content type ("text": str, "bytes": bytes, "json": JSON, "v8": any JSON-like
value or bytes, kept as it was sent; the default), and capped as Cloudflare caps it: 128 KB per
message, at most 100 messages and 256 KB per sendBatch, a delay of at most 12 hours.

Consumers (runtime/events/queue_consumers.py) `claim` ready messages: each claim counts an attempt and
leases the message until `settle` acks it, retries it (visible again after its delay) or, past
max_retries, moves it to the dead-letter queue or drops it. A lease left behind (the runtime
stopped mid-delivery) is released at the next start, so every message is delivered at least once.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from runtime.bindings.common import BindingError, arity, check_quota, integer, open_private_db, options
from runtime.bindings.kind import BindingKind

MESSAGE_BYTES = 128_000  # Cloudflare: 128 KB per message
BATCH_MESSAGES = 100  # Cloudflare: messages per sendBatch
BATCH_BYTES = 256_000  # Cloudflare: 256 KB per sendBatch
MAX_DELAY_S = 43_200  # Cloudflare: delaySeconds at most 12 hours
CONTENT_TYPES = ("text", "bytes", "json", "v8")
LEASE_S = 15 * 60  # a claimed message comes back after this if its delivery never settled

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
    account TEXT NOT NULL, queue TEXT NOT NULL, body BLOB NOT NULL, content_type TEXT NOT NULL,
    timestamp_ms INTEGER NOT NULL, visible_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    leased_until REAL);
CREATE INDEX IF NOT EXISTS messages_ready ON messages (account, queue, visible_at);
"""

_msgpack = msgspec.msgpack.Encoder()
_unpack = msgspec.msgpack.Decoder()


class QueueMessage(msgspec.Struct, frozen=True):
    """A claimed message: what a consumer's batch carries."""

    id: str
    timestamp_ms: int  # when it was sent, ms since the epoch
    body: Any
    content_type: str
    attempts: int  # this delivery included: 1 on the first


def encode_body(what: str, body: Any, content_type: str) -> bytes:
    """The stored form of `body` by its content type; BindingError when it does not fit the type."""
    if content_type == "text":
        if not isinstance(body, str):
            raise BindingError("TypeError", f"{what}: contentType 'text' needs a str body")
        return body.encode("utf-8", "surrogatepass")
    if content_type == "bytes":
        if not isinstance(body, bytes):
            raise BindingError("TypeError", f"{what}: contentType 'bytes' needs a bytes body")
        return body
    if content_type == "json":
        try:
            return json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError):
            raise BindingError(
                "TypeError", f"{what}: contentType 'json' needs a JSON-serialisable body"
            ) from None
    if content_type == "v8":
        try:
            return _msgpack.encode(body)
        except (TypeError, msgspec.EncodeError):
            raise BindingError("TypeError", f"{what}: the body must be JSON-like values or bytes") from None
    raise BindingError(
        "TypeError", f"{what}: contentType must be one of {', '.join(CONTENT_TYPES)}, got {content_type!r}"
    )


def decode_body(data: bytes, content_type: str) -> Any:
    if content_type == "text":
        return data.decode("utf-8", "surrogatepass")
    if content_type == "bytes":
        return data
    if content_type == "json":
        return json.loads(data)
    return _unpack.decode(data)


class QueueStore:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        self._db = open_private_db(path)
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self.clock = clock

    # --- producers (ipc.BindingCall) --------------------------------------------------------------

    def call(self, account: str, queue: str, method: str, args: list, kwargs: dict) -> Any:
        handler = {"send": self.send, "sendBatch": self.send_batch}.get(method)
        if handler is None:
            raise BindingError("TypeError", f"a queue has no method {method!r}; use send or sendBatch")
        return handler(account, queue, args, kwargs)

    def _prepare(self, what: str, body: Any, opts: dict, default_delay: int) -> tuple[bytes, str, int]:
        content_type = opts.get("contentType", "v8")
        if not isinstance(content_type, str):
            raise BindingError("TypeError", f"{what}: contentType must be a string")
        data = encode_body(what, body, content_type)
        if len(data) > MESSAGE_BYTES:
            raise BindingError(
                "RangeError", f"{what}: the message is {len(data)} bytes; the limit is {MESSAGE_BYTES}"
            )
        delay = integer(f"{what}: delaySeconds", opts.get("delaySeconds", default_delay), 0, MAX_DELAY_S)
        return data, content_type, delay

    def send(self, account: str, queue: str, args: list, kwargs: dict) -> None:
        arity("Queue send", args, 1)
        opts = options("Queue send", kwargs, {"contentType", "delaySeconds"})
        self._insert(account, queue, [self._prepare("Queue send", args[0], opts, 0)])

    def send_batch(self, account: str, queue: str, args: list, kwargs: dict) -> None:
        arity("Queue sendBatch", args, 1)
        opts = options("Queue sendBatch", kwargs, {"delaySeconds"})
        default_delay = integer("Queue sendBatch: delaySeconds", opts.get("delaySeconds", 0), 0, MAX_DELAY_S)
        entries = args[0]
        if not isinstance(entries, list) or not entries:
            raise BindingError("TypeError", "Queue sendBatch: pass a non-empty list of {'body': ...} dicts")
        if len(entries) > BATCH_MESSAGES:
            raise BindingError(
                "RangeError", f"Queue sendBatch: {len(entries)} messages; the limit is {BATCH_MESSAGES}"
            )
        prepared = []
        for i, entry in enumerate(entries):
            what = f"Queue sendBatch: message {i}"
            if not isinstance(entry, dict) or "body" not in entry:
                raise BindingError("TypeError", f"{what} must be a dict with a 'body'")
            rest = options(
                what, {k: v for k, v in entry.items() if k != "body"}, {"contentType", "delaySeconds"}
            )
            prepared.append(self._prepare(what, entry["body"], rest, default_delay))
        total = sum(len(data) for data, _, _ in prepared)
        if total > BATCH_BYTES:
            raise BindingError(
                "RangeError", f"Queue sendBatch: the batch is {total} bytes; the limit is {BATCH_BYTES}"
            )
        self._insert(account, queue, prepared)

    def _insert(self, account: str, queue: str, prepared: list[tuple[bytes, str, int]]) -> None:
        now = self.clock()
        rows = [
            (uuid.uuid4().hex, account, queue, data, ctype, int(now * 1000), now + delay)
            for data, ctype, delay in prepared
        ]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                (used,) = self._db.execute(
                    "SELECT COALESCE(SUM(LENGTH(body)), 0) FROM messages WHERE account = ?", (account,)
                ).fetchone()
                check_quota("Queues", used, sum(len(r[3]) for r in rows))
                self._db.executemany(
                    "INSERT INTO messages (id, account, queue, body, content_type, timestamp_ms, visible_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite ends it itself on a full disk
                    self._db.execute("ROLLBACK")
                raise

    # --- consumers --------------------------------------------------------------------------------

    def release_leases(self) -> None:
        """Claims of an earlier run that never settled: their messages are ready again."""
        with self._lock:
            self._db.execute("UPDATE messages SET leased_until = NULL WHERE leased_until IS NOT NULL")

    def ready(self, account: str, queue: str) -> int:
        """How many messages could be claimed now."""
        now = self.clock()
        with self._lock:
            (n,) = self._db.execute(
                "SELECT count(*) FROM messages WHERE account = ? AND queue = ? AND visible_at <= ?"
                " AND (leased_until IS NULL OR leased_until <= ?)",
                (account, queue, now, now),
            ).fetchone()
        return n

    def claim(self, account: str, queue: str, limit: int, lease_s: float = LEASE_S) -> list[QueueMessage]:
        """Up to `limit` ready messages, oldest first; each counts an attempt and is leased."""
        now = self.clock()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = self._db.execute(
                    "SELECT seq, id, timestamp_ms, body, content_type, attempts FROM messages"
                    " WHERE account = ? AND queue = ? AND visible_at <= ?"
                    " AND (leased_until IS NULL OR leased_until <= ?) ORDER BY visible_at, seq LIMIT ?",
                    (account, queue, now, now, limit),
                ).fetchall()
                self._db.executemany(
                    "UPDATE messages SET attempts = attempts + 1, leased_until = ? WHERE seq = ?",
                    [(now + lease_s, r[0]) for r in rows],
                )
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite ends it itself on a full disk
                    self._db.execute("ROLLBACK")
                raise
        return [
            QueueMessage(mid, ts, decode_body(body, ctype), ctype, attempts + 1)
            for _, mid, ts, body, ctype, attempts in rows
        ]

    def settle(
        self,
        account: str,
        queue: str,
        acked: list[str],
        retried: dict[str, int],
        max_retries: int,
        dead_letter_queue: str | None,
    ) -> list[tuple[str, str]]:
        """Apply a delivery's outcome: acked messages go; retried ones come back after their delay
        (seconds) while they have attempts left (1 + max_retries in all), else move to the
        dead-letter queue (the same message, attempts from 0) or are dropped. Returns
        (id, "deadLettered" | "dropped") for each that ran out. Ids not of this queue's claimed
        messages are ignored."""
        now = self.clock()
        spent: list[tuple[str, str]] = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for mid in acked:
                    self._db.execute(
                        "DELETE FROM messages WHERE id = ? AND account = ? AND queue = ?",
                        (mid, account, queue),
                    )
                for mid, delay in retried.items():
                    row = self._db.execute(
                        "SELECT attempts FROM messages WHERE id = ? AND account = ? AND queue = ?",
                        (mid, account, queue),
                    ).fetchone()
                    if row is None:
                        continue
                    if row[0] <= max_retries:
                        self._db.execute(
                            "UPDATE messages SET visible_at = ?, leased_until = NULL WHERE id = ?",
                            (now + delay, mid),
                        )
                    elif dead_letter_queue:
                        self._db.execute(
                            "UPDATE messages SET queue = ?, visible_at = ?, attempts = 0, leased_until = NULL"
                            " WHERE id = ?",
                            (dead_letter_queue, now, mid),
                        )
                        spent.append((mid, "deadLettered"))
                    else:
                        self._db.execute("DELETE FROM messages WHERE id = ?", (mid,))
                        spent.append((mid, "dropped"))
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite ends it itself on a full disk
                    self._db.execute("ROLLBACK")
                raise
        return spent

    def close(self) -> None:
        self._db.close()


class QueueProducerConfig(msgspec.Struct, kw_only=True):
    """A queues.producers entry of the wrangler config."""

    binding: str
    queue: str
    delivery_delay: int | None = None

    def not_simulated(self) -> str | None:
        if self.delivery_delay:
            return (
                "delivery_delay is not simulated yet; messages are ready at once unless send() "
                "passes delaySeconds"
            )
        return None


class QueueProducerUpload(msgspec.Struct, forbid_unknown_fields=True):
    binding: str
    queue: str


KIND = BindingKind(
    "queue", "queues.producers", QueueProducerConfig, QueueProducerUpload, ("queue",),
    lambda state_dir, query_s: QueueStore(state_dir / "queues.sqlite"), "workers.queue_producer:Queue",
)  # fmt: skip
