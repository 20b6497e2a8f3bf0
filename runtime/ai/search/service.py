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

Stated caps (local): MAX_NAMESPACES and MAX_INSTANCES per account, MAX_ITEMS items and
MAX_INSTANCE_BYTES of documents per instance, MAX_ITEM_BYTES a document, indexing.MAX_CHUNKS
chunks per instance; a cap reached is code 7004 naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fnmatch
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from runtime.ai.search import settings as cfg
from runtime.ai.search.answers import (
    GENERATION_OPTIONS,
    answer_messages,
    chat_completion,
    legacy_page,
    query_of,
    rewrite_messages,
    stream_chat,
    stream_legacy,
)
from runtime.ai.search.embedder import Embedder, default_embedder
from runtime.ai.search.errors import EXISTS, GENERATION, INVALID, LIMIT, NOT_FOUND, AISearchError
from runtime.ai.search.filters import compile_filter
from runtime.ai.search.indexing import MAX_CHUNKS, index_item
from runtime.ai.search.retrieve import RERANKER, Hit, Options, Retriever, rerank
from runtime.ai.search.store import ITEM_COLUMNS, SearchStore, item_row
from runtime.control.fair_pool import FairPool

Generate = Callable[[str, dict], Awaitable[Any]]

DEFAULT_NAMESPACE = "default"
THREADS, ACCOUNT_THREADS = 2, 1
MAX_NAMESPACES = 20
MAX_INSTANCES = 50
MAX_ITEMS = 10_000
MAX_ITEM_BYTES = 4 * 1024 * 1024
MAX_INSTANCE_BYTES = 256 * 1024 * 1024
MAX_KEY = 1024
MAX_INSTANCE_IDS = 10
SYNC_S = 3.0
STALE_RUNNING_S = 120.0  # an item 'running' this long was left by a process that ended
PER_PAGE = 50
RETRIEVAL_KEYS = {
    "retrieval_type",
    "match_threshold",
    "max_num_results",
    "filters",
    "context_expansion",
    "fusion_method",
    "keyword_match_mode",
    "boost_by",
    "return_on_failure",
}
OPTION_KEYS = {"retrieval", "query_rewrite", "reranking", "cache", "custom_metadata", "instance_ids"}
log = logging.getLogger("edge.ai_search")


def iso(ts: float | None) -> str | None:
    return None if ts is None else dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def _page(rows: list, page: Any, per_page: Any) -> tuple[list, int]:
    page = _int_arg(page, "page", 1, 1_000_000)
    per_page = _int_arg(per_page, "per_page", 1, PER_PAGE)
    return rows[(page - 1) * per_page : page * per_page], len(rows)


