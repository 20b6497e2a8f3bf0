"""env.AI.run's third argument, checked once: the options Cloudflare's binding takes (workerd's
`AiOptions`, types/defines/ai.d.ts) and what each does here. An option this runtime would accept and
ignore is refused instead, naming it: a worker must not believe it got what it asked for.

- `queueRequest`: a batch to queue (runtime.ai.batch).
- `rejectIfBusy`: refused at once (3040, "Capacity temporarily exceeded") rather than queued when every
  PoP serving the model is full (edge_sim.router). The REST API takes it in the body's `options`
  (`rest_body_options`), the one option Cloudflare documents there.
- `extraHeaders`: headers of the call; `x-session-affinity` (back to the PoP that served the session)
  and `x-edge-priority` are read, any other is passed on unread, as Cloudflare's are.
  `sessionOptions.extraHeaders` (workerd's deprecated spelling) is read beneath them.
- `returnRawResponse`: the answer as a Response with the headers the REST API sends.
- `tags`: at most MAX_TAGS strings, kept with the call in the request's tail event (and the
  gateway's log when through one).
- `prefix`: as workerd's binding, the model called is `prefix:model` (a namespace of models on
  Cloudflare's network); here it names the model the AI service looks up, so a model that does not
  exist under that name is refused (5007) naming it in full.
- `signal`: an AbortSignal; the isolate keeps it and cancels the call when it aborts (never sent).
- `gateway`: AI Gateway options (runtime.ai.gateway.GatewayOptions.parse checks them).

Refusals are AIError(5004) with the key at fault and what to send.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.ai.gateway import GatewayOptions
from workers import AIError

MAX_TAGS = 5
TAG_CHARS = 64
MAX_EXTRA_HEADERS = 32
HEADER_CHARS = 4096
PREFIX_CHARS = 64
ACCEPTED = (
    "queueRequest",
    "rejectIfBusy",
    "extraHeaders",
    "returnRawResponse",
    "tags",
    "prefix",
    "signal",
    "gateway",
    "sessionOptions",
)
ALIASES = {"extra_headers": "extraHeaders"}  # the snake_case spelling Python workers also use
# Cloudflare's options that mean something only on its own network
ELSEWHERE = {
    "websocket": "a WebSocket to the model is Cloudflare's own realtime endpoint; stream with stream: true",
}


class RunOptions(msgspec.Struct, frozen=True):
    queue: bool = False
    reject_if_busy: bool = False
    extra_headers: dict[str, str] = {}
    raw_response: bool = False
    tags: tuple[str, ...] = ()
    prefix: str | None = None
    gateway: GatewayOptions | None = None
    # read as the options are parsed, once: what the call carries
    model: str = ""  # the model called: `prefix:model` with a prefix, as workerd's binding names it
    session: str | None = None  # extraHeaders' x-session-affinity (edge_sim.affinity)
    priority: str | None = None  # extraHeaders' x-edge-priority (runtime.ai.service.priority_of checks it)

    def header(self, name: str) -> str | None:
        return self.extra_headers.get(name)


def _bad(key: str, why: str) -> AIError:
    return AIError(5004, f"env.AI.run options: {key}: {why}", param=key)


def parse_run_options(value: Any, model: str = "") -> RunOptions:
    """The checked options of an env.AI.run call (None or {} for none) to `model`; raises
    AIError(5004)."""
    if value is None:
        return RunOptions(model=model)
    if not isinstance(value, dict):
        raise AIError(5004, f"env.AI.run options must be a dict (or None), got {type(value).__name__}")
    for key in value:
        if key in ELSEWHERE:
            raise _bad(key, f"not available here: {ELSEWHERE[key]}")
        if key not in ACCEPTED and key not in ALIASES:
            raise _bad(str(key)[:64], f"no such option; the options are {', '.join(ACCEPTED)}")
    queue = value.get("queueRequest", False)
    if not isinstance(queue, bool):
        raise _bad("queueRequest", "expected true or false")
    raw = value.get("returnRawResponse", False)
    if not isinstance(raw, bool):
        raise _bad("returnRawResponse", "expected true or false")
    busy = value.get("rejectIfBusy", False)
    if not isinstance(busy, bool):
        raise _bad("rejectIfBusy", "expected true or false")
    gateway = value.get("gateway")
    headers = _session_headers(value) | _headers(value.get("extraHeaders", value.get("extra_headers")))
    prefix = _prefix(value.get("prefix"))
    return RunOptions(
        queue=queue,
        reject_if_busy=busy,
        extra_headers=headers,
        raw_response=raw,
        tags=_tags(value),
        prefix=prefix,
        gateway=None if gateway is None else GatewayOptions.parse(gateway),
        model=f"{prefix}:{model}" if prefix else model,
        session=headers.get("x-session-affinity"),
        priority=headers.get("x-edge-priority"),
    )


def _prefix(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > PREFIX_CHARS or ":" in value or value != value.strip():
        raise _bad(
            "prefix",
            f"expected a namespace name of at most {PREFIX_CHARS} characters without ':' or spaces "
            "around it (the model called is prefix:model)",
        )
    return value


def _session_headers(value: dict) -> dict[str, str]:
    """workerd's deprecated `sessionOptions: {extraHeaders}`, read as extraHeaders are."""
    session = value.get("sessionOptions")
    if session is None:
        return {}
    if not isinstance(session, dict) or set(session) - {"extraHeaders"}:
        raise _bad("sessionOptions", "expected {extraHeaders: {...}} (deprecated: send extraHeaders instead)")
    return _headers(session.get("extraHeaders"), "sessionOptions.extraHeaders")


