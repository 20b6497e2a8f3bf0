"""The worker binding's side of AI Search: what `env.AI_SEARCH` (a namespace binding), `env.DOCS`
(an instance binding) and the legacy `env.AI.autorag(name)` call in the isolate (workers.ai_search),
as method names and arguments, turned into calls of the AI Search service (runtime.ai.search.service).

Everything the isolate sends is checked here (its types and shapes; the options themselves are the
service's to check) and nothing it sends picks the account or the namespace: the worker host gives
the account (the worker's) and the Scope its binding stands for. A namespace binding reaches every
instance of its namespace and nothing else; an instance binding its one instance of the account's
"default" namespace. The service's errors come back as Cloudflare's binding raises them: an error
named AiSearchNotFoundError (a 404) or AiSearchInternalError (AutoRAG... for env.AI.autorag) whose
message is "code: message".

A streamed answer (chatCompletions or aiSearch with `stream: true`) is returned as the service's
async iterator of SSE bytes, guarded so that a failure mid-stream ends it as an AIError, which the
host sends as the stream's last message (as env.AI.run's streams end).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

from runtime.ai.search.common import DEFAULT_NAMESPACE, Generate
from runtime.ai.search.errors import EXISTS, GENERATION, NOT_FOUND, AISearchError
from workers import AIError

NAME_CHARS = 256  # an instance's, an item's or a job's id, as it may cross (the service checks the rest)
PAGES = 1_000_000  # a page number or size as it may cross (the service states its own limits)
CHUNK_PAGE = 50  # an item's chunks are read from the service in pages of this many
MAX_INSTANCE_IDS = 10  # a namespace's search or chat completions spans 1 to 10 instances
POLL_TIMEOUT_MS = 30_000  # uploadAndPoll's default wait, as Cloudflare's
MAX_POLL_TIMEOUT_MS = 300_000  # ... and the longest asked for here (the request's wall clock is shorter)
PART_BYTES = 1024 * 1024  # one part of an upload larger than one call may carry (workers.ai_search's)
STAGED_BYTES = 8 * 1024 * 1024  # parts one request may hold before the upload that names them
STAGED_UPLOADS = 8  # ... in at most this many uploads at once
LEGACY_LIST_PAGE = 50  # env.AI.autorag().list(): instances fetched a page at a time


class Scope(NamedTuple):
    """What a binding reaches: a namespace, and within it every instance (instance None: a
    namespace binding) or one (an instance binding)."""

    namespace: str
    instance: str | None = None


class Refused(Exception):
    """A call refused or failed, as the worker's exception names it (`type`: "TypeError",
    "AiSearchNotFoundError", "AiSearchInternalError", "AutoRAGNotFoundError", ...)."""

    def __init__(self, type: str, message: str):  # noqa: A002 - the name the wire carries
        super().__init__(message)
        self.type = type


def _error(exc: AISearchError, legacy: bool) -> Refused:
    prefix = "AutoRAG" if legacy else "AiSearch"
    name = f"{prefix}NotFoundError" if exc.code == NOT_FOUND else f"{prefix}InternalError"
    return Refused(name, f"{exc.code}: {exc.message}")


def _generation_error(exc: AIError, legacy: bool) -> Refused:
    prefix = "AutoRAG" if legacy else "AiSearch"
    return Refused(f"{prefix}InternalError", f"{GENERATION}: the answer's model failed: {exc}")


# --- argument checks (the isolate is hostile: every value is checked before use) ------------------


def _refuse(message: str) -> Refused:
    return Refused("TypeError", message)


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > NAME_CHARS:
        raise _refuse(
            f"{what} must be a non-empty string of at most {NAME_CHARS} characters, got {value!r:.80}"
        )
    return value


def _dict(value: Any, what: str, optional: bool = False) -> dict[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _refuse(f"{what} must be a dict (an object), got {type(value).__name__}")
    return value


def _only(params: dict[str, Any], allowed: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise _refuse(
            f"{what}: {', '.join(map(repr, unknown))} not accepted here; "
            f"the options are {', '.join(allowed) or 'none'}"
        )


def _int(params: dict[str, Any], key: str, default: int | None, low: int, high: int, what: str) -> int | None:
    value = params.get(key, default)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _refuse(f"{what}: {key} must be an integer from {low} to {high}, got {value!r:.40}")
    return value


def _args(args: list, low: int, high: int, what: str) -> list:
    if not low <= len(args) <= high:
        counted = f"{low}" if low == high else f"{low} to {high}"
        raise _refuse(f"{what} takes {counted} argument(s), got {len(args)}")
    return [*args, *[None] * (high - len(args))]


def _page(result: tuple[list, int], page: int, per_page: int) -> dict[str, Any]:
    rows, total = result
    return {
        "result": rows,
        "result_info": {"count": len(rows), "page": page, "per_page": per_page, "total_count": total},
    }


def _instance_ids(params: dict[str, Any], what: str) -> tuple[list[str], dict[str, Any]]:
    """A namespace call's `ai_search_options.instance_ids` (1 to 10 names), and the body without them."""
    options = params.get("ai_search_options")
    ids = options.get("instance_ids") if isinstance(options, dict) else None
    if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_INSTANCE_IDS:
        raise _refuse(
            f"{what}: ai_search_options.instance_ids must list 1 to {MAX_INSTANCE_IDS} instances of this "
            "namespace, as {'ai_search_options': {'instance_ids': ['docs', 'blog']}}"
        )
    names = [_name(i, f"{what}: ai_search_options.instance_ids[{n}]") for n, i in enumerate(ids)]
    body = copy.deepcopy(params)
    del body["ai_search_options"]["instance_ids"]
    return list(dict.fromkeys(names)), body


