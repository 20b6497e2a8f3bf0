"""What an isolate asks of the runtime, as one typed interface instead of a callback each: the calls
its script makes (AI, outbound fetch, bindings, Durable Objects), the lines it writes, its
WebSockets and its exit. The runtime's side of a worker (runtime.host.worker.WorkerHandle) is one;
`QuietHost` answers a worker that is only loaded (deploy's check, a test): its calls are refused,
its lines go to the console, unless a test hands it an AI answerer or a log list."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from runtime.isolate import ipc

# An AI call is answered with an AIReply, or (stream: true) with AIChunks ending in an AIReply.
AIReplies = ipc.AIReply | AsyncIterator[ipc.AIChunk | ipc.AIReply]
SocketMessage = ipc.SocketSend | ipc.SocketClose | ipc.SocketAttach


class IsolateHost(Protocol):
    async def ai(self, call: ipc.AIRun) -> AIReplies: ...

    async def ai_query(self, call: ipc.AIQuery) -> ipc.BindingReply:
        """env.AI's other methods (models())."""

    async def ai_gateway(self, call: ipc.AIGatewayCall) -> ipc.BindingReply:
        """env.AI.gateway(id).getUrl / getLog / patchLog."""

    async def ai_gateway_run(self, call: ipc.AIGatewayRun) -> AIReplies:
        """env.AI.gateway(id).run(data): answered as an AI call is."""

    async def fetch(self, call: ipc.FetchCall) -> ipc.FetchReply: ...

    async def binding(self, call: ipc.BindingCall) -> ipc.BindingReply: ...

    async def object(self, call: ipc.ObjectCall) -> ipc.ObjectReply: ...

    def log(self, msg: ipc.Log) -> None:
        """A line the worker logged in a request (or outside any: msg.request unknown)."""

    def output(self, level: str, text: str) -> None:
        """A line of the isolate's stdout or stderr pipe."""

    def socket(self, msg: SocketMessage) -> None:
        """What the isolate sends on one of its WebSockets."""

    def held_sockets(self) -> tuple[int, list[ipc.HeldSocket]]:
        """(the first socket id a new process may use, the sockets it starts holding)."""

    def socket_offer(self, msg: ipc.InvokeResult) -> None:
        """A 101 answer, as it is read: the frames after it are its socket's."""

    def exited(self) -> None:
        """The process ended (crashed, killed, stopped): what it held ends with it."""


class QuietHost:
    """An isolate's host that serves nothing: every call refused, no sockets; `ai` and `log`
    (a test's) answer AI calls and keep log lines when given."""

    def __init__(
        self,
        ai: Callable[[ipc.AIRun], Awaitable[AIReplies]] | None = None,
        log: Callable[[ipc.Log], None] | None = None,
        fetch: Callable[[ipc.FetchCall], Awaitable[ipc.FetchReply]] | None = None,
        name: str = "worker",
    ):
        self._ai, self._log, self._fetch = ai, log, fetch
        self._console = None
        self.name = name  # its pipes' lines show under it in the terminal

    async def ai(self, call: ipc.AIRun) -> AIReplies:
        if self._ai is None:
            return ipc.AIReply(call.call, error_code=5007, error_message="AI is not available here")
        return await self._ai(call)

    async def ai_query(self, call: ipc.AIQuery) -> ipc.BindingReply:
        return ipc.BindingReply(call.call, error_type="Error", error_message="AI is not available here")

    async def ai_gateway(self, call: ipc.AIGatewayCall) -> ipc.BindingReply:
        why = "AI Gateway is not available here"
        return ipc.BindingReply(call.call, error_type="Error", error_message=why)

    async def ai_gateway_run(self, call: ipc.AIGatewayRun) -> AIReplies:
        return ipc.AIReply(call.call, error_code=5007, error_message="AI Gateway is not available here")

    async def fetch(self, call: ipc.FetchCall) -> ipc.FetchReply:
        if self._fetch is None:
            return ipc.FetchReply(call.call, error="outbound fetch is not available here")
        return await self._fetch(call)

    async def binding(self, call: ipc.BindingCall) -> ipc.BindingReply:
        why = "bindings are not available here"
        return ipc.BindingReply(call.call, error_type="Error", error_message=why)

    async def object(self, call: ipc.ObjectCall) -> ipc.ObjectReply:
        return ipc.ObjectReply(
            call.call, error_type="Error", error_message="Durable Objects are not available here"
        )

    def log(self, msg: ipc.Log) -> None:
        if self._log is not None:
            self._log(msg)

    def output(self, level: str, text: str) -> None:
        if self._console is None:
            from runtime.isolate.console import WorkerConsole

            self._console = WorkerConsole(self.name)
        self._console.write(level, text)

    def socket(self, msg: SocketMessage) -> None:
        pass

    def held_sockets(self) -> tuple[int, list[ipc.HeldSocket]]:
        return 1, []

    def socket_offer(self, msg: ipc.InvokeResult) -> None:
        pass

    def exited(self) -> None:
        pass
