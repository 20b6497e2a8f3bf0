"""Inside the isolate: what a worker script is given (`env`, `ctx`, a scheduled event's
`controller`) and how it is loaded: its entry point (class Default or module-level on_fetch /
on_scheduled / on_queue, or one Durable Object class) read once into Handlers that call the
user's functions with the arguments they declare.

Imported only inside the isolate (runtime.isolate.view binds it into the jail)."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from workers import DurableObject, Request, WorkerEntrypoint, WorkflowEntrypoint
from workers.binding_values import no_such_binding
from workers.durable_objects import DurableObjectState
from workers.queues import MessageBatch

WAIT_UNTIL_SECONDS = 30.0  # as on Workers: work continues this long after the response


class Env:
    """`env` as the worker sees it: vars and bindings as attributes (and by name with `env["X"]`).
    A name it does not hold raises AttributeError listing the ones it does, with their kinds
    (`kinds`: name -> "var", "Ai", "KVNamespace"...), and the close one: a binding misspelt in the
    config or in the script is otherwise a bare AttributeError far from the mistake."""

    __slots__ = ("__dict__", "__kinds")  # the kinds in a slot: __dict__ holds env's names alone

    def __init__(self, values: dict[str, Any], kinds: dict[str, str] | None = None):
        self.__dict__.update(values)
        self.__kinds = {n: (kinds or {}).get(n, "var") for n in values}

    def __getattr__(self, name: str) -> Any:  # only for a name the worker's env does not hold
        if name.startswith("__") or name == "_Env__kinds":  # copy, pickle and friends probe these
            raise AttributeError(name)
        raise AttributeError(no_such_binding(name, self.__kinds))

    def __getitem__(self, name: str) -> Any:
        return self.__dict__[name]

    def __contains__(self, name: str) -> bool:
        return name in self.__dict__

    def __repr__(self) -> str:
        return f"Env({', '.join(sorted(self.__dict__))})"


class Context:
    """`ctx`: waitUntil keeps work running after the response has been sent (at most
    WAIT_UNTIL_SECONDS); the request counts as running, CPU included, until that work ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def waitUntil(self, awaitable: Any) -> None:  # noqa: N802 - Cloudflare's name
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    wait_until = waitUntil

    def passThroughOnException(self) -> None:  # noqa: N802 - Cloudflare's name
        pass

    async def settle(self) -> None:
        """Wait for the waitUntil work, cancelling what is still running after the limit."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=WAIT_UNTIL_SECONDS)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def _arity(fn: Any, most: int, method: bool) -> int:
    """How many of up to `most` positional arguments `fn` declares (self not counted): Cloudflare's
    shapes range from `fetch(self)` to `on_fetch(request, env, ctx)`, read once at load."""
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return most
    count = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    return max(0, min(most, count - (1 if method else 0)))


class Handlers:
    """The script's handlers: `fetch(request, ctx)`, `scheduled(controller, ctx)` and
    `queue(batch, ctx)` (None where the script has none), each calling the user's function with
    the arguments it declares."""

    def __init__(self, entry: str, fetch: Any = None, scheduled: Any = None, queue: Any = None):
        self.entry, self.fetch, self.scheduled, self.queue = entry, fetch, scheduled, queue


def _import_script(script: Path) -> Any:
    sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location(script.stem, script)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[script.stem] = module
    spec.loader.exec_module(module)
    return module


def load_object(
    script: Path, env: Env, class_name: str, state: DurableObjectState
) -> tuple[str, Handlers, Any]:
    """Import the script and build the one instance of its Durable Object class `class_name`
    this isolate serves; its `fetch(request)` (if any) is the Handlers' fetch."""
    module = _import_script(script)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise TypeError(
            f"{script.name} has no class {class_name}: durable_objects.bindings names it as class_name"
        )
    if not (inspect.isclass(cls) and issubclass(cls, DurableObject)):
        raise TypeError(f"{script.name}: {class_name} must be a class deriving from workers.DurableObject")
    instance = cls(state, env)
    handlers = Handlers(class_name)
    fetch = getattr(type(instance), "fetch", None)
    if fetch is not None:
        if not inspect.iscoroutinefunction(fetch):
            raise TypeError(f"{script.name}: {class_name}.fetch must be an `async def`")
        n_fetch = _arity(fetch, 3, method=True)

        async def handle_object_fetch(request: Request, ctx: Context) -> Any:
            return await instance.fetch(*(request, env, ctx)[:n_fetch])

        handlers.fetch = handle_object_fetch
    return class_name, handlers, instance


def load_workflow(script: Path, class_name: str) -> type:
    """Import the script and return its Workflow class `class_name` (a WorkflowEntrypoint with
    `async def run(self, event, step)`), or raise with what to fix."""
    module = _import_script(script)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise TypeError(
            f"{script.name} has no class {class_name}: the workflows entry names it as class_name"
        )
    if not (inspect.isclass(cls) and issubclass(cls, WorkflowEntrypoint)):
        raise TypeError(
            f"{script.name}: {class_name} must be a class deriving from workers.WorkflowEntrypoint"
        )
    if not inspect.iscoroutinefunction(getattr(cls, "run", None)):
        raise TypeError(f"{script.name}: {class_name} needs `async def run(self, event, step)`")
    return cls


