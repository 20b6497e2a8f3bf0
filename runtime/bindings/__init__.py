"""KV, D1, R2 and queue bindings: the stores behind `env.KV`, `env.DB`, `env.BUCKET` and
`env.QUEUE` (and each Durable Object's `ctx.storage`), simulated locally and kept under the
state dir (`.edge/`), which only the runtime can reach.

A worker's isolate names only a binding (`env.NAME.method(...)` crosses as ipc.BindingCall); the
runtime maps that name, through the worker's own spec, to a kind and an id, and every store is
keyed by the worker's account as well, so no isolate can choose which data it reaches and one
account never reaches another's, even with the same ids. Blocking SQLite and file work runs in
the stores' own pool (runtime.control.fair_pool: never the event loop, nor the default executor the
runtime resolves hosts in), which accounts share fairly: one queue per account, one lane per store
inside it, at most ACCOUNT_THREADS threads to one account, a D1 script or batch run a statement a
turn; so one account's flood of long calls never holds another's KV read, D1 query, Durable Object
storage or workflow books. Calls to one D1 database wait their turn without holding a thread. A
call ends with the task that awaits it (its request): dropped from the queue, or its statement
interrupted.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

from runtime.bindings import kinds
from runtime.bindings.common import BindingError, safe_component
from runtime.bindings.d1 import QUERY_S
from runtime.bindings.do_storage import ObjectStorageStore
from runtime.bindings.kind import BindingKind, BindingRef, Store
from runtime.bindings.kinds import binding_refs
from runtime.bindings.queues import QueueStore
from runtime.control.fair_pool import RUNTIME, FairPool
from runtime.control.storage_errors import storage_failure

__all__ = [
    "BindingError",
    "BindingKind",
    "BindingRef",
    "BindingStores",
    "binding_refs",
    "safe_component",
]

THREADS = 8  # binding calls running at once, all accounts together
ACCOUNT_THREADS = 4  # ... of which one account's: the rest stay free for the others


class BindingStores:
    """Every account's KV namespaces, D1 databases, R2 buckets and queues under `state_dir`."""

    def __init__(self, state_dir: Path, d1_query_s: float = QUERY_S):
        self.state_dir = Path(state_dir)
        self.d1_query_s = d1_query_s
        self._open: dict[str, Store] = {}  # by kind, opened on first use
        self._objects: ObjectStorageStore | None = None
        self._lock = threading.Lock()
        self.pool = FairPool(THREADS, ACCOUNT_THREADS, name="edge-bindings")
        self._turns: dict[tuple[str, str, str], asyncio.Lock] = {}  # kinds whose calls take turns

    def store(self, kind: str) -> Any:
        """The store of `kind` (a name in runtime.bindings.kinds.KINDS), opened on first use."""
        with self._lock:
            if kind not in self._open:
                found = kinds.kind(kind)
                if found is None:
                    raise BindingError("TypeError", f"unknown binding kind {kind!r}")
                self._open[kind] = found.open(self.state_dir, self.d1_query_s)
            return self._open[kind]

    @property
    def queues(self) -> QueueStore:
        """The queue store, which queue consumers (runtime.events.queue_consumers) claim from."""
        return self.store("queue")

    async def run(self, fn: Any, *args: Any, account: str = RUNTIME) -> Any:
        """Blocking store work of the runtime's own (a queue consumer's claim and settle, the
        workflow books, alarms) in the stores' pool, in `account`'s queue when it is one
        account's, else in the runtime's own."""
        return await self.pool.run(account, fn, *args, lane=getattr(fn, "__name__", None))

    @property
    def objects(self) -> ObjectStorageStore:
        with self._lock:
            if self._objects is None:
                self._objects = ObjectStorageStore(self.state_dir / "do", self.d1_query_s)
            return self._objects

    async def call_object_storage(
        self, account: str, script: str, class_name: str, object_id: str, method: str, args: Any, kwargs: Any
    ) -> Any:
        """A Durable Object's `ctx.storage` call, run in the pool; the caller (the runtime, never
        the isolate) names the object."""
        store = self.objects
        lane = ("do", script, class_name, object_id)
        return await self.pool.run(
            account, store.call, account, script, class_name, object_id, method, args, kwargs, lane=lane
        )

    def _store_call(self, account: str, ref: BindingRef, method: str, args: Any, kwargs: Any) -> Any:
        if not isinstance(method, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
            raise BindingError("TypeError", "a binding call is a method name, a list of arguments and a dict")
        return self.store(ref.kind).call(account, ref.id, method, args, kwargs)

    async def call(self, account: str, ref: BindingRef, method: str, args: Any, kwargs: Any) -> Any:
        """One call, run in the pool; BindingError says what the worker did wrong."""
        work = self._call(account, ref, method, args, kwargs)
        found = kinds.kind(ref.kind)
        if found is None or not found.one_call_at_a_time:
            return await work
        async with self._turns.setdefault((ref.kind, account, ref.id), asyncio.Lock()):
            return await work

    async def _call(self, account: str, ref: BindingRef, method: str, args: Any, kwargs: Any) -> Any:
        try:
            return await self.pool.run(
                account, self._store_call, account, ref, method, args, kwargs, lane=(ref.kind, ref.id)
            )
        except (sqlite3.OperationalError, OSError) as exc:  # its file locked elsewhere, or the disk full
            failure = storage_failure(exc, f"the local {ref.kind.upper()} store")
            if failure is None:
                raise
            raise BindingError(f"{ref.kind.upper()}_ERROR", str(failure)) from exc

    def close(self) -> None:
        """Stop: queued calls fail, running statements are interrupted, then the files close."""
        self.pool.close()
        with self._lock:
            stores, self._open = [*self._open.values(), self._objects], {}
            self._objects = None
        for store in stores:
            if store is not None:
                store.close()
