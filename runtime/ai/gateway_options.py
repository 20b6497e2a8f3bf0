"""What a call through AI Gateway asks for, checked once: env.AI.run's `gateway` option (workerd's
`GatewayOptions`, types/defines/ai.d.ts), its `retries`, a gateway's own settings from the config
([edge.ai_gateways.ID]) or from Cloudflare's API (GatewaySettings.from_api, answered by `to_api`)
and patchLog's fields. Every refusal is AIError(5004) naming the key at fault and what to send
instead."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.ai.gateway_store import ACCOUNT_LOG_ROWS
from workers import AIError

GATEWAY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_ATTEMPTS = 5
MAX_RETRY_DELAY_MS = 60_000
MAX_CACHE_TTL_S = 30 * 24 * 3600  # a month, as AI Gateway's longest
MAX_TIMEOUT_MS = 10 * 60 * 1000
MAX_METADATA = 5
MAX_LOG_ROWS = ACCOUNT_LOG_ROWS  # log_management's most: what its account keeps over all its gateways
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
class GatewaySettings:
    """A gateway's own settings ([edge.ai_gateways.ID] in the config, or set through Cloudflare's API:
    `from_api`; these defaults otherwise: the gateway Cloudflare makes on first use caches nothing
    unless asked, logs every call, no limit)."""

    cache_ttl: int | None = None  # seconds a call without its own cacheTtl is cached
    collect_logs: bool = True
    rate_limit: int | None = None  # requests per rate_limit_period_s, per account
    rate_limit_period_s: float = 60.0
    rate_limit_technique: str = "sliding"  # or "fixed" (windows aligned to the period), as Cloudflare's
    # only the API sets these (the config's table has no key for them)
    cache_invalidate_on_update: bool = False  # an update through the API drops its cached answers
    retries: RetryOptions | None = None  # a call without its own `retries` takes these
    log_rows: int | None = None  # log_management: the rows it keeps (None: the store's LOG_ROWS)
    log_strategy: str | None = None  # "STOP_INSERTING": full, it takes no more; else its oldest go
    authentication: bool = False  # answered as set: every door here takes the account's token anyway

    def to_api(self) -> dict[str, Any]:
        """As Cloudflare's API answers a gateway (the SDK's AIGatewayGetResponse fields, less
        id and times); what this edge does not do, at its off value."""
        retries = self.retries
        return {
            "cache_ttl": self.cache_ttl,
            "cache_invalidate_on_update": self.cache_invalidate_on_update,
            "collect_logs": self.collect_logs,
            "rate_limiting_limit": self.rate_limit,
            "rate_limiting_interval": None if self.rate_limit is None else round(self.rate_limit_period_s),
            "rate_limiting_technique": self.rate_limit_technique,
            "retry_max_attempts": None if retries is None else retries.max_attempts,
            "retry_delay": None if retries is None else retries.retry_delay_ms,
            "retry_backoff": None if retries is None else retries.backoff,
            "log_management": self.log_rows,
            "log_management_strategy": self.log_strategy,
            "authentication": self.authentication,
            **{key: off for key, off in API_OFF.items() if off is not None},
        }

    @classmethod
    def from_api(cls, body: dict[str, Any]) -> GatewaySettings:
        """The settings of a create or update body (the SDK's AIGatewayCreateParams, less `id`),
        checked: AIError(5004) naming the field at fault and what it takes. A field left out takes
        its default (an update replaces the settings whole, as a PUT does). What this edge does not
        do (DLP, guardrails, logpush, OpenTelemetry, spend limits, billing, ...) is accepted only at
        its off value, so that no setting is taken and silently not applied."""
        for key, value in body.items():
            if key not in API_FIELDS and key not in API_OFF:
                raise _refuse(str(key)[:64], f"no such field; a gateway takes {', '.join(API_FIELDS)}")
            if key in API_OFF and not _off(value):
                raise _refuse(key, "not simulated by this edge; leave it out (or at its off value)")
        for key in ("cache_invalidate_on_update", "collect_logs", "authentication"):
            if key in body and not isinstance(body[key], bool):
                raise _refuse(key, "expected true or false")
        limit = _maybe_int(body, "rate_limiting_limit", 0, 1_000_000)
        interval = _maybe_int(body, "rate_limiting_interval", 1, 86_400)
        technique = body.get("rate_limiting_technique") or "sliding"
        if technique not in ("fixed", "sliding"):
            raise _refuse("rate_limiting_technique", 'expected "fixed" or "sliding"')
        attempts = _maybe_int(body, "retry_max_attempts", 1, MAX_ATTEMPTS)
        delay = _maybe_int(body, "retry_delay", 0, MAX_RETRY_DELAY_MS)
        backoff = body.get("retry_backoff")
        if backoff is not None and backoff not in BACKOFFS:
            raise _refuse("retry_backoff", f"expected {', '.join(BACKOFFS)}")
        strategy = body.get("log_management_strategy")
        if strategy not in (None, "STOP_INSERTING", "DELETE_OLDEST"):
            raise _refuse("log_management_strategy", 'expected "STOP_INSERTING" or "DELETE_OLDEST"')
        retried = attempts is not None or delay is not None or backoff is not None
        return cls(
            cache_ttl=_maybe_int(body, "cache_ttl", 0, MAX_CACHE_TTL_S),
            collect_logs=body.get("collect_logs", True),
            rate_limit=limit or None,  # 0, as null: no limit
            rate_limit_period_s=float(interval or 60),
            rate_limit_technique=technique,
            cache_invalidate_on_update=body.get("cache_invalidate_on_update", False),
            retries=RetryOptions(attempts or 1, delay or 0, backoff or "constant") if retried else None,
            log_rows=_maybe_int(body, "log_management", 1, MAX_LOG_ROWS),
            log_strategy=strategy,
            authentication=body.get("authentication", False),
        )

    def to_json(self) -> str:
        """As the gateways' table keeps it (runtime.ai.gateway_store)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> GatewaySettings:
        fields = json.loads(text)
        retries = fields.pop("retries", None)
        known = {f.name for f in dataclasses.fields(cls)}
        settings = cls(**{k: v for k, v in fields.items() if k in known})
        return dataclasses.replace(settings, retries=None if retries is None else RetryOptions(**retries))


# the API's fields a gateway acts on (GatewaySettings.from_api)
API_FIELDS = (
    "cache_ttl",
    "cache_invalidate_on_update",
    "collect_logs",
    "rate_limiting_interval",
    "rate_limiting_limit",
    "rate_limiting_technique",
    "retry_max_attempts",
    "retry_delay",
    "retry_backoff",
    "log_management",
    "log_management_strategy",
    "authentication",
)
# the API's fields for what this edge does not do, each with the off value it answers (None: not
# answered, the SDK's default); taken only at an off value (_off)
API_OFF: dict[str, Any] = {
    "byok_only": False,
    "dlp": None,
    "guardrails": None,
    "log_classification": False,
    "logpush": False,
    "logpush_public_key": None,
    "otel": None,
    "spend_limits": None,
    "store_id": None,
    "stripe": None,
    "workers_ai_billing_mode": "postpaid",
    "zdr": False,
}


def _off(value: Any) -> bool:
    """Off: null, false, empty, {"enabled": false, ...}, or the one billing mode ("postpaid")."""
    if value is None or value is False or value == [] or value == {} or value == "postpaid":
        return True
    return isinstance(value, dict) and value.get("enabled") is False


def _refuse(key: str, why: str) -> AIError:
    return AIError(5004, f"{key}: {why}", param=key)


def _maybe_int(body: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _refuse(key, f"expected an integer from {low} to {high}, or null")
    return value


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
