"""Messages between the runtime and an isolate process: msgspec structs, msgpack, length-prefixed.

The runtime sends Init and Invoke; the isolate answers Ready/LoadFailed and InvokeResult/InvokeError,
and calls back into the runtime with AIRun (answered by AIReply) because the runtime owns the
AI service. Frames are a 4-byte big-endian length followed by the msgpack body.

Every pipe is bounded. Bodies larger than CHUNK travel as chunks in both directions, each side
holding at most WINDOW chunks that the other has not yet consumed (RequestAck / BodyAck give
credit back), so neither a 100 MB upload nor an endless response ever sits whole in memory. A
frame from an isolate may be at most FROM_ISOLATE bytes: the runtime never allocates more on an
untrusted peer's say-so.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec

CHUNK = 64 * 1024  # body bytes per frame
WINDOW = 16  # chunks in flight per body before the sender waits for credit
FROM_ISOLATE = 2 * 1024 * 1024  # largest frame the runtime reads from an isolate
TO_ISOLATE = 16 * 1024 * 1024  # largest frame an isolate reads from the runtime (fetch replies)
MAX_FRAME = TO_ISOLATE


class HeldSocket(msgspec.Struct):
    """A WebSocket the runtime held while a Durable Object hibernated: the woken isolate gets it
    back (ctx.getWebSockets) with its tags and attachment."""

    ws: int
    tags: list[str]
    attachment: Any = None


class Init(msgspec.Struct, tag=True):
    script: str  # absolute path of the worker's main module
    vars: dict[str, Any]  # [vars] and secrets: the worker's env
    ai_binding: str | None
    services: list[str] = []  # service binding names: env.NAME.fetch(...) reaches another worker
    memory_mb: int = 128  # address space the worker may add on top of the runtime's own
    sandbox: bool = True  # confine the file system and network (Landlock) before loading the script
    jailed: bool = (
        False  # runs inside runtime.isolate.jail's namespaces: its whole view is read-only but /tmp
    )
    # store bindings (KV, D1, R2, queue producers): env name -> its SDK client, "workers.kv:KVNamespace"
    bindings: dict[str, str] = {}
    durable_objects: dict[str, str] = {}  # Durable Object namespaces: env name -> namespace key
    durable_object: str | None = None  # serve this Durable Object class (its instance), not Default
    object_id: str | None = None  # ... the instance with this id
    workflow: str | None = None  # run instances of this Workflow class (WorkflowRun), not Default
    deps: str = ""  # the project's installed dependencies (runtime.host.deps), readable; "" = none
    sockets: list[HeldSocket] = []  # a Durable Object's hibernated WebSockets, woken with it
    socket_base: int = 1  # the first id this isolate gives a WebSocketPair (ids held stay below)


class Ready(msgspec.Struct, tag=True):
    entry: str  # "Default.fetch" or "on_fetch"


class LoadFailed(msgspec.Struct, tag=True):
    message: str
    traceback: str


class Invoke(msgspec.Struct, tag=True):
    id: int
    method: str
    url: str
    headers: list[tuple[str, str]]
    body: bytes  # the whole body when it fits one chunk; else b"" and RequestChunks follow
    cf: dict[str, Any]
    streamed_body: bool = False


class Scheduled(msgspec.Struct, tag=True):
    """Run the worker's scheduled handler (a Cron Trigger fired): answered by InvokeResult (status
    200; header no-retry when the handler called controller.noRetry()) or InvokeError, each once
    its waitUntil work has ended, then RequestDone."""

    id: int
    cron: str
    scheduled_time: int  # ms since the epoch, UTC: controller.scheduledTime


class QueuedMessage(msgspec.Struct):
    """One message of a QueueBatch."""

    id: str
    timestamp_ms: int  # when it was sent, ms since the epoch
    body: Any
    attempts: int  # 1 on its first delivery


class QueueBatch(msgspec.Struct, tag=True):
    """Run the worker's queue handler on a batch of one queue's messages: answered by QueueOutcome,
    then InvokeResult (status 200) or InvokeError (the handler raised), then RequestDone."""

    id: int
    queue: str
    messages: list[QueuedMessage]


class QueueOutcome(msgspec.Struct, tag=True):
    """What became of each message of a QueueBatch: acked, or retried after `delay` seconds
    (None: the consumer's retry_delay). A message in neither list is retried."""

    id: int
    acked: list[str]
    retried: dict[str, int | None]


class RequestChunk(msgspec.Struct, tag=True):
    id: int
    data: bytes


class RequestEnd(msgspec.Struct, tag=True):
    id: int
    error: str | None = None  # the client's body failed (or grew past the limit)


class RequestAck(msgspec.Struct, tag=True):
    """The worker consumed one RequestChunk: the runtime may send another."""

    id: int


class BodyAck(msgspec.Struct, tag=True):
    """The client took one BodyChunk: the isolate may send another."""

    id: int


class Cancel(msgspec.Struct, tag=True):
    """Stop the request's work: its client went away or it ran past its wall-clock limit."""

    id: int


class RequestDone(msgspec.Struct, tag=True):
    """Everything a request started (its response body, its waitUntil work) has ended."""

    id: int


class SocketOffer(msgspec.Struct):
    """A 101 response's WebSocket: the server end `ws` of a pair this isolate made (tags set: the
    Durable Object accepted it with ctx.acceptWebSocket, so it may hibernate), or `token`: one a
    Durable Object answered this worker's stub.fetch with, passed on."""

    ws: int = 0
    tags: list[str] | None = None
    attachment: Any = None
    token: str | None = None


class InvokeResult(msgspec.Struct, tag=True):
    id: int
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    web_socket: SocketOffer | None = None  # status 101 only


class SocketSend(msgspec.Struct, tag=True):
    """From an isolate: server.send(message) on one of its WebSockets (text or data)."""

    ws: int
    text: str | None = None
    data: bytes | None = None


class SocketClose(msgspec.Struct, tag=True):
    ws: int
    code: int = 1000
    reason: str = ""


class SocketAttach(msgspec.Struct, tag=True):
    """ws.serializeAttachment(value): the runtime keeps it with the socket (it outlives the isolate)."""

    ws: int
    value: Any = None


class SocketEvent(msgspec.Struct, tag=True):
    """To an isolate: a client's message ("message": text or data) or its socket's end ("close",
    "error") on WebSocket `ws`; an event as a request is, answered by InvokeResult or InvokeError,
    then RequestDone."""

    id: int
    ws: int
    kind: str
    text: str | None = None
    data: bytes | None = None
    code: int = 1005
    reason: str = ""
    was_clean: bool = True


class InvokeError(msgspec.Struct, tag=True):
    id: int
    message: str  # "ExceptionType: message"
    traceback: str


class InvokeStart(msgspec.Struct, tag=True):
    """A streamed response: status and headers now, the body as BodyChunk messages, then BodyEnd."""

    id: int
    status: int
    headers: list[tuple[str, str]]


class BodyChunk(msgspec.Struct, tag=True):
    id: int
    data: bytes


class BodyEnd(msgspec.Struct, tag=True):
    id: int
    error: str | None = None  # the body's iterator raised


class Log(msgspec.Struct, tag=True):
    """A line the worker logged (print or logging) while handling a request (0: outside one)."""

    request: int
    level: str
    message: str


class FetchCall(msgspec.Struct, tag=True):
    """Outbound HTTP (workers.fetch), or a call to a service binding when `service` is set."""

    call: int
    request: int
    method: str
    url: str
    headers: list[tuple[str, str]]
    body: bytes
    service: str | None = None


class FetchReply(msgspec.Struct, tag=True):
    call: int
    status: int = 0
    headers: list[tuple[str, str]] = []
    body: bytes = b""
    error: str | None = None


class AIRun(msgspec.Struct, tag=True):
    """From an isolate: env.AI.run(model, inputs, options), answered by AIReply (or AIChunks then an
    AIReply). Not the AI service's call object (runtime.ai.call.AICall), which the runtime makes of it."""

    call: int
    request: int  # the Invoke this call belongs to
    model: str
    inputs: Any
    options: Any = None


class BindingCall(msgspec.Struct, tag=True):
    """env.NAME.method(*args, **kwargs) on a KV, D1 or R2 binding; the runtime checks every value.
    Answered by a BindingReply, or (an AI Search binding's streamed answer) by AIChunks then an
    AIReply, as an AIRun is."""

    call: int
    request: int  # the Invoke this call belongs to
    binding: str
    method: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}


