"""Remote PoP nodes: one PoP served by its own process (`edge pop serve`), msgspec over HTTP.

The node process wraps an in-process PopNode in a small Starlette app; `RemotePopNode` is the
client the router drives exactly like an in-process node (same methods), so one edge can span
real hosts. Generation streams back as length-prefixed msgpack frames, one per engine event.
A health check refreshes what the router ranks by (and marks an unreachable node down).

A node answers `/v1/generate`, `/v1/down` and `/v1/up` (and the full `/v1/health`) only with
`Authorization: Bearer <node token>`, the token it was started with (`edge pop serve --token` or
$EDGE_NODE_TOKEN); without it `/v1/health` says only whether the node is up. The runtime's
`RemotePopNode` sends $EDGE_NODE_TOKEN_<CODE> (e.g. EDGE_NODE_TOKEN_FRA), else $EDGE_NODE_TOKEN.
Request bodies are capped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from edge_sim.errors import EdgeError, PopDown
from edge_sim.http_guard import bearer_ok, read_capped
from edge_sim.load import PopLoad
from edge_sim.node import NodeBase
from edge_sim.pop import PopNode
from edge_sim.request import Formats, GenerateRequest
from edge_sim.status import PopStatus
from edge_sim.topology import PoP
from engine import SeqEvent

log = logging.getLogger("edge.remote")

MSGPACK = "application/vnd.msgpack"
NODE_TOKEN_ENV = "EDGE_NODE_TOKEN"
GENERATE_BODY_BYTES = 8 * 1024 * 1024  # a prompt far past any context window
CONTROL_BODY_BYTES = 64 * 1024
# how often a stream waiting for its node's next frame looks whether a health check has failed since
# it started: a cut link sends no reset, so the read alone would wait out its whole timeout
STALL_POLL_S = 0.5


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


def create_pop_app(node: PopNode, token: str) -> Starlette:
    """The node's HTTP surface; `token` is the node token its runtime must send."""
    if not token:
        raise ValueError("a PoP node needs a node token")

    def refused(request: Request) -> Response | None:
        if bearer_ok(request.headers.get("authorization"), token):
            return None
        status = 401 if "authorization" not in request.headers else 403
        message = f"send Authorization: Bearer <node token> (edge pop serve --token or ${NODE_TOKEN_ENV})"
        return Response(_encode({"error": message}), status_code=status, media_type=MSGPACK)

    def too_large(limit: int) -> Response:
        return Response(_encode({"error": f"body over {limit} bytes"}), status_code=413, media_type=MSGPACK)

    async def generate(request: Request) -> Response:
        if (denied := refused(request)) is not None:
            return denied
        body = await read_capped(request, GENERATE_BODY_BYTES)
        if body is None:
            return too_large(GENERATE_BODY_BYTES)
        try:
            req = _decode_request(body)
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
        if refused(request) is not None:  # a liveness probe: nothing about models or load
            return Response(_encode({"up": node.up}), media_type=MSGPACK)
        return Response(_encode(node.status()), media_type=MSGPACK)

    async def state(request: Request) -> Response:
        if (denied := refused(request)) is not None:
            return denied
        action = request.path_params["action"]
        if action not in ("down", "up"):
            return Response(
                _encode({"error": "POST /v1/down or /v1/up"}), status_code=404, media_type=MSGPACK
            )
        if await read_capped(request, CONTROL_BODY_BYTES) is None:
            return too_large(CONTROL_BODY_BYTES)
        handed = await node.take_down() if action == "down" else 0
        if action == "up":
            await node.bring_up()
        return Response(_encode({"up": node.up, "rerouted": handed}), media_type=MSGPACK)

    return Starlette(
        routes=[
            Route("/v1/generate", generate, methods=["POST"]),
            Route("/v1/health", health, methods=["GET"]),
            Route("/v1/{action:str}", state, methods=["POST"]),
        ]
    )


# --- the router's side -----------------------------------------------------------------------------------


