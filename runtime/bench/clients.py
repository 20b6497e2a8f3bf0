"""The three backends `edge bench serve` drives, each sending one request and timing its answer.

workers-ai: POST /client/v4/accounts/ID/ai/run/MODEL ({"prompt", "max_tokens", "stream"});
openai-chat: POST /client/v4/accounts/ID/ai/v1/chat/completions (one user message); worker: GET or
POST a worker's URL, timed end to end only. Streamed answers are server-sent events: TTFT is when
the first delta with text arrives, ITL the gaps between later deltas (vLLM's definitions); token
counts come from the answer's `usage`. A failure keeps its error code: Workers AI's
`errors[0].code`, OpenAI's `error.code`, a stream's error event, else the HTTP status."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import httpx
import msgspec

from runtime.bench.dataset import BenchRequest

Backend = Literal["workers-ai", "openai-chat", "worker"]
BACKENDS: tuple[Backend, ...] = ("workers-ai", "openai-chat", "worker")


class Target(msgspec.Struct, kw_only=True):
    """Where and how requests go (one per run; tenants vary per request)."""

    backend: Backend
    base_url: str
    model: str
    stream: bool = True
    url: str | None = None  # worker: the route (default base_url + "/")
    method: str = "GET"  # worker
    temperature: float = 0.0
    location: str | None = None  # sent as x-edge-client-location


class Tenant(msgspec.Struct, frozen=True):
    account: str
    token: str


class RequestOutput(msgspec.Struct, kw_only=True):
    """What one request measured (seconds, as vLLM keeps them; the report converts to ms)."""

    success: bool = False
    start_time: float = 0.0  # perf_counter when it was sent
    latency: float = 0.0  # E2EL
    ttft: float | None = None  # None: not streamed (or no text came)
    itl: list[float] = []
    prompt_tokens: int | None = None  # None: the answer gave no usage (the drawn length counts)
    output_tokens: int = 0
    generated_text: str = ""
    error: str = ""
    code: str = ""  # the failure's error code (see the module docstring)
    status: int = 0  # HTTP status
    tenant: str = ""
    served_by: str = ""  # the answer's served_by.model (a canary's own name during a rollout)
    pop: str = ""  # the GPU PoP that ran it (timing.pop)
    batch: int = 1  # sequences decoding beside it, as its modeled timing assumed (timing.modeled.batch)


SendFn = Callable[[httpx.AsyncClient, Target, Tenant, BenchRequest], Awaitable[RequestOutput]]


def _headers(target: Target, tenant: Tenant, req: BenchRequest | None = None) -> dict[str, str]:
    headers = {"authorization": f"Bearer {tenant.token}"} if tenant.token else {}
    if target.location:
        headers["x-edge-client-location"] = target.location
    if req is not None and req.session:
        headers["x-session-affinity"] = req.session
    return headers


def _error_code(body: Any, status: int) -> tuple[str, str]:
    """(code, message) of an error body in either API's shape, else the HTTP status."""
    if isinstance(body, dict):
        errors = body.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            return str(errors[0].get("code", status)), str(errors[0].get("message", ""))
        err = body.get("error")
        if isinstance(err, dict):
            code = err.get("code")
            return (str(code) if code is not None else f"HTTP {status}"), str(err.get("message", ""))
        if err is not None:  # a Workers AI stream's {"error": "...", "code": N}
            return str(body.get("code", f"HTTP {status}")), str(err)
    return f"HTTP {status}", ""


def _fail(out: RequestOutput, status: int, body: Any, text: str = "") -> RequestOutput:
    code, message = _error_code(body, status)
    out.code = code if code.startswith("HTTP") else f"{code} (HTTP {status})"
    out.status, out.success = status, False
    out.error = message or text[:200]
    return out


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _delta_text(event: dict) -> str:
    """The text an SSE event carries: Workers AI's `response` or an OpenAI chunk's delta."""
    if "response" in event:
        return event["response"] or ""
    choices = event.get("choices") or []
    if choices:
        delta = choices[0].get("delta") or {}
        return delta.get("content") or choices[0].get("text") or ""
    return ""


async def _stream(
    client: httpx.AsyncClient, url: str, headers: dict, body: dict, out: RequestOutput
) -> RequestOutput:
    texts: list[str] = []
    last = out.start_time
    async with client.stream("POST", url, headers=headers, json=body) as r:
        if r.status_code >= 400:
            raw = (await r.aread()).decode(errors="replace")
            return _fail(out, r.status_code, _json(raw), raw)
        out.status = r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            event = _json(payload)
            if not isinstance(event, dict):
                continue
            if "error" in event:
                return _fail(out, r.status_code, event)
            text = _delta_text(event)
            if text:
                now = time.perf_counter()
                if out.ttft is None:
                    out.ttft = now - out.start_time
                else:
                    out.itl.append(now - last)
                last = now
                texts.append(text)
            _usage(out, event.get("usage"))
            _served(out, event)
    out.latency = time.perf_counter() - out.start_time
    out.generated_text = "".join(texts)
    out.success = True
    return out


