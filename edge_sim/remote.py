"""Remote PoP nodes: one PoP served by its own process (`edge pop serve`), msgspec over HTTP.

The node process wraps an in-process PopNode in a small Starlette app; `RemotePopNode` is the
client the router drives exactly like an in-process node (same methods), so one edge can span
real hosts. Generation streams back as length-prefixed msgpack frames, one per engine event.
A health check refreshes what the router ranks by (and marks an unreachable node down).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from edge_sim.errors import EdgeError
from edge_sim.pop import GenerateRequest, GenerateResult, PopDown, PopNode, collect
from edge_sim.topology import PoP
from engine import SeqEvent

log = logging.getLogger("edge.remote")

MSGPACK = "application/vnd.msgpack"


class Frame(msgspec.Struct):
    kind: Literal["event", "error", "down"]
    event: SeqEvent | None = None
    error_kind: str | None = None
    message: str | None = None


_HEADER = struct.Struct(">I")
_encode = msgspec.msgpack.Encoder().encode
_decode_frame = msgspec.msgpack.Decoder(Frame).decode
_decode_request = msgspec.msgpack.Decoder(GenerateRequest).decode


def _frame(frame: Frame) -> bytes:
    body = _encode(frame)
    return _HEADER.pack(len(body)) + body


# --- the node process ---------------------------------------------------------------------------------


def create_pop_app(node: PopNode) -> Starlette:
    async def generate(request: Request) -> Response:
        try:
            req = _decode_request(await request.body())
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return Response(_encode({"error": str(exc)}), status_code=400, media_type=MSGPACK)

        async def frames() -> AsyncIterator[bytes]:
            try:
                async for event in node.stream(req):
                    yield _frame(Frame("event", event=event))
            except EdgeError as exc:
                yield _frame(Frame("error", error_kind=exc.kind, message=exc.message))
            except PopDown as exc:
                yield _frame(Frame("down", message=str(exc)))

        return StreamingResponse(frames(), media_type=MSGPACK)

    async def health(request: Request) -> Response:
        return Response(_encode({**node.health(), "status": node.status()}), media_type=MSGPACK)

    async def state(request: Request) -> Response:
        handed = node.take_down() if request.path_params["action"] == "down" else (node.bring_up() or 0)
        return Response(_encode({"up": node.up, "rerouted": handed}), media_type=MSGPACK)

    return Starlette(
        routes=[
            Route("/v1/generate", generate, methods=["POST"]),
            Route("/v1/health", health, methods=["GET"]),
            Route("/v1/{action:str}", state, methods=["POST"]),
        ]
    )


# --- the router's side -----------------------------------------------------------------------------------


class RemotePopNode:
    """A PoP node in another process or host, behind the same interface as PopNode."""

    def __init__(self, pop: PoP, url: str, timeout: float = 600.0):
        self.pop = pop
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=5.0))
        self._health: dict[str, Any] = {}
        self.reachable = False
        self.refused: dict[str, str] = {}

    @property
    def code(self) -> str:
        return self.pop.code

    @property
    def up(self) -> bool:
        return self.reachable and bool(self._health.get("up"))

    @property
    def queue_depth(self) -> int:
        """Requests in flight at the node, as of its last health report."""
        return int(self._health.get("in_flight", 0))

    async def refresh(self) -> bool:
        """Fetch what the router ranks by; an unreachable node counts as down until it answers."""
        try:
            r = await self._client.get(self.url + "/v1/health", timeout=5.0)
            r.raise_for_status()
            self._health = msgspec.msgpack.decode(r.content)
            self.refused = dict(self._health.get("refused", {}))
            if not self.reachable:
                log.info("remote PoP %s at %s is reachable", self.code, self.url)
            self.reachable = True
        except (httpx.HTTPError, msgspec.DecodeError) as exc:
            if self.reachable:
                log.warning("remote PoP %s at %s failed its health check: %s", self.code, self.url, exc)
            self.reachable = False
        return self.reachable

    def models(self) -> list[str]:
        return list(self._health.get("models", {})) if self.reachable else []

    def serves(self, model: str) -> bool:
        return model in self.models()

    def has_room(self) -> bool:
        h = self._health
        return self.up and h.get("in_flight", 0) < h.get("max_in_flight", 0)

    def expected_ttft_ms(self, model: str, prompt_tokens: int) -> float:
        m = self._health["models"][model]
        return (m["pending_tokens"] + prompt_tokens) * m["prefill_ms_per_token"]

    async def stream(self, req: GenerateRequest) -> AsyncIterator[SeqEvent]:
        try:
            async with self._client.stream(
                "POST", self.url + "/v1/generate", content=_encode(req), headers={"content-type": MSGPACK}
            ) as r:
                if r.status_code != 200:
                    raise EdgeError("invalid_input", f"PoP {self.code} refused the request ({r.status_code})")
                buffer = b""
                async for chunk in r.aiter_bytes():
                    buffer += chunk
                    while len(buffer) >= _HEADER.size:
                        (n,) = _HEADER.unpack_from(buffer)
                        if len(buffer) < _HEADER.size + n:
                            break
                        frame = _decode_frame(buffer[_HEADER.size : _HEADER.size + n])
                        buffer = buffer[_HEADER.size + n :]
                        if frame.kind == "error":
                            raise EdgeError(frame.error_kind, frame.message)
                        if frame.kind == "down":
                            raise PopDown(self.code)
                        yield frame.event
        except httpx.HTTPError as exc:
            self.reachable = False
            raise EdgeError("no_capacity", f"remote PoP {self.code} failed mid-request ({exc})") from None

    def formats(self, model: str) -> tuple[str, str, dict[str, str]]:
        weights, kv, by_part = self._health["models"].get(model, {}).get("formats") or ["", "", {}]
        return weights, kv, by_part

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        return await collect(self.stream(req), self.code, req.model, *self.formats(req.model))

    async def take_down(self) -> int:
        r = await self._client.post(self.url + "/v1/down")
        await self.refresh()
        return msgspec.msgpack.decode(r.content)["rerouted"]

    async def bring_up(self) -> None:
        await self._client.post(self.url + "/v1/up")
        await self.refresh()

    def status(self) -> dict[str, Any]:
        status = dict(self._health.get("status", {"code": self.code, "city": self.pop.city, "models": {}}))
        status.update(up=self.up, remote=self.url, reachable=self.reachable)
        return status

    def close(self) -> None:
        try:
            asyncio.get_running_loop().create_task(self._client.aclose())
        except RuntimeError:
            pass  # no loop left: the process is ending


async def health_checks(nodes: list[RemotePopNode], interval: float = 2.0) -> None:
    """Refresh every remote node forever (run as a background task)."""
    while True:
        await asyncio.gather(*(node.refresh() for node in nodes))
        await asyncio.sleep(interval)
