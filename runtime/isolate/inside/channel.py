"""Inside the isolate: its end of the runtime's socket. Every call a worker makes of the runtime
(env.AI.run, fetch, a service binding, KV / D1 / R2, a Durable Object stub, a log line: print,
logging, sys.stdout and sys.stderr) crosses here, tagged with the request it belongs to; replies
are matched to their calls.

Imported only inside the isolate (runtime.isolate.view binds it into the jail)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import contextvars
import io
import itertools
import logging
import socket
import struct
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import msgspec

from runtime.isolate import ipc
from runtime.isolate.inside.ai_gateway import AIGateway
from workers import AIError, Response, markdown
from workers.abort import AbortSignal
from workers.ai_search import AutoRAG
from workers.binding_values import wrap_result
from workers.bindings import binding_error
from workers.blob import Blob
from workers.durable_objects import remote_error
from workers.errors import InferenceUpstreamError

# log lines sent per request (the runtime keeps fewer, and counts the rest for its note on them);
# past these the isolate drops them without sending, after one line that says so
LOG_LINES, LOG_BYTES, LOG_LINE_CHARS = 4096, 1024 * 1024, 16 * 1024
FETCH_BODY_BYTES = 1024 * 1024  # an outbound request body crosses to the runtime in one frame

current_request: contextvars.ContextVar[int | None] = contextvars.ContextVar("edge_request", default=None)
# the request's ctx, for the SDK's module-level wait_until (workers.context)
current_ctx: contextvars.ContextVar[Any] = contextvars.ContextVar("edge_ctx", default=None)


class AIAnswer(NamedTuple):
    """An AI call's answer (its result, or an async iterator of SSE bytes) and its headers."""

    result: Any
    headers: list[tuple[str, str]]


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the runtime has gone")
        data += chunk
    return bytes(data)