def load_entry(script: Path, env: Env) -> tuple[str, Handlers]:
    """Import the script and return its entry name and its Handlers, or raise with what to fix."""
    module = _import_script(script)

    default = getattr(module, "Default", None)
    on_fetch = getattr(module, "on_fetch", None)
    on_scheduled = getattr(module, "on_scheduled", None)
    on_queue = getattr(module, "on_queue", None)
    module_level = {"on_fetch": on_fetch, "on_scheduled": on_scheduled, "on_queue": on_queue}
    if default is not None and any(fn is not None for fn in module_level.values()):
        both = next(n for n, fn in module_level.items() if fn is not None)
        raise TypeError(f"{script.name} defines both class Default and {both}; keep one entry point")
    if default is not None:
        if not (inspect.isclass(default) and issubclass(default, WorkerEntrypoint)):
            raise TypeError(f"{script.name}: Default must be a class deriving from workers.WorkerEntrypoint")
        fetch, scheduled = getattr(default, "fetch", None), getattr(default, "scheduled", None)
        queue = getattr(default, "queue", None)
        if fetch is None and scheduled is None and queue is None:
            raise TypeError(
                f"{script.name}: Default must define `async def fetch(self, request)`, "
                "`async def scheduled(self, controller, env, ctx)` or `async def queue(self, batch)`"
            )
        methods = (("fetch", fetch), ("scheduled", scheduled), ("queue", queue))
        for name, fn in methods:
            if fn is not None and not inspect.iscoroutinefunction(fn):
                raise TypeError(f"{script.name}: Default.{name} must be an `async def`")
        handlers = Handlers(", ".join(f"Default.{n}" for n, f in methods if f))
        if fetch is not None:
            n_fetch = _arity(fetch, 3, method=True)

            async def handle_default(request: Request, ctx: Context) -> Any:
                return await default(ctx, env).fetch(*(request, env, ctx)[:n_fetch])

            handlers.fetch = handle_default
        if scheduled is not None:
            n_sched = _arity(scheduled, 3, method=True)

            async def schedule_default(controller: ScheduledController, ctx: Context) -> Any:
                return await default(ctx, env).scheduled(*(controller, env, ctx)[:n_sched])

            handlers.scheduled = schedule_default
        if queue is not None:
            n_queue = _arity(queue, 3, method=True)

            async def queue_default(batch: MessageBatch, ctx: Context) -> Any:
                return await default(ctx, env).queue(*(batch, env, ctx)[:n_queue])

            handlers.queue = queue_default
        return handlers.entry, handlers
    if any(fn is not None for fn in module_level.values()):
        for name, fn, shape in (
            ("on_fetch", on_fetch, "async def on_fetch(request, env)"),
            ("on_scheduled", on_scheduled, "async def on_scheduled(controller, env, ctx)"),
            ("on_queue", on_queue, "async def on_queue(batch, env, ctx)"),
        ):
            if fn is not None and not inspect.iscoroutinefunction(fn):
                raise TypeError(f"{script.name}: {name} must be `{shape}`")
        handlers = Handlers(", ".join(n for n, f in module_level.items() if f))
        if on_fetch is not None:
            n_fetch = _arity(on_fetch, 3, method=False)

            async def handle_on_fetch(request: Request, ctx: Context) -> Any:
                return await on_fetch(*(request, env, ctx)[:n_fetch])

            handlers.fetch = handle_on_fetch
        if on_scheduled is not None:
            n_sched = _arity(on_scheduled, 3, method=False)

            async def schedule_module(controller: ScheduledController, ctx: Context) -> Any:
                return await on_scheduled(*(controller, env, ctx)[:n_sched])

            handlers.scheduled = schedule_module
        if on_queue is not None:
            n_queue = _arity(on_queue, 3, method=False)

            async def queue_module(batch: MessageBatch, ctx: Context) -> Any:
                return await on_queue(*(batch, env, ctx)[:n_queue])

            handlers.queue = queue_module
        return handlers.entry, handlers
    raise TypeError(
        f"{script.name} has no entry point: define `class Default(WorkerEntrypoint)` with "
        "`async def fetch(self, request)`, or `async def on_fetch(request, env)`"
    )


class ScheduledController:
    """`controller` of a scheduled event, as Cloudflare's: `cron` (the trigger that fired),
    `scheduledTime` (ms since the epoch, UTC), `type` ("scheduled") and `noRetry()`."""

    type = "scheduled"

    def __init__(self, cron: str, scheduled_time: int):
        self.cron = cron
        self.scheduledTime = scheduled_time  # noqa: N815 - Cloudflare's name
        self.retry = True

    @property
    def scheduled_time(self) -> int:
        return self.scheduledTime

    def noRetry(self) -> None:  # noqa: N802 - Cloudflare's name
        self.retry = False

    no_retry = noRetry
