"""`env.QUEUE`: a Queues producer binding (send, sendBatch)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from workers.binding_values import (
    Transport,
    merge_options,
)


def _queue_body(body: Any) -> Any:
    return bytes(body) if isinstance(body, (bytearray, memoryview)) else body


class Queue:
    """`env.QUEUE`: send / sendBatch, as a Queues producer binding. The runtime checks and stores
    each message (128 KB each; a batch at most 100 messages and 256 KB)."""

    def __init__(self, transport: Transport):
        self._call = transport

    async def send(
        self,
        body: Any,
        options: dict[str, Any] | None = None,
        *,
        contentType: str | None = None,  # noqa: N803 - Cloudflare's names
        delaySeconds: int | None = None,
    ) -> None:
        """Queue one message: `contentType` "text", "bytes", "json" or "v8" (the default: any
        JSON-like value or bytes, delivered as it was sent); `delaySeconds` up to 43,200."""
        opts = merge_options(
            options, {"contentType": contentType, "delaySeconds": delaySeconds}, "Queue send"
        )
        await self._call("send", [_queue_body(body)], opts)

    async def sendBatch(  # noqa: N802 - Cloudflare's name
        self,
        messages: Iterable[Any],
        options: dict[str, Any] | None = None,
        *,
        delaySeconds: int | None = None,  # noqa: N803
    ) -> None:
        """Queue messages given as `{"body": ..., "contentType"?: ..., "delaySeconds"?: ...}`, all or none."""
        opts = merge_options(options, {"delaySeconds": delaySeconds}, "Queue sendBatch")
        entries = []
        for entry in messages:
            if not isinstance(entry, dict):
                raise TypeError("Queue sendBatch: each message is a dict such as {'body': ...}")
            entries.append({k: _queue_body(v) if k == "body" else v for k, v in entry.items()})
        await self._call("sendBatch", [entries], opts)

    send_batch = sendBatch
