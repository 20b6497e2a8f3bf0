"""The OpenAPI 3.1 document of every HTTP API the runtime serves (the worker front door aside:
its paths are the worker's), at GET /client/v4/openapi.json: Workers AI REST, the OpenAI-compatible
routes, the control plane (deploy, versions, secrets, tail) and /cdn-cgi/ (health, PoPs, metrics,
accounts and tokens). Request bodies come from the msgspec structs the handlers decode them as;
what no struct describes (the answers, the accounts' settings) is written out here.
tests/unit/test_openapi.py walks the router so that no served route is left out."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.ai.batch import MAX_REQUESTS
from runtime.ai.gateway_log_query import EQUALS, MAX_PER_PAGE, ORDER_BY, RANGES
from runtime.ai.inputs import ChatCompletionRequest, CompletionRequest, TextGenerationInputs
from runtime.ai.refusals import REFUSED
from runtime.ai.responses_inputs import ResponsesRequest
from runtime.routes.ai_search import JobCreate, NamespaceCreate, NamespaceUpdate
from runtime.routes.deploy import DeployRequest, RollbackRequest, SecretRequest, Upload
from runtime.routes.edge import ReloadRequest
from runtime.routes.rollouts import FinishRequest, StartRequest
from runtime.routes.workflows import TriggerRequest

PATH = "/client/v4/openapi.json"
REF = "#/components/schemas/{name}"
STRUCTS = [
    TextGenerationInputs,
    ChatCompletionRequest,
    CompletionRequest,
    ResponsesRequest,
    Upload,
    DeployRequest,
    RollbackRequest,
    SecretRequest,
    ReloadRequest,
    StartRequest,
    FinishRequest,
    TriggerRequest,
    NamespaceCreate,
    NamespaceUpdate,
    JobCreate,
]
ACCOUNT = "/client/v4/accounts/{account}"
SCRIPT = ACCOUNT + "/workers/scripts/{name}"
CDN = "/cdn-cgi/edge"

_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_ref_model: dict[str, Any] = {"$ref": REF.format(name="Model")}
_SCHEMAS: dict[str, Any] = {
    "Envelope": {  # Cloudflare's v4 answer, success or not
        "type": "object",
        "required": ["result", "success", "errors", "messages"],
        "properties": {
            "result": {},
            "success": {"type": "boolean"},
            "errors": {"type": "array", "items": {"$ref": REF.format(name="CFError")}},
            "messages": {"type": "array"},
            "result_info": _ANY_OBJECT,
        },
    },
    "CFError": {
        "type": "object",
        "required": ["code", "message"],
        "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
    },
    "OpenAIError": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "integer", "null"]},
                },
            }
        },
    },
    "RuntimeError": {  # the runtime's own answers under /cdn-cgi/ and at the front door
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
            }
        },
    },
    "OpenAIResult": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"enum": ["chat.completion", "text_completion"]},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": _ANY_OBJECT},
            "usage": _ANY_OBJECT,
        },
    },
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
        },
    },
    "Response": {  # OpenAI's Response object (runtime.ai.responses_shapes)
        "type": "object",
        "required": ["id", "object", "created_at", "status", "model", "output"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "response"},
            "created_at": {"type": "integer"},
            "status": {"enum": ["completed", "incomplete", "failed", "in_progress"]},
            "model": {"type": "string"},
            "output": {"type": "array", "items": _ANY_OBJECT},
            "output_text": {"type": "string"},
            "usage": {"type": ["object", "null"]},
        },
    },
    "AIRunInputs": {  # what /ai/run and env.AI.run take: a run, the Responses shape, a batch, a poll
        "oneOf": [
            {"$ref": REF.format(name="TextGenerationInputs")},
            {"$ref": REF.format(name="ResponsesRequest")},
            {"$ref": REF.format(name="BatchRequest")},
            {"$ref": REF.format(name="BatchPoll")},
        ]
    },
    "BatchRequest": {  # with ?queueRequest=true (runtime.ai.batch)
        "type": "object",
        "required": ["requests"],
        "additionalProperties": False,
        "properties": {
            "requests": {"type": "array", "minItems": 1, "maxItems": MAX_REQUESTS, "items": _ANY_OBJECT}
        },
    },
    "BatchPoll": {
        "type": "object",
        "required": ["request_id"],
        "additionalProperties": False,
        "properties": {"request_id": {"type": "string"}},
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _ref_model}},
    },
    "AccountSettings": {  # runtime.control.accounts: what POST and PATCH take (null: unlimited)
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z0-9_-]{1,63}$"},
            "rpm": {"type": "integer", "minimum": 1},
            "tpm": {"type": ["integer", "null"], "minimum": 1},
            "weight": {"type": "number", "exclusiveMinimum": 0},
            "kv_share": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        },
    },
    "TokenRequest": {"type": "object", "properties": {"name": {"type": "string"}}},
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": REF.format(name=name)}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _answers(ok: dict[str, Any], error: str, ok_status: str = "200", media: str = "application/json"):
    """The success answer and, for every other status, the API's error shape."""
    return {
        ok_status: {"description": "done", "content": {media: {"schema": ok}}},
        "default": {"description": "refused; the message says what to change", **_json(_ref(error))},
    }


