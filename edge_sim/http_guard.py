"""The two checks every HTTP door of a node or runtime makes before reading a request: its bearer
token, compared in constant time, and its body, read in chunks up to a cap. A module of its own,
light to import: the `edge` CLI's control commands use them without loading the engine."""

from __future__ import annotations

import hmac

from starlette.requests import Request


def bearer_ok(authorization: str | None, token: str) -> bool:
    """Whether `Authorization: Bearer <x>` carries `token` (compared in constant time)."""
    header = (authorization or "").strip()
    if not token or not header.lower().startswith("bearer "):
        return False
    return hmac.compare_digest(header[7:].strip().encode(), token.encode())


async def read_capped(request: Request, limit: int) -> bytes | None:
    """The request body, read in chunks; None as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
