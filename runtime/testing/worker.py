"""The `worker` a test holds: one real Runtime of the project (its worker in a real isolate, its
bindings' stores under the test's own folder, its AI calls on the session's real engines), and the
ways a test reaches it: HTTP requests, cron, queue batches, Durable Object alarms and calls,
workflows, and the binding stores themselves.

Requests go to the runtime's own Starlette app in this process (httpx's ASGI transport): the same
front, routing, isolate and answer `edge dev` gives, without a port. The binding clients are the
SDK's own classes (`workers.kv.KVNamespace`...) over a transport that calls the runtime's stores
for the worker's account, each value crossing as msgpack as it does from an isolate: a test seeds
and reads exactly what the worker sees, with the worker's API.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import itertools
import json as json_module
import logging
import time
import uuid
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import msgspec

from runtime.ai.call import AICall
from runtime.ai.search import binding as search_binding
from runtime.app import Runtime, create_app
from runtime.bindings import BindingError, BindingRef, kinds
from runtime.bindings.ai_search import KINDS as AI_SEARCH_KINDS
from runtime.bindings.ai_search import NAMESPACE_KIND as AI_SEARCH_NAMESPACE
from runtime.host.invocation import Invocation
from runtime.host.objects import namespace_key
from runtime.isolate import ipc
from workers.binding_values import binding_error, no_such_binding
from workers.durable_objects import DurableObjectNamespace, id_from_name, remote_error

T = TypeVar("T")

BASE_URL = "http://localhost"  # a request's URL when the test gives a path
TERMINAL = ("complete", "errored", "terminated")  # a workflow instance's statuses that never change
AI_SEARCH_WAIT_S = 60.0  # the AI Search folders (source_dir) indexed before a test runs, at most this long


class WorkerLoadError(Exception):
    """The worker's script did not load (a syntax error, no entry point); the message is the runtime's."""


class ForeignLoopError(RuntimeError):
    """A call of the worker's awaited on an event loop other than the one the worker lives on."""


def _on_its_loop(method):
    """An EdgeWorker coroutine method that refuses at once to run on another event loop than the
    worker's: there (asyncio.run in a test, a test run by anyio's or pytest-asyncio's plugin) its
    awaits would wait forever for answers that only the worker's loop delivers."""

    @functools.wraps(method)
    async def checked(self: EdgeWorker, *args: Any, **kwargs: Any) -> Any:
        self._check_loop(method.__name__)
        return await method(self, *args, **kwargs)

    return checked


def run_within(
    loop: asyncio.AbstractEventLoop, awaitable: Awaitable[T], timeout: float | None, what: str
) -> T:
    """Run `awaitable` on `loop` (not running) to its end, or fail the test once `timeout` seconds
    have passed: the plugin's last guard against a test that waits forever. The timeout is told
    apart from a TimeoutError the test itself raises, which propagates as any exception does."""
    import pytest

    task = asyncio.ensure_future(awaitable, loop=loop)
    try:
        done, _ = loop.run_until_complete(asyncio.wait({task}, timeout=timeout))
    except BaseException:  # Ctrl-C: the test's task ends with the run
        _cancel(loop, task)
        raise
    if task not in done:
        _cancel(loop, task)
        pytest.fail(
            f"{what} ran past {timeout:g} s (edge_test_timeout: set it with --edge-test-timeout S or "
            "the ini key edge_test_timeout, 0 for no limit); it was still waiting",
            pytrace=False,
        )
    return task.result()


def _cancel(loop: asyncio.AbstractEventLoop, task: asyncio.Future) -> None:
    task.cancel()
    loop.run_until_complete(asyncio.wait({task}, timeout=5.0))  # a test that ignores its cancel: left


