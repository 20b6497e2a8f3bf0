"""What a call through AI Gateway asks for, checked once: env.AI.run's `gateway` option (workerd's
`GatewayOptions`, types/defines/ai.d.ts), its `retries`, a gateway's own settings from the config
([edge.ai_gateways.ID]) and patchLog's fields. Every refusal is AIError(5004) naming the key at fault
and what to send instead."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workers import AIError

GATEWAY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_ATTEMPTS = 5
MAX_RETRY_DELAY_MS = 60_000
MAX_CACHE_TTL_S = 30 * 24 * 3600  # a month, as AI Gateway's longest
MAX_TIMEOUT_MS = 10 * 60 * 1000
MAX_METADATA = 5
METADATA_VALUE_CHARS = 1024
BACKOFFS = ("constant", "linear", "exponential")
OPTION_KEYS = (
    "id",
    "cacheKey",
    "cacheTtl",
    "skipCache",
    "metadata",
    "collectLog",
    "eventId",
    "requestTimeoutMs",
    "retries",
)


def _bad(key: str, why: str) -> AIError:
    return AIError(5004, f"env.AI.run options: gateway.{key}: {why}", param=f"gateway.{key}")


def _int(value: Any, key: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _bad(key, f"expected an integer from {low} to {high}")
    return value


def check_metadata(value: Any, refuse: Callable[[str, str], AIError]) -> dict[str, Any]:
    """At most MAX_METADATA entries, each a string key to a scalar (string, number, boolean, null),
    as Cloudflare's metadata takes; `refuse(key, why)` makes the error."""
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise refuse("metadata", f"expected a dict of at most {MAX_METADATA} entries")
    for k, v in value.items():
        if not isinstance(k, str) or not 0 < len(k) <= 64:
            raise refuse("metadata", "keys are strings of 1 to 64 characters")
        if v is not None and not isinstance(v, str | int | float | bool):
            raise refuse(f"metadata.{k}", "a value is a string, a number, a boolean or null")
        if len(str(v)) > METADATA_VALUE_CHARS:
            raise refuse(f"metadata.{k}", f"a value is at most {METADATA_VALUE_CHARS} characters")
    return dict(value)


@dataclass(frozen=True)
class GatewaySettings:
    """A gateway's own settings ([edge.ai_gateways.ID] in the config; these defaults otherwise: the
    gateway Cloudflare makes on first use caches nothing unless asked, logs every call, no limit)."""

    cache_ttl: int | None = None  # seconds a call without its own cacheTtl is cached
    collect_logs: bool = True
    rate_limit: int | None = None  # requests per rate_limit_period_s, per account
    rate_limit_period_s: float = 60.0
    rate_limit_technique: str = "sliding"  # or "fixed" (windows aligned to the period), as Cloudflare's


@dataclass(frozen=True)
class RetryOptions:
    """`gateway.retries` ({"maxAttempts", "retryDelayMs", "backoff"}): attempts in all (1-5),
    the delay before the second, and how it grows ("constant", "linear" or "exponential")."""

    max_attempts: int = 1
    retry_delay_ms: int = 0
    backoff: str = "constant"

    def delay_ms(self, attempt: int) -> float:
        """The wait after failed attempt `attempt` (1 the first): constant d, d, d; linear d, 2d,
        3d; exponential d, 2d, 4d."""
        if self.backoff == "linear":
            return self.retry_delay_ms * attempt
        if self.backoff == "exponential":
            return self.retry_delay_ms * 2 ** (attempt - 1)
        return self.retry_delay_ms


