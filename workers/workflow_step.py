"""The `event` and `step` a workflow's `run(self, event, step)` is given, inside the isolate.

Cloudflare's replay model: every `step.do`, `step.sleep` and `step.wait_for_event` asks the
runtime first; a finished step answers with its stored result and its body does not run again,
so the runtime can end a run at any sleep or wait (Suspend) and run `run()` again later. A step
is named by its name and how many steps of that name this run has reached before it, so a loop
over one name is many steps. Results cross as JSON-like values (the runtime stores them as JSON).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from workers.binding_values import JsObject, Transport, wrap_result
from workers.durations import duration_ms
from workers.workflows import NonRetryableError

NAME_CHARS = 256  # of a step's name, as Cloudflare's limit


class Suspend(BaseException):
    """Ends a run: the instance sleeps or waits, or is paused; the runtime runs it again later.
    A BaseException, so that a script's `except Exception` around a step does not keep it."""


class WorkflowEvent(JsObject):
    """`event`: `payload` (the params given to create), `timestamp` (a UTC datetime, when the
    instance was created) and `instance_id` (also `instanceId`), by attribute or key."""


def workflow_event(payload: Any, timestamp_ms: int, instance_id: str) -> WorkflowEvent:
    when = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
    return WorkflowEvent(
        payload=wrap_result(payload), timestamp=when, instance_id=instance_id, instanceId=instance_id
    )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:4096]


class WorkflowStep:
    """`step`: do, sleep, sleep_until, wait_for_event; each call is one step of this run."""

    def __init__(self, transport: Transport):
        self._call = transport
        self._seen: Counter[str] = Counter()

    def _key(self, name: Any) -> list:
        if not isinstance(name, str) or not name or len(name) > NAME_CHARS:
            raise TypeError(f"a step's name is a non-empty string of at most {NAME_CHARS} characters")
        self._seen[name] += 1
        return [name, self._seen[name]]

    def do(
        self, name: str, depends: list | None = None, concurrent: bool = False, config: dict | None = None
    ):
        """Decorate an `async def`: awaiting it runs the step once (its result stored), after
        its `depends` (other decorated steps, at once with asyncio.gather if `concurrent`), whose
        results it is given by parameter name, else in order. `config`: Cloudflare's
        {"retries": {"limit", "delay", "backoff"}, "timeout"} (defaults: 5 retries, 10 seconds,
        exponential; 10 minutes)."""
        if depends is not None and not isinstance(depends, (list, tuple)):
            raise TypeError("step.do: depends is a list of decorated steps")
        if config is not None and not isinstance(config, dict):
            raise TypeError("step.do: config is a dict")

        def decorate(fn: Any) -> StepFunction:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(f"step.do({name!r}) decorates an `async def`")
            return StepFunction(self, name, fn, list(depends or []), concurrent, config or {})

        return decorate

    async def sleep(self, name: str, duration: Any) -> None:
        """Sleep `duration` (ms, or a string such as "10 seconds"); the instance is `waiting`."""
        ms = duration_ms(duration, f"step.sleep({name!r})")
        await self._timed(self._key(name), {"ms": ms})

    async def sleep_until(self, name: str, timestamp: Any) -> None:
        """Sleep until `timestamp` (a datetime, or ms since the epoch)."""
        if isinstance(timestamp, datetime):
            until = timestamp.timestamp() * 1000
        elif isinstance(timestamp, (int, float)) and not isinstance(timestamp, bool):
            until = float(timestamp)
        else:
            raise TypeError("step.sleep_until: give a datetime or ms since the epoch")
        await self._timed(self._key(name), {"until_ms": round(until)})

    async def _timed(self, key: list, when: dict) -> None:
        reply = await self._call("sleep", [*key, when], {})
        if reply["state"] != "done":
            raise Suspend()

    async def wait_for_event(self, name: str, event_type: str, timeout: Any = "24 hours") -> Any:
        """The event that `instance.send_event(type=event_type, ...)` sends (sent before or
        after this is reached): `{"type", "payload", "timestamp"}` by key or attribute; TimeoutError
        once `timeout` (default 24 hours) has passed without one."""
        ms = duration_ms(timeout, f"step.wait_for_event({name!r}) timeout")
        if not isinstance(event_type, str):
            raise TypeError("step.wait_for_event: event_type is a string")
        reply = await self._call("wait", [*self._key(name), event_type, ms], {})
        if reply["state"] == "done":
            return wrap_result(reply["result"])
        if reply["state"] == "timeout":
            raise TimeoutError(f"step.wait_for_event({name!r}): no {event_type!r} event within its timeout")
        raise Suspend()

    waitForEvent = wait_for_event  # noqa: N815 - Cloudflare's name
    sleepUntil = sleep_until  # noqa: N815 - Cloudflare's name