@dataclass
class WorkerResponse:
    """The runtime's answer to a request: `status`, `headers`, `body` (bytes), `text`, `json()`."""

    status: int
    headers: httpx.Headers
    body: bytes
    url: str

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json_module.loads(self.body)

    def __repr__(self) -> str:
        shown = self.text if len(self.body) <= 300 else self.text[:300] + "..."
        return f"<WorkerResponse {self.status} {self.url}: {shown!r}>"


@dataclass
class EventResult:
    """How an event the worker handled ended: `outcome` ("ok", "exception", "exceededCpu"...) and
    the `exception` it raised ({"name", "message"}), as `edge tail` shows them."""

    outcome: str
    exception: dict | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


@dataclass
class QueueResult(EventResult):
    """A queue batch's outcome, and what the handler did with each message: `acked` (ids) and
    `retried` ({id: delaySeconds or None}); a message it left alone was acked when it returned."""

    acked: list[str] = field(default_factory=list)
    retried: dict[str, int | None] = field(default_factory=dict)


@dataclass
class AlarmResult:
    """`ran`: whether the object had an alarm to run; `outcome` of its handler when it ran."""

    ran: bool
    outcome: str | None = None


class EdgeWorker:
    """The project's worker, running for one test. Built by the `worker` fixture
    (runtime.testing.plugin); `start` and `close` are the fixture's."""

    def __init__(
        self,
        runtime: Runtime,
        loop: asyncio.AbstractEventLoop,
        config_path: str,
        ai_seed: int | None = 0,
        timeout: float | None = None,
    ):
        self.runtime, self.config_path = runtime, config_path
        self.config = runtime.config
        self.name, self.account = runtime.config.name, runtime.config.account_id
        self._loop = loop
        self._client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(runtime)), base_url=BASE_URL
        )
        self._tail = runtime.tail.subscribe(self.account, self.name)
        self._events: list[dict] = []
        self._calls = itertools.count(1)
        self.admin_token: str | None = None  # the /cdn-cgi/edge/ control endpoints' (the fixture sets it)
        self._api_token: str | None = None
        self.ai_seed = ai_seed
        self.timeout = timeout  # worker.run's limit, the plugin's edge_test_timeout (None: none)

    @property
    def api_token(self) -> str:
        """An API token of the worker's account, for the /client/v4/ APIs (`Authorization: Bearer`)."""
        if self._api_token is None:
            self.runtime.state.ensure_account(self.account)
            self._api_token = self.runtime.state.create_token(self.account, "pytest")
        return self._api_token

    # --- the fixture's ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the runtime (the worker's isolate, its cron, queue consumers, workflows, alarms);
        WorkerLoadError, with the runtime's message, when the script does not load."""
        failures: list[str] = []
        handler = _Collect(failures)
        logger = logging.getLogger("edge.runtime")
        logger.addHandler(handler)
        try:
            await self.runtime.start(ai_search_wait_s=AI_SEARCH_WAIT_S)
        finally:
            logger.removeHandler(handler)
        if not self.runtime.dev.isolate.alive:
            raise WorkerLoadError(
                f"{self.config.main_path}: the worker did not load: "
                + ("\n".join(failures) or "no reason given")
            )

    async def close(self) -> None:
        await self._client.aclose()
        self.runtime.tail.unsubscribe(self.account, self.name, self._tail)
        await self.runtime.stop()
        self.runtime.state.close()

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run one of this client's coroutines from a synchronous test or fixture:
        `worker.run(worker.fetch("/"))`. (In an `async def` test, just await it.) It fails the test
        past the plugin's edge_test_timeout."""
        if self._loop.is_running():
            raise RuntimeError("worker.run is for synchronous code; in an async test, await it")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise ForeignLoopError(self._foreign_loop("run"))
        return run_within(self._loop, awaitable, self.timeout, "worker.run")

    def _check_loop(self, what: str) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self._loop:
            raise ForeignLoopError(self._foreign_loop(what))

    @staticmethod
    def _foreign_loop(what: str) -> str:
        """`what`: a method of the worker ("fetch"), or a binding's call ("CACHE.get")."""
        call = f"worker.run(worker.{what}(...))" if what.isidentifier() else f"worker.run({what}(...))"
        call = "worker.run(...)" if what == "run" else call
        shown = f"worker.{what}" if what.isidentifier() else what
        return (
            f"{shown} was called on an event loop that is not the worker's (asyncio.run, or a test "
            "that anyio's or pytest-asyncio's plugin runs), where it would wait forever. Write the test as "
            "a plain `async def test_...(worker):` and await the worker there (the plugin runs it on the "
            f"worker's loop, no marker needed), or in a synchronous test call {call}"
        )

    # --- AI -----------------------------------------------------------------------------------------

    @property
    def ai_seed(self) -> int | None:
        """The seed every text generation without its own gets (AIService.default_seed; None: none):
        the real model samples as asked (temperature, top_p...) from a fixed seed, so the same call
        gives the same text. Set it to sample another answer."""
        return self.runtime.ai.default_seed

    @ai_seed.setter
    def ai_seed(self, seed: int | None) -> None:
        self.runtime.ai.default_seed = seed

    # --- HTTP ---------------------------------------------------------------------------------------

    @_on_its_loop
    async def fetch(
        self,
        url: str = "/",
        *,
        method: str = "GET",
        headers: dict[str, str] | Iterable[tuple[str, str]] | None = None,
        body: bytes | str | None = None,
        json: Any = None,
        location: str | None = None,
    ) -> WorkerResponse:
        """A request to the worker, as a client of `edge dev` sends it: `url` a path ("/hello?x=1")
        or a whole URL; `json` sends a JSON body; `location` is where the client is (a topology
        city, a PoP code or "lat,lon": the x-edge-client-location header), default the config's
        [edge] client_location."""
        sent = httpx.Headers(headers or {})
        if location is not None:
            sent["x-edge-client-location"] = location
        if json is not None and body is not None:
            raise TypeError("fetch: give either body or json, not both")
        r = await self._client.request(method, url, headers=sent, content=body, json=json)
        return WorkerResponse(r.status_code, r.headers, r.content, str(r.url))

    # --- events -------------------------------------------------------------------------------------

    @_on_its_loop
    async def scheduled(self, cron: str | None = None, *, time_ms: int | None = None) -> EventResult:
        """Run the worker's scheduled handler once now, as a Cron Trigger does: `cron` defaults to
        the config's first triggers.crons entry; `time_ms` is controller.scheduledTime (default
        now)."""
        crons = self.config.triggers.crons
        if cron is None:
            if not crons:
                raise ValueError(
                    "scheduled: the config has no triggers.crons; pass the cron to run, "
                    'e.g. worker.scheduled("*/5 * * * *")'
                )
            cron = crons[0]
        when = int(time.time() * 1000) if time_ms is None else time_ms
        outcome, exception = await self.runtime.run_scheduled(cron, when)
        return EventResult(outcome, exception)

    @_on_its_loop
    async def queue(self, queue: str, messages: list[dict[str, Any]]) -> QueueResult:
        """Hand the worker's queue handler one batch of `queue`'s messages now, each
        `{"body": ..., "id"?: str, "timestamp"?: ms, "attempts"?: int}`; the worker must consume
        `queue` (queues.consumers)."""
        consumed = [c.queue for c in self.config.queues.consumers]
        if queue not in consumed:
            raise ValueError(
                f"queue: the worker consumes no queue {queue!r} (queues.consumers: "
                f"{', '.join(consumed) or 'none'}); add a consumer for it to the config"
            )
        now = int(time.time() * 1000)
        batch = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "body" not in m:
                raise TypeError(f"queue: messages[{i}] must be a dict with a 'body' (and optional id, "
                                f"timestamp, attempts), got {m!r:.80}")  # fmt: skip
            body = _wire(m["body"], f"queue: messages[{i}].body")
            ident = str(m.get("id") or f"test-{next(self._calls)}")
            batch.append(
                ipc.QueuedMessage(ident, int(m.get("timestamp", now)), body, int(m.get("attempts", 1)))
            )
        outcome, acked, retried = await self.runtime.dev.deliver(queue, batch)
        return QueueResult(outcome, None, acked, retried)

    # --- bindings -----------------------------------------------------------------------------------

    def _ref(self, binding: str, kind: str | None = None) -> BindingRef:
        refs = self.runtime.dev.spec.bindings
        ref = refs.get(binding)
        if ref is None:  # the same words as env.MISSING in the worker (workers.binding_values)
            kinds_by_name = {n: r.kind for n, r in refs.items()}
            raise LookupError(no_such_binding(binding, kinds_by_name, declare_in=self.config_path))
        if kind is not None and ref.kind != kind:
            wanted = kinds.kind(kind)
            raise TypeError(
                f"{binding} is a {ref.kind} binding, not {kind}"
                + (f" (a {kind} binding is declared in {wanted.config_key})" if wanted else "")
            )
        return ref

    def binding(self, name: str) -> Any:
        """`env.<name>` as the worker sees it (KV, D1, R2, Vectorize, a queue producer, a workflow,
        a rate limit): the SDK's own client, over the runtime's store for the worker's account."""
        ref = self._ref(name)
        kind = kinds.kind(ref.kind)
        if kind is None:
            raise TypeError(f"{name}: no client for binding kind {ref.kind!r}")
        module, _, cls = kind.client.partition(":")
        client = getattr(importlib.import_module(module), cls)
        if ref.kind in AI_SEARCH_KINDS:
            return client(self._search_transport(name, ref))
        return client(self._transport(name, ref))

    def ai_search(self, name: str) -> Any:
        """`env.<name>`, an [[ai_search]] instance or an [[ai_search_namespaces]] namespace:
        search, chatCompletions (answered by the edge's models, as the worker's calls are), info,
        stats, items, jobs; get / create / list / delete on a namespace."""
        ref = self._ref(name)
        if ref.kind not in AI_SEARCH_KINDS:
            raise TypeError(
                f"{name} is a {ref.kind} binding, not AI Search (ai_search, ai_search_namespaces)"
            )
        return self.binding(name)

    def kv(self, name: str) -> Any:
        """`env.<name>`, a KV namespace: get, getWithMetadata, put, delete, list."""
        self._ref(name, "kv")
        return self.binding(name)

    def d1(self, name: str) -> Any:
        """`env.<name>`, a D1 database: prepare(...).bind(...).all()/first()/run()/raw(), batch, exec."""
        self._ref(name, "d1")
        return self.binding(name)

    def r2(self, name: str) -> Any:
        """`env.<name>`, an R2 bucket: put, get, head, list, delete."""
        self._ref(name, "r2")
        return self.binding(name)

    def vectorize(self, name: str) -> Any:
        """`env.<name>`, a Vectorize index: insert, upsert, query, getByIds, deleteByIds, describe
        (create the index first: create_vectorize_index)."""
        self._ref(name, "vectorize")
        return self.binding(name)

    def workflow(self, name: str) -> Any:
        """`env.<name>`, a workflow binding: create(id=, params=), create_batch, get(id)."""
        self._ref(name, "workflow")
        return self.binding(name)

    @_on_its_loop
    async def create_vectorize_index(
        self,
        binding: str,
        dimensions: int | None = None,
        metric: str = "cosine",
        *,
        preset: str | None = None,
    ) -> dict:
        """Create the index `binding` names (as `edge vectorize create` does): `dimensions` and
        `metric`, or `preset`, an embedding model's name, for its width."""
        ref = self._ref(binding, "vectorize")
        if preset is not None:
            from runtime.ai.cloudflare_names import EMBEDDING_MODELS

            if preset not in EMBEDDING_MODELS:
                raise ValueError(
                    f"preset: {preset!r} is not an embedding model; one of {', '.join(EMBEDDING_MODELS)}"
                )
            dimensions = EMBEDDING_MODELS[preset]
        if dimensions is None:
            raise TypeError("create_vectorize_index: give dimensions (or preset=an embedding model)")
        store = self.runtime.bindings.store("vectorize")
        try:
            return await self.runtime.bindings.run(store.create, self.account, ref.id, dimensions, metric, "")
        except BindingError as exc:
            raise binding_error(exc.type, str(exc)) from None

    def _transport(self, name: str, ref: BindingRef):
        stores, account = self.runtime.bindings, self.account

        async def call(method: str, args: list, kwargs: dict) -> Any:
            self._check_loop(f"{name}.{method}")  # worker.kv(NAME).get and the other clients' calls
            args, kwargs = _wire([list(args), dict(kwargs)], f"{name}.{method}")
            try:
                result = await stores.call(account, ref, method, args, kwargs)
            except BindingError as exc:
                raise binding_error(exc.type, str(exc) or f"{name}.{method} failed") from None
            return msgspec.msgpack.decode(msgspec.msgpack.encode(result))

        return call

    def _search_transport(self, name: str, ref: BindingRef):
        """An AI Search binding's calls, on the runtime's service for the worker's account, in the
        namespace (and instance) its binding names, as runtime.host.worker_calls makes them; a
        generation (chatCompletions, a query rewrite) is an AI call of the account's."""
        service, account, runtime = self.runtime.ai_search, self.account, self.runtime
        if ref.kind == AI_SEARCH_NAMESPACE:
            scope = search_binding.Scope(ref.id)
        else:
            scope = search_binding.Scope(search_binding.DEFAULT_NAMESPACE, ref.id)
        staged = search_binding.Staged(search_binding.Staging(), 0, {0})

        async def generate(model: str, inputs: dict) -> Any:
            ingress, rtt = runtime.locator.edge.ingress(runtime.locator.default_location)
            call = AICall(model, inputs, account, None, ingress, rtt, request_id=str(uuid.uuid4()))
            answer = await runtime.ai.answer(call)
            return answer.stream if answer.stream is not None else answer.body

        async def call(method: str, args: list, kwargs: dict) -> Any:
            self._check_loop(f"{name}.{method}")
            args, kwargs = _wire([list(args), dict(kwargs)], f"{name}.{method}")
            try:
                result = await search_binding.call(
                    service, account, scope, method, args, kwargs, generate, staged
                )
            except search_binding.Refused as exc:
                raise binding_error(exc.type, str(exc)) from None
            if hasattr(result, "__aiter__"):
                return result
            return msgspec.msgpack.decode(msgspec.msgpack.encode(result))

        return call

    # --- Durable Objects ----------------------------------------------------------------------------

    def durable_object(self, binding: str) -> DurableObjectNamespace:
        """`env.<binding>`, a Durable Object namespace: idFromName, newUniqueId, get, getByName; a
        stub's methods are RPC to the object, in its own isolate, as the worker's calls are."""
        ref = self._object_ref(binding)
        spec = self.runtime.dev.spec
        objects, locator = self.runtime.objects, self.runtime.locator

        async def call(binding: str, object_id: str, method: str, args: list, kwargs: dict) -> Any:
            self._check_loop(f"{binding}.{method}")
            args, kwargs = _wire([list(args), dict(kwargs)], f"{binding} {method}")
            message = ipc.ObjectCall(next(self._calls), 0, binding, object_id, method, args, kwargs)
            ingress, rtt = locator.edge.ingress(locator.default_location)
            where = locator.default_location
            ctx = Invocation(where, ingress, rtt, method="RPC", url=f"do://{binding}", origin=locator.origin)
            reply = await objects.call(spec, message, ctx)
            if reply.error_type is not None:
                raise remote_error(reply.error_type, reply.error_message or f"{binding} {method} failed")
            return msgspec.msgpack.decode(msgspec.msgpack.encode(reply.result))

        return DurableObjectNamespace(binding, namespace_key(self.account, self.name, ref.class_name), call)

    def _object_ref(self, binding: str):
        refs = self.runtime.dev.spec.durable_objects
        ref = refs.get(binding)
        if ref is None:
            known = ", ".join(sorted(refs)) or "none"
            raise LookupError(
                f"the worker has no Durable Object binding named {binding!r} (durable_objects.bindings "
                f"of {self.config_path}: {known})"
            )
        return ref

    @_on_its_loop
    async def alarm(self, binding: str, name: str | None = None, *, id: str | None = None) -> AlarmResult:  # noqa: A002
        """Run the alarm of the object `name` (or `id`) of `binding` now, whenever it is set for,
        as the scheduler would (its retries and a new alarm it sets are kept); `ran` is False
        when the object has no alarm set."""
        ref = self._object_ref(binding)
        key = namespace_key(self.account, self.name, ref.class_name)
        if (name is None) == (id is None):
            raise TypeError("alarm: give the object's name or its id=")
        object_id = id_from_name(key, name) if name is not None else id
        address = (self.account, self.name, ref.class_name, object_id)
        stores = self.runtime.bindings
        store = stores.objects
        due = await stores.run(lambda: store.storage(*address).get_alarm())
        if due is None:
            return AlarmResult(False)
        retries = await stores.run(store.begin_alarm, address, due)
        if retries is None:  # the scheduler took it meanwhile
            return AlarmResult(False)
        outcome = await self.runtime.objects.alarm(
            self.runtime.dev.spec, ref.class_name, object_id, retries, due
        )
        following = await stores.run(store.end_alarm, address, outcome == "ok", int(time.time() * 1000))
        if following is not None:
            self.runtime.alarms.changed(address, following)
        return AlarmResult(True, outcome)

    # --- workflows ----------------------------------------------------------------------------------

    @_on_its_loop
    async def wait_for_workflow(
        self, instance: Any, until: str | Iterable[str] = TERMINAL, timeout: float = 60.0
    ) -> Any:
        """Wait until a workflow instance (from worker.workflow(...).create or .get) has one of the
        statuses `until` (default: complete, errored or terminated) or one that can no longer
        change; returns its status() (status, output, error). TimeoutError names the last one."""
        wanted = {until} if isinstance(until, str) else set(until)
        deadline = time.monotonic() + timeout
        while True:
            status = await instance.status()
            if status["status"] in wanted or status["status"] in TERMINAL:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"workflow instance {instance.id}: still {status['status']!r} after {timeout} s "
                    f"(waiting for {', '.join(sorted(wanted))})"
                )
            await asyncio.sleep(0.05)

    # --- what the worker logged ---------------------------------------------------------------------

    def tail(self) -> list[dict]:
        """Every `edge tail` event of the worker so far in this test (requests, cron runs, queue
        batches...; each with its outcome, logs and exceptions)."""
        while not self._tail.empty():
            self._events.append(self._tail.get_nowait())
        return list(self._events)

    def logs(self) -> list[str]:
        """The worker's console lines so far in this test, in order."""
        lines = []
        for event in self.tail():
            for entry in event.get("logs", []):
                message = entry.get("message")
                lines.append(" ".join(map(str, message)) if isinstance(message, list) else str(message))
        return lines


class _Collect(logging.Handler):
    def __init__(self, into: list[str]):
        super().__init__(logging.ERROR)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def _wire(value: Any, what: str) -> Any:
    """`value` as it arrives after crossing from an isolate (msgpack); TypeError for what cannot."""
    try:
        return msgspec.msgpack.decode(msgspec.msgpack.encode(value))
    except (TypeError, msgspec.EncodeError) as exc:
        raise TypeError(
            f"{what}: arguments must be str, bytes, numbers, None, lists or dicts: {exc}"
        ) from None
