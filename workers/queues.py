"""What a queue consumer's handler receives: `batch` (MessageBatch) and its `batch.messages`
(Message), with Cloudflare's names.

Each message is settled once: the first of `message.ack()` / `message.retry()` for it wins;
`batch.ackAll()` / `batch.retryAll()` settle the messages not yet settled. When the handler
returns, the rest are acked; when it raises, the rest are retried (explicit acks stand).
`outcome` gives the runtime the result: the ids acked and the ids retried with their delays.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

MAX_DELAY_S = 43_200  # Cloudflare: a retry's delaySeconds at most 12 hours


def _delay(options: Any, delay_seconds: Any) -> int | None:
    if isinstance(options, dict):
        delay_seconds = options.get("delaySeconds", delay_seconds)
    elif options is not None:
        raise TypeError(f"retry: options must be a dict such as {{'delaySeconds': 10}}, got {options!r}")
    if delay_seconds is None:
        return None
    if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, int | float):
        raise TypeError(f"retry: delaySeconds must be a number, got {type(delay_seconds).__name__}")
    if not 0 <= delay_seconds <= MAX_DELAY_S:
        raise ValueError(f"retry: delaySeconds must be between 0 and {MAX_DELAY_S}, got {delay_seconds}")
    return int(delay_seconds)


class Message:
    """One message: `id`, `timestamp` (a UTC datetime: when it was sent), `body`, `attempts`
    (1 on its first delivery), `ack()` and `retry(delaySeconds=...)`."""

    def __init__(self, batch: MessageBatch, id: str, timestamp_ms: int, body: Any, attempts: int):  # noqa: A002
        self._batch = batch
        self.id = id
        self.timestamp = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
        self.body = body
        self.attempts = attempts

    def ack(self) -> None:
        self._batch._settle(self.id, None)

    def retry(self, options: Any = None, *, delaySeconds: Any = None) -> None:  # noqa: N803
        self._batch._settle(self.id, ("retry", _delay(options, delaySeconds)))

    def __repr__(self) -> str:
        return f"<Message {self.id} attempts={self.attempts}>"


class MessageBatch:
    """`batch`: `queue` (its name), `messages`, `ackAll()` and `retryAll(delaySeconds=...)`."""

    def __init__(self, queue: str, messages: list[tuple[str, int, Any, int]]):
        self.queue = queue
        self.messages = [Message(self, *m) for m in messages]
        self._settled: dict[str, tuple[str, int | None] | None] = {}  # id -> None (ack) or (retry, delay)

    def _settle(self, mid: str, decision: tuple[str, int | None] | None) -> None:
        self._settled.setdefault(mid, decision)

    def ackAll(self) -> None:  # noqa: N802 - Cloudflare's name
        for m in self.messages:
            self._settle(m.id, None)

    def retryAll(self, options: Any = None, *, delaySeconds: Any = None) -> None:  # noqa: N802, N803
        decision = ("retry", _delay(options, delaySeconds))
        for m in self.messages:
            self._settle(m.id, decision)

    ack_all, retry_all = ackAll, retryAll

    def outcome(self, failed: bool) -> tuple[list[str], dict[str, int | None]]:
        """(acked ids, {retried id: delay or None for the consumer's default}) once the handler
        has returned (failed=False: the rest are acked) or raised (failed=True: retried)."""
        acked, retried = [], {}
        for m in self.messages:
            decision = self._settled.get(m.id, ("retry", None) if failed else None)
            if decision is None:
                acked.append(m.id)
            else:
                retried[m.id] = decision[1]
        return acked, retried