@dataclass(frozen=True)
class GatewayOptions:
    """env.AI.run's `gateway` option, checked: `id` names the gateway (created on first use unless
    the config defines it); the rest as Cloudflare's `GatewayOptions` (types/defines/ai.d.ts)."""

    id: str
    cache_key: str | None = None
    cache_ttl: int | None = None  # seconds
    skip_cache: bool = False
    metadata: dict[str, Any] | None = None
    collect_log: bool | None = None  # None: the gateway's setting
    event_id: str | None = None
    request_timeout_ms: int | None = None
    retries: RetryOptions | None = None

    @classmethod
    def parse(cls, value: Any) -> GatewayOptions:
        """The checked options, or AIError(5004, ...) naming the key at fault (an unknown key, a
        wrong type, a value out of range) and what to send instead."""
        if not isinstance(value, dict):
            raise AIError(5004, "env.AI.run options: gateway: expected {id: ..., ...}", param="gateway")
        for key in value:
            if key not in OPTION_KEYS:
                raise _bad(str(key)[:64], f"no such option; the options are {', '.join(OPTION_KEYS)}")
        ident = value.get("id")
        if not isinstance(ident, str) or not GATEWAY_ID.fullmatch(ident):
            raise _bad("id", "name the gateway: 1 to 64 letters, digits, '-' or '_'")
        cache_key = value.get("cacheKey")
        if cache_key is not None and (not isinstance(cache_key, str) or not 0 < len(cache_key) <= 256):
            raise _bad("cacheKey", "expected a string of 1 to 256 characters")
        for key in ("skipCache", "collectLog"):
            if value.get(key) is not None and not isinstance(value[key], bool):
                raise _bad(key, "expected true or false")
        event_id = value.get("eventId")
        if event_id is not None and (not isinstance(event_id, str) or len(event_id) > 256):
            raise _bad("eventId", "expected a string of at most 256 characters")
        ttl = value.get("cacheTtl")
        timeout = value.get("requestTimeoutMs")
        return cls(
            id=ident,
            cache_key=cache_key,
            cache_ttl=None if ttl is None else _int(ttl, "cacheTtl", 0, MAX_CACHE_TTL_S),
            skip_cache=value.get("skipCache") is True,
            metadata=None if value.get("metadata") is None else check_metadata(value["metadata"], _bad),
            collect_log=value.get("collectLog"),
            event_id=event_id,
            request_timeout_ms=None
            if timeout is None
            else _int(timeout, "requestTimeoutMs", 1, MAX_TIMEOUT_MS),
            retries=None if value.get("retries") is None else _retries(value["retries"]),
        )


def _retries(value: Any) -> RetryOptions:
    if not isinstance(value, dict):
        raise _bad("retries", "expected {maxAttempts, retryDelayMs, backoff}")
    for key in value:
        if key not in ("maxAttempts", "retryDelayMs", "backoff"):
            raise _bad(f"retries.{str(key)[:32]}", "no such option; give maxAttempts, retryDelayMs, backoff")
    backoff = value.get("backoff", "constant")
    if backoff not in BACKOFFS:
        raise _bad("retries.backoff", f"expected {', '.join(BACKOFFS)}")
    return RetryOptions(
        max_attempts=_int(value.get("maxAttempts", 1), "retries.maxAttempts", 1, MAX_ATTEMPTS),
        retry_delay_ms=_int(value.get("retryDelayMs", 0), "retries.retryDelayMs", 0, MAX_RETRY_DELAY_MS),
        backoff=backoff,
    )


def check_patch(patch: Any) -> dict[str, Any]:
    """Cloudflare's patchLog fields, checked: `score` a number from 0 to 100, `feedback` -1, 0 or 1,
    `metadata` at most 5 scalar entries (each may be null: cleared); anything else refused naming it."""

    def refuse(key: str, why: str) -> AIError:
        return AIError(5004, f"patchLog: {key}: {why}", param=key)

    if not isinstance(patch, dict) or not patch:
        raise AIError(5004, "patchLog: give {score?, feedback?, metadata?}")
    checked: dict[str, Any] = {}
    for key, value in patch.items():
        if key == "score":
            if value is not None and (
                not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 100
            ):
                raise refuse("score", "a number from 0 to 100 (or null)")
        elif key == "feedback":
            if isinstance(value, str) and value in ("-1", "0", "1"):  # workerd's types allow "-1" / "1"
                value = int(value)
            if value is not None and (isinstance(value, bool) or value not in (-1, 0, 1)):
                raise refuse("feedback", "-1, 0 or 1 (or null)")
        elif key == "metadata":
            value = None if value is None else check_metadata(value, refuse)
        else:
            raise refuse(str(key)[:32], "no such field; give score, feedback or metadata")
        checked[key] = value
    return checked
