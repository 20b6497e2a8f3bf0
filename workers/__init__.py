"""The SDK a worker script imports, in the style of Cloudflare Python Workers.

    from workers import WorkerEntrypoint, Response

    class Default(WorkerEntrypoint):
        async def fetch(self, request):
            return Response.json({"hello": request.cf["city"]})

This package stands alone: it runs inside the isolate and imports nothing of the runtime's.
"""

from workers.entrypoint import WorkerEntrypoint
from workers.errors import AIError
from workers.fetch import fetch
from workers.http import Headers, Request, Response

__all__ = ["AIError", "Headers", "Request", "Response", "WorkerEntrypoint", "fetch"]
