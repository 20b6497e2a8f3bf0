"""Entry points beside WorkerEntrypoint: DurableObject, WorkflowEntrypoint, and the `@handler`
decorator, in the shapes Cloudflare's SDK gives them."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from workers.context import _remember


class DurableObject:
    """Base class of a Durable Object: `__init__(self, ctx, env)` keeps both. `ctx` is a
    workers.durable_objects.DurableObjectState (`ctx.id`, `ctx.storage`); the runtime builds one
    instance per id, in its own isolate, when `env.NS.get(id)`'s stub is first called."""

    def __init__(self, ctx: Any, env: Any):
        self.ctx = ctx
        self.env = env


class WorkflowEntrypoint:
    """Base class of a Workflow: `__init__(self, ctx, env)` keeps both; define
    `async def run(self, event, step)`. The runtime runs it for each instance that
    `env.MY_WORKFLOW.create(...)` makes (workers.workflows), with `event` and `step` from
    workers.workflow_step, in an isolate of its own that runs this worker's script."""

    def __init__(self, ctx: Any, env: Any):
        self.ctx = ctx
        self.env = env


def handler(func):
    """Decorate `on_fetch(request, env[, ctx])`. Cloudflare's converts the JavaScript arguments to
    the SDK's Python types; here they already are, so it passes them on, and makes the request's
    env and ctx known to `workers.env` and `workers.wait_until`."""
    params = list(inspect.signature(func).parameters.values())
    takes_any = any(p.kind is p.VAR_POSITIONAL for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    @functools.wraps(func)
    async def wrapper(*args, **kwargs):
        if len(args) > 1:
            _remember(args[2] if len(args) > 2 else None, args[1])
        result = func(*(args if takes_any else args[: len(positional)]), **kwargs)
        return await result if inspect.isawaitable(result) else result

    if not takes_any and len(positional) == 2:  # (request, env): let the runtime hand it ctx too
        ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
        wrapper.__signature__ = inspect.signature(func).replace(parameters=[*positional, ctx, *params[2:]])  # type: ignore[attr-defined]
    return wrapper
