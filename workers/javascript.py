"""`import_from_javascript("cloudflare:workers")`: the one JavaScript module a Python Worker may
import here, its env, waitUntil and entry-point classes.

A module of its own, above workers.context (env, wait_until) and the entry points
(workers.entrypoint, workers.objects), because it gathers them all: the entry points import
workers.context to learn each request's (ctx, env), so the gathering cannot live in
workers.context without that module importing them back.
"""

from __future__ import annotations

import types
from typing import Any

from workers.context import env, wait_until
from workers.entrypoint import WorkerEntrypoint
from workers.objects import DurableObject, WorkflowEntrypoint


def import_from_javascript(module_name: str) -> Any:
    """Cloudflare imports a JavaScript module. Here only `cloudflare:workers` exists (its env,
    waitUntil and entry-point classes); there is no JavaScript to import anything else from."""
    if module_name != "cloudflare:workers":
        raise ImportError(
            f"Failed to import {module_name!r}: the edge runtime runs no JavaScript; "
            "only 'cloudflare:workers' is simulated"
        )
    return types.SimpleNamespace(
        env=env,
        waitUntil=wait_until,
        WorkerEntrypoint=WorkerEntrypoint,
        DurableObject=DurableObject,
        WorkflowEntrypoint=WorkflowEntrypoint,
    )
