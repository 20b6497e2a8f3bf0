"""`env.LIMITER`: a Rate Limiting binding (`limit`)."""

from __future__ import annotations

from typing import Any

from workers.binding_values import Transport, merge_options, wrap_result


class RateLimit:
    """`env.LIMITER`: `await env.LIMITER.limit({"key": key})` (or `limit(key=key)`) -> an object
    whose `success` (also `["success"]`) is False once `key` has used up the configured `limit`
    in the current `period`."""

    def __init__(self, transport: Transport):
        self._call = transport

    async def limit(self, options: dict[str, Any] | None = None, *, key: str | None = None) -> Any:
        opts = merge_options(options, {"key": key}, "RateLimit limit")
        return wrap_result(await self._call("limit", [opts], {}))
