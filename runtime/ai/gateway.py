"""AI Gateway, locally: the gateway a worker names in `env.AI.run(..., {"gateway": {...}})` or reaches
through `env.AI.gateway(id)`, and the HTTP door at `Gateways.url` (runtime.routes.gateway). Per
account: a gateway is made on first use (as Cloudflare makes one on its first request), declared in
[edge.ai_gateways.ID] or created through Cloudflare's API (runtime.ai.gateway_registry says which
settings apply); its state lives in one SQLite database under `.edge/` (runtime.ai.gateway_store,
every row keyed by account), each SQLite call through the runtime's fair binding pool. What it does,
in the order a call meets it:

- its rate limit (the gateway's `rate_limit` per `rate_limit_period_s`, sliding or fixed, per
  account; none by default): over it, AIError 2003 "Rate limited" (HTTP 429, Retry-After);
- its cache, on when the call or the gateway gives a `cacheTtl` (seconds): keyed by the account, the
  gateway, the answer's shape (Workers AI or OpenAI), the model and the inputs (canonical JSON), or by
  `cacheKey` in their place when given; `skipCache` neither reads nor writes it. Errors are never
  cached. A stream is recorded as its event-stream bytes while it streams and kept only when it ended
  whole (runtime.ai.gateway_streams); a hit replays those bytes. `cf-aig-cache-status: HIT | MISS`;
- retries (the call's, else the gateway's own): `retries.maxAttempts` (1-5) on failures worth
  retrying (3040 out of capacity, 3007 timed out, which is also how the AI service answers an
  internal error), never on bad input (5004, 5007);
  `retryDelayMs` before the second attempt, growing by `backoff`; `requestTimeoutMs` bounds each
  attempt (a stream: until its first event), a timeout being a 3007 that says so;
- a log row per call (unless `collectLog: false` or the gateway's collect_logs is off), its id the
  `cf-aig-log-id` header (env.AI.aiGatewayLogId): read with `get_log` / `logs` / `list_logs`, scored
  with `patch_log`, its bodies with `log_body`; the request's body is the one the door was sent (or
  the inputs as JSON, from a worker), the answer's the body it answered, or for a stream the
  event-stream bytes as they streamed (what the client read, not an assembled answer: it is what
  was answered, and a replay of it reads the same); a stream's row is completed (duration, tokens,
  an error, its body) when the stream ends;
- `universal`: a list of steps in Cloudflare's universal shape, each tried in turn until one answers
  (`cf-aig-step`); see runtime.ai.gateway_universal.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import hashlib
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from runtime.ai.call import RUN, STREAM, AICall
from runtime.ai.gateway_log_query import LogQuery, list_page
from runtime.ai.gateway_options import (
    GATEWAY_ID,
    GatewayOptions,
    GatewaySettings,
    RetryOptions,
    check_patch,
)
from runtime.ai.gateway_registry import Gateway, GatewayRegistry
from runtime.ai.gateway_store import CACHE_ENTRY_BYTES, GatewayStore
from runtime.ai.gateway_streams import StreamOutcome, opened, recorded, replay
from runtime.ai.gateway_universal import MAX_STEPS, PROVIDER, read_step
from runtime.ai.service import AIService, Answer
from runtime.control.ai_record import AIRecord
from runtime.control.fair_pool import FairPool
from workers import AIError

__all__ = [
    "COMPAT",
    "PROVIDER",
    "GatewayAnswer",
    "GatewayOptions",
    "GatewaySettings",
    "Gateways",
    "RetryOptions",
]

COMPAT = "compat"  # the gateway's OpenAI-compatible door (runtime.routes.gateway), for the same models
OPENAI = "openai"  # the shape of the compat door's answers (`run`'s shape)
RETRYABLE = {3040, 3007}  # out of capacity, timed out (the AI service's answer to an internal error too)
RATE_LIMITED = 2003
HTTP_STATUS = {5007: 400, 5004: 400, 5006: 400, 3006: 413, 3036: 429, 3040: 503, 3007: 504, 2003: 429}
MAX_TAGS = 5


@dataclass
class GatewayAnswer:
    """An answer through a gateway: the AI service's answer (a body or an event stream), the log
    id (env.AI.aiGatewayLogId, `cf-aig-log-id`), the cache's verdict ("HIT", "MISS", or None where
    the call was not cacheable) and, for a universal run, the step that answered (0 first).
    `headers`: the `cf-aig-*` headers a raw response and the REST door carry; `record`: the record
    of the call that answered (a universal run's: its step's)."""

    answer: Answer
    log_id: str
    cache_status: str | None = None
    step: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    record: AIRecord | None = None


class Gateways:
    """Every account's gateways. `run` and `universal` raise AIError as the AI service does.
    `clock`: time for cache expiry and the rate limit; `sleep`: the wait between retries (a test's)."""

    def __init__(
        self,
        ai: AIService,
        pool: FairPool,
        state_dir: Path,
        clock: Callable[[], float] = time.time,
        settings: dict[str, GatewaySettings] | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ):
        """`settings`: the gateways the config names ([edge.ai_gateways.ID]); any other is made on
        first use with the defaults (no cache unless a call asks, logs kept, no rate limit)."""
        self.ai, self.pool, self.clock, self.sleep = ai, pool, clock, sleep
        self.store = GatewayStore(Path(state_dir) / "ai-gateway.db", lambda: self.clock())
        self.settings = settings or {}
        self.registry = GatewayRegistry(self.store, self.settings, lambda: self.clock())
        # the rate limit's request times per (account, gateway): only gateways with a limit have one
        self._windows: dict[tuple[str, str], collections.deque[float]] = {}

    def close(self) -> None:
        self.store.close()

    async def _db(self, account: str, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.pool.run(account, fn, *args, lane="ai-gateway")

    async def _settings(self, account: str, gateway_id: str) -> GatewaySettings:
        """The settings that apply to a call through the gateway (made on first use)."""
        known = self.registry.known(account, gateway_id)
        if known is not None:
            return known
        return await self._db(account, self.registry.settings, account, gateway_id)

    async def run(
        self,
        call: AICall,
        options: GatewayOptions,
        *,
        shape: str = PROVIDER,
        step: int = 0,
        body: bytes | None = None,
    ) -> GatewayAnswer:
        """`call` through gateway `options.id` of `call.account`, answered by the AI service's one
        door: its rate limit, cache, retries and a log row (unless `collect_log` is false) with the
        call's tags (at most 5) and Workers AI request id; the call's record names the gateway, its
        log and its cache's verdict. `shape`: the shape its answers take, as its cache keys name it
        (a cache entry of one shape never answers a call of another); `step`: the universal run's;
        `body`: the request's body as the door was sent it (None: the inputs, as JSON)."""
        started = time.monotonic()
        log_id = uuid.uuid4().hex
        settings = await self._settings(call.account, options.id)
        if options.cache_ttl is None and settings.cache_ttl is not None:
            options = dataclasses.replace(options, cache_ttl=settings.cache_ttl)
        if options.retries is None and settings.retries is not None:
            options = dataclasses.replace(options, retries=settings.retries)
        collect = options.collect_log if options.collect_log is not None else settings.collect_logs
        attempts = [0]
        status, answer, error = None, None, None
        try:
            self._admit(call.account, options.id, settings)
            answer, status = await self._answer(call, options, shape, attempts)
        except AIError as exc:
            error = exc
        row = {
            "id": log_id,
            "created_at": self.clock(),
            "gateway": options.id,
            "provider": PROVIDER,
            "path": f"{shape}/{call.model}"[:300],
            "model": call.model[:256],
            "step": step,
            "success": error is None,
            "cached": status == "HIT",
            "status_code": 200 if error is None else HTTP_STATUS.get(error.code, 500),
            "error": None if error is None else str(error)[:1000],
            "duration": _ms_since(started),
            "attempts": attempts[0],
            "stream": answer is not None and answer.stream is not None,
            "tokens_in": None,
            "tokens_out": None,
            "cost": 0.0,  # nothing is billed here
            "model_type": "Text Embeddings" if call.embedding else "Text Generation",
            "request_type": COMPAT if shape == OPENAI else PROVIDER,  # the door: compatibilityMode's
            "request_content_type": "application/json",
            "response_content_type": "text/event-stream"
            if answer is not None and answer.stream is not None
            else "application/json",
            "tags": [str(t)[:64] for t in call.tags[:MAX_TAGS]],
            "metadata": options.metadata or {},
            "event_id": options.event_id,
            "request_id": call.request_id,
            "score": None,
            "feedback": None,
        }
        if answer is not None and answer.stream is None:
            row["tokens_in"], row["tokens_out"] = _tokens(answer)
        if collect:
            request = body if body is not None else _json_bytes(call.inputs)
            await self._db(
                call.account,
                functools.partial(
                    self.store.log,
                    keep=settings.log_rows,
                    stop_when_full=settings.log_strategy == "STOP_INSERTING",
                ),
                call.account,
                options.id,
                row,
                request,
                _answered(answer, error),
            )
        if error is not None:
            if collect:  # a failure is logged too: its answer names the row (cf-aig-log-id), as a success's
                error.log_id = log_id  # type: ignore[attr-defined]
            raise error
        assert answer is not None
        if answer.stream is not None and collect:
            answer = Answer(stream=self._logged(answer.stream, call.account, options.id, log_id, started))
        headers = [("cf-aig-log-id", log_id)] + ([("cf-aig-cache-status", status)] if status else [])
        call.record.through_gateway(options.id, log_id, status)
        return GatewayAnswer(answer, log_id, status, step, headers, call.record)

    def _admit(self, account: str, gateway: str, settings: GatewaySettings) -> None:
        """The gateway's own rate limit, per account, as AI Gateway answers it: 429 "Rate limited",
        with the seconds to wait (`retry_after`, the Retry-After header)."""
        if settings.rate_limit is None:
            return
        now, period = self.clock(), settings.rate_limit_period_s
        window = self._windows.setdefault((account, gateway), collections.deque())
        sliding = settings.rate_limit_technique == "sliding"
        # sliding: the requests of the last `period` seconds; fixed: those since this period began
        begins = now - period if sliding else now - now % period
        while window and (window[0] <= begins if sliding else window[0] < begins):
            window.popleft()
        if len(window) >= settings.rate_limit:
            wait = max(1, math.ceil((window[0] if sliding else begins) + period - now))
            error = AIError(
                RATE_LIMITED,
                f"Rate limited: gateway {gateway!r} takes {settings.rate_limit} requests per "
                f"{period:g} s ({settings.rate_limit_technique} window); retry in {wait} s",
            )
            error.retry_after = wait  # type: ignore[attr-defined]
            raise error
        window.append(now)

    async def _answer(
        self, call: AICall, options: GatewayOptions, shape: str, attempts: list[int]
    ) -> tuple[Answer, str | None]:
        """The answer from the cache or the model (retried as asked); the cache's verdict."""
        ttl = options.cache_ttl or 0
        cacheable = ttl > 0 and call.mode in (RUN, STREAM)
        key = _cache_key(call, options, shape) if cacheable else ""
        if cacheable and not options.skip_cache:
            hit = await self._db(call.account, self.store.cached, call.account, options.id, key)
            if hit is not None:
                kind, body = hit
                return (
                    Answer(stream=replay(body)) if kind == "sse" else Answer(body=json.loads(body))
                ), "HIT"
        answer = await self._attempts(call, options, attempts)
        if not cacheable:
            return answer, None
        if options.skip_cache:  # neither read nor written: the call asked for a fresh answer
            return answer, "MISS"
        if answer.stream is not None:
            keep = self._keep(call.account, options.id, key, ttl)
            return Answer(stream=recorded(answer.stream, CACHE_ENTRY_BYTES, keep)), "MISS"
        if answer.body is not None:
            data = json.dumps(answer.body).encode()
            await self._db(call.account, self.store.cache, call.account, options.id, key, "json", data, ttl)
        return answer, "MISS"

    def _keep(self, account: str, gateway: str, key: str, ttl: float):
        async def keep(data: bytes | None, outcome: StreamOutcome) -> None:
            if data is not None and outcome.whole:
                await self._db(account, self.store.cache, account, gateway, key, "sse", data, ttl)

        return keep

    def _logged(
        self, stream: AsyncIterator[bytes], account: str, gateway: str, log_id: str, started: float
    ) -> AsyncIterator[bytes]:
        """A stream whose log row is completed when it ends: its duration, tokens, error and body
        (the bytes as they streamed; none past CACHE_ENTRY_BYTES, where the recording stops)."""

        async def ended(data: bytes | None, outcome: StreamOutcome) -> None:
            done = {"duration": _ms_since(started), "tokens_in": outcome.tokens_in}
            done["tokens_out"] = outcome.tokens_out
            if not outcome.whole:
                done.update(success=False, error=outcome.error or "the client left before the stream ended")
            await self._db(account, self.store.patch_log, account, gateway, log_id, done, data)

        return recorded(stream, CACHE_ENTRY_BYTES, ended)

    async def _attempts(self, call: AICall, options: GatewayOptions, attempts: list[int]) -> Answer:
        retries = options.retries or RetryOptions()
        timeout = None if options.request_timeout_ms is None else options.request_timeout_ms / 1000
        for attempt in range(1, retries.max_attempts + 1):
            attempts[0] = attempt
            try:
                return await self._attempt(call, timeout)
            except AIError as exc:
                if attempt == retries.max_attempts or exc.code not in RETRYABLE:
                    raise
            await self.sleep(retries.delay_ms(attempt) / 1000)
        raise AssertionError("unreachable")

    async def _attempt(self, call: AICall, timeout: float | None) -> Answer:
        try:
            answer = await asyncio.wait_for(self.ai.answer(call), timeout)
            if answer.stream is not None:
                return Answer(stream=await opened(answer.stream, timeout))
            return answer
        except TimeoutError:
            assert timeout is not None
            raise AIError(
                3007,
                f"the gateway's requestTimeoutMs ({round(timeout * 1000)} ms) passed before the model "
                "answered; raise it, or retry with retries.maxAttempts",
            ) from None

    async def universal(self, call: AICall, gateway_id: str, steps: list[Any]) -> GatewayAnswer:
        """`env.AI.gateway(id).run([...])`: each step in turn until one answers, a call of its own;
        `call` gives the account, where the call came from and its request id (its model and inputs
        are unused), and its record names the gateway, the answering step's log and cache verdict.
        Every step tried is logged (its row's `step`); all failing, AIError 3040 listing each
        step's failure."""
        if not GATEWAY_ID.fullmatch(gateway_id or ""):
            raise AIError(5004, "env.AI.gateway(id): name the gateway: 1 to 64 letters, digits, '-' or '_'")
        if isinstance(steps, dict):
            steps = [steps]
        if not isinstance(steps, list) or not 0 < len(steps) <= MAX_STEPS:
            raise AIError(5004, f"env.AI.gateway(id).run: give 1 to {MAX_STEPS} requests")
        failures = []
        for index, request in enumerate(steps):
            try:
                step = read_step(request, gateway_id)
                ingress = self._pop(step.model, step.pop) if step.pop else call.ingress
                stepped = AICall(
                    step.model,
                    step.inputs,
                    call.account,
                    call.session,
                    ingress,
                    call.client_rtt_ms,
                    request_id=call.request_id,
                )
                through = await self.run(stepped, step.options, step=index)
            except AIError as exc:
                failures.append(f"step {index}: {exc}")
                continue
            through.headers.append(("cf-aig-step", str(index)))
            call.record.through_gateway(gateway_id, through.log_id, through.cache_status)
            return through
        raise AIError(3040, "every step of the universal run failed: " + "; ".join(failures))

    def _pop(self, model: str, code: str):
        """The PoP a step prefers (cf-aig-edge-pop): the call enters the edge there, so the router
        ranks it first; AIError when the edge has no such GPU PoP or it does not serve the model."""
        edge = self.ai.edge
        node = edge.nodes.get(code.upper())
        if node is None:
            have = ", ".join(sorted(edge.nodes)) or "none"
            raise AIError(3040, f"cf-aig-edge-pop: this edge has no GPU PoP {code[:8]!r} (it has {have})")
        if not node.serves(self.ai.resolve(model)):
            raise AIError(3040, f"cf-aig-edge-pop: PoP {node.code} does not serve {model[:128]!r}")
        return node.pop

    async def get_log(self, account: str, gateway_id: str, log_id: str) -> dict[str, Any]:
        """A log row of the account's gateway; LookupError when it holds none of that id."""
        row = await self._db(account, self.store.get_log, account, gateway_id, str(log_id)[:64])
        if row is None:
            raise LookupError(f"no log {str(log_id)[:64]!r} in gateway {gateway_id[:64]!r}")
        return row

    async def patch_log(self, account: str, gateway_id: str, log_id: str, patch: dict[str, Any]) -> None:
        """Cloudflare's patchLog: `score` (0-100), `feedback` (-1, 0 or 1), `metadata` (at most 5
        scalar entries); anything else refused naming it (AIError 5004); LookupError for no such log."""
        checked = check_patch(patch)
        if not await self._db(account, self.store.patch_log, account, gateway_id, str(log_id)[:64], checked):
            raise LookupError(f"no log {str(log_id)[:64]!r} in gateway {gateway_id[:64]!r}")

    async def logs(self, account: str, gateway_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """The account's gateway's newest `limit` log rows, newest first."""
        return await self._db(account, self.store.logs, account, gateway_id, limit)

    async def list_logs(
        self, account: str, gateway_id: str, query: LogQuery
    ) -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
        """One page of the gateway's log rows as `query` selects and orders them
        (runtime.ai.gateway_log_query), how many match in all, and meta_info's min and max."""

        def page() -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
            rows, total, meta = self.store.read(lambda db: list_page(db, account, gateway_id, query))
            return [json.loads(r) for r in rows], total, meta

        return await self._db(account, page)

    async def log_detail(self, account: str, gateway_id: str, log_id: str) -> dict[str, Any]:
        """A log row with its bodies' sizes and heads; LookupError when the gateway holds none."""
        row = await self._db(account, self.store.log_detail, account, gateway_id, str(log_id)[:64])
        if row is None:
            raise LookupError(f"no log {str(log_id)[:64]!r} in gateway {gateway_id[:64]!r}")
        return row

    async def log_body(
        self, account: str, gateway_id: str, log_id: str, which: str
    ) -> tuple[bytes | None, int | None, str]:
        """What a log row kept of its request's or answer's body (`which`), its whole size and its
        content type; LookupError when the gateway holds no such row."""
        try:
            return await self._db(account, self.store.log_body, account, gateway_id, str(log_id)[:64], which)
        except LookupError:
            raise LookupError(f"no log {str(log_id)[:64]!r} in gateway {gateway_id[:64]!r}") from None

    # --- the gateways, as Cloudflare's API lists and changes them (runtime.ai.gateway_registry) ---

    async def list_gateways(
        self, account: str, search: str | None, page: int, per_page: int
    ) -> tuple[list[Gateway], int]:
        return await self._db(account, self.registry.list, account, search, page, per_page)

    async def get_gateway(self, account: str, gateway_id: str) -> Gateway:
        return await self._db(account, self.registry.get, account, gateway_id)

    async def create_gateway(self, account: str, gateway_id: str, settings: GatewaySettings) -> Gateway:
        return await self._db(account, self.registry.create, account, gateway_id, settings)

    async def update_gateway(self, account: str, gateway_id: str, settings: GatewaySettings) -> Gateway:
        return await self._db(account, self.registry.update, account, gateway_id, settings)

    async def delete_gateway(self, account: str, gateway_id: str) -> Gateway:
        gone = await self._db(account, self.registry.delete, account, gateway_id)
        self._windows.pop((account, gateway_id), None)
        return gone

    def url(self, account: str, gateway_id: str, provider: str | None, origin: str) -> str:
        """`getUrl(provider)`: the gateway's base URL, AI Gateway's
        (`https://gateway.ai.cloudflare.com/v1/{account}/{gateway}/{provider}`) at this runtime's own
        door (runtime.routes.gateway), under /cdn-cgi/ so it never shadows a worker's paths:
        `workers-ai` (POST .../workers-ai/{model}, Workers AI's shapes) and `compat` (POST
        .../compat/chat/completions, OpenAI's, `model: "workers-ai/<model>"`); another provider is
        refused (this edge reaches no other network)."""
        if provider not in (None, PROVIDER, COMPAT):
            raise AIError(
                5004,
                f"getUrl: provider {provider[:64]!r} cannot be reached from this edge (no network); "
                f"only {PROVIDER} and {COMPAT} are served",
            )
        base = f"{origin.rstrip('/')}/cdn-cgi/ai-gateway/v1/{account}/{gateway_id}"
        return f"{base}/{provider}" if provider else base


def _cache_key(call: AICall, options: GatewayOptions, shape: str) -> str:
    """The entry's key: the shape and mode of the answer, then the model and inputs as canonical
    JSON, or `cacheKey` in their place (as cf-aig-cache-key replaces AI Gateway's own key)."""
    inputs = call.inputs  # OpenAI's door hands its decoded body: keyed as the JSON it came as
    if isinstance(inputs, msgspec.Struct):
        inputs = msgspec.to_builtins(inputs)
    basis: list[Any] = [shape, call.mode]
    basis += [options.cache_key] if options.cache_key is not None else [call.model, inputs]
    return hashlib.sha256(json.dumps(basis, sort_keys=True, default=str).encode()).hexdigest()


def _ms_since(started: float) -> int:
    """Whole milliseconds since `started`, as Cloudflare's log rows count a duration."""
    return round((time.monotonic() - started) * 1000)


def _json_bytes(value: Any) -> bytes | None:
    """A call's inputs as the JSON a door would have been sent (None: they do not encode)."""
    try:
        return msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError):
        return None


def _answered(answer: Answer | None, error: AIError | None) -> bytes | None:
    """The body a call answered, for its log row: a whole answer's JSON, or a failure in Cloudflare's
    envelope as the Workers AI door answers it (the compat door answers the same failure in OpenAI's
    shape); None for a stream (its bytes come when it ends: Gateways._logged)."""
    if error is not None:
        errors = [{"code": error.code, "message": error.detail}]
        return json.dumps({"result": None, "success": False, "errors": errors, "messages": []}).encode()
    if answer is None or answer.stream is not None:
        return None
    return _json_bytes(answer.body)


def _tokens(answer: Answer) -> tuple[int | None, int | None]:
    """Prompt and completion tokens of a whole answer: its generation's, else its body's usage (a
    cached answer has no generation behind it)."""
    if answer.result is not None:
        return answer.result.prompt_tokens, answer.result.completion_tokens
    usage = (answer.body or {}).get("usage") if isinstance(answer.body, dict) else None
    if isinstance(usage, dict):
        return usage.get("prompt_tokens"), usage.get("completion_tokens")
    return None, None