def _headers(value: Any, key: str = "extraHeaders") -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(key, "expected a dict of header names to strings")
    if len(value) > MAX_EXTRA_HEADERS:
        raise _bad(key, f"at most {MAX_EXTRA_HEADERS} headers, got {len(value)}")
    headers: dict[str, str] = {}
    for name, v in value.items():
        if not isinstance(name, str) or not name or len(name) > 256:
            raise _bad(key, f"a header name must be a non-empty string, got {name!r}"[:200])
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, str) or len(v) > HEADER_CHARS:
            raise _bad(f"{key}.{name}", f"expected a string of at most {HEADER_CHARS} characters")
        headers[name.lower()] = v
    return headers


def _tags(value: dict) -> tuple[str, ...]:
    tags = value.get("tags")
    if tags is None:
        return ()
    if not isinstance(tags, list | tuple) or not all(isinstance(t, str) for t in tags):
        raise _bad("tags", "expected a list of strings")
    if len(tags) > MAX_TAGS:
        raise _bad("tags", f"at most {MAX_TAGS} tags, got {len(tags)}")
    for tag in tags:
        if not tag or len(tag) > TAG_CHARS:
            raise _bad("tags", f"each tag is 1 to {TAG_CHARS} characters, got {tag[:80]!r}")
    return tuple(tags)


REST_OPTIONS = ("rejectIfBusy",)


def rest_body_options(body: Any, where: str = "options") -> tuple[Any, bool]:
    """A REST request body's top-level `options` (Workers AI's /ai/run and its OpenAI-compatible doors
    take one beside the model's inputs), split from the inputs: (the inputs without it, rejectIfBusy).
    Any other key is refused (AIError 5004) naming the one accepted; a body that is not an object is
    left to the inputs' own checks."""
    if not isinstance(body, dict) or "options" not in body:
        return body, False
    options = body["options"]
    inputs = {k: v for k, v in body.items() if k != "options"}
    if options is None:
        return inputs, False
    if not isinstance(options, dict):
        raise AIError(5004, f'{where}: expected an object such as {{"rejectIfBusy": true}}', param=where)
    for key in options:
        if key not in REST_OPTIONS:
            raise AIError(
                5004,
                f"{where}.{str(key)[:64]}: no such request option; the REST API's options are "
                f"{', '.join(REST_OPTIONS)} (the binding's others go in env.AI.run's third argument)",
                param=where,
            )
    busy = options.get("rejectIfBusy", False)
    if not isinstance(busy, bool):
        raise AIError(5004, f"{where}.rejectIfBusy: expected true or false", param=where)
    return inputs, busy
