"""The SDK a worker script imports, in the style of Cloudflare Python Workers.

    from workers import WorkerEntrypoint, Response

    class Default(WorkerEntrypoint):
        async def fetch(self, request):
            return Response.json({"hello": request.cf["city"]})

This package stands alone: it runs inside the isolate and imports nothing of the runtime's.
"""

from workers.abort import AbortError
from workers.blob import Blob, BlobEnding, BlobValue, File
from workers.context import (
    env,
    patch_env,
    python_from_rpc,
    python_to_rpc,
    wait_until,
    waitUntil,
)
from workers.entrypoint import WorkerEntrypoint
from workers.errors import AIError, InferenceUpstreamError
from workers.fetch import fetch
from workers.formdata import FormData, FormDataValue
from workers.http import Headers, Request, Response
from workers.javascript import import_from_javascript
from workers.objects import DurableObject, WorkflowEntrypoint, handler
from workers.types import Body, Context, FetchKwargs, FetchResponse, JSBody, RequestInitCfProperties

# Cloudflare's workers-runtime-sdk names (tests/fixtures/cloudflare_workers_sdk_all.json), plus the
# errors env.AI raises (AIError, InferenceUpstreamError as workerd names it, AbortError for a signal)
__all__ = [
    "AIError",
    "AbortError",
    "Blob",
    "BlobEnding",
    "BlobValue",
    "Body",
    "Context",
    "DurableObject",
    "FetchKwargs",
    "FetchResponse",
    "File",
    "FormData",
    "FormDataValue",
    "Headers",
    "InferenceUpstreamError",
    "JSBody",
    "Request",
    "RequestInitCfProperties",
    "Response",
    "WorkerEntrypoint",
    "WorkflowEntrypoint",
    "env",
    "fetch",
    "handler",
    "import_from_javascript",
    "patch_env",
    "python_from_rpc",
    "python_to_rpc",
    "waitUntil",
    "wait_until",
]