def _one_instance(params: dict[str, Any], what: str) -> dict[str, Any]:
    """An instance's search or chat completions: `instance_ids` belong to a namespace's."""
    options = params.get("ai_search_options")
    if isinstance(options, dict) and "instance_ids" in options:
        raise _refuse(
            f"{what}: ai_search_options.instance_ids are a namespace binding's (env.AI_SEARCH.search); "
            "an instance searches itself"
        )
    return params


async def guarded(stream: AsyncIterator[bytes], legacy: bool = False) -> AsyncIterator[bytes]:
    """A streamed answer's SSE bytes; a failure mid-stream ends it as an AIError (its code and
    message), which the host sends as the stream's end. Closed (the worker stopped reading, its
    request ended), the service's stream is closed with it."""
    try:
        async for data in stream:
            yield data
    except AISearchError as exc:
        raise AIError(exc.code, exc.message) from None
    finally:
        if hasattr(stream, "aclose"):
            await stream.aclose()


# --- the calls ------------------------------------------------------------------------------------


class Staging:
    """The parts of items.upload calls too large for one call from the isolate (ipc.FROM_ISOLATE),
    sent ahead ("items.part") and held here, per request, until the upload that names them takes
    them; a request's parts go when it ends (dropped at the next part sent by any request)."""

    def __init__(self, limit: int = STAGED_BYTES):
        self.limit = limit
        self._held: dict[tuple[int, str], bytearray] = {}

    def add(self, request: int, live: Any, token: str, data: bytes) -> int:
        for key in [k for k in self._held if k[0] not in live]:  # their requests have ended
            del self._held[key]
        mine = [k for k in self._held if k[0] == request]
        if (request, token) not in self._held and len(mine) >= STAGED_UPLOADS:
            raise _refuse(f"items.upload: at most {STAGED_UPLOADS} large uploads at once in one request")
        if sum(len(self._held[k]) for k in mine) + len(data) > self.limit:
            raise Refused(
                "AiSearchInternalError",
                f"7004: a request holds at most {self.limit // 2**20} MiB of uploads in parts at once",
            )
        held = self._held.setdefault((request, token), bytearray())
        held += data
        return len(held)

    def take(self, request: int, token: Any) -> bytes:
        held = self._held.pop((request, token), None) if isinstance(token, str) else None
        if held is None:
            raise _refuse("items.upload: no parts were sent for this upload in this request")
        return bytes(held)


class Staged(NamedTuple):
    """One request's view of the worker's Staging: `live`, the requests still in flight."""

    staging: Staging
    request: int
    live: Any

    def add(self, token: str, data: bytes) -> int:
        return self.staging.add(self.request, self.live, token, data)

    def take(self, token: Any) -> bytes:
        return self.staging.take(self.request, token)


