"""`WorkerEntrypoint`: the base class of a worker's `Default` class."""

from __future__ import annotations

from typing import Any

from workers.context import _remember


class WorkerEntrypoint:
    """Subclass it and define `async def fetch(self, request)`; `self.env` holds the bindings."""

    def __new__(cls, *args: Any, **kwargs: Any):
        # built once per request with (ctx, env): workers.env and workers.wait_until learn them here
        _remember(args[0] if args else kwargs.get("ctx"), args[1] if len(args) > 1 else kwargs.get("env"))
        return super().__new__(cls)

    def __init__(self, ctx: Any, env: Any):
        self.ctx = ctx
        self.env = env