def _op(
    summary: str,
    params: list[str],
    responses: dict[str, Any],
    body: str | None = None,
    security: str = "apiToken",
    optional_body: bool = False,
    query: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "security": [{security: []}] if security else [],
        "parameters": [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params
        ]
        + [{"name": k, "in": "query", "required": False, "schema": v} for k, v in (query or {}).items()],
        "responses": responses,
    }
    if body is not None:
        op["requestBody"] = {"required": not optional_body, **_json(_ref(body))}
    return op


def _cf(summary: str, params: list[str], body: str | None = None, **kw) -> dict[str, Any]:
    return _op(summary, params, _answers(_ref("Envelope"), "Envelope"), body, **kw)


def _cdn(summary: str, params: list[str], body: str | None = None, ok: str = "200", **kw) -> dict[str, Any]:
    return _op(summary, params, _answers(_ANY_OBJECT, "RuntimeError", ok), body, security="adminToken", **kw)


def _page(summary: str, security: str, params: list[str] | None = None, ok: str = "200") -> dict[str, Any]:
    """A page or file for a browser (the dashboard's), not JSON."""
    answers = _answers({"type": "string"}, "RuntimeError", ok, "text/html")
    return _op(summary, params or [], answers, security=security)


def _streamed(ok: dict[str, Any], error: str) -> dict[str, Any]:
    """An AI call's answers: JSON, or server-sent events when the request asked for a stream."""
    answers = _answers(ok, error)
    answers["200"]["content"]["text/event-stream"] = {"schema": {}}
    return answers


def _log_query() -> dict[str, dict[str, Any]]:
    """The log list's query parameters (runtime.ai.gateway_log_query), each with its type; `filters`
    as the SDK writes it (filters.key, filters.operator, filters.value) or a JSON list."""
    number, text, flag = {"type": "number"}, {"type": "string"}, {"type": "boolean"}
    query: dict[str, dict[str, Any]] = {
        "page": {"type": "integer", "minimum": 1},
        "per_page": {"type": "integer", "minimum": 1, "maximum": MAX_PER_PAGE},
        "order_by": {"type": "string", "enum": list(ORDER_BY)},
        "order_by_direction": {"type": "string", "enum": ["asc", "desc"]},
        "direction": {"type": "string", "enum": ["asc", "desc"]},
        "start_date": {"type": "string", "format": "date-time"},
        "end_date": {"type": "string", "format": "date-time"},
        "feedback": {"type": "integer", "enum": [-1, 0, 1]},
        "meta_info": flag,
        "search": text,
        "filters": text,
    }
    for name, (_, kind) in EQUALS.items():
        query.setdefault(name, flag if kind == "boolean" else text)
    for name in RANGES:
        query[f"min_{name}"] = query[f"max_{name}"] = number
    return query


