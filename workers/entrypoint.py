"""`WorkerEntrypoint`: the base class of a worker's `Default` class."""

from __future__ import annotations

from typing import Any


class WorkerEntrypoint:
    """Subclass it and define `async def fetch(self, request)`; `self.env` holds the bindings."""

    def __init__(self, ctx: Any, env: Any):
        self.ctx = ctx
        self.env = env
