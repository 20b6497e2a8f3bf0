"""Queue consumers of the worker `edge dev` serves: one loop per `queues.consumers` entry, started
by Runtime.start as the cron loop is.

Each loop waits for ready messages, then until `max_batch_size` (default 10) are ready or
`max_batch_timeout` (default 5 s) has passed since the first was seen, whichever comes first;
claims a batch, runs the worker's queue handler on it, and settles each message as the handler
left it: acked, or retried after its delay (default `retry_delay`, 0) while it has attempts left
(1 + `max_retries`, default 3), then moved to `dead_letter_queue` or dropped with a tail note.
Batches of one queue run one at a time (max_concurrency is 1 here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from runtime.bindings.queues import MAX_DELAY_S, QueueMessage, QueueStore
from runtime.isolate import ipc

log = logging.getLogger("edge.queues")

POLL_S = 0.1  # how often an idle consumer looks for ready messages


class ConsumerError(ValueError):
    """A queues.consumers entry out of range."""


@dataclass(frozen=True)
class ConsumerSettings:
    queue: str
    max_batch_size: int = 10
    max_batch_timeout: float = 5.0
    max_retries: int = 3
    dead_letter_queue: str | None = None
    retry_delay: int = 0

    @classmethod
    def from_config(cls, entry, where: str) -> ConsumerSettings:
        """Cloudflare's ranges: batch size 1..100, batch timeout 0..60 s, retries 0..100, retry
        delay 0..43,200 s; ConsumerError names the key otherwise."""

        def pick(name: str, default, lo, hi):
            value = getattr(entry, name)
            if value is None:
                return default
            if not lo <= value <= hi:
                raise ConsumerError(f"{where}.{name}: must be between {lo} and {hi}, got {value}")
            return value

        if not entry.queue:
            raise ConsumerError(f"{where}.queue: a queue name is needed")
        if entry.dead_letter_queue == entry.queue:
            raise ConsumerError(f"{where}.dead_letter_queue: a queue cannot be its own dead-letter queue")
        if entry.max_concurrency not in (None, 1):
            log.warning("%s.max_concurrency: batches run one at a time here", where)
        return cls(
            queue=entry.queue,
            max_batch_size=pick("max_batch_size", 10, 1, 100),
            max_batch_timeout=float(pick("max_batch_timeout", 5.0, 0, 60)),
            max_retries=pick("max_retries", 3, 0, 100),
            dead_letter_queue=entry.dead_letter_queue or None,
            retry_delay=pick("retry_delay", 0, 0, MAX_DELAY_S),
        )


Run = Callable[..., Awaitable]  # BindingStores.run: blocking store work off the event loop
Deliver = Callable[[str, list[ipc.QueuedMessage]], Awaitable[tuple[str, list[str], dict[str, int | None]]]]
Note = Callable[[str, str], None]


async def next_batch(
    store: QueueStore, run: Run, account: str, settings: ConsumerSettings, clock=time.monotonic
) -> list[QueueMessage]:
    """Wait for a batch: as soon as max_batch_size messages are ready, or max_batch_timeout
    after the first ready one was seen, claim up to max_batch_size of them."""
    first_seen = None
    while True:
        ready = await run(store.ready, account, settings.queue)
        if ready:
            first_seen = clock() if first_seen is None else first_seen
            if ready >= settings.max_batch_size or clock() - first_seen >= settings.max_batch_timeout:
                batch = await run(store.claim, account, settings.queue, settings.max_batch_size)
                if batch:
                    return batch
                first_seen = None
        await asyncio.sleep(POLL_S)


async def consume(
    store: QueueStore, run: Run, account: str, settings: ConsumerSettings, deliver: Deliver, note: Note
) -> None:
    """Deliver `settings.queue`'s messages to the worker for ever."""
    while True:
        try:
            batch = await next_batch(store, run, account, settings)
            messages = [ipc.QueuedMessage(m.id, m.timestamp_ms, m.body, m.attempts) for m in batch]
            try:
                outcome, acked, retried = await deliver(settings.queue, messages)
            except Exception:  # the runtime's own failure: the batch comes back after its lease
                log.exception("queue %s: delivering a batch failed", settings.queue)
                await asyncio.sleep(1.0)
                continue
            delays = {
                mid: settings.retry_delay if d is None else min(d, MAX_DELAY_S) for mid, d in retried.items()
            }
            spent = await run(
                store.settle,
                account,
                settings.queue,
                acked,
                delays,
                settings.max_retries,
                settings.dead_letter_queue,
            )
            for mid, fate in spent:
                where = (
                    f"moved to dead-letter queue {settings.dead_letter_queue!r}"
                    if fate == "deadLettered"
                    else "dropped (no dead_letter_queue)"
                )
                note(
                    "warn",
                    f"queue {settings.queue!r}: message {mid} {where} "
                    f"after {settings.max_retries + 1} attempt(s)",
                )
        except asyncio.CancelledError:
            raise
        except Exception:  # a store failure must not end the consumer
            log.exception("queue %s: consumer loop failed; retrying", settings.queue)
            await asyncio.sleep(1.0)
