"""AI Search's REST API, as Cloudflare serves it (and so the `cloudflare` SDK's `client.aisearch`);
runtime.ai.search.service.AISearch does the work, for the token's account only:

    GET|POST          /client/v4/accounts/{account}/ai-search/namespaces          list (page, per_page,
                      search) / create {name, description?}
    GET|PUT|DELETE    .../namespaces/{namespace}                                  one namespace
    POST              .../namespaces/{namespace}/search                           search several instances:
                      {query | messages, ai_search_options: {instance_ids: [...], ...}}
    POST              .../namespaces/{namespace}/chat/completions                 answer from several
    GET|POST          .../namespaces/{namespace}/instances                        list (page, per_page,
                      search, order_by) / create (InstanceCreateParams' fields)
    GET|PUT|DELETE    .../instances/{instance}                                    one instance
    GET               .../instances/{instance}/stats                              queued, running, ...
    POST              .../instances/{instance}/search                             {query | messages, ...}
    POST              .../instances/{instance}/chat/completions                   chat.completion + chunks
                      (bare, as OpenAI answers; `stream: true`: text/event-stream, a `chunks` event first)
    GET|POST          .../instances/{instance}/items                              list (page, per_page, key,
                      status, item_id) / upload (multipart: `file`, its filename the key; `metadata` a
                      JSON object; `wait_for_completion`)
    GET|DELETE        .../instances/{instance}/items/{item}                       one item
    GET               .../items/{item}/download                                   its bytes, as uploaded
    GET               .../items/{item}/chunks                                     its chunks (limit, offset)
    GET|POST          .../instances/{instance}/jobs                               list / sync the source now
    GET               .../instances/{instance}/jobs/{job}                         one job

and the deprecated default-namespace paths, `/client/v4/accounts/{account}/ai-search/instances/...`
(the same handlers on the namespace "default"; a list there takes `namespace` to name another).

Every answer but a chat completion and a download is Cloudflare's envelope, lists with result_info.
Errors are the envelope's too: AI Search's own (runtime.ai.search.errors: 7001 invalid input 400,
7002 not found 404, 7003 exists 409, 7004 a limit 413, 7005 generation failed 502, 7006 a source
refused 400), 10000 authentication (401; 403 for another account's path, so that one account never
reaches another's namespaces). A generation (chat completions, query rewriting) is one AI call made
here as POST /ai/run makes it (runtime.ai.call.AICall through AIService.answer), so it is recorded,
counted and rate limited as every REST call is: past the account's limit it is 7004, 429, with the
limit's Retry-After; another refusal of the AI service before the service wraps it keeps Workers
AI's code."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import msgspec
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from runtime.ai.call import AICall
from runtime.ai.search.common import DEFAULT_NAMESPACE
from runtime.ai.search.errors import INVALID, LIMIT, AISearchError
from runtime.control.admin import read_capped
from runtime.http.errors import BodyTooLarge, ClientBody
from runtime.http.json_body import BadJSON, decode_json
from runtime.routes.ai_rest import (
    AUTH_ERROR,
    HTTP_STATUS,
    AIApi,
    AuthError,
    ai_error,
    cf_error,
    envelope,
    session_key,
)
from workers import AIError

if TYPE_CHECKING:
    from runtime.ai.search.service import AISearch, Generate

PREFIX = "/client/v4/accounts/{account}/ai-search"
NAMESPACES = PREFIX + "/namespaces"
NAMESPACE = NAMESPACES + "/{namespace}"
INSTANCES = NAMESPACE + "/instances"
LEGACY_INSTANCES = PREFIX + "/instances"  # the deprecated paths: the namespace "default"

JSON_BYTES = 1024 * 1024  # a JSON body (an instance's settings, a query and its messages)
MAX_UPLOAD = 16 * 1024 * 1024  # an upload's request in all; the service holds each item to its own cap
MAX_PAGE = 1_000_000
MAX_PER_PAGE = 50  # the service's largest page (runtime.ai.search), also asked of it for a whole list
PER_PAGE = 20
UPLOAD_FIELDS = ("file", "metadata", "wait_for_completion")

Handler = Callable[[Request, str, str], Awaitable[Response]]


# --- request bodies (decoded at the door; the service checks what they hold) ------------------------


class NamespaceCreate(msgspec.Struct, forbid_unknown_fields=True):
    """POST .../ai-search/namespaces (the SDK's NamespaceCreateParams)."""

    name: str
    description: str | None | msgspec.UnsetType = msgspec.UNSET
    public_endpoint_params: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class NamespaceUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """PUT .../ai-search/namespaces/{namespace} (NamespaceUpdateParams)."""

    description: str | None | msgspec.UnsetType = msgspec.UNSET
    public_endpoint_params: dict[str, Any] | None | msgspec.UnsetType = msgspec.UNSET


class JobCreate(msgspec.Struct, forbid_unknown_fields=True):
    """POST .../instances/{instance}/jobs (JobCreateParams): a sync of the source now."""

    description: str | msgspec.UnsetType = msgspec.UNSET


class SearchOptions(msgspec.Struct):
    """What a namespace-wide search or answer must name: the instances it reads (the rest of
    ai_search_options, retrieval and generation settings, is the service's to check)."""

    instance_ids: list[str]


class NamespaceQuery(msgspec.Struct):
    """POST .../namespaces/{namespace}/search | chat/completions, as far as the door reads it."""

    ai_search_options: SearchOptions


class AISearchRestApi:
    """`api`: the AI REST door (its authentication, its way of making a model call); `search`: the
    runtime's one AISearch (runtime.app.Runtime.ai_search)."""

    def __init__(self, api: AIApi, search: AISearch):
        self.api, self.search = api, search

    def routes(self) -> list[Route]:
        def door(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
            async def endpoint(request: Request) -> Response:  # async: starlette awaits it
                return await self._answer(request, handler)

            return endpoint

        routes = [
            Route(NAMESPACES, door(self.namespaces), methods=["GET", "POST"]),
            Route(NAMESPACE, door(self.namespace), methods=["GET", "PUT", "DELETE"]),
            Route(NAMESPACE + "/search", door(self.namespace_search), methods=["POST"]),
            Route(NAMESPACE + "/chat/completions", door(self.namespace_chat), methods=["POST"]),
        ]
        for base in (INSTANCES, LEGACY_INSTANCES):
            one = base + "/{instance}"
            routes += [
                Route(base, door(self.instances), methods=["GET", "POST"]),
                Route(one, door(self.instance), methods=["GET", "PUT", "DELETE"]),
                Route(one + "/stats", door(self.stats), methods=["GET"]),
                Route(one + "/search", door(self.instance_search), methods=["POST"]),
                Route(one + "/chat/completions", door(self.instance_chat), methods=["POST"]),
                Route(one + "/items", door(self.items), methods=["GET", "POST"]),
                Route(one + "/items/{item}", door(self.item), methods=["GET", "DELETE"]),
                Route(one + "/items/{item}/download", door(self.download), methods=["GET"]),
                Route(one + "/items/{item}/chunks", door(self.chunks), methods=["GET"]),
                Route(one + "/jobs", door(self.jobs), methods=["GET", "POST"]),
                Route(one + "/jobs/{job}", door(self.job), methods=["GET"]),
            ]
        return routes

    async def _answer(self, request: Request, handler: Handler) -> Response:
        """The request's account (its token's, which must be the path's), its namespace (the path's,
        else "default"), then the handler; every refusal in the envelope."""
        try:
            account = self.api.authenticate(request)
            namespace = request.path_params.get("namespace", DEFAULT_NAMESPACE)
            return await handler(request, account, namespace)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        except AISearchError as exc:
            response = cf_error(exc.code, exc.message, exc.status)
            retry_after = getattr(exc, "retry_after", None)
            if isinstance(retry_after, int):
                response.headers["retry-after"] = str(retry_after)
            return response
        except BadJSON as exc:
            return cf_error(INVALID, f"{exc}; send a JSON object", 400)
        except msgspec.ValidationError as exc:
            return cf_error(INVALID, f"the body does not read: {exc}", 400)
        except AIError as exc:  # the AI service refused the generation (a rate limit, a model)
            return ai_error(exc)

    def generator(self, request: Request, account: str) -> Generate:
        """The service's generation for this request: one Workers AI call per model call, made as
        POST /ai/run makes it (where the client entered the edge, its session key, its account), and
        answered by the AI service's one door, so that it is recorded and rate limited."""

        async def generate(model: str, inputs: dict[str, Any]) -> Any:
            ingress, rtt = self.api._where(request)
            call = AICall(
                model,
                inputs,
                account,
                session_key(request),
                ingress,
                rtt,
                request_id=str(uuid.uuid4()),
            )
            try:
                answer = await self.api.runtime.ai.answer(call)
            except AIError as exc:
                if HTTP_STATUS.get(exc.code) != 429:
                    raise
                # the account's rate limit (or a full edge): AI Search's 7004, 429, with its Retry-After
                limited = AISearchError(LIMIT, f"{model}: {exc.detail}", 429)
                limited.retry_after = getattr(exc, "retry_after", None)  # type: ignore[attr-defined]
                raise limited from None
            return answer.stream if answer.stream is not None else answer.body

        return generate

    # --- namespaces -------------------------------------------------------------------------------

    async def namespaces(self, request: Request, account: str, _: str) -> Response:
        if request.method == "POST":
            made = await _struct(request, NamespaceCreate)
            return envelope(await self.search.namespace_create(account, _builtins(made)))
        query = _only(request, ("page", "per_page", "search"))
        page, per_page = _paging(query)
        found = await self.search.namespaces(account)
        wanted = (query.get("search") or "").lower()
        if wanted:
            found = [
                n
                for n in found
                if wanted in str(n.get("name", "")).lower()
                or wanted in str(n.get("description") or "").lower()
            ]
        return _page(found[(page - 1) * per_page : page * per_page], page, per_page, len(found))

    async def namespace(self, request: Request, account: str, namespace: str) -> Response:
        if request.method == "GET":
            return envelope(await self.search.namespace_get(account, namespace))
        if request.method == "DELETE":
            return envelope(await self.search.namespace_delete(account, namespace))
        changed = await _struct(request, NamespaceUpdate)
        return envelope(await self.search.namespace_update(account, namespace, _builtins(changed)))

    async def namespace_search(self, request: Request, account: str, namespace: str) -> Response:
        ids, body = await self._across(request)
        found = await self.search.search(account, namespace, ids, body, self.generator(request, account))
        return envelope(found)

    async def namespace_chat(self, request: Request, account: str, namespace: str) -> Response:
        ids, body = await self._across(request)
        return await self._chat(request, account, namespace, ids, body)

    async def _across(self, request: Request) -> tuple[list[str], dict[str, Any]]:
        """A namespace-wide body: (its ai_search_options.instance_ids, the body without them)."""
        body = await _object(request)
        try:
            ids = msgspec.convert(body, NamespaceQuery).ai_search_options.instance_ids
        except msgspec.ValidationError as exc:
            raise AISearchError(
                INVALID,
                f"ai_search_options.instance_ids: name the namespace's instances to read, as a list of ids "
                f"({exc})",
            ) from None
        if not ids:
            raise AISearchError(INVALID, "ai_search_options.instance_ids: name at least one instance")
        options = {k: v for k, v in body["ai_search_options"].items() if k != "instance_ids"}
        return ids, {**body, "ai_search_options": options}

    # --- instances --------------------------------------------------------------------------------

    async def instances(self, request: Request, account: str, namespace: str) -> Response:
        if request.method == "POST":
            return envelope(await self.search.instance_create(account, namespace, await _object(request)))
        allowed = ("page", "per_page", "search", "order_by", "order_by_direction", "namespace", "hostname")
        query = _only(request, allowed)
        page, per_page = _paging(query)
        if "namespace" in query:  # the deprecated list names one; a namespace's own list, itself
            if "namespace" in request.path_params and query["namespace"] != namespace:
                raise AISearchError(INVALID, f"namespace: this path lists namespace {namespace!r}")
            namespace = query["namespace"]
        if query.get("hostname"):
            raise AISearchError(INVALID, "hostname: no instance here has a public hostname (no network)")
        order = query.get("order_by")
        if order not in (None, "created_at"):
            raise AISearchError(INVALID, "order_by: only created_at")
        direction = query.get("order_by_direction", "desc")
        if direction not in ("asc", "desc"):
            raise AISearchError(INVALID, "order_by_direction: asc or desc")
        wanted = (query.get("search") or "").lower()
        if not wanted and order is None:
            found, total = await self.search.instances(account, namespace, page, per_page)
            return _page(found, page, per_page, total)
        every = await _whole(lambda p, n: self.search.instances(account, namespace, p, n))
        if wanted:
            every = [i for i in every if wanted in str(i.get("id", "")).lower()]
        if order is not None:
            every.sort(key=lambda i: str(i.get("created_at") or ""), reverse=direction == "desc")
        return _page(every[(page - 1) * per_page : page * per_page], page, per_page, len(every))

    async def instance(self, request: Request, account: str, namespace: str) -> Response:
        name = request.path_params["instance"]
        if request.method == "GET":
            return envelope(await self.search.instance_get(account, namespace, name))
        if request.method == "DELETE":
            return envelope(await self.search.instance_delete(account, namespace, name))
        body = await _object(request)
        if body.get("id", name) != name:
            raise AISearchError(
                INVALID, f"id: the path names instance {name!r}; an instance's id does not change"
            )
        body.pop("id", None)
        return envelope(await self.search.instance_update(account, namespace, name, body))

    async def stats(self, request: Request, account: str, namespace: str) -> Response:
        return envelope(await self.search.instance_stats(account, namespace, request.path_params["instance"]))

    async def instance_search(self, request: Request, account: str, namespace: str) -> Response:
        name, body = request.path_params["instance"], await _object(request)
        generate = self.generator(request, account)
        return envelope(await self.search.search(account, namespace, [name], body, generate))

    async def instance_chat(self, request: Request, account: str, namespace: str) -> Response:
        body = await _object(request)
        return await self._chat(request, account, namespace, [request.path_params["instance"]], body)

    async def _chat(
        self, request: Request, account: str, namespace: str, ids: list[str], body: dict[str, Any]
    ) -> Response:
        """A chat completion, bare as OpenAI's (the SDK reads it so), or its event stream."""
        generate = self.generator(request, account)
        answer = await self.search.chat_completions(account, namespace, ids, body, generate)
        if isinstance(answer, dict):
            return JSONResponse(answer)
        return StreamingResponse(answer, media_type="text/event-stream")

    # --- items ------------------------------------------------------------------------------------

    async def items(self, request: Request, account: str, namespace: str) -> Response:
        name = request.path_params["instance"]
        if request.method == "POST":
            return await self._upload(request, account, namespace, name)
        query = _only(request, ("page", "per_page", "key", "status", "item_id"))
        page, per_page = _paging(query)
        if query.get("item_id"):  # at most one item: that one, if it is there and matches
            try:
                item = await self.search.item_get(account, namespace, name, query["item_id"])
            except AISearchError as exc:
                if exc.status != 404:
                    raise
                return _page([], page, per_page, 0)
            if self._matches(item, query):
                return _page([item] if page == 1 else [], page, per_page, 1)
            return _page([], page, per_page, 0)
        found, total = await self.search.items(
            account, namespace, name, page, per_page, key=query.get("key"), status=query.get("status")
        )
        return _page(found, page, per_page, total)

    @staticmethod
    def _matches(item: dict[str, Any], query: dict[str, str]) -> bool:
        return all(query.get(f) in (None, item.get(f)) for f in ("key", "status"))

    async def _upload(self, request: Request, account: str, namespace: str, name: str) -> Response:
        """One file, as the SDK's items.upload sends it: multipart/form-data with the file in a part
        named `file` (its filename is the item's key), `metadata` a JSON object of at most the
        instance's metadata fields, `wait_for_completion` true to answer once it is indexed."""
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise AISearchError(
                INVALID,
                "send the file as multipart/form-data: a part named 'file' (its filename is the item's "
                "key) and, if any, 'metadata' (a JSON object)",
            )
        parser = MultiPartParser(
            request.headers, ClientBody(request.stream(), MAX_UPLOAD), max_files=1, max_fields=8
        )
        try:
            form = await parser.parse()
        except BodyTooLarge:
            raise AISearchError(INVALID, f"over {MAX_UPLOAD // 2**20} MiB in one upload", 413) from None
        except MultiPartException as exc:
            raise AISearchError(
                INVALID, f"{exc.message} (one file a request, in a part named 'file')"
            ) from None
        try:
            for key in form:
                if key not in UPLOAD_FIELDS:
                    raise AISearchError(
                        INVALID, f"{key[:64]}: no such field; an upload takes {UPLOAD_FIELDS}"
                    )
            part = form.get("file")
            if part is None or isinstance(part, str):
                raise AISearchError(INVALID, "file: send the document as a file part named 'file'")
            key = part.filename or ""
            if not key:
                raise AISearchError(INVALID, "file: the part needs a filename: it is the item's key")
            content = await part.read()
            metadata = _metadata(form.get("metadata"))
            wait = _flag("wait_for_completion", form.get("wait_for_completion"))
        finally:
            await form.close()
        item = await self.search.item_upload(account, namespace, name, key, content, metadata)
        if wait:
            item = {**item, **await self.search.item_wait(account, namespace, name, item["id"])}
        return envelope(item)

    async def item(self, request: Request, account: str, namespace: str) -> Response:
        name, item_id = request.path_params["instance"], request.path_params["item"]
        if request.method == "DELETE":
            return envelope(await self.search.item_delete(account, namespace, name, item_id))
        return envelope(await self.search.item_get(account, namespace, name, item_id))

    async def download(self, request: Request, account: str, namespace: str) -> Response:
        """The item's bytes as uploaded (or read from its source), bare, with its type and its key as
        the file's name."""
        name, item_id = request.path_params["instance"], request.path_params["item"]
        item = await self.search.item_get(account, namespace, name, item_id)
        content, kind = await self.search.item_download(account, namespace, name, item_id)
        filename = str(item.get("key") or item_id).rsplit("/", 1)[-1]
        disposition = f"attachment; filename*=UTF-8''{quote(filename, safe='')}"
        # a tenant's file, never run as a page of this origin: downloaded, not sniffed, sandboxed
        headers = {
            "content-disposition": disposition,
            "x-content-type-options": "nosniff",
            "content-security-policy": "sandbox; default-src 'none'",
        }
        return Response(content, media_type=kind, headers=headers)

    async def chunks(self, request: Request, account: str, namespace: str) -> Response:
        """An item's chunks, by the SDK's limit and offset (or page and per_page)."""
        name, item_id = request.path_params["instance"], request.path_params["item"]
        query = _only(request, ("limit", "offset", "page", "per_page"))
        if "limit" in query or "offset" in query:
            limit = _integer(query, "limit", PER_PAGE, 1, MAX_PER_PAGE)
            offset = _integer(query, "offset", 0, 0, MAX_PAGE * MAX_PER_PAGE)
            if offset % limit == 0:
                found, total = await self.search.item_chunks(
                    account, namespace, name, item_id, offset // limit + 1, limit
                )
            else:
                every = await _whole(
                    lambda p, n: self.search.item_chunks(account, namespace, name, item_id, p, n)
                )
                found, total = every[offset : offset + limit], len(every)
            info = {"count": len(found), "total_count": total, "limit": limit, "offset": offset}
            return _listed(found, info)
        page, per_page = _paging(query)
        found, total = await self.search.item_chunks(account, namespace, name, item_id, page, per_page)
        return _page(found, page, per_page, total)

    # --- jobs -------------------------------------------------------------------------------------

    async def jobs(self, request: Request, account: str, namespace: str) -> Response:
        name = request.path_params["instance"]
        if request.method == "POST":
            made = await _struct(request, JobCreate)
            return envelope(await self.search.job_create(account, namespace, name, _builtins(made) or None))
        page, per_page = _paging(_only(request, ("page", "per_page")))
        found, total = await self.search.jobs(account, namespace, name, page, per_page)
        return _page(found, page, per_page, total)

    async def job(self, request: Request, account: str, namespace: str) -> Response:
        name, job_id = request.path_params["instance"], request.path_params["job"]
        return envelope(await self.search.job_get(account, namespace, name, job_id))


# --- reading requests -------------------------------------------------------------------------------


async def _body(request: Request) -> bytes:
    body = await read_capped(request, JSON_BYTES)
    if body is None:
        raise AISearchError(INVALID, f"the body is over {JSON_BYTES // 1024} KiB", 413)
    return body or b"{}"


async def _object(request: Request) -> dict[str, Any]:
    body = decode_json(await _body(request))
    if not isinstance(body, dict):
        raise AISearchError(INVALID, "send a JSON object")
    return body


async def _struct(request: Request, kind: type[msgspec.Struct]) -> Any:
    return decode_json(await _body(request), kind)


def _builtins(value: msgspec.Struct) -> dict[str, Any]:
    """A decoded body as the service takes it: the fields sent, and only those."""
    return msgspec.to_builtins(value)


def _only(request: Request, names: tuple[str, ...]) -> dict[str, str]:
    """The query's parameters, each one of `names` (7001 naming another)."""
    query = dict(request.query_params)
    for key in query:
        if key not in names:
            raise AISearchError(INVALID, f"{key[:64]}: no such parameter; this takes {', '.join(names)}")
    return query


def _integer(query: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise AISearchError(INVALID, f"{name}: an integer from {low} to {high}, not {raw[:32]!r}")
    return value


def _paging(query: dict[str, str]) -> tuple[int, int]:
    return _integer(query, "page", 1, 1, MAX_PAGE), _integer(query, "per_page", PER_PAGE, 1, MAX_PER_PAGE)


def _metadata(raw: Any) -> dict[str, Any] | None:
    """The upload's `metadata` field: a JSON object (the SDK sends it as a string), or none."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise AISearchError(INVALID, "metadata: send it as a text field holding a JSON object")
    try:
        value = json.loads(raw)
    except ValueError:
        raise AISearchError(
            INVALID, 'metadata: not JSON; send a JSON object such as {"folder": "docs"}'
        ) from None
    if not isinstance(value, dict):
        raise AISearchError(INVALID, "metadata: a JSON object of field names to values")
    return value


def _flag(name: str, raw: Any) -> bool:
    if raw is None:
        return False
    text = raw.strip().lower() if isinstance(raw, str) else ""
    if text in ("true", "1"):
        return True
    if text in ("false", "0", ""):
        return False
    raise AISearchError(INVALID, f"{name}: true or false")


async def _whole(page_of: Callable[[int, int], Awaitable[tuple[list[Any], int]]]) -> list[Any]:
    """Every row of a list the service pages, page by page."""
    rows: list[Any] = []
    page = 1
    while True:
        found, total = await page_of(page, MAX_PER_PAGE)
        rows += found
        if not found or len(rows) >= total:
            return rows
        page += 1


def _page(result: list[Any], page: int, per_page: int, total: int) -> JSONResponse:
    """A page of a list, with result_info: where it lies, how many in all. The SDK's auto-pagination
    asks the next page until one comes back empty."""
    return _listed(result, {"page": page, "per_page": per_page, "count": len(result), "total_count": total})


def _listed(result: list[Any], info: dict[str, Any]) -> JSONResponse:
    return JSONResponse(
        {"result": result, "result_info": info, "success": True, "errors": [], "messages": []}
    )
