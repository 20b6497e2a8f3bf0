"""`env.AI.gateway(id)` inside the isolate, as workerd's `AiGateway` (aig-api.ts): `await
getUrl(provider=None)`, `await getLog(log_id)`, `await patchLog(log_id, data)` and `await run(data)`,
AI Gateway's universal endpoint (one request `{provider, endpoint, headers, query}` or a list tried
in turn) answering a `workers.Response` whose headers say which step answered (`cf-aig-step`) and
its log (`cf-aig-log-id`). Each crosses to the runtime (runtime.ai.gateway answers it there)."""

from __future__ import annotations

import json
from typing import Any, Protocol

from runtime.isolate import ipc
from workers import Response
from workers.binding_values import wrap_result
from workers.errors import AiGatewayInternalError, AiGatewayLogNotFound


class AIBinding(Protocol):
    """What a gateway uses of env.AI (runtime.isolate.inside.channel.AIBinding, named by shape:
    the binding makes its gateways, so this module cannot import it)."""

    _channel: Any

    def note_answer(self, headers: list[tuple[str, str]]) -> None: ...


GATEWAY_ID_CHARS = 64
_ERRORS = {"AiGatewayLogNotFound": AiGatewayLogNotFound, "TypeError": TypeError}


class AIGateway:
    def __init__(self, binding: AIBinding, gateway_id: str):
        if not isinstance(gateway_id, str) or not gateway_id or len(gateway_id) > GATEWAY_ID_CHARS:
            raise TypeError(
                f"env.AI.gateway(id): id must be a gateway name of 1 to {GATEWAY_ID_CHARS} characters"
            )
        self._binding, self.id = binding, gateway_id

    async def getUrl(self, provider: str | None = None) -> str:  # noqa: N802 - Cloudflare's name
        if provider is not None and not isinstance(provider, str):
            raise TypeError(
                "env.AI.gateway(id).getUrl(provider): provider must be a string such as 'workers-ai'"
            )
        return await self._call("getUrl", [] if provider is None else [provider])

    async def getLog(self, log_id: str) -> Any:  # noqa: N802 - Cloudflare's name
        return await self._call("getLog", [_log_id(log_id)])

    async def patchLog(self, log_id: str, data: dict[str, Any]) -> None:  # noqa: N802 - Cloudflare's name
        data = _plain(data)
        if not isinstance(data, dict):
            raise TypeError("env.AI.gateway(id).patchLog(logId, data): data is {score, feedback, metadata}")
        await self._call("patchLog", [_log_id(log_id), data])

    async def run(self, data: Any, options: Any = None) -> Response:
        """The universal endpoint; `options` (workerd's per-run gateway options and extraHeaders)
        are refused rather than ignored: put the cf-aig-* headers in each request's `headers`."""
        if _plain(options):
            raise TypeError(
                "env.AI.gateway(id).run(data, options): options are not served here; set the cf-aig-* "
                "headers (cf-aig-cache-ttl, cf-aig-skip-cache, ...) in each request's headers instead"
            )
        steps = _plain(data)
        steps = [_step(s) for s in (steps if isinstance(steps, list) else [steps])]
        channel = self._binding._channel
        answer = await channel.ai_exchange(
            "env.AI.gateway(id).run",
            lambda call, request: ipc.AIGatewayRun(call, request, self.id, steps),
        )
        self._binding.note_answer(answer.headers)
        result = answer.result
        if hasattr(result, "__aiter__"):
            return Response(result, headers=[("content-type", "text/event-stream"), *answer.headers])
        return Response(json.dumps(result), headers=[("content-type", "application/json"), *answer.headers])

    async def _call(self, method: str, args: list[Any]) -> Any:
        reply: ipc.BindingReply = await self._binding._channel._round_trip(
            f"env.AI.gateway(id).{method}",
            lambda call, request: ipc.AIGatewayCall(call, request, self.id, method, args),
        )
        if reply.error_type is not None:
            error = _ERRORS.get(reply.error_type, AiGatewayInternalError)
            raise error(reply.error_message or f"env.AI.gateway(id).{method} failed")
        result = reply.result
        return wrap_result(result) if isinstance(result, dict) else result


def _log_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError("env.AI.gateway(id): a log id is a string (env.AI.aiGatewayLogId, cf-aig-log-id)")
    return value


def _step(step: Any) -> dict[str, Any]:
    """One universal request, its header values as strings (numbers and booleans as text,
    objects as JSON), as workerd sends them."""
    step = _plain(step)
    if not isinstance(step, dict):
        raise TypeError("env.AI.gateway(id).run: each request is {provider, endpoint, headers, query}")
    headers = _plain(step.get("headers")) or {}
    if not isinstance(headers, dict):
        raise TypeError("env.AI.gateway(id).run: a request's headers are a dict of names to values")
    out: dict[str, str] = {}
    for name, value in headers.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, int | float):
            value = str(value)
        elif isinstance(value, dict | list):
            value = json.dumps(value)
        out[str(name)] = value
    return {**step, "headers": out}


def _plain(value: Any) -> Any:
    to_py = getattr(value, "to_py", None)
    return to_py() if callable(to_py) and not isinstance(value, dict) else value