def _int_arg(value: Any, what: str, lo: int, hi: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise AISearchError(INVALID, f"{what}: an integer from {lo} to {hi}") from None
    if isinstance(value, bool) or not lo <= number <= hi or (isinstance(value, float) and value != number):
        raise AISearchError(INVALID, f"{what}: an integer from {lo} to {hi}")
    return number


class AISearch:
    def __init__(self, state_dir: Path, bindings: Any = None, embedder: Embedder | None = None):
        self.state_dir = Path(state_dir)
        self.bindings = (
            bindings  # runtime.bindings.BindingStores: R2 sources (duck-typed: ai sits beside bindings)
        )
        self.embedder = embedder or default_embedder()
        self.store = SearchStore(self.state_dir / "ai_search.sqlite")
        self.retriever = Retriever(self.store)
        self.pool = FairPool(THREADS, ACCOUNT_THREADS, name="edge-ai-search")
        self._indexer: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._busy: set[str] = set()  # accounts with an item being indexed now
        self._folders: dict[tuple[str, str, str], Path] = {}  # config-declared folder sources
        self.store.execute(
            "UPDATE items SET status = 'queued' WHERE status = 'running' AND modified < ?",
            (time.time() - STALE_RUNNING_S,),
        )

    def close(self) -> None:
        if self._indexer is not None:
            self._indexer.cancel()
        self.pool.close()
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
        config = {k: v for k, v in row["config"].items() if k != "source_dir"}
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
            "embedder": self.embedder.name,
            "dimensions": self.embedder.dimensions,
            "reranker": RERANKER,
            "keyword_tokenizer": "porter",
            "source_dir": row["config"].get("source_dir"),
            "caps": {
                "items": MAX_ITEMS,
                "item_bytes": MAX_ITEM_BYTES,
                "instance_bytes": MAX_INSTANCE_BYTES,
                "chunks": MAX_CHUNKS,
            },
        }
        return out

    async def instances(self, account: str, ns: str, page: Any = 1, per_page: Any = 20) -> tuple[list, int]:
        def work() -> list[dict]:
            self._namespace_row(account, ns)
            return [self._instance_shape(r) for r in self.store.instances(account, ns)]

        return _page(await self._run(account, work), page, per_page)

    async def instance_create(self, account: str, ns: str, body: Any) -> dict:
        name = cfg.check_name(body.get("id") if isinstance(body, dict) else None, "id")
        changes = cfg.check_settings(body, creating=True)
        return await self._create(account, ns, name, changes)

    async def _create(
        self, account: str, ns: str, name: str, changes: dict, source_dir: Path | None = None
    ) -> dict:
        config = cfg.merged(None, changes)
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
                    "vectorize": {"dimensions": self.embedder.dimensions, "vectorsCount": chunks},
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

    # --- items ------------------------------------------------------------------------------------

    def _item_shape(self, item: dict) -> dict:
        return {
            "id": item["id"],
            "key": item["key"],
            "checksum": item["checksum"],
            "chunks_count": item["chunks_count"],
            "created_at": iso(item["created"]),
            "last_seen_at": iso(item["last_seen"]),
            "file_size": item["size"],
            "metadata": item["metadata"],
            "namespace": item["namespace"],
            "next_action": "INDEX" if item["status"] in ("queued", "running") else None,
            "source_id": item["source_id"],
            "status": item["status"],
            "error": item["error"],
        }

    def _check_metadata(self, metadata: Any, schema: list[dict]) -> dict:
        if metadata is None:
            return {}
        if not isinstance(metadata, dict):
            raise AISearchError(INVALID, "metadata: an object of at most 5 fields")
        if len(metadata) > cfg.CUSTOM_FIELDS:
            raise AISearchError(
                INVALID, f"metadata: {len(metadata)} fields; an item carries at most {cfg.CUSTOM_FIELDS}"
            )
        for key, value in metadata.items():
            if (
                not isinstance(key, str)
                or not 1 <= len(key) <= 64
                or key in ("filename", "folder", "timestamp")
            ):
                raise AISearchError(
                    INVALID,
                    f"metadata: field {str(key)[:64]!r}: a name of 1 to 64 characters, not "
                    "filename/folder/timestamp",
                )
            if isinstance(value, str) and len(value) > 500:
                raise AISearchError(INVALID, f"metadata.{key}: text of at most 500 characters")
            if not isinstance(value, str | int | float | bool):
                raise AISearchError(INVALID, f"metadata.{key}: a string, a number or a boolean")
        return dict(metadata)

    @staticmethod
    def _check_key(key: Any) -> str:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY or key.startswith("/") or "\x00" in key:
            raise AISearchError(INVALID, f"the item's name: 1 to {MAX_KEY} characters, not starting with '/'")
        if any(part in ("", ".", "..") for part in key.split("/")):
            raise AISearchError(INVALID, f"the item's name {key[:80]!r}: no empty, '.' or '..' path parts")
        return key

    def _put_item(
        self,
        account: str,
        ns: str,
        name: str,
        key: str,
        content: bytes,
        content_type: str,
        metadata: dict,
        source_id: str,
        object_time: float,
        job: str | None = None,
    ) -> tuple[dict, bool]:
        """Insert or replace an item (queued); (its row, whether it changed)."""
        checksum = hashlib.sha256(content).hexdigest()
        now = time.time()
        with self.store.transaction() as db:
            old = db.execute(
                "SELECT id, checksum, size, metadata, status FROM items WHERE account = ? AND namespace = ? "
                "AND instance = ? AND key = ?",
                (account, ns, name, key),
            ).fetchone()
            if old is not None and old[1] == checksum and json.loads(old[3] or "{}") == metadata:
                db.execute("UPDATE items SET last_seen = ? WHERE id = ?", (now, old[0]))
                changed = False
                item_id = old[0]
            else:
                inst = db.execute(
                    "SELECT bytes FROM instances WHERE account = ? AND namespace = ? AND name = ?",
                    (account, ns, name),
                ).fetchone()
                count = db.execute(
                    "SELECT count(*) FROM items WHERE account = ? AND namespace = ? AND instance = ?",
                    (account, ns, name),
                ).fetchone()[0]
                if old is None and count >= MAX_ITEMS:
                    raise AISearchError(LIMIT, f"an instance holds at most {MAX_ITEMS} items here")
                grown = len(content) - (old[2] if old else 0)
                if inst[0] + grown > MAX_INSTANCE_BYTES:
                    raise AISearchError(
                        LIMIT,
                        f"an instance holds at most {MAX_INSTANCE_BYTES // 2**20} MiB of documents here",
                    )
                item_id = old[0] if old else str(uuid.uuid4())
                if old is None:
                    db.execute(
                        "INSERT INTO items (id, account, namespace, instance, key, source_id, "
                        "content, content_type, "
                        "size, checksum, metadata, status, created, modified, last_seen, object_time) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?, ?)",
                        (
                            item_id,
                            account,
                            ns,
                            name,
                            key,
                            source_id,
                            content,
                            content_type,
                            len(content),
                            checksum,
                            json.dumps(metadata),
                            now,
                            now,
                            now,
                            object_time,
                        ),
                    )
                else:
                    db.execute(
                        "UPDATE items SET content = ?, content_type = ?, size = ?, checksum = "
                        "?, metadata = ?, "
                        "status = 'queued', error = NULL, modified = ?, last_seen = ?, "
                        "object_time = ? WHERE id = ?",
                        (
                            content,
                            content_type,
                            len(content),
                            checksum,
                            json.dumps(metadata),
                            now,
                            now,
                            object_time,
                            item_id,
                        ),
                    )
                self.store.bump(db, account, ns, name, grown)
                changed = True
            if job is not None and changed:
                db.execute("UPDATE items SET error = NULL WHERE id = ?", (item_id,))
        return self.store.item(account, ns, name, item_id), changed

    async def item_upload(
        self, account: str, ns: str, name: str, key: Any, content: Any, metadata: Any = None
    ) -> dict:
        key = self._check_key(key)
        if isinstance(content, str):
            content = content.encode()
        if not isinstance(content, bytes | bytearray | memoryview):
            raise AISearchError(INVALID, "the item's content: text or bytes")
        content = bytes(content)
        if len(content) > MAX_ITEM_BYTES:
            raise AISearchError(
                LIMIT, f"the item is {len(content)} bytes; at most {MAX_ITEM_BYTES // 2**20} MiB a document"
            )

        def work() -> dict:
            row = self._instance_row(account, ns, name)
            if row["config"].get("type") == "r2" or row["config"].get("source_dir"):
                raise AISearchError(
                    INVALID, "this instance's documents come from its source; upload to the source"
                )
            meta = self._check_metadata(metadata, row["config"].get("custom_metadata") or [])
            item, _ = self._put_item(account, ns, name, key, content, "", meta, "builtin", time.time())
            return self._item_shape(item)

        out = await self._run(account, work, lane=("upload", ns, name))
        self._nudge()
        return out

    async def item_wait(
        self, account: str, ns: str, name: str, item_id: str, timeout_s: float = 30.0
    ) -> dict:
        deadline = time.monotonic() + max(0.0, min(float(timeout_s), 300.0))
        while True:
            item = await self.item_get(account, ns, name, item_id)
            if item["status"] not in ("queued", "running") or time.monotonic() >= deadline:
                return item
            self._nudge()
            await asyncio.sleep(0.05)

    async def items(
        self,
        account: str,
        ns: str,
        name: str,
        page: Any = 1,
        per_page: Any = 20,
        key: Any = None,
        status: Any = None,
    ) -> tuple[list, int]:
        if status is not None and status not in (
            "queued",
            "running",
            "completed",
            "error",
            "skipped",
            "outdated",
        ):
            raise AISearchError(INVALID, "status: queued, running, completed, error, skipped or outdated")
        page_n = _int_arg(page, "page", 1, 1_000_000)
        per = _int_arg(per_page, "per_page", 1, PER_PAGE)

        def work() -> tuple[list, int]:
            self._instance_row(account, ns, name)
            where, args = "account = ? AND namespace = ? AND instance = ?", [account, ns, name]
            if key is not None:
                where, args = where + " AND key = ?", [*args, str(key)]
            if status is not None:
                where, args = where + " AND status = ?", [*args, status]
            total = self.store.one(f"SELECT count(*) FROM items WHERE {where}", tuple(args))[0]
            rows = self.store.execute(
                f"SELECT {ITEM_COLUMNS} FROM items WHERE {where} ORDER BY key, id LIMIT ? OFFSET ?",
                (*args, per, (page_n - 1) * per),
            )
            return [self._item_shape(item_row(r)) for r in rows], total

        return await self._run(account, work)

    def _item(self, account: str, ns: str, name: str, item_id: Any) -> dict:
        self._instance_row(account, ns, name)
        found = self.store.item(account, ns, name, str(item_id)) if isinstance(item_id, str) else None
        if found is None:
            raise AISearchError(NOT_FOUND, f"no item {str(item_id)[:80]!r} in instance {name!r}")
        return found

    async def item_get(self, account: str, ns: str, name: str, item_id: Any) -> dict:
        return await self._run(account, lambda: self._item_shape(self._item(account, ns, name, item_id)))

    async def item_download(self, account: str, ns: str, name: str, item_id: Any) -> tuple[bytes, str]:
        def work() -> tuple[bytes, str]:
            item = self._item(account, ns, name, item_id)
            from workers import markdown

            mime = item["content_type"] or markdown.mime_type_of(item["key"], None)
            return self.store.content(item["id"]) or b"", mime

        return await self._run(account, work)

    async def item_delete(self, account: str, ns: str, name: str, item_id: Any) -> dict:
        def work() -> dict:
            item = self._item(account, ns, name, item_id)
            if item["source_id"] != "builtin":
                raise AISearchError(INVALID, "this item comes from the instance's source: delete it there")
            self._drop_items(account, ns, name, [item["id"]])
            return {"id": item["id"], "key": item["key"]}

        return await self._run(account, work)

    def _drop_items(self, account: str, ns: str, name: str, ids: list[str]) -> None:
        with self.store.transaction() as db:
            for item_id in ids:
                size = db.execute("SELECT size FROM items WHERE id = ?", (item_id,)).fetchone()
                db.execute("DELETE FROM chunks WHERE item_id = ?", (item_id,))
                db.execute("DELETE FROM items WHERE id = ?", (item_id,))
                self.store.bump(db, account, ns, name, -(size[0] if size else 0))

    async def item_chunks(
        self, account: str, ns: str, name: str, item_id: Any, page: Any = 1, per_page: Any = 20
    ) -> tuple[list, int]:
        def work() -> list[dict]:
            item = self._item(account, ns, name, item_id)
            rows = self.store.execute(
                "SELECT seq, text FROM chunks WHERE item_id = ? ORDER BY seq", (item["id"],)
            )
            return [
                {"id": f"{item['id']}-{seq}", "item": {"key": item["key"]}, "text": text}
                for seq, text in rows
            ]

        return _page(await self._run(account, work), page, per_page)

    # --- sources and jobs ---------------------------------------------------------------------------

    def _source_objects(self, account: str, config: dict) -> dict[str, tuple[float, Callable[[], bytes]]]:
        """key -> (last change in s, its bytes on demand) of every object of the source."""
        params = config.get("source_params") or {}
        out: dict[str, tuple[float, Callable[[], bytes]]] = {}
        if config.get("source_dir"):
            root = Path(config["source_dir"])
            for path in sorted(root.rglob("*")):
                if path.is_file() and not any(p.startswith(".") for p in path.relative_to(root).parts):
                    key = path.relative_to(root).as_posix()
                    out[key] = (path.stat().st_mtime, path.read_bytes)
        elif config.get("type") == "r2" and self.bindings is not None:
            r2, bucket, cursor = self.bindings.store("r2"), config["source"], None
            while True:
                opts: dict[str, Any] = {"prefix": params.get("prefix") or "", "limit": 1000}
                if cursor:
                    opts["cursor"] = cursor
                listed = r2.call(account, bucket, "list", [], opts)
                for obj in listed["objects"]:
                    key = obj["key"]
                    got = lambda k=key: (r2.call(account, bucket, "get", [k], {}) or {}).get("body", b"")  # noqa: E731
                    out[key] = (float(obj.get("uploaded", 0)) / 1000.0, got)
                cursor = listed.get("cursor")
                if not listed.get("truncated") or not cursor:
                    break
        include, exclude = params.get("include_items") or [], params.get("exclude_items") or []
        return {
            k: v
            for k, v in out.items()
            if (not include or any(fnmatch.fnmatch(k, g) for g in include))
            and not any(fnmatch.fnmatch(k, g) for g in exclude)
        }

    def _sync(self, account: str, ns: str, name: str, source: str, description: str) -> dict | None:
        """New and changed objects of the instance's source queued, removed ones dropped; the job's row."""
        row = self.store.instance(account, ns, name)
        if row is None or not (row["config"].get("type") == "r2" or row["config"].get("source_dir")):
            return None
        objects = self._source_objects(account, row["config"])
        known = {
            key: (item_id, object_time)
            for key, item_id, object_time in self.store.execute(
                "SELECT key, id, object_time FROM items WHERE account = ? AND namespace = ? AND instance = ?",
                (account, ns, name),
            )
        }
        gone = [item_id for key, (item_id, _) in known.items() if key not in objects]
        fresh = [k for k, (t, _) in objects.items() if k not in known or abs(known[k][1] - t) > 1e-6]
        if not gone and not fresh and source == "schedule":
            return None
        job_id = str(uuid.uuid4())
        now = time.time()
        self.store.execute(
            "INSERT INTO jobs (id, account, namespace, instance, source, description, started, total) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (job_id, account, ns, name, source, description, now, len(objects)),
        )
        errors = skipped = 0
        for key in fresh:
            t, read = objects[key]
            content = read()
            if len(content) > MAX_ITEM_BYTES:
                errors += 1
                continue
            try:
                _, changed = self._put_item(
                    account, ns, name, key, content, "", {}, _source_id(row["config"]), t, job_id
                )
            except AISearchError:
                errors += 1
                continue
            if changed:
                self.store.execute(
                    "UPDATE items SET error = ? WHERE account = ? AND key = ? AND namespace = ? "
                    "AND instance = ?",
                    (None, account, key, ns, name),
                )
            else:
                skipped += 1
        if gone:
            self._drop_items(account, ns, name, gone)
        self.store.execute(
            "UPDATE jobs SET documents = ?, errors = ?, skipped = ?, ended = ?, end_reason = ? WHERE id = ?",
            (
                len(fresh) - errors - skipped,
                errors,
                skipped,
                time.time(),
                f"{len(fresh) - errors - skipped} queued, {len(gone)} removed, {errors} refused",
                job_id,
            ),
        )
        return self._job_shape(self.store.one(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)))

    def _job_shape(self, row: tuple) -> dict:
        job_id, source, description, started, ended, end_reason, documents, chunks, errors, skipped, total = (
            row
        )
        return {
            "id": job_id,
            "source": source,
            "description": description,
            "started_at": iso(started),
            "ended_at": iso(ended),
            "end_reason": end_reason,
            "last_seen_at": iso(ended or started),
            "documents": documents,
            "errors": errors,
            "skipped": skipped,
            "total": total,
        }

    async def jobs(
        self, account: str, ns: str, name: str, page: Any = 1, per_page: Any = 20
    ) -> tuple[list, int]:
        def work() -> list[dict]:
            self._instance_row(account, ns, name)
            rows = self.store.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE account = ? AND namespace = ? AND instance = ? "
                "ORDER BY started DESC, id",
                (account, ns, name),
            )
            return [self._job_shape(r) for r in rows]

        return _page(await self._run(account, work), page, per_page)

    async def job_create(self, account: str, ns: str, name: str, body: Any = None) -> dict:
        if body is not None and (not isinstance(body, dict) or set(body) - {"description"}):
            raise AISearchError(INVALID, "a job is {description?}: a sync of the instance's source")

        def work() -> dict:
            row = self._instance_row(account, ns, name)
            if not (row["config"].get("type") == "r2" or row["config"].get("source_dir")):
                raise AISearchError(
                    INVALID, "this instance has no source to sync: its documents are uploaded items"
                )
            return self._sync(
                account, ns, name, "user", (body or {}).get("description") or "a sync asked for"
            )

        out = await self._run(account, work)
        self._nudge()
        return out

    async def job_get(self, account: str, ns: str, name: str, job_id: Any) -> dict:
        def work() -> dict:
            self._instance_row(account, ns, name)
            row = self.store.one(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ? AND account = ? AND namespace = ? "
                "AND instance = ?",
                (str(job_id), account, ns, name),
            )
            if row is None:
                raise AISearchError(NOT_FOUND, f"no job {str(job_id)[:80]!r} in instance {name!r}")
            return self._job_shape(row)

        return await self._run(account, work)

    async def wait_indexed(self, account: str, ns: str, name: str, timeout_s: float = 60.0) -> dict:
        """Until nothing of the instance is queued or running (edge ai-search's progress, tests)."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = await self.instance_stats(account, ns, name)
            if stats["queued"] + stats["running"] == 0 or time.monotonic() >= deadline:
                return stats
            self._nudge()
            await asyncio.sleep(0.05)

    # --- the indexer ----------------------------------------------------------------------------------

    def _ensure_indexer(self) -> None:
        if self._indexer is not None and not self._indexer.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._wake = asyncio.Event()
        self._indexer = loop.create_task(self._index_loop(), name="ai-search-indexer")

    def _nudge(self) -> None:
        self._ensure_indexer()
        if self._wake is not None:
            self._wake.set()

    async def _index_loop(self) -> None:
        running: set[asyncio.Task] = set()
        last_sync = 0.0
        try:
            while True:
                if time.monotonic() - last_sync >= SYNC_S:
                    last_sync = time.monotonic()
                    await self._sync_sources()
                claimed = await asyncio.to_thread(self._claim, set(self._busy))
                for account, ns, name, item_id in claimed:
                    self._busy.add(account)
                    task = asyncio.create_task(self._index_one(account, ns, name, item_id))
                    running.add(task)
                    task.add_done_callback(running.discard)
                if not claimed:
                    assert self._wake is not None
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=SYNC_S)
        except asyncio.CancelledError:
            for task in running:
                task.cancel()
            raise

    async def _sync_sources(self) -> None:
        rows = await asyncio.to_thread(
            self.store.execute, "SELECT account, namespace, name, config FROM instances"
        )
        for account, ns, name, config in rows:
            config = json.loads(config)
            if config.get("type") == "r2" or config.get("source_dir"):
                try:
                    await self.pool.run(
                        account,
                        self._sync,
                        account,
                        ns,
                        name,
                        "schedule",
                        "a change in the source",
                        lane=("sync", ns, name),
                    )
                except Exception as exc:  # a bucket or folder gone: said, and the others go on
                    log.warning("AI Search: syncing %s/%s of %s failed: %s", ns, name, account, exc)

    def _claim(self, busy: set[str]) -> list[tuple[str, str, str, str]]:
        """The oldest queued item of each account not indexing now, marked running (a claim that
        another process, the CLI, cannot take too)."""
        out = []
        rows = self.store.execute(
            "SELECT account, min(modified) FROM items WHERE status = 'queued' GROUP BY account"
        )
        for account, _ in rows:
            if account in busy:
                continue
            row = self.store.one(
                "SELECT id, namespace, instance FROM items WHERE account = ? AND status = 'queued' "
                "ORDER BY modified, id LIMIT 1",
                (account,),
            )
            if row is None:
                continue
            with self.store.lock:
                cur = self.store.db.execute(
                    "UPDATE items SET status = 'running', modified = ? WHERE id = ? AND status = 'queued'",
                    (time.time(), row[0]),
                )
            if cur.rowcount == 1:
                out.append((account, row[1], row[2], row[0]))
        return out

    async def _index_one(self, account: str, ns: str, name: str, item_id: str) -> None:
        try:
            row = await self.pool.run(account, self.store.instance, account, ns, name)
            if row is not None:
                await self.pool.run(
                    account,
                    index_item,
                    self.store,
                    self.embedder,
                    account,
                    ns,
                    name,
                    item_id,
                    row["config"],
                    lane=("index", ns, name),
                )
        except Exception as exc:  # a bug or the disk: the item says so, the indexer goes on
            log.exception("AI Search: indexing %s failed", item_id)
            self.store.execute(
                "UPDATE items SET status = 'error', error = ? WHERE id = ? AND status = 'running'",
                (f"indexing failed: {str(exc)[:300]}", item_id),
            )
        finally:
            self._busy.discard(account)
            if self._wake is not None:
                self._wake.set()

    # --- retrieval -------------------------------------------------------------------------------------

    def _options(self, config: dict, options: dict) -> Options:
        retrieval = options.get("retrieval") or {}
        if not isinstance(retrieval, dict):
            raise AISearchError(INVALID, "ai_search_options.retrieval: an object")
        unknown = sorted(set(retrieval) - RETRIEVAL_KEYS)
        if unknown:
            raise AISearchError(
                INVALID,
                f"ai_search_options.retrieval.{unknown[0][:64]}: not an option; the options are: "
                f"{', '.join(sorted(RETRIEVAL_KEYS))}",
            )
        r = dict(retrieval)
        index_method = config.get("index_method") or {"vector": True, "keyword": True}
        default_type = (
            "hybrid"
            if index_method.get("keyword") and index_method.get("vector", True)
            else ("keyword" if index_method.get("keyword") else "vector")
        )
        kind = r.get("retrieval_type", default_type)
        if kind not in ("vector", "keyword", "hybrid"):
            raise AISearchError(
                INVALID, "ai_search_options.retrieval.retrieval_type: vector, keyword or hybrid"
            )
        if kind != "vector" and not index_method.get("keyword", True):
            raise AISearchError(
                INVALID,
                f"retrieval_type {kind!r}: this instance keeps no keyword index "
                "(index_method.keyword is false)",
            )
        cfg._float(r, "match_threshold", 0.0, 1.0)
        cfg._int(r, "max_num_results", 1, cfg.MAX_RESULTS)
        cfg._int(r, "context_expansion", 0, 3)
        cfg._choice(r, "fusion_method", ("rrf", "max"))
        cfg._choice(r, "keyword_match_mode", ("and", "or"))
        boosts = []
        for b in r.get("boost_by") or (config.get("retrieval_options") or {}).get("boost_by") or []:
            if not isinstance(b, dict) or not isinstance(b.get("field"), str):
                raise AISearchError(
                    INVALID, "ai_search_options.retrieval.boost_by: a list of {field, direction?}"
                )
            direction = b.get("direction", "desc" if b["field"] == "timestamp" else "exists")
            if direction not in ("asc", "desc", "exists", "not_exists"):
                raise AISearchError(INVALID, "boost_by.direction: asc, desc, exists or not_exists")
            boosts.append((b["field"], direction))
        reranking = options.get("reranking") or {}
        if not isinstance(reranking, dict) or set(reranking) - {"enabled", "match_threshold", "model"}:
            raise AISearchError(INVALID, "ai_search_options.reranking: {enabled?, match_threshold?, model?}")
        return Options(
            retrieval_type=kind,
            match_threshold=float(r.get("match_threshold", config.get("score_threshold", 0.0))),
            max_num_results=int(r.get("max_num_results", config.get("max_num_results", 10))),
            fusion_method=r.get("fusion_method", config.get("fusion_method", "rrf")),
            keyword_match_mode=r.get(
                "keyword_match_mode", (config.get("retrieval_options") or {}).get("keyword_match_mode", "and")
            ),
            context_expansion=int(r.get("context_expansion", 0)),
            boost_by=tuple(boosts),
            rerank=bool(reranking.get("enabled", config.get("reranking", False))),
            rerank_threshold=float(reranking.get("match_threshold", 0.0)),
            filter=compile_filter(r.get("filters")),
        )

    def _retrieve(
        self, account: str, ns: str, name: str, query: str, options: dict
    ) -> tuple[list[dict], Options]:
        row = self._instance_row(account, ns, name)
        opts = self._options(row["config"], options)
        vector = self.embedder.embed([query])[0]
        loaded = self.retriever.loaded(account, ns, name, row["version"], self.embedder.dimensions)
        hits = self.retriever.search((account, ns, name), loaded, query, vector, opts)
        texts = self._texts([h.rowid for h in hits])
        if opts.rerank and hits:
            vectors = {h.rowid: loaded.vectors[loaded.row_of[h.rowid]] for h in hits}
            rerank(hits, query, vector, {r: t for r, (t, _, _) in texts.items()}, vectors)
            hits = [h for h in hits if (h.reranking_score or 0.0) >= opts.rerank_threshold]
            hits.sort(key=lambda h: (-h.score, h.rowid))
            hits = hits[: opts.max_num_results]
        return [self._chunk_shape(h, texts, loaded, opts) for h in hits], opts

    def _texts(self, rowids: list[int]) -> dict[int, tuple[str, str, int]]:
        if not rowids:
            return {}
        marks = ",".join("?" * len(rowids))
        rows = self.store.execute(
            f"SELECT rowid, text, item_id, seq FROM chunks WHERE rowid IN ({marks})", tuple(rowids)
        )
        return {r: (t, i, s) for r, t, i, s in rows}

    def _chunk_shape(self, hit: Hit, texts: dict, loaded: Any, opts: Options) -> dict:
        text, item_id, seq = texts.get(hit.rowid, ("", hit.item_id, 0))
        if opts.context_expansion:
            around = self.store.execute(
                "SELECT text FROM chunks WHERE item_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
                (item_id, seq - opts.context_expansion, seq + opts.context_expansion),
            )
            text = "\n\n".join(t for (t,) in around)
        attrs = loaded.item_attrs.get(item_id, {})
        metadata = {k: v for k, v in attrs.items() if k not in ("filename", "folder", "timestamp")}
        details: dict[str, Any] = {"vector_score": hit.vector_score, "vector_rank": hit.vector_rank}
        if hit.keyword_score is not None:
            details.update(keyword_score=hit.keyword_score, keyword_rank=hit.keyword_rank)
        if opts.retrieval_type == "hybrid":
            details["fusion_method"] = opts.fusion_method
        if hit.reranking_score is not None:
            details["reranking_score"] = hit.reranking_score
        return {
            "id": f"{item_id}-{seq}",
            "type": "text",
            "score": round(float(hit.score), 6),
            "text": text,
            "item": {
                "key": attrs.get("filename"),
                "timestamp": attrs.get("timestamp", 0) / 1000.0,
                "metadata": metadata,
            },
            "scoring_details": details,
        }

    def _check_body(self, body: Any, extra: set[str]) -> tuple[str, dict]:
        if not isinstance(body, dict):
            raise AISearchError(INVALID, "the body is {query | messages, ai_search_options?}")
        unknown = sorted(set(body) - {"query", "messages", "ai_search_options"} - extra)
        if unknown:
            raise AISearchError(
                INVALID,
                f"{unknown[0][:64]}: not a parameter; send query or messages, and ai_search_options"
                + (f" ({', '.join(sorted(extra))})" if extra else ""),
            )
        query = query_of(body)
        options = body.get("ai_search_options") or {}
        if not isinstance(options, dict):
            raise AISearchError(INVALID, "ai_search_options: an object")
        bad = sorted(set(options) - OPTION_KEYS)
        if bad:
            raise AISearchError(
                INVALID,
                f"ai_search_options.{bad[0][:64]}: not an option; the options are: "
                f"{', '.join(sorted(OPTION_KEYS))}",
            )
        return query, options

    async def _rewritten(
        self,
        account: str,
        ns: str,
        instances: list[str],
        query: str,
        options: dict,
        generate: Generate | None,
    ) -> str:
        rewrite = options.get("query_rewrite") or {}
        if not isinstance(rewrite, dict) or set(rewrite) - {"enabled", "model", "rewrite_prompt"}:
            raise AISearchError(
                INVALID, "ai_search_options.query_rewrite: {enabled?, model?, rewrite_prompt?}"
            )
        row = await self._run(account, self._instance_row, account, ns, instances[0])
        config = row["config"]
        if not rewrite.get("enabled", config.get("rewrite_query", False)) or generate is None:
            return query
        model = (
            rewrite.get("model")
            or config.get("rewrite_model")
            or config.get("ai_search_model")
            or cfg.DEFAULT_MODEL
        )
        prompt = rewrite.get("rewrite_prompt") or config.get("system_prompt_rewrite_query")
        try:
            answer = await generate(model, {"messages": rewrite_messages(query, prompt), "max_tokens": 64})
        except Exception as exc:
            raise AISearchError(GENERATION, f"query rewrite with {model}: {str(exc)[:300]}") from None
        rewritten = str((answer or {}).get("response") or "").strip()
        # searched beside the original: a miniature's rewrite can lose what the user asked
        return f"{query}\n{rewritten}" if rewritten and rewritten != query else query

    async def search(
        self,
        account: str,
        ns: str,
        instance_ids: list[str],
        body: Any,
        generate: Generate | None = None,
        extra: set[str] = frozenset(),
    ) -> dict:
        query, options = self._check_body(body, set(extra))
        names = self._instance_ids(options, instance_ids)
        search_query = await self._rewritten(account, ns, names, query, options, generate)
        results: list[dict] = []
        limit = 0
        for name in names:
            chunks, opts = await self._run(
                account, self._retrieve, account, ns, name, search_query, options, lane=("search", ns)
            )
            limit = max(limit, opts.max_num_results)
            for chunk in chunks:
                if len(names) > 1:
                    chunk["instance_id"] = name
                results.append(chunk)
        results.sort(key=lambda c: -c["score"])
        return {"search_query": search_query, "chunks": results[:limit], "query_kind": "text"}

    @staticmethod
    def _instance_ids(options: dict, given: list[str]) -> list[str]:
        ids = options.get("instance_ids")
        if ids is None:
            ids = given
        if (
            not isinstance(ids, list)
            or not ids
            or len(ids) > MAX_INSTANCE_IDS
            or not all(isinstance(i, str) for i in ids)
        ):
            raise AISearchError(
                INVALID, f"ai_search_options.instance_ids: a list of 1 to {MAX_INSTANCE_IDS} instance names"
            )
        if given and ids != given and not set(ids) <= set(given) and len(given) == 1:
            raise AISearchError(INVALID, "instance_ids are given to a namespace's search, not an instance's")
        return list(dict.fromkeys(ids))

    async def chat_completions(
        self, account: str, ns: str, instance_ids: list[str], body: Any, generate: Generate
    ) -> dict | AsyncIterator[bytes]:
        query, options = self._check_body(body, GENERATION_OPTIONS)
        names = self._instance_ids(options, instance_ids)
        found = await self.search(
            account,
            ns,
            names,
            {k: v for k, v in body.items() if k in ("query", "messages", "ai_search_options")},
            generate,
        )
        row = await self._run(account, self._instance_row, account, ns, names[0])
        config = row["config"]
        model = body.get("model") or config.get("ai_search_model") or cfg.DEFAULT_MODEL
        if not isinstance(model, str):
            raise AISearchError(INVALID, "model: a model name")
        messages = answer_messages(body, found["chunks"], config.get("system_prompt_ai_search"))
        inputs = {"messages": messages, **{k: body[k] for k in GENERATION_OPTIONS - {"model"} if k in body}}
        try:
            answer = await generate(model, inputs)
        except AISearchError:
            raise
        except Exception as exc:
            raise AISearchError(GENERATION, f"{model}: {str(exc)[:300]}") from None
        if body.get("stream"):
            return stream_chat(answer, model, found["chunks"])
        return chat_completion(answer, model, found["chunks"])

    # --- the legacy env.AI.autorag(name) -------------------------------------------------------------------

    def _legacy_body(self, body: Any, generation: bool) -> dict:
        allowed = {
            "query",
            "rewrite_query",
            "max_num_results",
            "ranking_options",
            "reranking",
            "filters",
            "stream",
        }
        if generation:
            allowed |= {"model", "system_prompt"}
        if not isinstance(body, dict) or not isinstance(body.get("query"), str) or not body["query"].strip():
            raise AISearchError(INVALID, "query: the question, a non-empty string")
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise AISearchError(
                INVALID,
                f"{unknown[0][:64]}: not a parameter; the parameters are: {', '.join(sorted(allowed))}",
            )
        ranking = body.get("ranking_options") or {}
        if not isinstance(ranking, dict) or set(ranking) - {"score_threshold", "ranker"}:
            raise AISearchError(INVALID, "ranking_options: {score_threshold?, ranker?}")
        retrieval: dict[str, Any] = {"max_num_results": body.get("max_num_results", 10)}
        if "score_threshold" in ranking:
            retrieval["match_threshold"] = ranking["score_threshold"]
        if body.get("filters") is not None:
            retrieval["filters"] = body["filters"]
        options: dict[str, Any] = {
            "retrieval": retrieval,
            "query_rewrite": {"enabled": bool(body.get("rewrite_query", False))},
        }
        if body.get("reranking") is not None:
            options["reranking"] = body["reranking"]
        return {"query": body["query"], "ai_search_options": options}

    async def autorag_search(
        self, account: str, name: str, body: Any, generate: Generate | None = None
    ) -> dict:
        found = await self.search(
            account, DEFAULT_NAMESPACE, [name], self._legacy_body(body, False), generate
        )
        return legacy_page(found)

    async def autorag_ai_search(
        self, account: str, name: str, body: Any, generate: Generate
    ) -> dict | AsyncIterator[bytes]:
        request = self._legacy_body(body, True)
        found = await self.search(account, DEFAULT_NAMESPACE, [name], request, generate)
        row = await self._run(account, self._instance_row, account, DEFAULT_NAMESPACE, name)
        model = body.get("model") or row["config"].get("ai_search_model") or cfg.DEFAULT_MODEL
        prompt = body.get("system_prompt") or row["config"].get("system_prompt_ai_search")
        messages = answer_messages({"query": body["query"]}, found["chunks"], prompt)
        inputs: dict[str, Any] = {"messages": messages}
        if body.get("stream"):
            inputs["stream"] = True
        try:
            answer = await generate(model, inputs)
        except Exception as exc:
            raise AISearchError(GENERATION, f"{model}: {str(exc)[:300]}") from None
        if body.get("stream"):
            return stream_legacy(answer)
        return {**legacy_page(found), "response": str((answer or {}).get("response") or "")}


JOB_COLUMNS = "id, source, description, started, ended, end_reason, documents, chunks, errors, skipped, total"


def _source_id(config: dict) -> str:
    if config.get("source_dir"):
        return "dir:" + Path(config["source_dir"]).name
    return f"r2:{config.get('source')}"


def unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm else vector
