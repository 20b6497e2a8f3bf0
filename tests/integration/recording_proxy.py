"""A recording reverse proxy, run as its own process by the upstream tests: it appends each JSON
request body's `cache_salt` (or null) to a file, removes the field (this project's OpenAI endpoint
refuses fields it does not know) and forwards the request, streaming the answer back.

    python tests/integration/recording_proxy.py TARGET_URL PORT RECORD_FILE
"""

from __future__ import annotations

import json
import sys

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route


def create_app(target: str, record: str) -> Starlette:
    client = httpx.AsyncClient(timeout=600)

    async def forward(request: Request) -> StreamingResponse:
        body = await request.body()
        if body:
            payload = json.loads(body)
            with open(record, "a") as f:
                f.write(json.dumps(payload.pop("cache_salt", None)) + "\n")
            body = json.dumps(payload).encode()
        headers = {k: v for k, v in request.headers.items() if k in ("authorization", "content-type")}
        upstream = await client.send(
            client.build_request(request.method, target + request.url.path, content=body, headers=headers),
            stream=True,
        )
        return StreamingResponse(
            upstream.aiter_raw(),
            status_code=upstream.status_code,
            media_type=upstream.headers.get("content-type"),
            background=None,
        )

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


if __name__ == "__main__":
    target_url, port, record_file = sys.argv[1].rstrip("/"), int(sys.argv[2]), sys.argv[3]
    uvicorn.run(create_app(target_url, record_file), host="127.0.0.1", port=port, log_level="warning")
