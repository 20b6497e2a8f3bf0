"""Cloudflare Workflows in a worker: the binding (`env.MY_WORKFLOW.create(...)`, `get(id)`), an
instance's controls (`status()`, `pause()`, `resume()`, `terminate()`, `restart()`,
`send_event(...)`), and NonRetryableError, at the path Cloudflare's SDK has them. The runtime
keeps every instance (runtime.bindings.workflows) and runs them (runtime.events.workflows); the
`step` a workflow's `run` is given is workers.workflow_step."""

from __future__ import annotations

from typing import Any

from workers.binding_values import Transport, merge_options, wrap_result


class NonRetryableError(Exception):
    """Raised in a workflow step: the step is not retried and the instance errors at once."""


class WorkflowInstance:
    """One instance of a workflow: `id`, and its controls, each a call to the runtime."""

    def __init__(self, transport: Transport, instance_id: str):
        self._call = transport
        self.id = instance_id

    def __repr__(self) -> str:
        return f"WorkflowInstance({self.id!r})"

    async def status(self) -> Any:
        """`{"status": ..., "output": ..., "error": ...}`, readable by key or attribute; status is
        one of queued, running, paused, errored, terminated, complete, waiting."""
        return wrap_result(await self._call("status", [self.id], {}))

    async def pause(self) -> None:
        await self._call("pause", [self.id], {})

    async def resume(self) -> None:
        await self._call("resume", [self.id], {})

    async def terminate(self) -> None:
        await self._call("terminate", [self.id], {})

    async def restart(self) -> None:
        await self._call("restart", [self.id], {})

    async def send_event(self, options: dict[str, Any] | None = None, *, type: str | None = None,  # noqa: A002
                         payload: Any = None) -> None:  # fmt: skip
        """Deliver an event to `step.wait_for_event(..., event_type=type)` (kept until it is waited for)."""
        opts = merge_options(options, {"type": type, "payload": payload}, "send_event")
        await self._call("send_event", [self.id, opts], {})

    sendEvent = send_event  # noqa: N815 - Cloudflare's name


class Workflow:
    """`env.MY_WORKFLOW`: a Workflow binding."""

    def __init__(self, transport: Transport):
        self._call = transport

    async def create(self, options: dict[str, Any] | None = None, *, id: str | None = None,  # noqa: A002
                     params: Any = None) -> WorkflowInstance:  # fmt: skip
        """A new instance (`id` optional: one is generated), queued to run with `params` as its
        event's payload."""
        opts = merge_options(options, {"id": id, "params": params}, "Workflow create")
        result = await self._call("create", [opts], {})
        return WorkflowInstance(self._call, result["id"])

    async def create_batch(self, batch: list[dict[str, Any]]) -> list[WorkflowInstance]:
        """Up to 100 instances at once, each given as create's options."""
        if not isinstance(batch, list):
            raise TypeError("create_batch: pass a list of {id, params} dicts")
        result = await self._call("create_batch", [batch], {})
        return [WorkflowInstance(self._call, r["id"]) for r in result]

    createBatch = create_batch  # noqa: N815 - Cloudflare's name

    async def get(self, id: str) -> WorkflowInstance:  # noqa: A002
        """The instance with this id; an error when this account has none."""
        result = await self._call("get", [id], {})
        return WorkflowInstance(self._call, result["id"])