class SearchCall:
    """One call of an AI Search binding: `account` (the worker's), `scope` (its binding's),
    `generate` (its request's generation, routed and counted as env.AI.run)."""

    def __init__(
        self,
        service: Any,
        account: str,
        scope: Scope,
        generate: Generate | None,
        staged: Staged | None = None,
    ):
        self.service, self.account, self.scope, self.generate = service, account, scope, generate
        self.staged = staged

    def _instance(self, given: Any, what: str) -> str:
        """The instance a call names: an instance binding's own (it can name no other), or the one
        a namespace binding's handle was got for."""
        if self.scope.instance is not None:
            if given is not None and given != self.scope.instance:
                raise _refuse(f"{what}: this binding reaches instance {self.scope.instance!r} only")
            return self.scope.instance
        return _name(given, f"{what}: the instance name")

    def _namespace_only(self, what: str) -> None:
        if self.scope.instance is not None:
            raise _refuse(f"{what} is a namespace binding's method ([[ai_search_namespaces]])")

    # namespace binding: env.AI_SEARCH.list / create / delete / search / chatCompletions

    async def list(self, params: Any = None) -> dict[str, Any]:
        self._namespace_only("list")
        params = _dict(params, "list(params)", optional=True)
        _only(params, ("page", "per_page"), "list(params)")
        page = _int(params, "page", 1, 1, PAGES, "list(params)")
        per_page = _int(params, "per_page", 20, 1, PAGES, "list(params)")
        found = await self.service.instances(self.account, self.scope.namespace, page, per_page)
        return _page(found, page, per_page)

    async def create(self, config: Any) -> dict[str, Any]:
        self._namespace_only("create")
        config = _dict(config, "create(config)")
        _name(config.get("id"), "create(config): id")
        return await self.service.instance_create(self.account, self.scope.namespace, config)

    async def delete(self, name: Any) -> None:
        self._namespace_only("delete")
        await self.service.instance_delete(self.account, self.scope.namespace, _name(name, "delete(name)"))
        return None

    async def search(self, params: Any) -> dict[str, Any]:
        self._namespace_only("search")
        ids, body = _instance_ids(_dict(params, "search(params)"), "search(params)")
        return await self.service.search(self.account, self.scope.namespace, ids, body, self.generate)

    async def chatCompletions(self, params: Any) -> Any:  # noqa: N802 - Cloudflare's name
        self._namespace_only("chatCompletions")
        ids, body = _instance_ids(_dict(params, "chatCompletions(params)"), "chatCompletions(params)")
        return await self.service.chat_completions(
            self.account, self.scope.namespace, ids, body, self.generate
        )

    # an instance: get(name) of a namespace binding, or an instance binding

    async def instance_search(self, name: Any, params: Any) -> dict[str, Any]:
        instance = self._instance(name, "search")
        body = _one_instance(_dict(params, "search(params)"), "search(params)")
        return await self.service.search(self.account, self.scope.namespace, [instance], body, self.generate)

    async def instance_chatCompletions(self, name: Any, params: Any) -> Any:  # noqa: N802
        instance = self._instance(name, "chatCompletions")
        body = _one_instance(_dict(params, "chatCompletions(params)"), "chatCompletions(params)")
        return await self.service.chat_completions(
            self.account, self.scope.namespace, [instance], body, self.generate
        )

    async def instance_info(self, name: Any) -> dict[str, Any]:
        return await self.service.instance_get(
            self.account, self.scope.namespace, self._instance(name, "info")
        )

    async def instance_stats(self, name: Any) -> dict[str, Any]:
        instance = self._instance(name, "stats")
        return await self.service.instance_stats(self.account, self.scope.namespace, instance)

    async def instance_update(self, name: Any, config: Any) -> dict[str, Any]:
        instance = self._instance(name, "update")
        config = _dict(config, "update(config)")
        return await self.service.instance_update(self.account, self.scope.namespace, instance, config)

    # an instance's items

    async def items_list(self, name: Any, params: Any = None) -> dict[str, Any]:
        instance = self._instance(name, "items.list")
        params = _dict(params, "items.list(params)", optional=True)
        _only(params, ("page", "per_page", "status"), "items.list(params)")
        page = _int(params, "page", 1, 1, PAGES, "items.list(params)")
        per_page = _int(params, "per_page", 25, 1, PAGES, "items.list(params)")
        status = params.get("status")
        if status is not None and not isinstance(status, str):
            raise _refuse("items.list(params): status must be a string (queued, running, completed, ...)")
        found = await self.service.items(
            self.account, self.scope.namespace, instance, page, per_page, status=status
        )
        return _page(found, page, per_page)

    async def _upload(self, name: Any, key: Any, content: Any, options: Any, what: str) -> tuple:
        instance = self._instance(name, what)
        key = _name(key, f"{what}(name)")
        if isinstance(content, dict) and set(content) == {"staged"} and self.staged is not None:
            content = self.staged.take(content["staged"])  # sent ahead in parts (items.part)
        if isinstance(content, str):
            content = content.encode("utf-8")
        if not isinstance(content, bytes):
            raise _refuse(f"{what}(name, content): content must be str, bytes, a Blob or a stream")
        options = _dict(options, f"{what}(name, content, options)", optional=True)
        metadata = options.get("metadata")
        if metadata is not None:
            _dict(metadata, f"{what}: options.metadata")
        item = await self.service.item_upload(
            self.account, self.scope.namespace, instance, key, content, metadata
        )
        return instance, options, item

    async def items_upload(self, name: Any, key: Any, content: Any, options: Any = None) -> dict[str, Any]:
        if isinstance(options, dict):
            _only(options, ("metadata",), "items.upload(name, content, options)")
        return (await self._upload(name, key, content, options, "items.upload"))[2]

    async def items_uploadAndPoll(  # noqa: N802 - Cloudflare's name
        self, name: Any, key: Any, content: Any, options: Any = None
    ) -> dict[str, Any]:
        what = "items.uploadAndPoll"
        if isinstance(options, dict):
            _only(options, ("metadata", "pollIntervalMs", "timeoutMs"), f"{what}(name, content, options)")
            _int(options, "pollIntervalMs", None, 1, MAX_POLL_TIMEOUT_MS, f"{what}(options)")  # checked only:
            # the service wakes at the item's end rather than polling
        instance, options, item = await self._upload(name, key, content, options, what)
        timeout_ms = _int(options, "timeoutMs", POLL_TIMEOUT_MS, 1, MAX_POLL_TIMEOUT_MS, f"{what}(options)")
        return await self.service.item_wait(
            self.account, self.scope.namespace, instance, item["id"], timeout_s=timeout_ms / 1000
        )

    async def items_part(self, name: Any, token: Any, data: Any) -> dict[str, Any]:
        """A part of an upload too large for one call, held until the upload names it."""
        self._instance(name, "items.upload")
        token = _name(token, "items.upload: the upload's token")
        if not isinstance(data, bytes) or not 0 < len(data) <= PART_BYTES:
            raise _refuse(f"items.upload: a part is 1 to {PART_BYTES} bytes")
        if self.staged is None:
            raise _refuse("items.upload: parts are not taken here")
        return {"staged": self.staged.add(token, data)}

    async def items_delete(self, name: Any, item_id: Any) -> None:
        instance = self._instance(name, "items.delete")
        await self.service.item_delete(
            self.account, self.scope.namespace, instance, _name(item_id, "items.delete(itemId)")
        )
        return None

    async def item_info(self, name: Any, item_id: Any) -> dict[str, Any]:
        instance = self._instance(name, "items.get(itemId).info")
        item_id = _name(item_id, "items.get(itemId)")
        return await self.service.item_get(self.account, self.scope.namespace, instance, item_id)

    async def item_download(self, name: Any, item_id: Any) -> dict[str, Any]:
        """{filename, contentType, size, body (bytes: the isolate makes it a stream)}."""
        instance = self._instance(name, "items.get(itemId).download")
        item_id = _name(item_id, "items.get(itemId)")
        ns = self.scope.namespace
        item = await self.service.item_get(self.account, ns, instance, item_id)
        body, content_type = await self.service.item_download(self.account, ns, instance, item_id)
        return {
            "filename": item.get("key", item_id),
            "contentType": content_type,
            "size": len(body),
            "body": body,
        }

    async def item_chunks(self, name: Any, item_id: Any, params: Any = None) -> dict[str, Any]:
        """An item's chunks, `limit` (1-100, default 20) from `offset` (default 0), as workerd's."""
        instance = self._instance(name, "items.get(itemId).chunks")
        item_id = _name(item_id, "items.get(itemId)")
        params = _dict(params, "chunks(params)", optional=True)
        _only(params, ("limit", "offset"), "chunks(params)")
        limit = _int(params, "limit", 20, 1, 100, "chunks(params)")
        offset = _int(params, "offset", 0, 0, 10_000_000, "chunks(params)")
        ns, rows, total = self.scope.namespace, [], 0
        first, last = offset // CHUNK_PAGE + 1, (offset + limit - 1) // CHUNK_PAGE + 1
        for page in range(first, last + 1):  # the service's pages that hold the window
            found, total = await self.service.item_chunks(
                self.account, ns, instance, item_id, page, CHUNK_PAGE
            )
            rows += found
            if len(found) < CHUNK_PAGE:
                break
        start = offset - (first - 1) * CHUNK_PAGE
        rows = rows[start : start + limit]
        return {
            "result": rows,
            "result_info": {"count": len(rows), "total": total, "limit": limit, "offset": offset},
        }

    # an instance's jobs

    async def jobs_list(self, name: Any, params: Any = None) -> dict[str, Any]:
        instance = self._instance(name, "jobs.list")
        params = _dict(params, "jobs.list(params)", optional=True)
        _only(params, ("page", "per_page"), "jobs.list(params)")
        page = _int(params, "page", 1, 1, PAGES, "jobs.list(params)")
        per_page = _int(params, "per_page", 20, 1, PAGES, "jobs.list(params)")
        found = await self.service.jobs(self.account, self.scope.namespace, instance, page, per_page)
        return _page(found, page, per_page)

    async def jobs_create(self, name: Any, params: Any = None) -> dict[str, Any]:
        instance = self._instance(name, "jobs.create")
        params = _dict(params, "jobs.create(params)", optional=True)
        _only(params, ("description",), "jobs.create(params)")
        return await self.service.job_create(self.account, self.scope.namespace, instance, params or None)

    async def job_info(self, name: Any, job_id: Any) -> dict[str, Any]:
        instance = self._instance(name, "jobs.get(jobId).info")
        job_id = _name(job_id, "jobs.get(jobId)")
        return await self.service.job_get(self.account, self.scope.namespace, instance, job_id)