class StepFunction:
    """A decorated step: awaiting its call runs it, once per run (a second await returns the same)."""

    def __init__(self, step: WorkflowStep, name: str, fn: Any, depends: list, concurrent: bool, config: dict):
        for dep in depends:
            if not isinstance(dep, StepFunction):
                raise TypeError(f"step.do({name!r}): each of depends is a function decorated with @step.do")
        self.step, self.name, self.fn, self.depends = step, name, fn, depends
        self.concurrent, self.config = concurrent, config
        self.__name__ = getattr(fn, "__name__", name)
        self._result: asyncio.Future | None = None

    def __call__(self) -> Any:
        return self._once()

    async def _once(self) -> Any:
        if self._result is None:
            self._result = asyncio.ensure_future(self._run())
        return await asyncio.shield(self._result)

    async def _arguments(self) -> tuple[list, dict]:
        if self.concurrent:
            results = list(await asyncio.gather(*(dep() for dep in self.depends)))
        else:
            results = [await dep() for dep in self.depends]
        names = [dep.__name__ for dep in self.depends]
        params = list(inspect.signature(self.fn).parameters)
        if params and set(params) <= set(names) and len(set(names)) == len(names):
            return [], {p: results[names.index(p)] for p in params}  # injected by name
        return results, {}

    async def _run(self) -> Any:
        args, kwargs = await self._arguments()
        key = self.step._key(self.name)
        call = self.step._call
        while True:
            reply = await call("do", [*key, self.config], {})
            state = reply["state"]
            if state == "done":
                return wrap_result(reply["result"])
            if state == "failed":
                raise (
                    NonRetryableError(reply["error"])
                    if reply.get("nonretryable")
                    else RuntimeError(reply["error"])
                )
            if state == "wait":  # a short retry delay
                await asyncio.sleep(reply["ms"] / 1000)
                continue
            if state != "run":
                raise Suspend()
            try:
                value = _as_stored(
                    self.name, await asyncio.wait_for(self.fn(*args, **kwargs), reply["timeout_ms"] / 1000)
                )
            except NonRetryableError as exc:
                await call("fail", [*key, _describe(exc), True, self.config], {})
                raise
            except NotStorable as exc:  # it would fail the same way again: not retried
                await call("fail", [*key, _describe(exc), True, self.config], {})
                raise
            except TimeoutError:
                message = f"TimeoutError: step {self.name!r} did not finish within {reply['timeout_ms']} ms"
                outcome = await call("fail", [*key, message, False, self.config], {})
                if outcome["state"] != "retry":
                    raise TimeoutError(message) from None
            except Exception as exc:  # noqa: BLE001 - the step failed: retried as its config says
                outcome = await call("fail", [*key, _describe(exc), False, self.config], {})
                if outcome["state"] != "retry":
                    raise
            else:
                await call("done", [*key, value], {})
                return wrap_result(value)


class NotStorable(TypeError):
    """A step's result that cannot be stored as JSON."""


def _as_stored(name: str, value: Any) -> Any:
    """`value` as the books will give it back on a replay (through JSON: tuples become lists, keys
    strings), so that the first run sees what every later one does."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise NotStorable(
            f"step {name!r} returned a value that is not JSON-serializable ({exc}); return dicts, "
            "lists, strings, numbers, booleans or None"
        ) from None