class Channel:
    """This process's end of the socket: sends frames, matches AI replies to their calls."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.sync: socket.socket | None = None  # the synchronous channel (blocking), if given
        self._calls = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self.request_bodies: dict[int, asyncio.Queue] = {}  # streamed request bodies arriving
        self.credits: dict[int, asyncio.Semaphore] = {}  # response chunks we may still send
        self.tasks: dict[int, asyncio.Task] = {}  # request id -> the task serving it
        self._log_budget: dict[int, list[int]] = {}  # request -> [lines left, bytes left]
        # (request, level) -> (the unfinished line written to sys.stdout / sys.stderr, whether it
        # was already sent, cut at LOG_LINE_CHARS: then the rest of it, up to its newline, is dropped)
        self._partial: dict[tuple[int, str], tuple[str, bool]] = {}

    def send(self, msg: ipc.Message) -> None:
        if self._partial and isinstance(msg, _ANSWERS):  # a request's output goes before its answer
            self.flush_console(request=msg.id)
        frame = ipc.encode(msg)
        if len(frame) > ipc.FROM_ISOLATE:  # the runtime would take a bigger one as an attack
            raise ValueError(f"message of {len(frame)} bytes is over the {ipc.FROM_ISOLATE}-byte limit")
        self.writer.write(frame)

    async def request_body(self, rid: int) -> AsyncIterator[bytes]:
        """A streamed request body, chunk by chunk; each chunk taken gives the runtime credit."""
        queue = self.request_bodies[rid]
        try:
            while True:
                msg = await queue.get()
                if isinstance(msg, ipc.RequestEnd):
                    if msg.error:
                        raise OSError(f"the request body could not be read: {msg.error}")
                    return
                self.send(ipc.RequestAck(rid))
                yield msg.data
        finally:
            self.request_bodies.pop(rid, None)

    async def call_ai(self, model: str, inputs: Any, options: Any, signal: Any = None) -> AIAnswer:
        """One env.AI.run call: its answer (a result, or an async iterator of SSE bytes) and the
        headers the runtime sent with it. `signal` (an AbortSignal): when it aborts, the runtime
        is told to cancel the call (at the PoP too) and the waiting code raises its AbortError."""
        return await self.ai_exchange(
            "env.AI.run", lambda call, request: ipc.AIRun(call, request, model, inputs, options), signal
        )

    async def ai_exchange(
        self, what: str, message: Callable[[int, int], ipc.Message], signal: Any = None
    ) -> AIAnswer:
        """A call answered as env.AI.run's are (AIChunks then an AIReply, or an AIReply), built
        from its call id and the current request: env.AI.run, env.AI.gateway(id).run."""
        request = current_request.get()
        if request is None:
            raise AIError(5004, f"{what} can only be called while handling a request")
        if signal is not None:
            signal.throwIfAborted()
        call = next(self._calls)
        # every message for this call lands here: AIChunk(s) of a stream, then the AIReply
        queue: asyncio.Queue = asyncio.Queue()
        self._pending[call] = queue
        try:
            self.send(message(call, request))
        except (TypeError, msgspec.EncodeError) as exc:
            del self._pending[call]
            raise AIError(5004, f"inputs must be JSON-like (dicts, lists, strings, numbers): {exc}") from None
        except UnicodeEncodeError:
            del self._pending[call]
            raise AIError(5004, "inputs hold a lone UTF-16 surrogate ('\\ud800'); send valid text") from None
        except OverflowError:
            del self._pending[call]
            raise AIError(5004, "inputs hold an integer outside [-2**63, 2**64 - 1]") from None
        except ValueError:
            del self._pending[call]
            raise AIError(3006, f"inputs are larger than {ipc.FROM_ISOLATE // 2**20} MB; send less") from None
        aborted = None
        if signal is not None:

            def aborted(_event: Any = None) -> None:
                self._pending.pop(call, None)
                queue.put_nowait(signal.error())
                self.send(ipc.AICancel(call))

            signal.addEventListener("abort", aborted)
        try:
            first = await queue.get()
        except BaseException:
            self._forget_ai(call, signal, aborted)
            raise
        if isinstance(first, BaseException):  # aborted
            self._forget_ai(call, signal, aborted)
            raise first
        if isinstance(first, ipc.AIReply):
            self._forget_ai(call, signal, aborted)
            if first.error_code is not None:
                raise InferenceUpstreamError(first.error_code, first.error_message or "AI request failed")
            return AIAnswer(first.result, first.headers)
        stream = self._stream(call, first, queue, signal, aborted)
        return AIAnswer(stream, first.headers)

    def _forget_ai(self, call: int, signal: Any, aborted: Any) -> None:
        self._pending.pop(call, None)
        if signal is not None:
            signal.removeEventListener("abort", aborted)

    async def _stream(self, call: int, first: ipc.AIChunk, queue: asyncio.Queue, signal: Any, aborted: Any):
        try:
            msg = first
            while isinstance(msg, ipc.AIChunk):
                yield msg.data
                if signal is not None and signal.aborted:  # before the chunks already here
                    raise signal.error()
                msg = await queue.get()
            if isinstance(msg, BaseException):  # aborted while streaming
                raise msg
            if msg.error_code is not None:
                raise InferenceUpstreamError(msg.error_code, msg.error_message or "AI request failed")
        finally:
            if call in self._pending:  # left before its end (the worker stopped reading): cancel it
                with contextlib.suppress(Exception):
                    self.send(ipc.AICancel(call))
            self._forget_ai(call, signal, aborted)

    def resolve(
        self, msg: ipc.AIReply | ipc.AIChunk | ipc.FetchReply | ipc.BindingReply | ipc.ObjectReply
    ) -> None:
        queue = self._pending.get(msg.call)
        if queue is not None:
            queue.put_nowait(msg)

    async def fetch(
        self, method: str, url: str, headers: list[tuple[str, str]], body: bytes, service: str | None = None
    ) -> Response:
        """Outbound HTTP (or a service binding call) carried by the runtime."""
        request = current_request.get()
        if request is None:
            raise RuntimeError("fetch can only be called while handling a request")
        if len(body) > FETCH_BODY_BYTES:
            raise ValueError(f"fetch body of {len(body)} bytes is over the {FETCH_BODY_BYTES}-byte limit")
        call = next(self._calls)
        queue: asyncio.Queue = asyncio.Queue()
        self._pending[call] = queue
        try:
            self.send(ipc.FetchCall(call, request, method, url, headers, body, service))
        except ValueError:
            del self._pending[call]
            raise
        try:
            reply: ipc.FetchReply = await queue.get()
        finally:
            self._pending.pop(call, None)
        if reply.error:
            raise RuntimeError(reply.error)
        return Response(reply.body, status=reply.status, headers=reply.headers)

    def call_binding_sync(self, binding: str, method: str, args: list, kwargs: dict) -> Any:
        """The same call, blocking on the synchronous channel (for the API Cloudflare makes
        synchronous: a Durable Object's storage.sql.exec); the event loop waits meanwhile."""
        request = current_request.get()
        if request is None or self.sync is None:
            raise RuntimeError(f"{binding}.{method} can only be called while handling a request")
        frame = ipc.encode(ipc.BindingCall(next(self._calls), request, binding, method, list(args), kwargs))
        if len(frame) > ipc.FROM_ISOLATE:
            raise ValueError(
                f"{binding}.{method}: the call is over the {ipc.FROM_ISOLATE // 2**20} MiB limit"
            )
        self.sync.sendall(frame)
        (length,) = struct.unpack(">I", _recv_exactly(self.sync, 4))
        if length > ipc.TO_ISOLATE:
            raise ConnectionError("the runtime's reply is over the frame limit")
        reply = ipc.decode(_recv_exactly(self.sync, length))
        if not isinstance(reply, ipc.BindingReply):
            raise ConnectionError("the synchronous channel answered out of turn")
        if reply.error_type is not None:
            raise binding_error(reply.error_type, reply.error_message or f"{binding}.{method} failed")
        return reply.result

    def _start_call(self, what: str, message: Callable[[int, int], ipc.Message]) -> tuple[int, asyncio.Queue]:
        """Send one call (built from its call id and the current request): its id, and the queue
        its replies land in; what cannot be sent says why in the worker's terms."""
        request = current_request.get()
        if request is None:
            raise RuntimeError(f"{what} can only be called while handling a request")
        call = next(self._calls)
        queue: asyncio.Queue = asyncio.Queue()
        self._pending[call] = queue
        try:
            self.send(message(call, request))
        except (TypeError, msgspec.EncodeError) as exc:
            del self._pending[call]
            raise TypeError(
                f"{what}: arguments must be str, bytes, numbers, None, lists or dicts: {exc}"
            ) from None
        except UnicodeEncodeError:
            del self._pending[call]
            raise ValueError(
                f"{what}: a string holds a lone UTF-16 surrogate ('\\ud800'); send valid text"
            ) from None
        except ValueError:
            del self._pending[call]
            raise ValueError(
                f"{what}: the call is over the {ipc.FROM_ISOLATE // 2**20} MiB one call may carry to the "
                "runtime; send less per call"
            ) from None
        return call, queue

    async def _round_trip(self, what: str, message: Callable[[int, int], ipc.Message]) -> Any:
        """Send one call and wait for the runtime's reply."""
        call, queue = self._start_call(what, message)
        try:
            return await queue.get()
        finally:
            self._pending.pop(call, None)

    async def call_streamable(self, what: str, message: Callable[[int, int], ipc.Message]) -> Any:
        """A call answered by a BindingReply (its result; its error raised as binding_error
        makes it), or, streamed, by AIChunks then an AIReply as env.AI.run's streams are: then an
        async iterator of their bytes (a failure at its end raised as InferenceUpstreamError; left
        before its end, the runtime is told to cancel it). AI Search's calls."""
        call, queue = self._start_call(what, message)
        try:
            first = await queue.get()
        except BaseException:
            self._pending.pop(call, None)
            raise
        if isinstance(first, ipc.AIChunk):
            return self._stream(call, first, queue, None, None)
        self._pending.pop(call, None)
        if isinstance(first, ipc.AIReply):  # a stream that ended before its first chunk
            if first.error_code is not None:
                raise InferenceUpstreamError(first.error_code, first.error_message or f"{what} failed")
            return _no_chunks()
        if first.error_type is not None:
            raise binding_error(first.error_type, first.error_message or f"{what} failed")
        return first.result

    async def call_binding_streamable(self, binding: str, method: str, args: list, kwargs: dict) -> Any:
        """env.BINDING.method(...) on a binding whose answer may stream (AI Search's)."""
        if not all(isinstance(k, str) for k in kwargs):
            raise TypeError(f"env.{binding}.{method}: option names must be strings")
        return await self.call_streamable(
            f"env.{binding}.{method}",
            lambda call, request: ipc.BindingCall(call, request, binding, method, list(args), dict(kwargs)),
        )

    async def call_binding(self, binding: str, method: str, args: list, kwargs: dict) -> Any:
        """env.BINDING.method(...) on a KV, D1 or R2 binding, answered by the runtime's store."""
        if not all(isinstance(k, str) for k in kwargs):
            raise TypeError(f"env.{binding}.{method}: option names must be strings")
        reply: ipc.BindingReply = await self._round_trip(
            f"env.{binding}.{method}",
            lambda call, request: ipc.BindingCall(call, request, binding, method, list(args), dict(kwargs)),
        )
        if reply.error_type is not None:
            raise binding_error(reply.error_type, reply.error_message or f"env.{binding}.{method} failed")
        return reply.result

    async def call_object(self, binding: str, object_id: str, method: str, args: list, kwargs: dict) -> Any:
        """`await env.NS.get(id).method(...)`: the runtime runs it in that object's isolate."""
        reply: ipc.ObjectReply = await self._round_trip(
            f"env.{binding} {method}",
            lambda call, request: ipc.ObjectCall(call, request, binding, object_id, method, args, kwargs),
        )
        if reply.error_type is not None:
            raise remote_error(reply.error_type, reply.error_message or f"env.{binding} {method} failed")
        return reply.result

    def log(self, level: str, message: str, request: int | None = None) -> None:
        """A line for the tail and edge dev's terminal; past the per-request budget lines are
        dropped here, after one that says so (the runtime keeps a smaller budget of its own, since
        it trusts nothing an isolate sends)."""
        rid = (current_request.get() or 0) if request is None else request
        budget = self._log_budget.setdefault(rid, [LOG_LINES, LOG_BYTES])
        if budget[0] <= 0 or budget[1] <= 0:
            return
        message = message[:LOG_LINE_CHARS]
        budget[0] -= 1
        budget[1] -= len(message)
        self.send(ipc.Log(rid, level, message))
        if budget[0] <= 0 or budget[1] <= 0:
            note = (
                f"over {LOG_LINES} log lines or {LOG_BYTES // 2**20} MiB: the isolate sends no more for this"
            )
            self.send(ipc.Log(rid, "warn", note + (" request" if rid else " process")))

    def write_console(self, level: str, text: str) -> None:
        """What the worker wrote to sys.stdout ("log") or sys.stderr ("error"): each write's text
        up to its last newline is one log line of the current request; the rest waits for its
        newline (or a flush, or the request's answer)."""
        key = (current_request.get() or 0, level)
        held, sent = self._partial.pop(key, ("", False))
        head, newline, rest = text.rpartition("\n")
        if newline:
            if sent:  # the first line of head ends one already sent, cut: the rest of it is dropped
                _, more, head = head.partition("\n")
                if more:
                    self.log(level, head, key[0])
            else:
                self.log(level, held + head, key[0])
            held, sent = "", False
        if not sent:
            held += rest if newline else text
            if len(held) > LOG_LINE_CHARS:  # a line that long goes now, cut
                self.log(level, held, key[0])
                held, sent = "", True
        if held or sent:
            self._partial[key] = (held, sent)

    def flush_console(self, level: str | None = None, request: int | None = None) -> None:
        """Send the unfinished line(s) of a request (the current one unless named) as they are."""
        rid = (current_request.get() or 0) if request is None else request
        for lvl in (level,) if level else ("log", "error"):
            held, sent = self._partial.pop((rid, lvl), ("", False))
            if held and not sent:
                self.log(lvl, held, rid)

    def forget(self, rid: int) -> None:
        self.flush_console(request=rid)
        self._log_budget.pop(rid, None)
        self.credits.pop(rid, None)
        self.tasks.pop(rid, None)


# what ends a request's answer (or the request): its unfinished output lines are sent before it
_ANSWERS = (ipc.InvokeResult, ipc.InvokeStart, ipc.InvokeError, ipc.ObjectResult, ipc.RequestDone)


class AIBinding:
    """`env.AI`, as Cloudflare's binding (workerd's ai-api.ts): `await env.AI.run(model, inputs,
    options=None)` crosses to the runtime's AI service, the answer read as Cloudflare's Python Workers
    read a JS object (keys, attributes, `to_py()`); `lastRequestId` is the last call's request id
    (cf-ai-req-id), `aiGatewayLogId` its AI Gateway log id (None: not through a gateway);
    `models(params)` lists the models; `toMarkdown(files)` converts documents (workers.markdown);
    `gateway(id)` reaches an AI Gateway (runtime.isolate.inside.ai_gateway); `autorag(name)` an
    AI Search instance of the default namespace, as the legacy binding did (workers.ai_search).
    Options are checked by the runtime (runtime.ai.run_options), except `signal`, which stays here:
    when it aborts, the call is cancelled."""

    def __init__(self, channel: Channel):
        self._channel = channel
        self.lastRequestId: str | None = None
        self.aiGatewayLogId: str | None = None

    async def run(self, model: str, inputs: dict[str, Any], options: dict[str, Any] | None = None) -> Any:
        if not isinstance(model, str):
            raise AIError(
                5004, f"model must be a string such as '@edge/moonshotai/kimi-k2-mini', got {model!r}"
            )
        options = _plain_options(options)
        signal = options.pop("signal", None) if isinstance(options, dict) else None
        if signal is not None and not isinstance(signal, AbortSignal):
            raise AIError(5004, "options.signal must be an AbortSignal (from js import AbortController)")
        answer = await self._channel.call_ai(model, inputs, options, signal)
        self.note_answer(answer.headers)
        result = answer.result
        if isinstance(options, dict) and options.get("returnRawResponse") is True:
            return _raw_response(result, answer.headers)
        # Pyodide hands the script a JS object: `out.response` as well as `out["response"]`, `to_py()`
        return wrap_result(result) if isinstance(result, dict) else result

    def note_answer(self, headers: list[tuple[str, str]]) -> None:
        """An answer's ids, kept as workerd's binding keeps them: lastRequestId (cf-ai-req-id)
        and aiGatewayLogId (cf-aig-log-id; None when not through a gateway)."""
        named = dict(headers)
        self.lastRequestId = named.get("cf-ai-req-id")
        self.aiGatewayLogId = named.get("cf-aig-log-id")

    async def models(self, params: dict[str, Any] | None = None) -> list:
        """The models this edge serves, as Cloudflare's `env.AI.models({search, task, author})`."""
        params = _plain_options(params)
        reply: ipc.BindingReply = await self._channel._round_trip(
            "env.AI.models", lambda call, request: ipc.AIQuery(call, request, "models", [params])
        )
        if reply.error_type is not None:
            raise binding_error(reply.error_type, reply.error_message or "env.AI.models failed")
        return [wrap_result(m) for m in reply.result]

    async def toMarkdown(self, files: Any) -> Any:  # noqa: N802 - Cloudflare's name
        """Documents to Markdown: a list of {name, blob} (a Blob, bytes or str) -> a list of
        {name, mimeType, format, tokens, data}; one document -> one result."""
        one = isinstance(files, dict)
        items = [files] if one else files
        if not isinstance(items, list | tuple) or not items:
            raise TypeError("env.AI.toMarkdown takes {name, blob} or a list of them")
        results = []
        for item in items:
            item = _plain_options(item)
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or "blob" not in item:
                raise TypeError("env.AI.toMarkdown: each document is {name: str, blob: Blob | bytes | str}")
            blob, name = item["blob"], item["name"]
            if isinstance(blob, Blob):
                data, declared = await blob.bytes(), blob.type
            elif isinstance(blob, bytes | bytearray | memoryview):
                data, declared = bytes(blob), None
            elif isinstance(blob, str):
                data, declared = blob.encode(), None
            else:
                raise TypeError(f"env.AI.toMarkdown: {name}: blob must be a Blob, bytes or str")
            results.append(wrap_result(markdown.convert(name, markdown.mime_type_of(name, declared), data)))
        return results[0] if one else results

    def gateway(self, gateway_id: str) -> AIGateway:
        """AI Gateway `gateway_id` of this account: getUrl, getLog, patchLog, run (ai_gateway)."""
        return AIGateway(self, gateway_id)

    def autorag(self, name: str | None = None) -> AutoRAG:
        """The legacy AI Search binding (workerd's AutoRAG): `env.AI.autorag("docs").search(...)`,
        `.aiSearch(...)` (streamed with `stream: True`: a Response of the event stream) and
        `env.AI.autorag().list()`, on the account's "default" namespace; nothing is called yet."""
        if name is not None and not isinstance(name, str):
            raise TypeError(f"env.AI.autorag(name): name must be a string, got {type(name).__name__}")

        def transport(method: str, args: list, kwargs: dict) -> Any:
            return self._channel.call_streamable(
                f"env.AI.autorag().{method}",
                lambda call, request: ipc.AIQuery(call, request, f"autorag.{method}", list(args)),
            )

        return AutoRAG(transport, name)

    def aiSearch(self, *_args: Any) -> Any:  # noqa: N802 - Cloudflare's name
        raise AIError(
            5004,
            "env.AI.aiSearch: bind AI Search in the config instead: [[ai_search]] (an instance) or "
            "[[ai_search_namespaces]] (a namespace); env.AI.autorag(name) serves the legacy calls",
        )


async def _no_chunks() -> AsyncIterator[bytes]:
    return
    yield  # an async generator that yields nothing


def _plain_options(value: Any) -> Any:
    """A JS object (to_js, JsObject) as a dict; anything else as it is."""
    if value is None or isinstance(value, dict):
        return dict(value) if value is not None else None
    to_py = getattr(value, "to_py", None)
    return to_py() if callable(to_py) else value


def _raw_response(result: Any, headers: list[tuple[str, str]]) -> Response:
    """returnRawResponse: the answer as the REST API sends it (JSON in Cloudflare's envelope, or
    the event stream), with its headers."""
    if hasattr(result, "__aiter__"):
        return Response(result, headers=[("content-type", "text/event-stream"), *headers])
    body = {"result": result, "success": True, "errors": [], "messages": []}
    return Response.json(body, headers=[("content-type", "application/json"), *headers])


class ServiceBinding:
    """`env.NAME` for a [[services]] binding: `await env.NAME.fetch(url_or_request)` calls that worker."""

    def __init__(self, channel: Channel, name: str):
        self._channel, self._name = channel, name

    async def fetch(self, resource: Any, method: str | None = None, headers: Any = None, body: Any = None):
        from workers.fetch import _as_parts

        url, verb, hdrs, data = _as_parts(resource, method, headers, body)
        return await self._channel.fetch(verb, url, hdrs, data, service=self._name)


class ChannelSockets:
    """workers.websocket's transport: a server end's send, close and attachment, to the runtime
    (a frame each, at most MESSAGE_BYTES of message: within FROM_ISOLATE)."""

    def __init__(self, channel: Channel):
        self._channel = channel

    def send(self, ws: int, data: str | bytes) -> None:
        if isinstance(data, str):
            self._channel.send(ipc.SocketSend(ws, text=data))
        else:
            self._channel.send(ipc.SocketSend(ws, data=data))

    def close(self, ws: int, code: int, reason: str) -> None:
        self._channel.send(ipc.SocketClose(ws, code, reason))

    def attach(self, ws: int, value: Any) -> None:
        self._channel.send(ipc.SocketAttach(ws, value))


class _LogToRuntime(logging.Handler):
    def __init__(self, channel: Channel):
        super().__init__()
        self.channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.channel.log(record.levelname.lower(), self.format(record))
        except Exception:  # a log line must never break the request
            pass


class ConsoleStream(io.TextIOBase):
    """sys.stdout ("log") or sys.stderr ("error") inside the isolate: what the worker writes (print,
    sys.stdout.write, a logging.StreamHandler, warnings) reaches the runtime as log lines of the
    request it belongs to, for the tail and edge dev's terminal. Written outside the event loop's
    thread (or after it ended), it goes to the real pipe, which the runtime reads bounded too;
    fileno() is that pipe, for a child process or faulthandler."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, channel: Channel, level: str, real: Any):
        super().__init__()
        self._channel, self._level, self._real = channel, level, real

    def _in_loop(self) -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return not self._channel.writer.is_closing()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self._in_loop():
            self._channel.write_console(self._level, text)
        elif self._real is not None:
            self._real.write(text)
        return len(text)

    def flush(self) -> None:
        if self._in_loop():
            self._channel.flush_console(self._level)
        elif self._real is not None:
            self._real.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        if self._real is None:
            raise io.UnsupportedOperation("fileno")
        return self._real.fileno()

    def close(self) -> None:  # a worker closing sys.stdout must not silence the next request
        pass

    @property
    def buffer(self) -> _ConsoleBytes:
        return _ConsoleBytes(self)


class _ConsoleBytes:
    """sys.stdout.buffer: bytes written there are decoded (invalid UTF-8 replaced) and written."""

    def __init__(self, stream: ConsoleStream):
        self._stream = stream

    def write(self, data: bytes) -> int:
        self._stream.write(bytes(data).decode("utf-8", "replace"))
        return len(data)

    def flush(self) -> None:
        self._stream.flush()


_real_print = builtins.print


def worker_print(*args: Any, sep: str | None = " ", end: str | None = "\n", file: Any = None, flush=False):
    """print() inside the worker: one call is one write, so that one print is one log line of the
    tail (print("a\nb") too), as console.log is on Cloudflare."""
    target = sys.stdout if file is None else file
    if not isinstance(target, ConsoleStream):
        return _real_print(*args, sep=sep, end=end, file=file, flush=flush)
    for name, value in (("sep", sep), ("end", end)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be None or a string, not {type(value).__name__}")
    text = (" " if sep is None else sep).join(map(str, args))
    target.write(text + ("\n" if end is None else end))
    if flush:
        target.flush()


def capture_logs(channel: Channel) -> None:
    """print(), logging and writes to sys.stdout / sys.stderr inside the worker reach the runtime
    (edge tail and edge dev's terminal), tagged by request."""
    builtins.print = worker_print
    sys.stdout = ConsoleStream(channel, "log", sys.__stdout__)
    sys.stderr = ConsoleStream(channel, "error", sys.__stderr__)
    root = logging.getLogger()
    root.handlers = [_LogToRuntime(channel)]
    root.setLevel(logging.INFO)