def _served(out: RequestOutput, answer: Any) -> None:
    """Where the answer ran: its served_by model, GPU PoP and modeled batch, when it says."""
    if not isinstance(answer, dict):
        return
    served, timing = answer.get("served_by"), answer.get("timing")
    if isinstance(served, dict) and served.get("model"):
        out.served_by = str(served["model"])
    if isinstance(timing, dict):
        out.pop = str(timing.get("pop") or out.pop)
        modeled = timing.get("modeled")
        if isinstance(modeled, dict) and modeled.get("batch"):
            out.batch = int(modeled["batch"])


def _usage(out: RequestOutput, usage: Any) -> None:
    if isinstance(usage, dict):
        out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        out.output_tokens = int(usage.get("completion_tokens") or 0)


async def _post(client: httpx.AsyncClient, url: str, headers: dict, body: dict, out: RequestOutput) -> Any:
    """The answer's JSON on success (out filled), None on failure (out says why)."""
    r = await client.post(url, headers=headers, json=body)
    out.latency = time.perf_counter() - out.start_time
    out.status = r.status_code
    answer = _json(r.text)
    if r.status_code >= 400 or (isinstance(answer, dict) and answer.get("success") is False):
        _fail(out, r.status_code, answer, r.text)
        return None
    out.success = True
    return answer


async def send_workers_ai(
    client: httpx.AsyncClient, target: Target, tenant: Tenant, req: BenchRequest
) -> RequestOutput:
    url = f"{target.base_url}/client/v4/accounts/{tenant.account}/ai/run/{target.model}"
    body = {"prompt": req.prompt, "max_tokens": req.output_len, "temperature": target.temperature}
    out = RequestOutput(start_time=time.perf_counter(), tenant=tenant.account)
    if target.stream:
        return await _stream(client, url, _headers(target, tenant, req), {**body, "stream": True}, out)
    answer = await _post(client, url, _headers(target, tenant, req), body, out)
    if answer is not None:
        result = answer.get("result") or {}
        _usage(out, result.get("usage"))
        _served(out, result)
        out.generated_text = result.get("response") or _message(result)
    return out


def _message(result: dict) -> str:
    choices = result.get("choices") or [{}]
    return (choices[0].get("message") or {}).get("content") or ""


async def send_openai_chat(
    client: httpx.AsyncClient, target: Target, tenant: Tenant, req: BenchRequest
) -> RequestOutput:
    url = f"{target.base_url}/client/v4/accounts/{tenant.account}/ai/v1/chat/completions"
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": req.prompt}],
        "max_tokens": req.output_len,
        "temperature": target.temperature,
        "stream": target.stream,
    }
    out = RequestOutput(start_time=time.perf_counter(), tenant=tenant.account)
    if target.stream:
        return await _stream(client, url, _headers(target, tenant, req), body, out)
    answer = await _post(client, url, _headers(target, tenant, req), body, out)
    if answer is not None:
        _usage(out, answer.get("usage"))
        _served(out, answer)
        out.generated_text = _message(answer)
    return out


async def send_worker(
    client: httpx.AsyncClient, target: Target, tenant: Tenant, req: BenchRequest
) -> RequestOutput:
    """A worker route, timed end to end; POST sends the prompt as the body."""
    url = target.url or target.base_url + "/"
    out = RequestOutput(start_time=time.perf_counter(), tenant=tenant.account)
    headers = _headers(target, tenant, req)
    if target.method == "POST":
        r = await client.post(url, headers=headers, content=req.prompt.encode())
    else:
        r = await client.get(url, headers=headers)
    out.latency = time.perf_counter() - out.start_time
    out.status, out.prompt_tokens = r.status_code, 0  # no model prompt: no tokens to count
    if r.status_code >= 400:
        return _fail(out, r.status_code, _json(r.text), r.text)
    out.success = True
    return out


SENDERS: dict[Backend, SendFn] = {
    "workers-ai": send_workers_ai,
    "openai-chat": send_openai_chat,
    "worker": send_worker,
}


async def send(client: httpx.AsyncClient, target: Target, tenant: Tenant, req: BenchRequest) -> RequestOutput:
    """One request; a transport failure is a failed output with the exception's name as its code."""
    try:
        return await SENDERS[target.backend](client, target, tenant, req)
    except httpx.HTTPError as exc:
        return RequestOutput(
            success=False, code=type(exc).__name__, error=str(exc)[:200], tenant=tenant.account
        )