class BindingReply(msgspec.Struct, tag=True):
    call: int
    result: Any = None
    error_type: str | None = None  # "KV_ERROR", "D1_ERROR", "R2_ERROR", "TypeError", "RangeError", ...
    error_message: str | None = None


class ObjectCall(msgspec.Struct, tag=True):
    """From an isolate: `await env.NS.get(id).method(*args, **kwargs)` (method "fetch": args are
    [method, url, headers, body]); answered by ObjectReply. The runtime checks every value."""

    call: int
    request: int  # the Invoke this call belongs to
    binding: str
    object_id: str
    method: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}


class ObjectReply(msgspec.Struct, tag=True):
    call: int
    result: Any = None  # the method's result; for "fetch": [status, headers, body]
    error_type: str | None = None  # the object's exception type ("ValueError") or "Error"
    error_message: str | None = None


class ObjectInvoke(msgspec.Struct, tag=True):
    """To a Durable Object's isolate: run `instance.method(*args, **kwargs)`; answered by
    ObjectResult or InvokeError, then RequestDone (its waitUntil work has ended)."""

    id: int
    method: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}


class WorkflowRun(msgspec.Struct, tag=True):
    """To a workflow's isolate: run `run(event, step)` of its class for one instance, from the
    top (finished steps answer from the runtime's books); answered by ObjectResult ({"output": x},
    or {"suspend": True} when the run stopped at a sleep or wait) or InvokeError, then RequestDone."""

    id: int
    instance_id: str
    payload: Any
    timestamp_ms: int


