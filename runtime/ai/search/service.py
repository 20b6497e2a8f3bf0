"""AI Search, the one service: namespaces, instances, items, jobs, search and chat completions,
per account, for the worker binding (runtime.ai.search.binding), the REST door
(runtime.routes.ai_search) and `edge ai-search`.

Every method takes the caller's account (the runtime's, never a client's) and answers Cloudflare's
REST `result` shapes; AISearchError says what is wrong. Blocking work (SQLite, conversion,
chunking, embedding, vector math) runs in the service's own fair pool: one queue per account, at
most ACCOUNT_THREADS of its THREADS to one account, so one account's flood of uploads or indexing
never holds another's search. Indexing runs in the background (one item a turn, at most one item
of an account at a time) from a task started with the first call in a running loop; an instance
over an R2 bucket or a folder is synced (new, changed and removed objects) every SYNC_S seconds
and on `jobs create`.

Stated caps (local): MAX_NAMESPACES and MAX_INSTANCES per account, the documents' caps
(runtime.ai.search.documents); a cap reached is code 7004 naming it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.ai.embeddings import HASHED_NGRAMS
from runtime.ai.search import documents, indexing
from runtime.ai.search import settings as cfg
from runtime.ai.search.common import DEFAULT_NAMESPACE, PER_PAGE, Generate, iso, page_of
from runtime.ai.search.documents import (
    STALE_RUNNING_S,
    Documents,
)
from runtime.ai.search.embedder import Embedder, default_embedder, embedder_named
from runtime.ai.search.errors import EXISTS, INVALID, LIMIT, NOT_FOUND, AISearchError
from runtime.ai.search.querying import Querying
from runtime.ai.search.retrieve import RERANKER, Retriever
from runtime.ai.search.store import SearchStore
from runtime.control.fair_pool import FairPool

THREADS, ACCOUNT_THREADS = 2, 1
MAX_NAMESPACES = 20
MAX_INSTANCES = 50
INTERNAL_KEYS = ("source_dir", "embedder", "embedder_dimensions")  # set by the runtime, not by a body
CLOSE_WAIT_S = 10.0  # at stop, a slice running (one document's stage) finishes first
log = logging.getLogger("edge.ai_search")
__all__ = ["DEFAULT_NAMESPACE", "PER_PAGE", "AISearch", "Generate"]


class AISearch(Documents, Querying):
    def __init__(self, state_dir: Path, bindings: Any = None, embedder: Embedder | None = None):
        self.state_dir = Path(state_dir)
        self.bindings = (
            bindings  # runtime.bindings.BindingStores: R2 sources (duck-typed: ai sits beside bindings)
        )
        self.embedder = embedder or default_embedder()  # what new instances index with
        self._embedders: dict[tuple[str, int], Embedder] = {
            (self.embedder.name, self.embedder.dimensions): self.embedder
        }
        self.store = SearchStore(self.state_dir / "ai_search.sqlite")
        self.retriever = Retriever(self.store)
        self.pool = FairPool(THREADS, ACCOUNT_THREADS, name="edge-ai-search")
        self._indexer: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None  # the indexer's: something was queued
        self._moved: asyncio.Event | None = None  # set (and replaced) each time an item is indexed
        self._busy: set[str] = set()  # accounts with an item being indexed now
        self._folders: dict[tuple[str, str, str], Path] = {}  # config-declared folder sources
        self._reader: sqlite3.Connection | None = None  # the dashboard's (progress)
        self.store.execute(
            "UPDATE items SET status = 'queued' WHERE status = 'running' AND modified < ?",
            (time.time() - STALE_RUNNING_S,),
        )

    def embedder_of(self, row: dict) -> Embedder:
        """The embedder an instance's vectors come from (an instance made before embedders were
        named: the stand-in). One that is not here any more (a trained model removed) is replaced
        by the default: the instance's documents are queued to be indexed again, and until they
        are, its old vectors (another width) are skipped by search."""
        name = row["config"].get("embedder", HASHED_NGRAMS)
        width = int(row["config"].get("embedder_dimensions", 768))
        found = self._embedders.get((name, width))
        if found is None:
            found = embedder_named(name, width)
            if found is None:
                self._reembed(row)
                return self.embedder
            self._embedders[(name, width)] = found
        return found

    def _reembed(self, row: dict) -> None:
        account, ns, name = row["account"], row["namespace"], row["name"]
        config = dict(
            row["config"], embedder=self.embedder.name, embedder_dimensions=self.embedder.dimensions
        )
        with self.store.transaction() as db:
            db.execute(
                "UPDATE instances SET config = ? WHERE account = ? AND namespace = ? AND name = ?",
                (json.dumps(config), account, ns, name),
            )
            db.execute(
                "UPDATE items SET status = 'queued', modified = ? WHERE account = ? AND namespace = ? "
                "AND instance = ? AND status IN ('completed', 'error')",
                (time.time(), account, ns, name),
            )
            self.store.bump(db, account, ns, name)
        row["config"] = config
        log.warning("AI Search: %s/%s is indexed again with %s", ns, name, self.embedder.name)

    def progress(self) -> list[dict]:
        """Each instance's indexing progress, for the dashboard: read on a connection of its own
        (WAL lets it read beside a write), never waiting on the indexer's transactions."""
        if self._reader is None:
            self._reader = sqlite3.connect(self.store.path, check_same_thread=False, isolation_level=None)
            self._reader.execute("PRAGMA query_only=1")
        rows = self._reader.execute(
            "SELECT account, namespace, instance, status, count(*), coalesce(sum(chunks_count), 0) "
            "FROM items GROUP BY account, namespace, instance, status"
        ).fetchall()
        errors = dict(
            ((a, n, i), f"{k}: {e}")
            for a, n, i, k, e in self._reader.execute(
                "SELECT account, namespace, instance, key, error FROM items WHERE status = 'error' "
                "ORDER BY modified"
            ).fetchall()
        )
        out: dict[tuple, dict] = {}
        for account, ns, name, status, count, chunks in rows:
            row = out.setdefault(
                (account, ns, name),
                {"account": account, "namespace": ns, "instance": name, "documents": 0, "chunks": 0}
                | {s: 0 for s in ("queued", "running", "completed", "error", "skipped")},
            )
            row["documents"] += count
            row["chunks"] += chunks
            row[status] = row.get(status, 0) + count
        for key, row in out.items():
            row["last_error"] = errors.get(key)
        return [out[k] for k in sorted(out)]

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._indexer is not None:
            self._indexer.cancel()
        self.pool.close()
        self.pool.join(CLOSE_WAIT_S)  # a slice indexing or syncing ends before its files close
        self.store.close()

    async def _run(self, account: str, fn: Callable[..., Any], *args: Any, lane: Any = None) -> Any:
        self._ensure_indexer()
        return await self.pool.run(account, fn, *args, lane=lane)

    # --- namespaces -------------------------------------------------------------------------------

    def _namespace_shape(self, account: str, row: dict) -> dict:
        return {
            "name": row["name"],
            "description": row["description"],
            "created_at": iso(row["created"]),
            "modified_at": iso(row["modified"]),
            "instances": len(self.store.instances(account, row["name"])),
        }

    def _namespace_row(self, account: str, ns: str) -> dict:
        if ns == DEFAULT_NAMESPACE:
            self.store.ensure_namespace(account, ns, "The account's default namespace")
        found = self.store.namespace(account, ns)
        if found is None:
            raise AISearchError(NOT_FOUND, f"no AI Search namespace {ns[:80]!r} in this account")
        return found

    async def namespaces(self, account: str) -> list[dict]:
        def work() -> list[dict]:
            self._namespace_row(account, DEFAULT_NAMESPACE)
            return [self._namespace_shape(account, r) for r in self.store.namespaces(account)]

        return await self._run(account, work)

    async def namespace_create(self, account: str, body: Any) -> dict:
        if not isinstance(body, dict) or set(body) - {"name", "description"}:
            raise AISearchError(INVALID, "a namespace is {name, description?}")
        name = cfg.check_name(body.get("name"), "name")
        description = body.get("description") or ""
        if not isinstance(description, str) or len(description) > 1024:
            raise AISearchError(INVALID, "description: a string of at most 1024 characters")

        def work() -> dict:
            self._namespace_row(account, DEFAULT_NAMESPACE)
            if self.store.namespace(account, name) is not None:
                raise AISearchError(EXISTS, f"namespace {name!r} exists in this account")
            if len(self.store.namespaces(account)) >= MAX_NAMESPACES:
                raise AISearchError(LIMIT, f"an account holds at most {MAX_NAMESPACES} namespaces here")
            self.store.ensure_namespace(account, name, description)
            return self._namespace_shape(account, self.store.namespace(account, name))

        return await self._run(account, work)

    async def namespace_get(self, account: str, ns: str) -> dict:
        return await self._run(
            account, lambda: self._namespace_shape(account, self._namespace_row(account, ns))
        )

    async def namespace_update(self, account: str, ns: str, body: Any) -> dict:
        if not isinstance(body, dict) or set(body) - {"description", "name", "public_endpoint_params"}:
            raise AISearchError(INVALID, "a namespace update is {description?}")
        description = body.get("description") or ""
        if not isinstance(description, str) or len(description) > 1024:
            raise AISearchError(INVALID, "description: a string of at most 1024 characters")

        def work() -> dict:
            self._namespace_row(account, ns)
            self.store.execute(
                "UPDATE namespaces SET description = ?, modified = ? WHERE account = ? AND name = ?",
                (description, time.time(), account, ns),
            )
            return self._namespace_shape(account, self.store.namespace(account, ns))

        return await self._run(account, work)

    async def namespace_delete(self, account: str, ns: str) -> dict:
        def work() -> dict:
            row = self._namespace_row(account, ns)
            if ns == DEFAULT_NAMESPACE:
                raise AISearchError(INVALID, "the default namespace cannot be deleted")
            if self.store.instances(account, ns):
                raise AISearchError(EXISTS, f"namespace {ns!r} still holds instances: delete them first")
            self.store.execute("DELETE FROM namespaces WHERE account = ? AND name = ?", (account, ns))
            return self._namespace_shape(account, row)

        return await self._run(account, work)

    # --- instances --------------------------------------------------------------------------------

    def _instance_row(self, account: str, ns: str, name: str) -> dict:
        self._namespace_row(account, ns)
        found = self.store.instance(account, ns, name)
        if found is None:
            raise AISearchError(NOT_FOUND, f"no AI Search instance {str(name)[:80]!r} in namespace {ns!r}")
        return found

    def _instance_shape(self, row: dict) -> dict:
        # edge's own keys (the folder, the embedder) are shown under "edge", never as settings
        config = {k: v for k, v in row["config"].items() if k not in INTERNAL_KEYS}
        out = {
            "id": row["name"],
            "namespace": row["namespace"],
            **config,
            "created_at": iso(row["created"]),
            "modified_at": iso(row["modified"]),
            "last_activity": iso(row["last_activity"]),
            "status": "paused" if config.get("paused") else "active",
            "enable": not config.get("paused", False),
            "engine_version": 1,
        }
        if row["config"].get("source_dir"):
            out["type"], out["source"] = None, None
        out["edge"] = {
            "embedder": row["config"].get("embedder", HASHED_NGRAMS),
            "dimensions": self.embedder_of(row).dimensions,
            "reranker": RERANKER,
            "keyword_tokenizer": "porter",
            "source_dir": row["config"].get("source_dir"),
            "caps": {
                "items": documents.MAX_ITEMS,
                "item_bytes": documents.MAX_ITEM_BYTES,
                "instance_bytes": documents.MAX_INSTANCE_BYTES,
                "chunks": indexing.MAX_CHUNKS,
            },
        }
        return out

    async def instances(self, account: str, ns: str, page: Any = 1, per_page: Any = 20) -> tuple[list, int]:
        def work() -> list[dict]:
            self._namespace_row(account, ns)
            return [self._instance_shape(r) for r in self.store.instances(account, ns)]

        return page_of(await self._run(account, work), page, per_page)

    async def instance_create(self, account: str, ns: str, body: Any) -> dict:
        name = cfg.check_name(body.get("id") if isinstance(body, dict) else None, "id")
        changes = cfg.check_settings(body, creating=True)
        return await self._create(account, ns, name, changes)

    async def _create(
        self, account: str, ns: str, name: str, changes: dict, source_dir: Path | None = None
    ) -> dict:
        config = cfg.merged(None, changes)
        # kept with the instance: its vectors are this embedder's, this wide
        config["embedder"], config["embedder_dimensions"] = self.embedder.name, self.embedder.dimensions
        if source_dir is not None:
            config["source_dir"] = str(source_dir)

        def work() -> dict:
            self._namespace_row(account, ns)
            if config.get("type") == "r2":
                self._check_bucket(account, config["source"])
            if self.store.instance(account, ns, name) is not None:
                raise AISearchError(EXISTS, f"instance {name!r} exists in namespace {ns!r}")
            if len(self.store.instances(account)) >= MAX_INSTANCES:
                raise AISearchError(LIMIT, f"an account holds at most {MAX_INSTANCES} instances here")
            now = time.time()
            self.store.execute(
                "INSERT INTO instances (account, namespace, name, config, created, modified, last_activity) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (account, ns, name, json.dumps(config), now, now, now),
            )
            if config.get("type") == "r2" or source_dir is not None:
                self._sync(account, ns, name, "user", "the instance was created")
            return self._instance_shape(self.store.instance(account, ns, name))

        out = await self._run(account, work)
        self._nudge()
        return out

    def _check_bucket(self, account: str, bucket: str) -> None:
        if self.bindings is None:
            raise AISearchError(INVALID, "R2 sources are read by a running edge (edge dev)")
        listed = self.bindings.store("r2").call(account, bucket, "list", [], {"limit": 1})
        if not listed["objects"] and not listed.get("delimitedPrefixes"):
            log.info(
                "AI Search: R2 bucket %r of %s is empty (or new): indexed as objects arrive", bucket, account
            )

    async def instance_get(self, account: str, ns: str, name: str) -> dict:
        return await self._run(account, lambda: self._instance_shape(self._instance_row(account, ns, name)))

    async def instance_update(self, account: str, ns: str, name: str, body: Any) -> dict:
        changes = cfg.check_settings(body, creating=False)

        def work() -> dict:
            row = self._instance_row(account, ns, name)
            if row["config"].get("source_dir") and ({"type", "source"} & set(changes)):
                raise AISearchError(INVALID, "this instance's source is a folder set in wrangler-like.toml")
            config = cfg.merged(row["config"], changes)
            if config.get("type") == "r2" and changes.get("source"):
                self._check_bucket(account, config["source"])
            rechunk = any(
                config.get(k) != row["config"].get(k) for k in ("chunk", "chunk_size", "chunk_overlap")
            )
            with self.store.transaction() as db:
                db.execute(
                    "UPDATE instances SET config = ?, modified = ? WHERE account = ? AND "
                    "namespace = ? AND name = ?",
                    (json.dumps(config), time.time(), account, ns, name),
                )
                if rechunk:  # chunking changed: every document is indexed again
                    db.execute(
                        "UPDATE items SET status = 'queued', modified = ? WHERE account = ? AND "
                        "namespace = ? "
                        "AND instance = ? AND status IN ('completed', 'error')",
                        (time.time(), account, ns, name),
                    )
                self.store.bump(db, account, ns, name)
            return self._instance_shape(self.store.instance(account, ns, name))

        out = await self._run(account, work)
        self._nudge()
        return out

    async def instance_delete(self, account: str, ns: str, name: str) -> dict:
        def work() -> dict:
            row = self._instance_row(account, ns, name)
            shape = self._instance_shape(row)
            with self.store.transaction() as db:
                where = "account = ? AND namespace = ? AND instance = ?"
                db.execute(f"DELETE FROM chunks WHERE {where}", (account, ns, name))
                db.execute(f"DELETE FROM items WHERE {where}", (account, ns, name))
                db.execute(f"DELETE FROM jobs WHERE {where}", (account, ns, name))
                db.execute(
                    "DELETE FROM instances WHERE account = ? AND namespace = ? AND name = ?",
                    (account, ns, name),
                )
            self.retriever.forget(account, ns, name)
            self._folders.pop((account, ns, name), None)
            return shape

        return await self._run(account, work)

    async def instance_stats(self, account: str, ns: str, name: str) -> dict:
        def work() -> dict:
            row = self._instance_row(account, ns, name)
            counts = self.store.counts(account, ns, name)
            chunks = self.store.chunk_count(account, ns, name)
            errors = self.store.execute(
                "SELECT key, error FROM items WHERE account = ? AND namespace = ? AND instance = ? "
                "AND status = 'error' ORDER BY modified DESC LIMIT 20",
                (account, ns, name),
            )
            return {
                **{
                    s: counts.get(s, 0)
                    for s in ("queued", "running", "completed", "error", "skipped", "outdated")
                },
                "last_activity": iso(row["last_activity"]),
                "file_embed_errors": {key: error for key, error in errors},
                "engine": {
                    "vectorize": {"dimensions": self.embedder_of(row).dimensions, "vectorsCount": chunks},
                    "r2": {
                        "objectCount": sum(counts.values()),
                        "payloadSizeBytes": row["bytes"],
                        "metadataSizeBytes": 0,
                    },
                },
            }

        return await self._run(account, work)

    # --- config-declared folders ----------------------------------------------------------------

    async def sync_folder(self, account: str, ns: str, name: str, path: Path) -> dict:
        """An instance whose documents are a project folder (wrangler-like.toml `[[ai_search]]
        source_dir`): made if missing, then kept in step with the folder (synced every SYNC_S)."""
        cfg.check_name(name, "instance_name")
        folder = Path(path).resolve()
        if not folder.is_dir():
            raise AISearchError(INVALID, f"source_dir {str(path)!r} is not a folder")
        self._folders[(account, ns, name)] = folder
        found = await self._run(account, lambda: self.store.instance(account, ns, name))
        if found is None:
            return await self._create(account, ns, name, {}, source_dir=folder)
        if found["config"].get("source_dir") != str(folder):

            def point() -> None:
                config = dict(found["config"], source_dir=str(folder))
                self.store.execute(
                    "UPDATE instances SET config = ? WHERE account = ? AND namespace = ? AND name = ?",
                    (json.dumps(config), account, ns, name),
                )

            await self._run(account, point)
        await self._run(account, self._sync, account, ns, name, "schedule", "the folder was read")
        self._nudge()
        return await self.instance_get(account, ns, name)
