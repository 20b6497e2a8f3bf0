"""Workflows of the worker `edge dev` serves: the engine that runs their instances.

One isolate per workflow (the worker's script, jailed and limited as the worker is, its entry the
workflow's class) runs that workflow's instances, at most RUNNING_PER_ACCOUNT at once. A loop
looks every POLL_S for instances that are due (runtime.bindings.workflow_books.WorkflowBooks.due:
queued, interrupted by a restart of edge dev, or waiting whose time or event has come) and runs
each from the top (Cloudflare's replay model). Each step call of a run is answered by the books,
scoped by the runtime to the instance the run belongs to (the isolate names only its request).
A step that runs past its timeout (plus GRACE_S, for one that never yields to the event loop) has
its isolate stopped: the step counts a failed attempt and is retried as its config says, or the
instance errors; the other runs cut with it are run again. pause, terminate and restart take
effect at the run's next step call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime.bindings import BindingError, BindingStores
from runtime.bindings.workflow_books import MAX_STEPS, StepConfig, WorkflowBooks, json_value
from runtime.host.spec import WorkerSpec, WorkflowAddress
from runtime.host.worker import WorkerHandle
from runtime.isolate import ipc
from runtime.isolate.process import ExceededResources, IsolateCrashed, WorkerLoadError

log = logging.getLogger("edge.workflows")

POLL_S = 0.1
RUNNING_PER_ACCOUNT = 32  # runs in flight at once, all the account's workflows together
GRACE_S = 1.0  # past a step's timeout: the isolate is stopped if the step has not ended by then
# step calls one run may make: every step of MAX_STEPS with a few retries waited inline; past it the
# run is refused (a script looping on one raw call would otherwise keep the books busy for ever)
STEP_CALLS_PER_RUN = 20 * MAX_STEPS
# a run cut outside any step (its isolate killed past a limit, perhaps for another run's sake) is
# run again, at most this many times in a row before the instance errors
CUTS_OUTSIDE_STEPS = 3


@dataclass
class _Run:
    workflow: str
    instance: str
    generation: int
    cut: bool = False  # its isolate was stopped for another run's step: run it again, counting nothing
    # the step.do attempts in flight (several at once under concurrent=True): (name, n) ->
    # (monotonic deadline, config)
    steps: dict[tuple[str, int], tuple[float, StepConfig]] = field(default_factory=dict)
    timed_out: tuple[tuple[str, int], StepConfig, str] | None = None  # the step the isolate was stopped for
    calls: int = 0  # step calls so far


@dataclass
class _Workflow:
    address: WorkflowAddress
    handle: WorkerHandle
    base: WorkerSpec  # the dev worker's spec it was made from (edge dev --reload replaces that)
    runs: dict[int, _Run] = field(default_factory=dict)  # by the isolate's request id


class WorkflowEngine:
    """Runs the instances of `workflows` (name -> class) of the dev worker's account."""

    def __init__(self, spec: Callable[[], WorkerSpec], start: Callable[[WorkerSpec], WorkerHandle],
                 stores: BindingStores, workflows: dict[str, str]):  # fmt: skip
        self.spec, self.start, self.stores = spec, start, stores
        self.names = dict(workflows)
        self._workflows: dict[str, _Workflow] = {}
        self._tasks: set[asyncio.Task] = set()
        self._cuts: dict[tuple[str, str], int] = {}  # (workflow, instance) -> runs cut outside a step

    @property
    def books(self) -> WorkflowBooks:
        return self.stores.store("workflow").books

    async def _workflow(self, name: str) -> _Workflow:
        """The workflow's handle, made anew (once its runs are over) when the dev worker was reloaded."""
        base = self.spec()
        wf = self._workflows.get(name)
        if wf is not None and wf.base is not base and not wf.runs:
            await wf.handle.stop()
            wf = None
        if wf is None:
            address = WorkflowAddress(name, self.names[name])
            spec = msgspec.structs.replace(base, workflow=address)
            wf = self._workflows[name] = _Workflow(address, self.start(spec), base)
        return wf

    # --- the loop ---------------------------------------------------------------------------------

    async def run_forever(self) -> None:
        if not self.names:
            return
        while True:
            try:
                await self._look()
            except asyncio.CancelledError:
                raise
            except Exception:  # a store failure must not end the engine
                log.exception("workflows: looking for due instances failed; retrying")
                await asyncio.sleep(1.0)
            await asyncio.sleep(POLL_S)

    async def _look(self) -> None:
        account = self.spec().account
        running = sum(len(w.runs) for w in self._workflows.values())
        for name in self.names:
            room = RUNNING_PER_ACCOUNT - running
            if room <= 0:
                break
            wf = await self._workflow(name)
            busy = {r.instance for r in wf.runs.values()}
            due = await self.stores.run(self.books.due, account, name, room, busy, account=account)
            for ident, params, created, generation in due:
                if not await self.stores.run(
                    self.books.begin, account, name, ident, generation, account=account
                ):
                    continue
                rid = wf.handle.isolate.next_request_id()
                wf.runs[rid] = _Run(name, ident, generation)
                running += 1
                task = asyncio.create_task(self._run(wf, rid, params, int(created * 1000)))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        await self._watch_timeouts()

    async def _watch_timeouts(self) -> None:
        now = time.monotonic()
        for wf in self._workflows.values():
            late = 0
            for run in wf.runs.values():
                for key, (deadline, config) in run.steps.items():
                    if now > deadline:
                        message = (
                            f"step {key[0]!r} did not finish within its timeout of {config.timeout_ms} ms "
                            "(it never returned, or never awaited); the workflow's isolate was stopped"
                        )
                        run.timed_out, late = (key, config, message), late + 1
                        break
            if not late:
                continue
            for run in wf.runs.values():
                run.cut = run.timed_out is None
            log.warning("workflow %s: a step ran past its timeout; stopping its isolate", wf.address.name)
            await wf.handle.stop()  # the next run starts a fresh isolate

    # --- one run ----------------------------------------------------------------------------------

    async def _run(self, wf: _Workflow, rid: int, params: Any, created_ms: int) -> None:
        run = wf.runs[rid]
        account, books = self.spec().account, self.books
        args = (account, run.workflow, run.instance, run.generation)
        try:
            try:
                result = await wf.handle.run_workflow(rid, run.instance, params, created_ms)
            except WorkerLoadError as exc:
                error = {"name": "WorkerLoadError", "message": str(exc)}
                await self.stores.run(lambda: books.finish(*args, "errored", error=error), account=account)
                return
            except (ExceededResources, IsolateCrashed) as exc:
                if run.cut and run.timed_out is None:
                    return  # still `running`: due again, it replays from its last finished step
                if run.timed_out is not None:
                    step, config, message = run.timed_out
                else:  # past a CPU, memory or wall-clock limit: the step in flight (if any) counts
                    step, (_, config) = next(iter(run.steps.items()), (None, (0.0, None)))
                    message = f"the run was cut: {exc}"
                if step is None and run.timed_out is None:
                    cuts = self._cuts[(run.workflow, run.instance)] = (
                        self._cuts.get((run.workflow, run.instance), 0) + 1
                    )
                    if cuts < CUTS_OUTSIDE_STEPS:
                        return  # still `running`: due again
                fate = await self.stores.run(books.interrupt, *args, step, config, message, account=account)
                log.warning("workflow %s instance %s: %s (%s)", run.workflow, run.instance, message, fate)
                return
            self._cuts.pop((run.workflow, run.instance), None)
            await self.stores.run(self._settle, books, args, result, account=account)
        except Exception:
            log.exception(
                "workflow %s instance %s: the run failed in the runtime", run.workflow, run.instance
            )
        finally:
            wf.runs.pop(rid, None)

    @staticmethod
    def _settle(books: WorkflowBooks, args: tuple, result: ipc.ObjectResult | ipc.InvokeError) -> None:
        if isinstance(result, ipc.InvokeError):
            name, _, message = result.message.partition(": ")
            if name == "MemoryError":
                message = "the workflow's isolate ran out of memory (limits.memory_mb)"
            error = {"name": name or "Error", "message": message or result.message}
            if books.finish(*args, "errored", error=error):
                log.warning("workflow %s instance %s errored: %s", args[1], args[2], result.message[:2000])
            return
        reply = result.result if isinstance(result.result, dict) else {}
        if reply.get("suspend"):  # sleeping, waiting, paused or terminated: the books know which
            error = {"name": "Error", "message": "run() stopped without a sleep or wait; never raise Suspend"}
            books.finish(*args, "errored", error=error)  # only if it is still `running`: a forged stop
            return
        try:
            output = json_value(
                "the output of run()", reply.get("output"), "store it in KV or R2, return its key"
            )
        except BindingError as exc:
            books.finish(*args, "errored", error={"name": exc.type, "message": str(exc)})
            return
        books.finish(*args, "complete", output=output)

    # --- a run's step calls -----------------------------------------------------------------------

    async def step(self, spec: WorkerSpec, request: int, method: str, args: Any) -> Any:
        """A step call from the isolate of `spec.workflow`, for the run with that request id."""
        wf = self._workflows.get(spec.workflow.name) if spec.workflow else None
        run = wf.runs.get(request) if wf is not None else None
        if run is None or not isinstance(method, str):
            raise BindingError("Error", "this step call belongs to no running workflow instance")
        run.calls += 1
        if run.calls > STEP_CALLS_PER_RUN:
            raise BindingError("RangeError", f"a run makes at most {STEP_CALLS_PER_RUN} step calls")
        reply = await self.stores.run(
            self.books.step_call,
            spec.account,
            run.workflow,
            run.instance,
            run.generation,
            method,
            args,
            account=spec.account,  # in its account's queue: fair with the others' binding calls
        )
        key = (args[0], args[1]) if isinstance(args, list) and len(args) > 1 else None
        if method == "do" and reply.get("state") == "run":
            deadline = time.monotonic() + reply["timeout_ms"] / 1000 + GRACE_S
            run.steps[key] = (deadline, StepConfig(args[2] if len(args) > 2 else {}))
        elif method in ("done", "fail"):
            run.steps.pop(key, None)
        return reply

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for wf in self._workflows.values():
            await wf.handle.stop()