def _ai_search() -> dict[str, dict[str, Any]]:
    """AI Search's REST paths (runtime.routes.ai_search): the namespaces, then each instance's paths
    under a namespace and under the deprecated default-namespace prefix alike."""
    a, n = ["account"], ["account", "namespace"]
    base = ACCOUNT + "/ai-search"
    page = {"type": "integer", "minimum": 1}
    paging = {"page": page, "per_page": {"type": "integer", "minimum": 1, "maximum": 100}}
    text = {"type": "string"}
    chat = _streamed(_ANY_OBJECT, "Envelope")  # a chat.completion with its chunks, bare, or its events
    multipart = {"required": True, "content": {"multipart/form-data": {"schema": _ANY_OBJECT}}}
    paths: dict[str, dict[str, Any]] = {
        base + "/namespaces": {
            "get": _cf("the account's AI Search namespaces", a, query={**paging, "search": text}),
            "post": _cf("create a namespace", a, "NamespaceCreate"),
        },
        base + "/namespaces/{namespace}": {
            "get": _cf("one namespace", n),
            "put": _cf("change a namespace's description", n, "NamespaceUpdate", optional_body=True),
            "delete": _cf("delete an empty namespace (not default)", n),
        },
        base + "/namespaces/{namespace}/search": {
            "post": _cf("search several instances (ai_search_options.instance_ids)", n)
        },
        base + "/namespaces/{namespace}/chat/completions": {
            "post": _op("answer from several instances (ai_search_options.instance_ids)", n, chat)
        },
    }
    for prefix, p in ((base + "/namespaces/{namespace}/instances", n), (base + "/instances", a)):
        i = p + ["instance"]
        one = prefix + "/{instance}"
        listing = {**paging, "search": text, "order_by": {"enum": ["created_at"]}}
        listing["order_by_direction"] = {"enum": ["asc", "desc"]}
        listing |= {"namespace": text, "hostname": text}
        paths |= {
            prefix: {
                "get": _cf("the namespace's instances", p, query=listing),
                "post": _cf(
                    "create an instance (InstanceCreateParams: id, type, source, chunk_size, ...)", p
                ),
            },
            one: {
                "get": _cf("one instance", i),
                "put": _cf("change an instance's settings", i),
                "delete": _cf("delete an instance, its items and its index", i),
            },
            one + "/stats": {"get": _cf("queued, running, completed, error, skipped; the index's size", i)},
            one + "/search": {"post": _cf("search the instance: {query | messages, ai_search_options}", i)},
            one + "/chat/completions": {"post": _op("answer from the instance (stream: true: SSE)", i, chat)},
            one + "/items": {
                "get": _cf(
                    "the instance's items",
                    i,
                    query={**paging, "key": text, "item_id": text, "status": text},
                ),
                "post": {
                    **_cf("upload a file: part 'file' (its name the key), 'metadata' a JSON object", i),
                    "requestBody": multipart,
                },
            },
            one + "/items/{item}": {
                "get": _cf("one item: its status, chunks and metadata", i + ["item"]),
                "delete": _cf("delete an item and its chunks", i + ["item"]),
            },
            one + "/items/{item}/download": {
                "get": _op(
                    "the item's bytes, as uploaded",
                    i + ["item"],
                    _answers({}, "Envelope", media="application/octet-stream"),
                )
            },
            one + "/items/{item}/chunks": {
                "get": _cf(
                    "the item's chunks and their text",
                    i + ["item"],
                    query={"limit": page, "offset": {"type": "integer", "minimum": 0}, **paging},
                )
            },
            one + "/jobs": {
                "get": _cf("the instance's indexing jobs", i, query=paging),
                "post": _cf("sync the instance's source now", i, "JobCreate", optional_body=True),
            },
            one + "/jobs/{job}": {"get": _cf("one job: when it ran and how it ended", i + ["job"])},
        }
    return paths