# the wire's method names (workers.ai_search sends them) -> SearchCall's method, its arity
METHODS: dict[str, tuple[str, int, int]] = {
    "list": ("list", 0, 1),
    "create": ("create", 1, 1),
    "delete": ("delete", 1, 1),
    "search": ("search", 1, 1),
    "chatCompletions": ("chatCompletions", 1, 1),
    "instance.search": ("instance_search", 2, 2),
    "instance.chatCompletions": ("instance_chatCompletions", 2, 2),
    "instance.info": ("instance_info", 1, 1),
    "instance.stats": ("instance_stats", 1, 1),
    "instance.update": ("instance_update", 2, 2),
    "items.list": ("items_list", 1, 2),
    "items.upload": ("items_upload", 3, 4),
    "items.uploadAndPoll": ("items_uploadAndPoll", 3, 4),
    "items.part": ("items_part", 3, 3),
    "items.delete": ("items_delete", 2, 2),
    "item.info": ("item_info", 2, 2),
    "item.download": ("item_download", 2, 2),
    "item.chunks": ("item_chunks", 2, 3),
    "jobs.list": ("jobs_list", 1, 2),
    "jobs.create": ("jobs_create", 1, 2),
    "job.info": ("job_info", 2, 2),
}


async def call(
    service: Any,
    account: str,
    scope: Scope,
    method: Any,
    args: Any,
    kwargs: Any,
    generate: Generate | None,
    staged: Staged | None = None,
) -> Any:
    """One call of an AI Search binding: its result (plain data), or an async iterator of SSE
    bytes (a streamed answer); Refused says why not. `staged`: where the request's large uploads
    are held in parts (None: none are taken)."""
    if service is None:
        raise Refused("AiSearchInternalError", "AI Search is not available in this runtime")
    if not isinstance(method, str) or method not in METHODS:
        raise _refuse(f"{str(method)[:64]!r} is not a method of an AI Search binding")
    if not isinstance(args, list) or kwargs:
        raise _refuse(f"{method}: takes its arguments in order (options as a dict)")
    name, low, high = METHODS[method]
    args = _args(args, low, high, method)
    try:
        await _ensure_namespace(service, account, scope.namespace)
        result = await getattr(SearchCall(service, account, scope, generate, staged), name)(*args)
    except AISearchError as exc:
        raise _error(exc, legacy=False) from None
    except AIError as exc:
        raise _generation_error(exc, legacy=False) from None
    return guarded(result) if hasattr(result, "__aiter__") else result