class ObjectAlarm(msgspec.Struct, tag=True):
    """To a Durable Object's isolate: its alarm is due, run `instance.alarm(alarm_info)`; answered
    by InvokeResult (status 200) or InvokeError, then RequestDone."""

    id: int
    retry_count: int = 0  # alarm_info.retryCount: 0 on the first try


class ObjectResult(msgspec.Struct, tag=True):
    id: int
    result: Any = None


class AIChunk(msgspec.Struct, tag=True):
    """Part of a streamed AI answer (SSE bytes); the AIReply that follows ends the stream. The
    first chunk carries the answer's headers (as the REST API's response: cf-ai-req-id, ...)."""

    call: int
    data: bytes
    headers: list[tuple[str, str]] = []


class AIReply(msgspec.Struct, tag=True):
    """An AI call's answer, or its error; `headers` as the REST API's response carries them
    (cf-ai-req-id: env.AI.lastRequestId)."""

    call: int
    result: Any = None
    error_code: int | None = None
    error_message: str | None = None
    headers: list[tuple[str, str]] = []


class AIQuery(msgspec.Struct, tag=True):
    """From an isolate: an env.AI method other than run (method "models": args [params];
    "autorag.search" / "autorag.aiSearch": args [name, params]; "autorag.list": args []);
    answered by BindingReply, or (a streamed aiSearch) by AIChunks then an AIReply."""

    call: int
    request: int  # the Invoke this call belongs to
    method: str
    args: list[Any] = []


class AIGatewayCall(msgspec.Struct, tag=True):
    """From an isolate: env.AI.gateway(id).getUrl(provider) / getLog(logId) / patchLog(logId,
    data), `args` as given; answered by BindingReply."""

    call: int
    request: int  # the Invoke this call belongs to
    gateway: str
    method: str
    args: list[Any] = []


class AIGatewayRun(msgspec.Struct, tag=True):
    """From an isolate: env.AI.gateway(id).run(data), AI Gateway's universal endpoint (one
    request or a fallback list); answered as an AIRun is (AIChunks, then an AIReply; the first
    carries the cf-aig-step and cf-aig-log-id headers)."""

    call: int
    request: int  # the Invoke this call belongs to
    gateway: str
    data: Any


class AICancel(msgspec.Struct, tag=True):
    """From an isolate: AI call `call` is aborted (its AbortSignal): the runtime cancels it, at
    the PoP too, and its KV blocks are freed."""

    call: int


Message = (
    Init
    | Ready
    | LoadFailed
    | Invoke
    | Scheduled
    | QueueBatch
    | QueueOutcome
    | InvokeResult
    | InvokeError
    | InvokeStart
    | BodyChunk
    | BodyEnd
    | AIRun
    | AIChunk
    | AIReply
    | AICancel
    | AIQuery
    | AIGatewayCall
    | AIGatewayRun
    | BindingCall
    | BindingReply
    | ObjectCall
    | ObjectReply
    | ObjectInvoke
    | WorkflowRun
    | ObjectAlarm
    | SocketSend
    | SocketClose
    | SocketAttach
    | SocketEvent
    | ObjectResult
    | Log
    | FetchCall
    | FetchReply
    | RequestChunk
    | RequestEnd
    | RequestAck
    | BodyAck
    | Cancel
    | RequestDone
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
_HEADER = struct.Struct(">I")


def encode(msg: Message) -> bytes:
    body = _encoder.encode(msg)
    return _HEADER.pack(len(body)) + body


def decode(body: bytes) -> Message:
    """One frame's body (without its length prefix)."""
    return _decoder.decode(body)


class FrameTooLarge(ValueError):
    """The peer announced a frame over the limit: a protocol violation, never read."""


async def read_message(reader: asyncio.StreamReader, limit: int = MAX_FRAME) -> Message:
    """The next message; raises asyncio.IncompleteReadError when the peer has gone."""
    (length,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if length > limit:
        raise FrameTooLarge(f"IPC frame of {length} bytes exceeds {limit}")
    return _decoder.decode(await reader.readexactly(length))
