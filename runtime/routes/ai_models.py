"""The Workers AI REST routes about models and documents, beside the calls (runtime.routes.ai_rest):

    GET  /client/v4/accounts/{account}/ai/models/schema?model=M   M's input and output as JSON Schema
    GET  /client/v4/accounts/{account}/ai/tasks/search            the tasks of the models served
    GET  /client/v4/accounts/{account}/ai/authors/search          their authors
    POST /client/v4/accounts/{account}/ai/tomarkdown              documents (multipart `files`) to Markdown
    GET  /client/v4/accounts/{account}/ai/tomarkdown/supported    the types it converts

In Cloudflare's envelope and shapes (the `cloudflare` SDK's `ai.models.schema.get`, `ai.tasks.list`,
`ai.authors.list`, `ai.to_markdown.supported`), each authenticated as every REST call is. A document
is converted by the same converter as env.AI.toMarkdown (workers.markdown), in the runtime's fair
pool for AI work (runtime.ai.service.AIService.embed_pool: one account's documents take turns with
the others' work, never the event loop), at most MAX_FILES a request and MAX_UPLOAD bytes in all."""

from __future__ import annotations

from typing import Any

from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime.ai.model_schema import authors, model_schema, tasks
from runtime.http.errors import BodyTooLarge, ClientBody
from runtime.routes.ai_rest import AUTH_ERROR, BAD_QUERY, PREFIX, AIApi, AuthError, cf_error, envelope
from workers import markdown

MAX_FILES = 16
MAX_UPLOAD = 2 * markdown.MAX_BYTES  # a request's bytes in all; each file is held to MAX_BYTES too
NOT_FOUND = 5007  # Workers AI's "no such model"
BAD_UPLOAD = 5004


class AIModelsApi:
    def __init__(self, api: AIApi):
        self.api = api

    def routes(self) -> list[Route]:
        return [
            Route(PREFIX + "/ai/models/schema", self.schema, methods=["GET"]),
            Route(PREFIX + "/ai/tasks/search", self.tasks, methods=["GET"]),
            Route(PREFIX + "/ai/authors/search", self.authors, methods=["GET"]),
            Route(PREFIX + "/ai/tomarkdown", self.to_markdown, methods=["POST"]),
            Route(PREFIX + "/ai/tomarkdown/supported", self.supported, methods=["GET"]),
        ]

    def _models(self, request: Request) -> list[dict[str, Any]]:
        self.api.authenticate(request)
        return self.api.runtime.catalog_view()

    async def schema(self, request: Request) -> Response:
        try:
            models = self._models(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        name = request.query_params.get("model")
        if not name:
            return cf_error(
                BAD_QUERY, "model: required; send ?model=<a name GET /ai/models/search lists>", 400
            )
        entry = next((m for m in models if m["name"] == name), None)
        if entry is None:
            return cf_error(NOT_FOUND, f"no such model {name[:200]!r}; GET /ai/models/search lists them", 404)
        return envelope(model_schema(entry))

    async def tasks(self, request: Request) -> Response:
        try:
            return envelope(tasks(self._models(request)))
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)

    async def authors(self, request: Request) -> Response:
        try:
            return envelope(authors(self._models(request)))
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)

    async def supported(self, request: Request) -> Response:
        try:
            self.api.authenticate(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        return envelope(
            [
                {"extension": ext.lstrip("."), "mimeType": mime}
                for mime, extensions in markdown.SUPPORTED.items()
                for ext in extensions
            ]
        )

    async def to_markdown(self, request: Request) -> Response:
        """Each part named `files` converted, in order, as Cloudflare answers: [{name, mimeType,
        format: "markdown", tokens, data}], or format "error" with `error` for a file it cannot
        convert (the others still are). `tokens` is a string, as the SDK's type reads it."""
        try:
            account = self.api.authenticate(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            return cf_error(
                BAD_UPLOAD, "send the documents as multipart/form-data, each in a part named 'files'"
            )
        body = ClientBody(request.stream(), MAX_UPLOAD)
        parser = MultiPartParser(request.headers, body, max_files=MAX_FILES, max_fields=MAX_FILES)
        try:
            form = await parser.parse()
        except BodyTooLarge:
            return cf_error(
                BAD_UPLOAD, f"over {MAX_UPLOAD // 2**20} MiB in one request; send fewer files", 413
            )
        except MultiPartException as exc:
            return cf_error(BAD_UPLOAD, f"{exc.message} (at most {MAX_FILES} files a request)", 400)
        try:
            uploads = [(f.filename or "document", f.content_type, await f.read()) for f in _files(form)]
        finally:
            await form.close()
        if not uploads:
            return cf_error(BAD_UPLOAD, "no part named 'files' holds a file; send each document as one", 400)
        results = await self.api.runtime.ai.embed_pool.run(account, _convert_all, uploads)
        return envelope(results)


def _files(form: Any) -> list[Any]:
    """The form's file parts named `files` (the SDK's field; `files[]` as some clients spell it)."""
    return [v for key in ("files", "files[]") for v in form.getlist(key) if hasattr(v, "read")]


def _convert_all(uploads: list[tuple[str, str | None, bytes]]) -> list[dict[str, Any]]:
    out = []
    for name, declared, data in uploads:
        result = markdown.convert(name, markdown.mime_type_of(name, _declared(declared)), data)
        if "tokens" in result:
            result["tokens"] = str(result["tokens"])
        out.append(result)
    return out


def _declared(content_type: str | None) -> str | None:
    """A part's declared type, unless it is the generic one a client sends when it knows none
    (then the file's extension says)."""
    if not content_type or content_type.split(";")[0].strip() == "application/octet-stream":
        return None
    return content_type