_ensured: weakref.WeakKeyDictionary[Any, set[tuple[str, str]]] = weakref.WeakKeyDictionary()


async def _ensure_namespace(service: Any, account: str, ns: str) -> None:
    """A namespace binding's namespace is made on its first call if the account has none of that
    name, as wrangler makes it when the worker is deployed (once per runtime: one deleted later
    stays deleted, its calls answered 7002)."""
    done = _ensured.setdefault(service, set())
    if ns == DEFAULT_NAMESPACE or (account, ns) in done:
        return
    try:
        await service.namespace_get(account, ns)
    except AISearchError as exc:
        if exc.code != NOT_FOUND:
            raise
        try:
            await service.namespace_create(account, {"name": ns})
        except AISearchError as lost:
            if lost.code != EXISTS:  # another call made it meanwhile
                raise
    done.add((account, ns))


# --- env.AI.autorag(name): the legacy binding, on the account's "default" namespace --------------

LEGACY_METHODS = ("autorag.list", "autorag.search", "autorag.aiSearch")


async def autorag(service: Any, account: str, method: str, args: Any, generate: Generate | None) -> Any:
    """env.AI.autorag(name).search(params) / .aiSearch(params) (args [name, params]) and
    env.AI.autorag().list() (args []): the legacy formats, on the default namespace; errors named
    AutoRAGNotFoundError / AutoRAGInternalError as workerd's."""
    if service is None:
        raise Refused("AutoRAGInternalError", "AI Search is not available in this runtime")
    if not isinstance(args, list):
        raise _refuse(f"env.AI.{method}: takes its arguments in order")
    try:
        if method == "autorag.list":
            _args(args, 0, 0, "env.AI.autorag().list")
            return await _legacy_list(service, account)
        name, params = _args(args, 2, 2, f"env.AI.{method}")
        if name is None:
            raise Refused("AutoRAGNameNotSetError", "AutoRAG name not defined")
        name = _name(name, "env.AI.autorag(name)")
        body = _dict(params, f"env.AI.autorag(name).{method.split('.', 1)[1]}(params)")
        if method == "autorag.search":
            return await service.autorag_search(account, name, body, generate)
        if method == "autorag.aiSearch":
            result = await service.autorag_ai_search(account, name, body, generate)
            return guarded(result, legacy=True) if hasattr(result, "__aiter__") else result
    except AISearchError as exc:
        raise _error(exc, legacy=True) from None
    except AIError as exc:
        raise _generation_error(exc, legacy=True) from None
    raise _refuse(f"env.AI.autorag(name).{method.split('.', 1)[-1][:64]} is not a method")


