"""AI Search bindings as a worker sees them, with the names and shapes of Cloudflare's Workers
binding (workerd's ai-search types), called from Python as the other clients are (dicts in, dicts
out readable by key or attribute, awaited; options as a dict or as keywords):

    docs = env.AI_SEARCH.get("docs")                      # [[ai_search_namespaces]]: synchronous, lazy
    found = await docs.search({"query": "How does caching work?"})
    answer = await env.DOCS.chatCompletions({"messages": [{"role": "user", "content": "..."}]})
    stream = await env.DOCS.chatCompletions(messages=[...], stream=True)   # SSE bytes, `chunks` first
    item = await docs.items.upload("faq.md", "# FAQ ...", {"metadata": {"lang": "en"}})
    answer = await env.AI.autorag("docs").aiSearch({"query": "..."})       # the legacy binding

A failed call raises what workerd's binding raises: AiSearchNotFoundError (no such instance, item
or job), AiSearchInternalError (anything else: options refused, a limit reached, the model failed),
each with `.code` (AI Search's: 7001 invalid input, 7002 not found, ...) and the message
"code: message"; the legacy binding's are AutoRAGNotFoundError and AutoRAGInternalError. Arguments
of the wrong type raise TypeError at once.

Each class takes a transport, `async (method, args, kwargs) -> Any` (its `streams` attribute tells
the isolate that an answer may be a stream of bytes); this module imports nothing of the runtime.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

from workers.binding_values import (
    BindingError,
    JsObject,
    Transport,
    as_bytes,
    byte_stream,
    merge_options,
    to_py_value,
    wrap_result,
)
from workers.blob import Blob
from workers.errors import AIError

# --- errors -----------------------------------------------------------------------------------------


class AiSearchError(Exception):
    """What every AI Search error is: `code` (7001 invalid input, 7002 not found, 7003 exists,
    7004 a limit reached, 7005 the model failed, 7006 a source refused), `name` (workerd's)."""

    name = "AiSearchError"

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class AiSearchInternalError(AiSearchError):
    name = "AiSearchInternalError"


class AiSearchNotFoundError(AiSearchError):
    name = "AiSearchNotFoundError"


class AiSearchNameNotSetError(AiSearchError):
    name = "AiSearchNameNotSetError"


class AutoRAGInternalError(AiSearchError):
    name = "AutoRAGInternalError"


class AutoRAGNotFoundError(AiSearchError):
    name = "AutoRAGNotFoundError"


class AutoRAGNameNotSetError(AiSearchError):
    name = "AutoRAGNameNotSetError"


_ERRORS: dict[str, type[AiSearchError]] = {
    cls.name: cls
    for cls in (
        AiSearchInternalError,
        AiSearchNotFoundError,
        AiSearchNameNotSetError,
        AutoRAGInternalError,
        AutoRAGNotFoundError,
        AutoRAGNameNotSetError,
    )
}
NOT_FOUND = 7002


def _code(message: str) -> int | None:
    head = message.split(":", 1)[0]
    return int(head) if head.isdigit() else None


def _mapped(exc: BindingError, legacy: bool) -> Exception:
    """A refused call's error as the worker catches it (its type named by the runtime)."""
    message = str(exc)
    cls = _ERRORS.get(exc.type)
    if cls is None:
        cls = AutoRAGInternalError if legacy else AiSearchInternalError
    return cls(message, _code(message))


async def _mapped_stream(stream: AsyncIterator[bytes], legacy: bool) -> AsyncIterator[bytes]:
    """A streamed answer's bytes; a failure at its end raised as AI Search's error."""
    try:
        async for data in stream:
            yield data
    except AIError as exc:
        if exc.code == NOT_FOUND:
            cls = AutoRAGNotFoundError if legacy else AiSearchNotFoundError
        else:
            cls = AutoRAGInternalError if legacy else AiSearchInternalError
        raise cls(f"{exc.code}: {exc.detail}", exc.code) from None
    finally:
        if hasattr(stream, "aclose"):
            await stream.aclose()


def _plain(value: Any) -> Any:
    """A JS object (JsProxy, to_js) or a result read back (JsObject) as plain dicts and lists."""
    if not isinstance(value, dict | list) and callable(getattr(value, "to_py", None)):
        value = value.to_py()
    return to_py_value(value)


def _params(params: Any, kwargs: dict[str, Any], what: str) -> dict[str, Any]:
    """Cloudflare's params object, given as a dict or as keywords (keywords win)."""
    return merge_options(_plain(params), {k: _plain(v) for k, v in kwargs.items()}, what)


def _name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{what} must be a non-empty string, got {name!r:.80}")
    return name


async def _content(content: Any, what: str) -> bytes:
    """An item's content: str, bytes (an ArrayBuffer), a Blob, or a stream (a ReadableStream,
    request.body), read whole: it crosses to the runtime in one call."""
    if isinstance(content, Blob):
        return await content.bytes()
    if not isinstance(content, str | bytes | bytearray | memoryview) and callable(
        getattr(content, "to_py", None)
    ):
        content = content.to_py()
    return await as_bytes(content, what)


class _Calls:
    """A binding's transport, its errors raised as AI Search's."""

    def __init__(self, transport: Transport, legacy: bool = False):
        self._transport, self._legacy = transport, legacy

    async def __call__(self, method: str, *args: Any) -> Any:
        try:
            result = await self._transport(method, list(args), {})
        except BindingError as exc:
            raise _mapped(exc, self._legacy) from None
        if hasattr(result, "__aiter__"):
            return _mapped_stream(result, self._legacy)
        return wrap_result(result)


# --- an instance, its items and jobs ---------------------------------------------------------------


class AISearchItem:
    """`instance.items.get(item_id)`: `info()`, `download()` and `chunks({limit, offset})`; no
    call is made until one of them is awaited."""

    def __init__(self, calls: _Calls, instance: str | None, item_id: str):
        self._calls, self._instance, self.id = calls, instance, item_id

    async def info(self) -> JsObject:
        """{id, key, status, metadata, ...}: the item as the instance holds it."""
        return await self._calls("item.info", self._instance, self.id)

    async def download(self) -> JsObject:
        """The original file: {filename, contentType, size, body}; `body` a stream of its bytes
        (hand it to a Response, or read it with `async for`)."""
        out = await self._calls("item.download", self._instance, self.id)
        body = out.get("body") if isinstance(out, dict) else None
        if isinstance(body, bytes):
            out["body"] = byte_stream(body)
        return out

    async def chunks(self, params: dict[str, Any] | None = None, **kwargs: Any) -> JsObject:
        """Its indexed chunks: {result: [{id, text, start_byte, end_byte, item}], result_info}."""
        return await self._calls("item.chunks", self._instance, self.id, _params(params, kwargs, "chunks"))


PART_BYTES = 1024 * 1024  # content larger than this crosses to the runtime in parts of this size


async def _sent(calls: _Calls, instance: str | None, data: bytes) -> bytes | dict[str, str]:
    """An item's content as one upload call carries it: the bytes, or (more than PART_BYTES: one
    call from the isolate carries at most 2 MiB) a token naming the parts sent ahead."""
    if len(data) <= PART_BYTES:
        return data
    token = secrets.token_hex(8)
    for start in range(0, len(data), PART_BYTES):
        await calls("items.part", instance, token, data[start : start + PART_BYTES])
    return {"staged": token}


class AISearchItems:
    """`instance.items`: upload (an upsert by name), uploadAndPoll, list, get, delete."""

    def __init__(self, calls: _Calls, instance: str | None):
        self._calls, self._instance = calls, instance

    async def upload(
        self, name: str, content: Any, options: dict[str, Any] | None = None, **kwargs: Any
    ) -> JsObject:
        """Queue a document for indexing: {id, key, status: "queued", ...}. `content`: str, bytes,
        a Blob or a stream; options {metadata: {field: value}} (at most 5 fields an instance)."""
        name = _name(name, "items.upload(name)")
        data = await _content(content, "items.upload(name, content)")
        opts = _params(options, kwargs, "items.upload options")
        sent = await _sent(self._calls, self._instance, data)
        return await self._calls("items.upload", self._instance, name, sent, opts)

    async def uploadAndPoll(  # noqa: N802 - Cloudflare's name
        self, name: str, content: Any, options: dict[str, Any] | None = None, **kwargs: Any
    ) -> JsObject:
        """Upload, then wait for the item's indexing to end (timeoutMs, default 30000): its info,
        `status` "completed" (or "error", "skipped"; still "queued" or "running" past the wait)."""
        name = _name(name, "items.uploadAndPoll(name)")
        data = await _content(content, "items.uploadAndPoll(name, content)")
        opts = _params(options, kwargs, "items.uploadAndPoll options")
        sent = await _sent(self._calls, self._instance, data)
        return await self._calls("items.uploadAndPoll", self._instance, name, sent, opts)

    async def list(self, params: dict[str, Any] | None = None, **kwargs: Any) -> JsObject:
        """{result: [{id, key, status, ...}], result_info: {count, page, per_page, total_count}};
        params page, per_page (default 25), status."""
        return await self._calls("items.list", self._instance, _params(params, kwargs, "items.list"))

    def get(self, item_id: str) -> AISearchItem:
        """A handle on item `item_id` (synchronous: nothing is called yet)."""
        return AISearchItem(self._calls, self._instance, _name(item_id, "items.get(itemId)"))

    async def delete(self, item_id: str) -> None:
        """Delete the item and its chunks; AiSearchNotFoundError when the instance has no such item."""
        await self._calls("items.delete", self._instance, _name(item_id, "items.delete(itemId)"))


class AISearchJob:
    """`instance.jobs.get(job_id)`: `info()`."""

    def __init__(self, calls: _Calls, instance: str | None, job_id: str):
        self._calls, self._instance, self.id = calls, instance, job_id

    async def info(self) -> JsObject:
        return await self._calls("job.info", self._instance, self.id)


class AISearchJobs:
    """`instance.jobs`: list, create (a sync of the instance's source now), get."""

    def __init__(self, calls: _Calls, instance: str | None):
        self._calls, self._instance = calls, instance

    async def list(self, params: dict[str, Any] | None = None, **kwargs: Any) -> JsObject:
        return await self._calls("jobs.list", self._instance, _params(params, kwargs, "jobs.list"))

    async def create(self, params: dict[str, Any] | None = None, **kwargs: Any) -> JsObject:
        return await self._calls("jobs.create", self._instance, _params(params, kwargs, "jobs.create"))

    def get(self, job_id: str) -> AISearchJob:
        return AISearchJob(self._calls, self._instance, _name(job_id, "jobs.get(jobId)"))


class AISearchInstance:
    """An AI Search instance: `env.DOCS` (an [[ai_search]] binding) or `env.AI_SEARCH.get(name)`.
    search, chatCompletions (streamed with `stream: True`: an async iterator of SSE bytes, the
    `chunks` event first), info, stats, update, `items` and `jobs`."""

    streams = True  # an answer may stream (the isolate reads it as env.AI.run's)

    def __init__(self, transport: Transport | _Calls, name: str | None = None):
        self._calls = transport if isinstance(transport, _Calls) else _Calls(transport)
        self._name = name  # None: the instance binding's own (the runtime knows which)

    async def search(self, params: dict[str, Any] | None = None, **kwargs: Any) -> JsObject:
        """Retrieval only: {search_query, chunks: [{id, type, score, text, item: {key, timestamp,
        metadata}, scoring_details}]}. params {query | messages, ai_search_options: {retrieval,
        query_rewrite, reranking, cache}}."""
        return await self._calls("instance.search", self._name, _params(params, kwargs, "search"))

    async def chatCompletions(self, params: dict[str, Any] | None = None, **kwargs: Any) -> Any:  # noqa: N802
        """Retrieval and an answer: a `chat.completion` with the `chunks` it used; with `stream:
        True` an async iterator of SSE bytes (a `chunks` event, then chat.completion.chunk events,
        then `[DONE]`): return it in a Response with content-type text/event-stream."""
        return await self._calls(
            "instance.chatCompletions", self._name, _params(params, kwargs, "chatCompletions")
        )

    async def info(self) -> JsObject:
        return await self._calls("instance.info", self._name)

    async def stats(self) -> JsObject:
        """{queued, running, completed, error, skipped, outdated, last_activity, engine}."""
        return await self._calls("instance.stats", self._name)

    async def update(self, config: dict[str, Any] | None = None, **kwargs: Any) -> JsObject:
        """Change some of the instance's settings; its info after."""
        return await self._calls("instance.update", self._name, _params(config, kwargs, "update"))

    @property
    def items(self) -> AISearchItems:
        return AISearchItems(self._calls, self._name)

    @property
    def jobs(self) -> AISearchJobs:
        return AISearchJobs(self._calls, self._name)

    def __repr__(self) -> str:
        return f"<AISearchInstance {self._name or '(bound)'}>"


class AISearchNamespace:
    """`env.AI_SEARCH`, an [[ai_search_namespaces]] binding: every instance of its namespace.
    get (synchronous, lazy), list, create, delete, and search / chatCompletions across instances
    (`ai_search_options.instance_ids`)."""

    streams = True

    def __init__(self, transport: Transport):
        self._calls = _Calls(transport)

    def get(self, name: str) -> AISearchInstance:
        """A handle on instance `name` of the namespace; nothing is called until it is used."""
        return AISearchInstance(self._calls, _name(name, "get(name)"))

    async def list(self, params: dict[str, Any] | None = None, **kwargs: Any) -> JsObject:
        """{result: [instance info], result_info: {count, page, per_page, total_count}}."""
        return await self._calls("list", _params(params, kwargs, "list"))

    async def create(self, config: dict[str, Any] | None = None, **kwargs: Any) -> AISearchInstance:
        """Create an instance ({id, type: "r2" | None, source, source_params, ...}); its handle."""
        config = _params(config, kwargs, "create")
        info = await self._calls("create", config)
        name = info.get("id") if isinstance(info, dict) else None
        return AISearchInstance(self._calls, name if isinstance(name, str) else config.get("id"))

    async def delete(self, name: str) -> None:
        """Delete an instance and everything indexed in it."""
        await self._calls("delete", _name(name, "delete(name)"))

    async def search(self, params: dict[str, Any] | None = None, **kwargs: Any) -> JsObject:
        """Search several instances at once: {search_query, chunks (each with its instance_id),
        errors?}; `ai_search_options.instance_ids` lists them."""
        return await self._calls("search", _params(params, kwargs, "search"))

    async def chatCompletions(self, params: dict[str, Any] | None = None, **kwargs: Any) -> Any:  # noqa: N802
        """chatCompletions over several instances (`ai_search_options.instance_ids`)."""
        return await self._calls("chatCompletions", _params(params, kwargs, "chatCompletions"))


# workerd's spelling of the same classes
AiSearchInstance = AISearchInstance
AiSearchNamespace = AISearchNamespace


# --- env.AI.autorag(name): the legacy binding ------------------------------------------------------


class AutoRAG:
    """`env.AI.autorag(name)`: `search({query, filters, max_num_results, ranking_options,
    reranking, rewrite_query})` -> {object: "vector_store.search_results.page", search_query,
    data: [{file_id, filename, score, attributes, content}], has_more, next_page}; `aiSearch`
    takes `model`, `system_prompt` and `stream` as well and adds `response` (streamed: a Response
    of the event stream); `env.AI.autorag().list()` lists the default namespace's instances."""

    def __init__(self, transport: Transport, name: str | None = None):
        self._calls = _Calls(transport, legacy=True)
        self._name = name

    def _named(self) -> str:
        if not self._name:
            raise AutoRAGNameNotSetError("AutoRAG name not defined")
        return self._name

    async def list(self) -> list:
        return await self._calls("list")

    async def search(self, params: dict[str, Any] | None = None, **kwargs: Any) -> JsObject:
        return await self._calls("search", self._named(), _params(params, kwargs, "autorag search"))

    async def aiSearch(self, params: dict[str, Any] | None = None, **kwargs: Any) -> Any:  # noqa: N802
        params = _params(params, kwargs, "autorag aiSearch")
        result = await self._calls("aiSearch", self._named(), params)
        if hasattr(result, "__aiter__"):
            from workers.http import Response

            return Response(result, headers=[("content-type", "text/event-stream")])
        return result