def _paths() -> dict[str, dict[str, Any]]:
    a, s, g = ["account"], ["account", "name"], ["account", "gateway"]
    sse_or_envelope = _streamed(_ref("Envelope"), "Envelope")
    openai = _streamed(_ref("OpenAIResult"), "OpenAIError")
    page = {"type": "integer", "minimum": 1}
    return {
        PATH: {"get": _op("this document", [], _answers(_ANY_OBJECT, "Envelope"), security="")},
        ACCOUNT + "/ai/run/{model}": {
            "post": _op(
                "run a model (Workers AI), queue a batch (queueRequest=true) or poll one",
                a + ["model"],
                sse_or_envelope,
                "AIRunInputs",
                query={"queueRequest": {"type": "boolean"}},
            )
        },
        ACCOUNT + "/ai/models/search": {
            "get": _cf(
                "the model catalog",
                a,
                query={
                    "search": {"type": "string"},
                    "task": {"type": "string"},
                    "author": {"type": "string"},
                    "page": page,
                    "per_page": page,
                },
            )
        },
        ACCOUNT + "/ai/models/schema": {
            "get": _cf("a model's input and output as JSON Schema", a, query={"model": {"type": "string"}})
        },
        ACCOUNT + "/ai/tasks/search": {"get": _cf("the tasks of the models served", a)},
        ACCOUNT + "/ai/authors/search": {"get": _cf("the authors of the models served", a)},
        ACCOUNT + "/ai/tomarkdown": {
            "post": {
                **_cf("documents to Markdown (multipart/form-data, each file in a part named 'files')", a),
                "requestBody": {
                    "required": True,
                    "content": {"multipart/form-data": {"schema": _ANY_OBJECT}},
                },
            }
        },
        ACCOUNT + "/ai/tomarkdown/supported": {"get": _cf("the file types toMarkdown converts", a)},
        ACCOUNT + "/ai/v1/chat/completions": {
            "post": _op("OpenAI chat completion", a, openai, "ChatCompletionRequest")
        },
        ACCOUNT + "/ai/v1/completions": {"post": _op("OpenAI completion", a, openai, "CompletionRequest")},
        ACCOUNT + "/ai/v1/responses": {
            "post": _op("OpenAI Responses", a, _streamed(_ref("Response"), "OpenAIError"), "ResponsesRequest")
        },
        ACCOUNT + "/ai/v1/models": {
            "get": _op("OpenAI model list", a, _answers(_ref("ModelList"), "OpenAIError"))
        },
        ACCOUNT + "/ai/v1/models/{model}": {
            "get": _op(
                "OpenAI model (404 for one not served)", a + ["model"], _answers(_ref("Model"), "OpenAIError")
            )
        },
        ACCOUNT + "/ai/v1/embeddings": {
            "post": _op(
                "OpenAI embeddings under the BGE names (a deterministic stand-in); 404 for another model",
                a,
                {
                    "default": {
                        "description": "an embeddings list, or an OpenAI error",
                        **_json(_ref("OpenAIError")),
                    }
                },
            )
        },
        SCRIPT: {"put": _cf("upload and deploy a version", s, "Upload")},
        SCRIPT + "/versions": {"get": _cf("versions, newest first", s)},
        SCRIPT + "/deployments": {
            "get": _cf("deployments, newest first", s),
            "post": _cf("deploy versions by percentage", s, "DeployRequest"),
        },
        SCRIPT + "/rollback": {"post": _cf("back to a version", s, "RollbackRequest", optional_body=True)},
        SCRIPT + "/secrets": {"get": _cf("secret names", s), "put": _cf("set a secret", s, "SecretRequest")},
        SCRIPT + "/secrets/{secret}": {"delete": _cf("delete a secret", s + ["secret"])},
        ACCOUNT + "/workflows": {"get": _cf("each workflow and its instances by status", a)},
        ACCOUNT + "/workflows/{name}/instances": {
            "post": _cf("a new instance of a workflow", s, "TriggerRequest", optional_body=True)
        },
        ACCOUNT + "/workflows/{name}/instances/{id}": {
            "get": _cf("an instance: status, params, output, error, steps", s + ["id"])
        },
        ACCOUNT + "/ai-gateway/gateways": {
            "get": _cf(
                "the account's AI gateways",
                a,
                query={"page": page, "per_page": page, "search": {"type": "string"}},
            ),
            "post": _cf("create a gateway (Cloudflare's fields: id, cache_ttl, collect_logs, ...)", a),
        },
        ACCOUNT + "/ai-gateway/gateways/{gateway}": {
            "get": _cf("one gateway", g),
            "put": _cf("replace a gateway's settings", g),
            "delete": _cf("delete a gateway, its logs and its cache", g),
        },
        ACCOUNT + "/ai-gateway/gateways/{gateway}/url/{provider}": {
            "get": _cf("the gateway's URL for a provider (workers-ai, compat)", g + ["provider"])
        },
        ACCOUNT + "/ai-gateway/gateways/{gateway}/logs": {
            "get": _cf("a page of a gateway's logs, filtered and ordered", g, query=_log_query())
        },
        ACCOUNT + "/ai-gateway/gateways/{gateway}/logs/{id}": {
            "get": _cf("one log of a gateway", g + ["id"]),
            "patch": _cf("score, feedback or metadata of a log", g + ["id"], optional_body=True),
        },
        ACCOUNT + "/ai-gateway/gateways/{gateway}/logs/{id}/request": {
            "get": _op(
                "the request body a log kept, as it was sent", g + ["id"], _answers(_ANY_OBJECT, "Envelope")
            )
        },
        ACCOUNT + "/ai-gateway/gateways/{gateway}/logs/{id}/response": {
            "get": _op(
                "the body a log's call answered (a stream's events as they streamed)",
                g + ["id"],
                _answers(_ANY_OBJECT, "Envelope"),
            )
        },
        **_ai_search(),
        "/cdn-cgi/ai-gateway/v1/{account}/{gateway}/compat/chat/completions": {
            "post": _op("OpenAI's chat completions through a gateway", g, openai, "ChatCompletionRequest")
        },
        "/cdn-cgi/ai-gateway/v1/{account}/{gateway}/compat/embeddings": {
            "post": _op("OpenAI's embeddings through a gateway", g, _answers(_ANY_OBJECT, "OpenAIError"))
        },
        "/cdn-cgi/ai-gateway/v1/{account}/{gateway}/compat/models": {
            "get": _op("the models the compat door reaches", g, _answers(_ref("ModelList"), "OpenAIError"))
        },
        "/cdn-cgi/ai-gateway/v1/{account}/{gateway}/workers-ai/{model}": {
            "post": _op(
                "a Workers AI call through a gateway (cache, retries, logs)", g + ["model"], sse_or_envelope
            )
        },
        SCRIPT + "/tail": {
            "get": _op(
                "live events, one JSON per line",
                s,
                _answers({}, "Envelope", media="application/x-ndjson"),
                query={"status": {"enum": ["ok", "error"]}},
            )
        },
        CDN + "/health": {"get": _op("readiness", [], _answers(_ANY_OBJECT, "RuntimeError"), security="")},
        CDN + "/pops": {"get": _cdn("each GPU PoP's state", [])},
        CDN + "/metrics": {
            "get": _op(
                "Prometheus metrics",
                [],
                _answers({"type": "string"}, "RuntimeError", media="text/plain"),
                security="",
            )
        },
        CDN + "/models/reload": {"post": _cdn("load a new version of a model", [], "ReloadRequest")},
        CDN + "/models/rollout": {
            "get": _cdn("the canary rollouts in progress", []),
            "post": _cdn("serve a new version to a share of session keys", [], "StartRequest"),
        },
        CDN + "/models/rollout/finish": {
            "post": _cdn("promote a canary or roll it back", [], "FinishRequest")
        },
        CDN + "/pops/{code}/{action}": {"post": _cdn("take a PoP down or bring it up", ["code", "action"])},
        CDN + "/accounts": {
            "get": _cdn("accounts", []),
            "post": _cdn("a new account and its first token", [], "AccountSettings", ok="201"),
        },
        CDN + "/accounts/{name}": {
            "patch": _cdn("change an account's settings", ["name"], "AccountSettings")
        },
        CDN + "/accounts/{name}/tokens": {
            "get": _cdn("token names", ["name"]),
            "post": _cdn("a new API token", ["name"], "TokenRequest", ok="201", optional_body=True),
        },
        CDN + "/accounts/{name}/tokens/{token}": {"delete": _cdn("revoke a token", ["name", "token"])},
        # the live dashboard (runtime.routes.dashboard): a page for a browser, its session a cookie
        CDN + "/dashboard": {"get": _page("the dashboard, or its login form without a session", "")},
        CDN + "/dashboard/login": {
            "post": _op(
                "trade the admin token (form field `token`) for a session cookie; 303 to the dashboard",
                [],
                {
                    **_answers({"type": "string"}, "RuntimeError", ok_status="303", media="text/html"),
                    "403": {
                        "description": "not the admin token: the login form again, saying so",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    },
                },
                security="",
            )
        },
        CDN + "/dashboard/logout": {"post": _page("end the session; 303 to the login form", "", ok="303")},
        CDN + "/dashboard/events": {
            "get": _op(
                "the dashboard's live state, as server-sent events",
                [],
                _answers({"type": "string"}, "RuntimeError", media="text/event-stream"),
                security="dashboardSession",
            )
        },
        CDN + "/dashboard/static/{name}": {"get": _page("the page's own CSS and JavaScript", "", ["name"])},
        "/cdn-cgi/handler/scheduled": {
            "get": _op(
                "run the dev worker's scheduled handler once",
                [],
                _answers({"type": "string"}, "RuntimeError", media="text/plain"),
                security="",
                query={"cron": {"type": "string"}, "time": {"type": "string"}},
            )
        },
    }


def document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(STRUCTS, ref_template=REF)
    for name in ("TextGenerationInputs", "ChatCompletionRequest", "CompletionRequest"):
        # documented by the APIs, refused here by name (runtime.ai.refusals): what and why
        components[name]["x-refused"] = {param: why for param, (_, why) in REFUSED.items()}
    return {
        "openapi": "3.1.0",
        "info": {"title": "edge-workers runtime", "version": "1"},
        "paths": _paths(),
        "components": {
            "schemas": {**components, **_SCHEMAS},
            "securitySchemes": {
                "apiToken": {"type": "http", "scheme": "bearer", "description": "an account's API token"},
                "adminToken": {"type": "http", "scheme": "bearer", "description": "edge dev's admin token"},
                "dashboardSession": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": "edge_dashboard",
                    "description": "the session the dashboard's login form gives for the admin token",
                },
            },
        },
    }


def routes() -> list[Route]:
    cached: list[dict[str, Any]] = []

    async def serve(request: Request) -> Response:
        if not cached:
            cached.append(document())
        return JSONResponse(cached[0])

    return [Route(PATH, serve, methods=["GET"])]
