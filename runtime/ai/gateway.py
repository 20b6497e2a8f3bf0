"""AI Gateway, locally: the gateway a worker names in `env.AI.run(..., {"gateway": {...}})` or reaches
through `env.AI.gateway(id)`. Per account (a gateway is created on first use, as Cloudflare's
default gateway is), its state in SQLite under `.edge/` (runtime.ai.gateway_store), every SQLite
call through the runtime's fair binding pool:

- a response cache, on when a call gives `cacheTtl` (seconds): keyed by the account, the gateway,
  the model and the inputs, or by `cacheKey` when given; `skipCache` bypasses it; errors are never
  cached. A streamed answer is recorded as its event-stream bytes while it streams and, only when it
  finished whole, replayed byte for byte on a hit (`cf-aig-cache-status: HIT`);
- retries: `retries.maxAttempts` (1-5) on failures worth retrying (3040 out of capacity, 3007 timeout,
  an internal error), `retryDelayMs` before the second, growing by `backoff` (constant, linear,
  exponential); `requestTimeoutMs` bounds each attempt (a stream: until its first event);
- a log row per call (unless `collectLog: false`): `get_log`, `patch_log` ({score, feedback,
  metadata}), `logs`;
- the universal run over a list of requests (`env.AI.gateway(id).run([...])`): each tried in turn
  until one answers, `cf-aig-step` naming it; a provider this edge cannot reach (it has no network:
  only `workers-ai` is served) is that step's failure, and the chain goes on.

`GatewayOptions.parse` reads env.AI.run's `gateway` option; `Gateways.run` answers a call through a
gateway; `universal`, `get_log`, `patch_log` and `url` serve `env.AI.gateway(id)`'s methods.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.ai.gateway_store import GatewayStore
from runtime.ai.service import AICall, AIService, Answer, mode_of
from runtime.control.fair_pool import FairPool
from workers import AIError

GATEWAY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_ATTEMPTS = 5
MAX_RETRY_DELAY_MS = 60_000
MAX_CACHE_TTL_S = 30 * 24 * 3600  # a month, as AI Gateway's longest
MAX_TIMEOUT_MS = 10 * 60 * 1000
MAX_METADATA = 5
MAX_STEPS = 8
RETRYABLE = {3040, 3007}  # out of capacity, timed out (and any internal error)
PROVIDER = "workers-ai"  # the one provider this edge serves (it reaches no other network)
COMPAT = "compat"  # the gateway's OpenAI-compatible door (runtime.routes.gateway), for the same models
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


def _metadata(value: Any, where: Callable[[str, str], AIError]) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise where("metadata", f"expected a dict of at most {MAX_METADATA} entries")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str | int | float | bool) or len(str(v)) > 1024:
            raise where("metadata", "keys are strings, values strings, numbers or booleans")
    return dict(value)


@dataclass(frozen=True)
class GatewaySettings:
    """A gateway's own settings ([edge.ai_gateways.ID] in the config; these defaults otherwise)."""

    cache_ttl: int | None = None  # seconds a call without its own cacheTtl is cached
    collect_logs: bool = True
    rate_limit: int | None = None  # requests per rate_limit_period_s, per account
    rate_limit_period_s: float = 60.0


@dataclass(frozen=True)
class RetryOptions:
    """`gateway.retries` ({"maxAttempts", "retryDelayMs", "backoff"}): attempts in all (1-5),
    the delay before the second, and how it grows ("constant", "linear" or "exponential")."""

    max_attempts: int = 1
    retry_delay_ms: int = 0
    backoff: str = "constant"


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
            metadata=None if value.get("metadata") is None else _metadata(value["metadata"], _bad),
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
    if backoff not in ("constant", "linear", "exponential"):
        raise _bad("retries.backoff", "expected constant, linear or exponential")
    return RetryOptions(
        max_attempts=_int(value.get("maxAttempts", 1), "retries.maxAttempts", 1, MAX_ATTEMPTS),
        retry_delay_ms=_int(value.get("retryDelayMs", 0), "retries.retryDelayMs", 0, MAX_RETRY_DELAY_MS),
        backoff=backoff,
    )


@dataclass
class GatewayAnswer:
    """An answer through a gateway: the AI service's answer (a body or an event stream), the log
    id (env.AI.aiGatewayLogId, `cf-aig-log-id`), the cache's verdict ("HIT", "MISS", or None where
    the call was not cacheable) and, for a universal run, the step that answered (0 first).
    `headers`: the `cf-aig-*` headers a raw response and the REST door carry."""

    answer: Answer
    log_id: str
    cache_status: str | None = None
    step: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)


