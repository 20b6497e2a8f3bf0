"""KV, D1, R2 and queue bindings: the stores behind `env.KV`, `env.DB`, `env.BUCKET` and
`env.QUEUE` (and each Durable Object's `ctx.storage`), simulated locally and kept under the
state dir (`.edge/`), which only the runtime can reach.

A worker's isolate names only a binding (`env.NAME.method(...)` crosses as ipc.BindingCall); the
runtime maps that name, through the worker's own spec, to a kind and an id, and every store is
keyed by the worker's account as well, so no isolate can choose which data it reaches and one
account never reaches another's, even with the same ids. Blocking SQLite and file work runs in
the stores' own thread pool (never the event loop, nor the default executor the runtime resolves
hosts in), so the runtime keeps serving while a query runs; calls to one D1 database wait their
turn without holding a thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from runtime.bindings.common import BindingError, safe_component
from runtime.bindings.d1 import QUERY_S, D1Store
from runtime.bindings.do_storage import ObjectStorageStore
from runtime.bindings.kv import KVStore
from runtime.bindings.queues import QueueStore
from runtime.bindings.r2 import R2Store
from runtime.control.storage_errors import storage_failure

__all__ = [
    "BindingError",
    "BindingRef",
    "BindingStores",
    "binding_refs",
    "check_binding_names",
    "safe_component",
]

KINDS = ("kv", "d1", "r2", "queue")
ID_BYTES = 256
THREADS = 8  # binding calls running at once, all accounts together


class BindingRef(msgspec.Struct, frozen=True):
    """What a binding name stands for: a KV namespace id, a D1 database (id or name), an R2 bucket."""

    kind: str  # "kv" | "d1" | "r2" | "queue" (its id is the queue's name)
    id: str


def _field(entry: Any, name: str) -> Any:
    return entry.get(name) if isinstance(entry, dict) else getattr(entry, name, None)


def binding_refs(
    kv: Iterable[Any] = (), d1: Iterable[Any] = (), r2: Iterable[Any] = (), queues: Iterable[Any] = ()
) -> dict[str, BindingRef]:
    """Bindings from wrangler's lists (config structs or the dicts a deployed version stores):
    kv_namespaces [{binding, id}], d1_databases [{binding, database_name, database_id}],
    r2_buckets [{binding, bucket_name}], queues.producers [{binding, queue}]. ValueError names
    the entry that is wrong."""
    refs: dict[str, BindingRef] = {}

    def add(where: str, binding: Any, kind: str, ident: Any) -> None:
        if not isinstance(binding, str) or not binding.isidentifier():
            raise ValueError(f"{where}.binding: {binding!r} is not a valid Python identifier")
        if not isinstance(ident, str) or not ident or len(ident.encode("utf-8", "replace")) > ID_BYTES:
            raise ValueError(
                f"{where}: {binding} needs an id (a non-empty string of at most {ID_BYTES} bytes)"
            )
        if binding in refs:
            raise ValueError(f"{where}.binding: {binding!r} is bound twice")
        refs[binding] = BindingRef(kind, ident)

    for i, e in enumerate(kv):
        add(f"kv_namespaces.{i}", _field(e, "binding"), "kv", _field(e, "id") or _field(e, "binding"))
    for i, e in enumerate(d1):
        add(
            f"d1_databases.{i}",
            _field(e, "binding"),
            "d1",
            _field(e, "database_id") or _field(e, "database_name") or _field(e, "binding"),
        )
    for i, e in enumerate(r2):
        add(f"r2_buckets.{i}", _field(e, "binding"), "r2", _field(e, "bucket_name"))
    for i, e in enumerate(queues):
        add(f"queues.producers.{i}", _field(e, "binding"), "queue", _field(e, "queue"))
    return refs


def check_binding_names(refs: dict[str, BindingRef], taken: Iterable[str], where: str = "") -> None:
    """A binding must not share its name with a var, secret, service or the AI binding."""
    clash = sorted(set(refs) & set(taken))
    if clash:
        raise ValueError(
            f"{where}binding name(s) {', '.join(clash)} are also used by vars, services or ai; rename one"
        )


class BindingStores:
    """Every account's KV namespaces, D1 databases, R2 buckets and queues under `state_dir`."""

    def __init__(self, state_dir: Path, d1_query_s: float = QUERY_S):
        self.state_dir = Path(state_dir)
        self.d1_query_s = d1_query_s
        self._kv: KVStore | None = None
        self._d1: D1Store | None = None
        self._r2: R2Store | None = None
        self._queues: QueueStore | None = None
        self._objects: ObjectStorageStore | None = None
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="edge-bindings")
        self._d1_turns: dict[tuple[str, str], asyncio.Lock] = {}  # one statement at a time per database

    @property
    def kv(self) -> KVStore:
        with self._lock:
            if self._kv is None:
                self._kv = KVStore(self.state_dir / "kv.sqlite")
            return self._kv

    @property
    def d1(self) -> D1Store:
        with self._lock:
            if self._d1 is None:
                self._d1 = D1Store(self.state_dir / "d1", self.d1_query_s)
            return self._d1

    @property
    def r2(self) -> R2Store:
        with self._lock:
            if self._r2 is None:
                self._r2 = R2Store(self.state_dir / "r2")
            return self._r2

    @property
    def queues(self) -> QueueStore:
        with self._lock:
            if self._queues is None:
                self._queues = QueueStore(self.state_dir / "queues.sqlite")
            return self._queues

    async def run(self, fn: Any, *args: Any) -> Any:
        """Blocking store work (a queue consumer's claim and settle) in the stores' pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

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
        loop = asyncio.get_running_loop()
        store = self.objects
        return await loop.run_in_executor(
            self._pool, store.call, account, script, class_name, object_id, method, args, kwargs
        )

    def call_sync(self, account: str, ref: BindingRef, method: str, args: Any, kwargs: Any) -> Any:
        if not isinstance(method, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
            raise BindingError("TypeError", "a binding call is a method name, a list of arguments and a dict")
        store = {
            "kv": lambda: self.kv,
            "d1": lambda: self.d1,
            "r2": lambda: self.r2,
            "queue": lambda: self.queues,
        }.get(ref.kind)
        if store is None:
            raise BindingError("TypeError", f"unknown binding kind {ref.kind!r}")
        try:
            return store().call(account, ref.id, method, args, kwargs)
        except (sqlite3.OperationalError, OSError) as exc:  # its file locked elsewhere, or the disk full
            failure = storage_failure(exc, f"the local {ref.kind.upper()} store")
            if failure is None:
                raise
            raise BindingError(f"{ref.kind.upper()}_ERROR", str(failure)) from exc

    async def call(self, account: str, ref: BindingRef, method: str, args: Any, kwargs: Any) -> Any:
        """One call, run in the pool; BindingError says what the worker did wrong."""
        loop = asyncio.get_running_loop()
        work = (self._pool, self.call_sync, account, ref, method, args, kwargs)
        if ref.kind != "d1":
            return await loop.run_in_executor(*work)
        async with self._d1_turns.setdefault((account, ref.id), asyncio.Lock()):
            return await loop.run_in_executor(*work)

    def close(self) -> None:
        for store in (self._kv, self._d1, self._r2, self._queues, self._objects):
            if store is not None:
                store.close()
        self._kv = self._d1 = self._r2 = self._queues = self._objects = None
        self._pool.shutdown(wait=False, cancel_futures=True)