class RemotePopNode(NodeBase):
    """A PoP node in another process or host, behind the same interface as PopNode (node.PopNodeLike)."""

    def __init__(self, pop: PoP, url: str, timeout: float = 600.0, token: str | None = None):
        self.pop = pop
        self.url = url.rstrip("/")
        token = (
            token or os.environ.get(f"{NODE_TOKEN_ENV}_{pop.code.upper()}") or os.environ.get(NODE_TOKEN_ENV)
        )
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=5.0), headers=headers)
        self._status: PopStatus | None = None  # the node's own view, as of its last health check
        self.reachable = False
        self.refused: dict[str, str] = {}
        self._token_refused = False
        self.failed_checks = 0  # health checks that got no answer, ever: streams in flight watch it

    @property
    def up(self) -> bool:
        return self.reachable and self._status is not None and self._status.up

    @property
    def in_flight(self) -> int:
        """Requests in flight at the node, as of its last health check."""
        return self._status.in_flight if self._status else 0

    async def refresh(self) -> bool:
        """Fetch what the router ranks by; an unreachable node counts as down until it answers."""
        try:
            r = await self._client.get(self.url + "/v1/health", timeout=5.0)
            r.raise_for_status()
            health = msgspec.msgpack.decode(r.content)
            if not isinstance(health, dict) or "models" not in health:
                # the node's liveness view: it did not take our token
                if not self._token_refused:
                    log.warning(
                        "remote PoP %s at %s does not accept this runtime's node token; set %s_%s or %s "
                        "to the token it was started with (it counts as down until then)",
                        self.code,
                        self.url,
                        NODE_TOKEN_ENV,
                        self.code,
                        NODE_TOKEN_ENV,
                    )
                self._token_refused, self.reachable = True, False
                return False
            self._token_refused = False
            self._status = msgspec.convert(health, PopStatus)
            self.refused = dict(self._status.refused)
            if not self.reachable:
                log.info("remote PoP %s at %s is reachable", self.code, self.url)
            self.reachable = True
        except (httpx.HTTPError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            if self.reachable:
                log.warning("remote PoP %s at %s failed its health check: %s", self.code, self.url, exc)
            self.reachable = False
            self.failed_checks += 1
        return self.reachable

    def models(self) -> list[str]:
        return list(self._status.models) if self.reachable and self._status else []

    def has_room(self) -> bool:
        return self.up and self._status.in_flight < self._status.max_in_flight

    def route_load(self, model: str) -> PopLoad:
        return self._status.models[model].load()  # as of the last health check

    async def stream(self, req: GenerateRequest) -> AsyncIterator[SeqEvent]:
        try:
            async with self._client.stream(
                "POST", self.url + "/v1/generate", content=_encode(req), headers={"content-type": MSGPACK}
            ) as r:
                if r.status_code in (401, 403):
                    self.reachable = False
                    raise EdgeError(
                        "no_capacity", f"remote PoP {self.code} refused this runtime's node token"
                    )
                if r.status_code != 200:
                    raise EdgeError("invalid_input", f"PoP {self.code} refused the request ({r.status_code})")
                buffer = b""
                chunks, checks_failed = r.aiter_bytes(), self.failed_checks
                while (chunk := await self._next_chunk(chunks, checks_failed)) is not None:
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

    async def _next_chunk(self, chunks: AsyncIterator[bytes], checks_failed: int) -> bytes | None:
        """The stream's next bytes (None at its end); an EdgeError once a health check made after
        the stream started has failed and the node is still unreachable (its link is cut, say)."""
        pending = asyncio.ensure_future(anext(chunks, None))
        try:
            while not (await asyncio.wait({pending}, timeout=STALL_POLL_S))[0]:
                if self.failed_checks > checks_failed and not self.reachable:
                    raise EdgeError(
                        "no_capacity",
                        f"remote PoP {self.code} stopped answering its health checks mid-request",
                    )
            return pending.result()
        finally:
            pending.cancel()  # a no-op once it is done

    def formats(self, model: str) -> Formats:
        m = self._status.models.get(model) if self._status else None
        return m.formats() if m else Formats.unknown()

    async def _control(self, action: str) -> dict[str, Any]:
        try:
            r = await self._client.post(self.url + f"/v1/{action}", timeout=30.0)
        except httpx.HTTPError as exc:
            raise EdgeError("no_capacity", f"remote PoP {self.code} at {self.url}: {exc}") from None
        if r.status_code != 200:
            reason = "it refused this runtime's node token" if r.status_code in (401, 403) else r.status_code
            raise EdgeError("no_capacity", f"remote PoP {self.code} did not go {action} ({reason})")
        await self.refresh()
        return msgspec.msgpack.decode(r.content)

    async def take_down(self) -> int:
        return (await self._control("down"))["rerouted"]

    async def bring_up(self) -> None:
        await self._control("up")

    def status(self) -> PopStatus:
        """The node's status as of its last health check, with how this runtime reaches it."""
        last = self._status or PopStatus(
            code=self.code,
            city=self.pop.city,
            up=False,
            gpus=dict(self.pop.gpus),
            in_flight=0,
            queue_depth=0,
            max_in_flight=0,
            models={},
            refused={},
        )
        return msgspec.structs.replace(last, up=self.up, remote=self.url, reachable=self.reachable)

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