class Gateways:
    """Every account's gateways. `run` and `universal` raise AIError as the AI service does.
    `clock`: time for cache expiry (a test's)."""

    def __init__(
        self,
        ai: AIService,
        pool: FairPool,
        state_dir: Path,
        clock: Callable[[], float] = time.time,
        settings: dict[str, GatewaySettings] | None = None,
    ):
        """`settings`: the gateways the config names ([edge.ai_gateways.ID]); any other is made on
        first use with the defaults (no cache unless a call asks, logs kept, no rate limit)."""
        self.ai, self.pool, self.clock = ai, pool, clock
        self.store = GatewayStore(Path(state_dir) / "ai-gateway.db", clock)
        self.settings = settings or {}
        self._windows: dict[tuple[str, str], collections.deque[float]] = {}  # rate limit, per account

    def close(self) -> None:
        self.store.close()

    async def _db(self, account: str, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.pool.run(account, fn, *args, lane="ai-gateway")

    async def run(
        self,
        call: AICall,
        options: GatewayOptions,
        *,
        tags: tuple[str, ...] = (),
        request_id: str = "",
        answer_with: Callable[[AICall], Awaitable[Answer]] | None = None,
        step: int = 0,
    ) -> GatewayAnswer:
        """`call` through gateway `options.id` of `call.account`: its cache (keyed by the account,
        model, inputs and `cache_key`), retries, and a log row (unless `collect_log` is false).
        `tags` (at most 5) and the Workers AI `request_id` are logged. `answer_with`: what answers
        the call (default the AI service's door; the OpenAI-compatible door gives its own)."""
        started = time.monotonic()
        log_id = uuid.uuid4().hex
        status, answer, error = None, None, None
        settings = self.settings.get(options.id, GatewaySettings())
        if options.cache_ttl is None and settings.cache_ttl is not None:
            options = dataclasses.replace(options, cache_ttl=settings.cache_ttl)
        try:
            self._admit(call.account, options.id, settings)
            answer, status = await self._answer(call, options, answer_with or self.ai.answer)
        except AIError as exc:
            error = exc
        row = {
            "id": log_id,
            "created_at": time.time(),
            "provider": PROVIDER,
            "model": call.model[:256],
            "success": error is None,
            "cached": status == "HIT",
            "status_code": 200 if error is None else _status(error.code),
            "error": None if error is None else str(error)[:1000],
            "duration": round((time.monotonic() - started) * 1000, 3),
            "tokens_in": _tokens(answer, "prompt_tokens"),
            "tokens_out": _tokens(answer, "completion_tokens"),
            "tags": list(tags),
            "metadata": options.metadata or {},
            "event_id": options.event_id,
            "request_id": request_id,
            "step": step,  # of a universal run (0 otherwise)
            "score": None,
            "feedback": None,
        }
        if (options.collect_log if options.collect_log is not None else settings.collect_logs) is not False:
            await self._db(call.account, self.store.log, call.account, options.id, row)
        if error is not None:
            raise error
        assert answer is not None
        headers = [("cf-aig-log-id", log_id)] + ([("cf-aig-cache-status", status)] if status else [])
        return GatewayAnswer(answer, log_id, status, step, headers)

    def _admit(self, account: str, gateway: str, settings: GatewaySettings) -> None:
        """The gateway's own rate limit (a sliding window per account), as AI Gateway answers it:
        429, "Rate limited" (code 2003), with the seconds to wait."""
        if settings.rate_limit is None:
            return
        now, period = self.clock(), settings.rate_limit_period_s
        window = self._windows.setdefault((account, gateway), collections.deque())
        while window and window[0] <= now - period:
            window.popleft()
        if len(window) >= settings.rate_limit:
            wait = max(1, math.ceil(window[0] + period - now))
            error = AIError(
                2003,
                f"Rate limited: gateway {gateway!r} takes {settings.rate_limit} requests per "
                f"{period:g} s; retry in {wait} s",
            )
            error.retry_after = wait  # type: ignore[attr-defined]
            raise error
        window.append(now)

    async def _answer(
        self, call: AICall, options: GatewayOptions, answer_with: Callable[[AICall], Awaitable[Answer]]
    ) -> tuple[Answer, str | None]:
        """The answer from the cache or the model (retried as asked); the cache's verdict."""
        cacheable = (
            options.cache_ttl is not None and options.cache_ttl > 0 and mode_of(call) in ("run", "stream")
        )
        key = _cache_key(call, options) if cacheable else ""
        if cacheable and not options.skip_cache:
            hit = await self._db(call.account, self.store.cached, call.account, options.id, key)
            if hit is not None:
                kind, body = hit
                if kind == "sse":
                    return Answer(stream=_replay(body)), "HIT"
                return Answer(body=json.loads(body)), "HIT"
        answer = await self._attempts(call, options, answer_with)
        if not cacheable:
            return answer, None
        ttl = float(options.cache_ttl or 0)
        if answer.stream is not None:
            keep = self._keep(call.account, options.id, key, ttl)
            return Answer(stream=_recorded(answer.stream, keep)), "MISS"
        if answer.body is not None:
            data = json.dumps(answer.body).encode()
            await self._db(call.account, self.store.cache, call.account, options.id, key, "json", data, ttl)
        return answer, "MISS"

    def _keep(self, account: str, gateway: str, key: str, ttl: float) -> Callable[[bytes], Any]:
        async def keep(data: bytes) -> None:
            await self._db(account, self.store.cache, account, gateway, key, "sse", data, ttl)

        return keep

    async def _attempts(
        self, call: AICall, options: GatewayOptions, answer_with: Callable[[AICall], Awaitable[Answer]]
    ) -> Answer:
        retries = options.retries or RetryOptions()
        timeout = None if options.request_timeout_ms is None else options.request_timeout_ms / 1000
        for attempt in range(1, retries.max_attempts + 1):
            try:
                return await self._attempt(call, timeout, answer_with)
            except AIError as exc:
                if attempt == retries.max_attempts or exc.code not in RETRYABLE:
                    raise
                await asyncio.sleep(_delay_ms(retries, attempt) / 1000)
        raise AssertionError("unreachable")

    async def _attempt(
        self, call: AICall, timeout: float | None, answer_with: Callable[[AICall], Awaitable[Answer]]
    ) -> Answer:
        try:
            answer = await asyncio.wait_for(answer_with(call), timeout)
            if answer.stream is not None and timeout is not None:
                return Answer(stream=await _first_within(answer.stream, timeout))
            return answer
        except TimeoutError:
            raise AIError(
                3007,
                f"the gateway's requestTimeoutMs ({round(timeout * 1000)} ms) passed before the model "
                "answered",
            ) from None

    async def universal(
        self, call: AICall, gateway_id: str, steps: list[Any], *, request_id: str = ""
    ) -> GatewayAnswer:
        """`env.AI.gateway(id).run([...])`: each step in turn until one answers; `call` gives the
        account and where the call came from (its model and inputs are unused)."""
        if not GATEWAY_ID.fullmatch(gateway_id or ""):
            raise AIError(5004, "env.AI.gateway(id): name the gateway: 1 to 64 letters, digits, '-' or '_'")
        if not 0 < len(steps) <= MAX_STEPS:
            raise AIError(5004, f"env.AI.gateway(id).run: give 1 to {MAX_STEPS} requests")
        failures = []
        for step, request in enumerate(steps):
            try:
                model, inputs, options = _step(request, gateway_id, step)
                stepped = AICall(model, inputs, call.account, call.session, call.ingress, call.client_rtt_ms)
                through = await self.run(stepped, options, request_id=request_id, step=step)
            except AIError as exc:
                failures.append(f"step {step}: {exc}")
                continue
            through.step = step
            through.headers.append(("cf-aig-step", str(step)))
            return through
        raise AIError(3040, "every step of the universal run failed: " + "; ".join(failures))

    async def get_log(self, account: str, gateway_id: str, log_id: str) -> dict[str, Any]:
        row = await self._db(account, self.store.get_log, account, gateway_id, log_id)
        if row is None:
            raise LookupError(f"no log {log_id[:64]!r} in gateway {gateway_id[:64]!r}")
        return row

    async def patch_log(self, account: str, gateway_id: str, log_id: str, patch: dict[str, Any]) -> None:
        """Cloudflare's patchLog: `score` (0-100), `feedback` (-1, 0 or 1), `metadata` (at most 5
        scalar entries); anything else refused naming it."""
        checked: dict[str, Any] = {}
        for key, value in patch.items():
            if key == "score":
                if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 100:
                    raise AIError(5004, "patchLog: score is a number from 0 to 100")
            elif key == "feedback":
                if value not in (-1, 0, 1) or isinstance(value, bool):
                    raise AIError(5004, "patchLog: feedback is -1, 0 or 1")
            elif key == "metadata":
                value = _metadata(value, lambda k, why: AIError(5004, f"patchLog: {k}: {why}"))
            else:
                raise AIError(5004, f"patchLog: no field {str(key)[:32]!r}; give score, feedback or metadata")
            checked[key] = value
        if not await self._db(account, self.store.patch_log, account, gateway_id, log_id, checked):
            raise LookupError(f"no log {log_id[:64]!r} in gateway {gateway_id[:64]!r}")

    async def logs(self, account: str, gateway_id: str, limit: int = 50) -> list[dict[str, Any]]:
        return await self._db(account, self.store.logs, account, gateway_id, limit)

    def url(self, account: str, gateway_id: str, provider: str | None, origin: str) -> str:
        """`getUrl(provider)`: the gateway's base URL, AI Gateway's
        (`https://gateway.ai.cloudflare.com/v1/{account}/{gateway}/{provider}`) at this runtime's own
        door (runtime.routes.gateway): `workers-ai` (Workers AI's shapes) and `compat` (OpenAI's chat
        completions, `model: "workers-ai/<model>"`) are served there; another provider is refused."""
        if provider not in (None, PROVIDER, COMPAT):
            raise AIError(
                5004,
                f"getUrl: provider {provider[:64]!r} cannot be reached from this edge (no network); "
                f"only {PROVIDER} is served",
            )
        base = f"{origin}/cdn-cgi/ai-gateway/v1/{account}/{gateway_id}"
        return f"{base}/{provider}" if provider else base


def _step(request: Any, gateway_id: str, step: int) -> tuple[str, Any, GatewayOptions]:
    """A universal request {provider, endpoint, headers, query} as (model, inputs, options): the
    cf-aig-* headers it carries set its gateway options (cache, timeout, retries)."""
    if not isinstance(request, dict):
        raise AIError(5004, "a request is {provider, endpoint, headers, query}")
    provider = request.get("provider")
    if provider != PROVIDER:
        raise AIError(
            3040,
            f"provider {str(provider)[:64]!r} cannot be reached from this edge (no network): only {PROVIDER}",
        )
    endpoint = request.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise AIError(5004, "endpoint: the model to run, such as @edge/moonshotai/kimi-k2-mini")
    headers = request.get("headers") or {}
    if not isinstance(headers, dict):
        raise AIError(5004, "headers: a dict of header names to strings")
    h = {str(k).lower(): v for k, v in headers.items()}
    options: dict[str, Any] = {"id": gateway_id}
    for name, key in (("cf-aig-cache-ttl", "cacheTtl"), ("cf-aig-request-timeout", "requestTimeoutMs")):
        if name in h:
            try:
                options[key] = int(h[name])
            except (TypeError, ValueError):
                raise AIError(5004, f"headers.{name}: expected an integer") from None
    if "cf-aig-cache-key" in h:
        options["cacheKey"] = str(h["cf-aig-cache-key"])
    if "cf-aig-skip-cache" in h:
        options["skipCache"] = str(h["cf-aig-skip-cache"]).lower() == "true"
    return endpoint.removeprefix("run/"), request.get("query"), GatewayOptions.parse(options)


def _cache_key(call: AICall, options: GatewayOptions) -> str:
    basis = (
        options.cache_key
        if options.cache_key is not None
        else json.dumps([call.model, call.inputs], sort_keys=True)
    )
    return hashlib.sha256(basis.encode()).hexdigest()


def _delay_ms(retries: RetryOptions, attempt: int) -> float:
    """The wait after failed attempt `attempt` (1 first)."""
    base = retries.retry_delay_ms
    if retries.backoff == "linear":
        return base * attempt
    if retries.backoff == "exponential":
        return base * 2 ** (attempt - 1)
    return base


def _status(code: int) -> int:
    return {5007: 400, 5004: 400, 3006: 413, 3036: 429, 2003: 429, 3040: 503, 3007: 504}.get(code, 500)


def _tokens(answer: Answer | None, name: str) -> int | None:
    if answer is None or answer.result is None:
        return None
    return getattr(answer.result, name, None)


async def _replay(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _recorded(stream: AsyncIterator[bytes], keep: Callable[[bytes], Any]) -> AsyncIterator[bytes]:
    """`stream` as it comes, recorded; kept (`keep`) only when it ended whole without an error."""
    seen = bytearray()
    async for chunk in stream:
        seen += chunk
        yield chunk
    if b'"error"' not in seen:
        await keep(bytes(seen))


async def _first_within(stream: AsyncIterator[bytes], timeout: float) -> AsyncIterator[bytes]:
    """A stream whose first event must come within `timeout` seconds (requestTimeoutMs)."""
    iterator = aiter(stream)
    try:
        first = await asyncio.wait_for(anext(iterator), timeout)
    except StopAsyncIteration:
        return _empty()
    except TimeoutError:
        if hasattr(iterator, "aclose"):
            await iterator.aclose()
        raise

    async def rest() -> AsyncIterator[bytes]:
        yield first
        async for chunk in iterator:
            yield chunk

    return rest()


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""
