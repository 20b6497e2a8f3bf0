"""AI Search's documents: items uploaded or read from a source (an R2 bucket of the project, a
folder named in wrangler-like.toml), their indexing jobs, and the background indexer that claims
queued items one per account at a time and indexes them in the service's fair pool
(runtime.ai.search.indexing). Mixed into runtime.ai.search.service.AISearch, whose store, pool and
instance lookups it uses.

Stated caps (local): MAX_ITEMS items and MAX_INSTANCE_BYTES of documents per instance,
MAX_ITEM_BYTES a document, indexing.MAX_CHUNKS chunks per instance; a cap reached is code 7004.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.ai.search import settings as cfg
from runtime.ai.search.common import PER_PAGE, int_arg, iso, page_of
from runtime.ai.search.embedder import Embedder
from runtime.ai.search.errors import EXISTS, INVALID, LIMIT, NOT_FOUND, AISearchError
from runtime.ai.search.indexing import index_item
from runtime.ai.search.store import ITEM_COLUMNS, SearchStore, item_row
from runtime.control.fair_pool import RUNTIME, FairPool

log = logging.getLogger("edge.ai_search")


MAX_ITEMS = 10_000
MAX_ITEM_BYTES = 4 * 1024 * 1024
MAX_INSTANCE_BYTES = 256 * 1024 * 1024
MAX_KEY = 1024
SYNC_S = 3.0  # an R2 or folder source is compared with its items this often
OTHER_PROCESS_S = 0.5  # a waiter looks again this often when another process may be indexing
STALE_RUNNING_S = 120.0  # an item 'running' this long was left by a process that ended
JOB_COLUMNS = "id, source, description, started, ended, end_reason, documents, chunks, errors, skipped, total"


class Documents:
    """Items, sources, jobs and the indexer (the state is AISearch's: store, pool, embedder)."""

    store: SearchStore
    pool: FairPool
    embedder: Embedder
    bindings: Any
    _indexer: asyncio.Task | None
    _wake: asyncio.Event | None
    _moved: asyncio.Event | None
    _busy: set[str]

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
                db.execute(
                    "UPDATE items SET last_seen = ?, object_time = ? WHERE id = ?", (now, object_time, old[0])
                )
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
                        "UPDATE items SET content = ?, content_type = ?, size = ?, checksum = ?, "
                        "metadata = ?, status = 'queued', error = NULL, modified = ?, last_seen = ?, "
                        "object_time = ?, source_id = ? WHERE id = ?",
                        (
                            content,
                            content_type,
                            len(content),
                            checksum,
                            json.dumps(metadata),
                            now,
                            now,
                            object_time,
                            source_id,
                            item_id,
                        ),
                    )
                self.store.bump(db, account, ns, name, grown)
                changed = True
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
            held = self.store.item_by_key(account, ns, name, key)
            if held is not None and held["source_id"] != "builtin":  # the source's copy wins its name
                raise AISearchError(
                    EXISTS,
                    f"{key!r} is a document of the instance's source ({held['source_id']}); "
                    "upload under another name, or change it in the source",
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
            await self._indexing_moved(deadline)

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
        page_n = int_arg(page, "page", 1, 1_000_000)
        per = int_arg(per_page, "per_page", 1, PER_PAGE)

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

        return page_of(await self._run(account, work), page, per_page)

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
                "SELECT key, id, object_time FROM items WHERE account = ? AND namespace = ? AND instance = ? "
                "AND source_id = ?",
                (account, ns, name, _source_id(row["config"])),
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
        source_id = _source_id(row["config"])
        for key in fresh:
            t, read = objects[key]
            content = read()
            try:
                if len(content) > MAX_ITEM_BYTES:
                    raise AISearchError(
                        LIMIT, f"{len(content)} bytes; at most {MAX_ITEM_BYTES // 2**20} MiB a document"
                    )
                _, changed = self._put_item(account, ns, name, key, content, "", {}, source_id, t)
            except AISearchError as exc:  # said on the item, and the others go on
                self._refused_item(account, ns, name, key, source_id, t, exc.message)
                errors += 1
                continue
            skipped += 0 if changed else 1
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

    def _refused_item(
        self, account: str, ns: str, name: str, key: str, source_id: str, object_time: float, why: str
    ) -> None:
        """An object of the source that cannot be taken (too big, a cap): an item in `error` with
        the reason, its old chunks gone, so that stats and the dashboard say so."""
        now = time.time()
        with self.store.transaction() as db:
            old = db.execute(
                "SELECT id FROM items WHERE account = ? AND namespace = ? AND instance = ? AND key = ?",
                (account, ns, name, key),
            ).fetchone()
            if old is not None:
                db.execute("DELETE FROM chunks WHERE item_id = ?", (old[0],))
                db.execute(
                    "UPDATE items SET status = 'error', error = ?, modified = ?, object_time = ?, "
                    "chunks_count = NULL WHERE id = ?",
                    (why, now, object_time, old[0]),
                )
            else:
                db.execute(
                    "INSERT INTO items (id, account, namespace, instance, key, source_id, content, "
                    "content_type, size, checksum, metadata, status, error, created, modified, last_seen, "
                    "object_time) "
                    "VALUES (?, ?, ?, ?, ?, ?, x'', '', 0, '', '{}', 'error', ?, ?, ?, ?, ?)",
                    (str(uuid.uuid4()), account, ns, name, key, source_id, why, now, now, now, object_time),
                )
            self.store.bump(db, account, ns, name)

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

        return page_of(await self._run(account, work), page, per_page)

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
            await self._indexing_moved(deadline)

    async def _indexing_moved(self, deadline: float) -> None:
        """Until this process finishes indexing an item (or OTHER_PROCESS_S passes: another
        process, the CLI or edge dev, may be the one indexing), at most until `deadline`."""
        self._nudge()
        assert self._moved is not None
        wait = max(0.0, min(OTHER_PROCESS_S, deadline - time.monotonic()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._moved.wait()

    # --- the indexer ----------------------------------------------------------------------------------

    def _ensure_indexer(self) -> None:
        if self._indexer is not None and not self._indexer.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._wake, self._moved = asyncio.Event(), asyncio.Event()
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
                claimed = await self.pool.run(RUNTIME, self._claim, set(self._busy))
                for account, ns, name, item_id in claimed:
                    self._busy.add(account)
                    task = asyncio.create_task(self._index_one(account, ns, name, item_id))
                    running.add(task)
                    task.add_done_callback(running.discard)
                if not claimed:
                    assert self._wake is not None
                    self._wake.clear()
                    # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that
                    # lands as the event is set, and the loop would then never stop
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(SYNC_S):
                            await self._wake.wait()
        except asyncio.CancelledError:
            for task in running:
                task.cancel()
            raise

    async def _sync_sources(self) -> None:
        rows = await self.pool.run(
            RUNTIME, self.store.execute, "SELECT account, namespace, name, config FROM instances"
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
                    self.embedder_of(row),
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
            if self._moved is not None:  # the waiters (item_wait, wait_indexed) look again
                self._moved.set()
                self._moved = asyncio.Event()


def _source_id(config: dict) -> str:
    if config.get("source_dir"):
        return "dir:" + Path(config["source_dir"]).name
    return f"r2:{config.get('source')}"