async def _legacy_list(service: Any, account: str) -> list[dict[str, Any]]:
    """The default namespace's instances as AutoRAG's list() gave them."""
    rows: list[dict[str, Any]] = []
    page = 1
    while True:
        found, total = await service.instances(account, DEFAULT_NAMESPACE, page, LEGACY_LIST_PAGE)
        rows += found
        if not found or len(rows) >= total:
            break
        page += 1
    return [
        {
            "id": r.get("id"),
            "enable": r.get("enable", True),
            "type": r.get("type"),
            "source": r.get("source"),
            "vectorize_name": r.get("vectorize_name", f"ai-search-{r.get('id')}"),
            "paused": r.get("paused", False),
            "status": r.get("status"),
        }
        for r in rows
    ]


# --- what edge dev does for the worker's bindings before it serves ------------------------------


async def prepare(
    service: Any,
    account: str,
    namespaces: list[str],
    folders: list[tuple[str, Path]],
    wait_s: float = 0.0,
) -> None:
    """What `edge dev` does for the worker's AI Search bindings before it serves: each namespace a
    binding names is made if missing (as wrangler's deploy makes it; a call would make it too),
    and each [[ai_search]] instance with a `source_dir` (runtime.bindings.ai_search.source_folders)
    made if missing in the default namespace and kept in step with its folder (service.sync_folder).
    `wait_s`: how long to wait for the folders' documents to be indexed (the pytest plugin waits,
    so that a test's first search sees them all; `edge dev` serves at once)."""
    for ns in dict.fromkeys(namespaces):
        await _ensure_namespace(service, account, ns)
    for name, folder in folders:
        await service.sync_folder(account, DEFAULT_NAMESPACE, name, folder)
    if wait_s > 0:
        for name, _ in folders:
            await service.wait_indexed(account, DEFAULT_NAMESPACE, name, timeout_s=wait_s)
