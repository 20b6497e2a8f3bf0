"""What a worker's isolate asks of the runtime while it runs: AI calls (to the edge), outbound
fetches (checked and capped by the fetch guard), service-binding calls, KV / D1 / R2, AI Search
and Durable Object calls, and log lines. Each call names the request it belongs to; a call whose request has
ended is refused, and every per-request budget (subrequests, binding calls, log volume) is
counted here, never trusted to the isolate."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from runtime.ai.call import AICall
from runtime.ai.catalog import models_matching
from runtime.ai.gateway import GatewayAnswer, Gateways
from runtime.ai.run_options import parse_run_options
from runtime.ai.search import binding as search_binding
from runtime.ai.search.common import Generate
from runtime.ai.service import Answer
from runtime.bindings import BindingError, BindingRef
from runtime.bindings.ai_search import KINDS as AI_SEARCH_KINDS
from runtime.bindings.ai_search import NAMESPACE_KIND as AI_SEARCH_NAMESPACE
from runtime.bindings.workflows import WORKFLOW_STEP
from runtime.control.ai_record import AIRecord
from runtime.control.tail import LogBudget, log_event
from runtime.host.fetch_guard import FetchError
from runtime.host.invocation import Invocation
from runtime.host.objects import OBJECT_STORAGE
from runtime.host.services import WorkerServices
from runtime.host.spec import WorkerSpec
from runtime.isolate import ipc
from runtime.isolate.calls import ENDED
from runtime.isolate.console import WorkerConsole
from workers import AIError

log = logging.getLogger("edge.worker")

LOG_LINE_CHARS = 16 * 1024  # a logged line is cut here
GATEWAY_KINDS = "KV, D1, R2, Durable Object and AI Gateway"  # the budget a gateway call counts in
GATEWAY_METHODS = {  # what each of env.AI.gateway(id)'s methods takes, for a refusal
    "getUrl": "takes an optional provider name (a string)",
    "getLog": "takes a log id (a string)",
    "patchLog": "takes a log id (a string) and a dict {score, feedback, metadata}",
}


class WorkerCalls:
    """The isolate's callbacks for one worker: `requests` maps the isolate's request ids to the
    requests in flight (shared with the WorkerHandle that serves them); `console`: its lines in
    edge dev's terminal (by default under the worker's name)."""

    def __init__(
        self,
        spec: WorkerSpec,
        requests: dict[int, Invocation],
        services: WorkerServices,
        console: WorkerConsole | None = None,
    ):
        self.spec, self.requests, self.services = spec, requests, services
        self._console = console
        self._background_logs = LogBudget()
        self._staging = search_binding.Staging()  # AI Search uploads sent in parts, per request

    @property
    def console(self) -> WorkerConsole:
        if self._console is None:
            self._console = WorkerConsole(self.spec.name)
        return self._console

    async def ai(self, msg: ipc.AIRun):
        """env.AI.run: its options checked (runtime.ai.run_options), the one call object made of it
        (runtime.ai.call.AICall), then through the AI service's one door (AIService.answer), or
        through an AI Gateway (`gateway` option: runtime.ai.gateway). The request keeps the call's
        record for its tail event and timing headers. Every answer carries its request id
        (cf-ai-req-id: the worker's env.AI.lastRequestId) and, through a gateway, its cf-aig-*
        headers (cf-aig-log-id: env.AI.aiGatewayLogId), whole or streamed."""
        ctx = self.requests.get(msg.request)
        if ctx is None:
            return ipc.AIReply(msg.call, error_code=5004, error_message=ENDED)
        request_id = str(uuid.uuid4())
        try:
            answer, headers, record = await self._run(ctx, msg.model, msg.inputs, msg.options, request_id)
        except AIError as exc:
            headers = [("cf-ai-req-id", request_id)]
            return ipc.AIReply(msg.call, error_code=exc.code, error_message=exc.detail, headers=headers)
        return self._reply(msg.call, ctx, answer, headers, record)

    async def _run(
        self,
        ctx: Invocation,
        model: str,
        inputs: Any,
        options: Any,
        request_id: str,
        listed_as: str | None = None,
    ) -> tuple[Answer, list[tuple[str, str]], AIRecord]:
        """One env.AI.run-like call of the worker's request `ctx` (env.AI.run itself, or the
        generation behind an AI Search answer): its options checked, its call made, recorded in
        the request (`listed_as`: its name in the tail, the model as written by default) and
        answered by the AI service or through a gateway; its answer, headers and record. Raises
        AIError."""
        headers = [("cf-ai-req-id", request_id)]
        options = parse_run_options(options, model)
        call = AICall(
            options.model,
            inputs,
            self.spec.account,
            options.session,
            ctx.ingress,
            ctx.client_rtt_ms,
            queue=options.queue,
            reject_if_busy=options.reject_if_busy,
            priority=options.priority,
            request_id=request_id,
            tags=options.tags,
        )
        call.record.listed_as = model if listed_as is None else listed_as  # the tail lists it so
        ctx.ai_calls.append(call.record)
        if options.gateway is None:
            answer = await self.services.ai.answer(call)
        else:
            through = await self._gateways().run(call, options.gateway)
            answer, headers = through.answer, [*headers, *_gateway_headers(through)]
        return answer, headers, call.record

    def _generate(self, ctx: Invocation) -> Generate:
        """The generation behind an AI Search answer (chatCompletions, aiSearch, a query rewrite)
        for the worker's request `ctx`: run as env.AI.run is (routed, recorded in the request and
        its tail, counted, rate limited): the Workers AI answer {response, usage}, or (inputs'
        `stream`) its SSE bytes. Raises AIError."""

        async def generate(model: str, inputs: dict) -> Any:
            answer, _, record = await self._run(ctx, model, inputs, None, str(uuid.uuid4()))
            if answer.stream is not None:
                return answer.stream
            if answer.result is not None:
                ctx.ai_answers.append(record)  # its latency in the response's server-timing
            return answer.body

        return generate

    def _reply(
        self,
        call: int,
        ctx: Invocation,
        answer: Answer,
        headers: list[tuple[str, str]],
        record: AIRecord | None,
    ):
        """An answer as the isolate reads it: an AIReply, or AIChunks (the first with the headers)
        and the AIReply that ends them. A run answered now (not a batch, not a cache hit) reports
        its latency and formats, from `record`, the record of the call that answered."""
        if answer.stream is not None:
            return self._chunks(call, answer.stream, headers)
        if answer.result is not None and record is not None:
            ctx.ai_answers.append(record)
            if record.server_timing:
                headers.append(("server-timing", record.server_timing))
        return ipc.AIReply(call, result=answer.body, headers=headers)

    def _gateways(self) -> Gateways:
        gateways = getattr(self.services, "gateways", None)
        if gateways is None:
            raise AIError(
                5004, "AI Gateway is not available in this runtime: call the model without a gateway"
            )
        return gateways

    async def ai_gateway(self, call: ipc.AIGatewayCall) -> ipc.BindingReply:
        """env.AI.gateway(id).getUrl(provider), getLog(logId), patchLog(logId, data), on this
        worker's account's gateway; each counts against the request's binding-call budget."""
        ctx = self.requests.get(call.request)
        if ctx is None:
            return ipc.BindingReply(call.call, error_type="Error", error_message=ENDED)
        if refused := ctx.spend_binding_call(GATEWAY_KINDS):
            return ipc.BindingReply(call.call, error_type="Error", error_message=refused)
        account, args, method = self.spec.account, call.args, call.method
        try:
            gateways = self._gateways()
            if method == "getUrl" and len(args) <= 1 and all(isinstance(a, str | None) for a in args):
                result = gateways.url(account, call.gateway, args[0] if args else None, ctx.origin)
            elif method == "getLog" and len(args) == 1 and isinstance(args[0], str):
                result = await gateways.get_log(account, call.gateway, args[0])
            elif (
                method == "patchLog"
                and len(args) == 2
                and isinstance(args[0], str)
                and isinstance(args[1], dict)
            ):
                result = await gateways.patch_log(account, call.gateway, args[0], args[1])
            else:
                why = f"env.AI.gateway(id).{method[:64]}: " + GATEWAY_METHODS.get(method, "no such method")
                return ipc.BindingReply(call.call, error_type="TypeError", error_message=why)
        except (AIError, LookupError) as exc:
            return ipc.BindingReply(call.call, error_type=_gateway_error(exc), error_message=str(exc))
        return ipc.BindingReply(call.call, result=result)

    async def ai_gateway_run(self, call: ipc.AIGatewayRun):
        """env.AI.gateway(id).run(data): AI Gateway's universal endpoint, one request or a list
        tried in turn; answered as env.AI.run is, with cf-aig-step (the step that answered) and
        cf-aig-log-id. Counts against the request's binding-call budget."""
        ctx = self.requests.get(call.request)
        if ctx is None:
            return ipc.AIReply(call.call, error_code=5004, error_message=ENDED)
        request_id = str(uuid.uuid4())
        headers = [("cf-ai-req-id", request_id)]
        if refused := ctx.spend_binding_call(GATEWAY_KINDS):
            return ipc.AIReply(call.call, error_code=3040, error_message=refused, headers=headers)
        steps = [call.data] if isinstance(call.data, dict) else call.data
        if not isinstance(steps, list) or not steps:
            why = (
                "env.AI.gateway(id).run takes one request {provider, endpoint, headers, query} or a "
                "non-empty list of them (each tried in turn until one answers)"
            )
            return ipc.AIReply(call.call, error_code=5004, error_message=why, headers=headers)
        # the universal run names no model of its own: the call gives the account, the origin and
        # the request id; each step is a call of its own (runtime.ai.gateway.Gateways.universal)
        run = AICall("", None, self.spec.account, None, ctx.ingress, ctx.client_rtt_ms, request_id=request_id)
        run.record.listed_as = f"gateway:{call.gateway[:64]}"
        ctx.ai_calls.append(run.record)
        try:
            through = await self._gateways().universal(run, call.gateway, steps)
        except AIError as exc:
            return ipc.AIReply(call.call, error_code=exc.code, error_message=exc.detail, headers=headers)
        headers = [*headers, *_gateway_headers(through, True)]
        return self._reply(call.call, ctx, through.answer, headers, through.record)

    async def ai_query(self, call: ipc.AIQuery):
        """env.AI.models(params): the models this edge serves, filtered as the REST API's
        `ai/models/search` filters them (search, task, author); env.AI.autorag(name)'s search,
        aiSearch (streamed: AIChunks then an AIReply) and list, on the AI Search service
        (runtime.ai.search.binding.autorag)."""
        ctx = self.requests.get(call.request)
        if ctx is None:
            return ipc.BindingReply(call.call, error_type="Error", error_message=ENDED)
        if refused := ctx.spend_binding_call("KV, D1, R2, Durable Object and AI"):
            return ipc.BindingReply(call.call, error_type="Error", error_message=refused)
        if call.method in search_binding.LEGACY_METHODS:  # env.AI.autorag(name).search / aiSearch / list
            try:
                result = await search_binding.autorag(
                    self.services.ai_search, self.spec.account, call.method, call.args, self._generate(ctx)
                )
            except search_binding.Refused as exc:
                return ipc.BindingReply(call.call, error_type=exc.type, error_message=str(exc))
            if hasattr(result, "__aiter__"):
                return self._chunks(call.call, result, [])
            return ipc.BindingReply(call.call, result=result)
        if call.method != "models":
            return ipc.BindingReply(
                call.call, error_type="TypeError", error_message=f"env.AI.{call.method[:64]} is not a method"
            )
        params = call.args[0] if call.args else None
        try:
            found = models_matching(self.services.catalog_view(), params)
        except ValueError as exc:
            return ipc.BindingReply(call.call, error_type="TypeError", error_message=str(exc))
        return ipc.BindingReply(call.call, result=found)

    async def _chunks(self, call: int, stream, headers: list[tuple[str, str]]):
        try:
            try:
                async for data in stream:
                    yield ipc.AIChunk(call, data, headers)
                    headers = []  # the first chunk carries them
            except AIError as exc:  # failed mid-stream (an AI Search answer's): the stream ends so
                yield ipc.AIReply(call, error_code=exc.code, error_message=exc.detail, headers=headers)
                return
            yield ipc.AIReply(call)
        finally:
            if hasattr(stream, "aclose"):
                await stream.aclose()  # cut (its request ended): the generation ends at the PoP now

    def log(self, msg: ipc.Log) -> None:
        """A line the worker logged (print, logging, sys.stdout / sys.stderr): shown at once in
        edge dev's terminal (runtime.isolate.console, bounded per event) and kept for the tail.
        Each request keeps at most invocation.LOG_LINES lines and LOG_BYTES (the rest is counted and noted
        once in its tail event); lines outside any request share a budget that refills over time.
        The isolate's own counting is not trusted."""
        ctx = self.requests.get(msg.request)
        level, text = msg.level[:16], msg.message[:LOG_LINE_CHARS]
        if ctx is None:
            self.output(level, text)
            return
        ctx.keep_log(level, text, self.console)

    def output(self, level: str, text: str) -> None:
        """A line outside any request (module-level output, waitUntil after the response, the
        isolate's stdout and stderr pipes): terminal and tail alike take at most LogBudget's rate,
        the lines refused counted in a note before the next one shown."""
        budget = self._background_logs
        if not budget.take():
            return
        entries = []
        if dropped := budget.take_dropped():
            note = (
                f"… {dropped} line(s) outside any request dropped: at most {budget.rate:g} a second "
                f"(bursts of {budget.burst}) are kept"
            )
            self.console.write("warn", note)
            entries.append({"level": "warn", "message": note, "timestamp": int(time.time() * 1000)})
        self.console.write(level, text)
        entries.append(
            {"level": level, "message": text[:LOG_LINE_CHARS], "timestamp": int(time.time() * 1000)}
        )
        self.services.tail.publish(self.spec.account, self.spec.name, log_event(self.spec.name, entries))

    async def fetch(self, call: ipc.FetchCall) -> ipc.FetchReply:
        ctx = self.requests.get(call.request)
        if ctx is None:
            return ipc.FetchReply(call.call, error="fetch outside a request is not allowed")
        if refused := ctx.spend_subrequest(self.spec.subrequests):
            return ipc.FetchReply(call.call, error=refused)
        if call.service is not None:
            return await self.services.call_service(self.spec, call, ctx)
        try:  # checked by address on every hop, pinned to the checked address, body capped
            r = await self.services.fetch_guard.fetch(
                call.method,
                call.url,
                call.headers,
                call.body,
                runtime_origin=ctx.origin,
                refuse_host=lambda host: self.services.refuse_host(self.spec.account, host),
            )
        except FetchError as exc:
            return ipc.FetchReply(call.call, error=str(exc))
        return ipc.FetchReply(call.call, r.status, r.headers, r.body)

    async def binding(self, call: ipc.BindingCall) -> ipc.BindingReply:
        """env.NAME.method(...) on a KV, D1 or R2 binding: the name is looked up in this worker's
        own spec (the isolate cannot pick an id) and the store is this worker's account's. An AI
        Search binding's call goes to the AI Search service instead (_ai_search)."""
        ctx = self.requests.get(call.request)
        if ctx is None:
            return ipc.BindingReply(call.call, error_type="Error", error_message=ENDED)
        if self.spec.workflow is not None and call.binding == WORKFLOW_STEP:  # counted by the books
            try:
                result = await self.services.workflows.step(self.spec, call.request, call.method, call.args)
            except BindingError as exc:
                return ipc.BindingReply(call.call, error_type=exc.type, error_message=str(exc))
            return ipc.BindingReply(call.call, result=result)
        obj = self.spec.durable_object
        ref = self.spec.bindings.get(call.binding)
        if obj is not None and call.binding == OBJECT_STORAGE:
            ref = BindingRef("do", obj.id)  # this object's own storage: the isolate cannot name another
        if ref is None:
            return ipc.BindingReply(
                call.call,
                error_type="TypeError",
                error_message=f"no KV, D1 or R2 binding named {call.binding!r}",
            )
        if refused := ctx.spend_binding_call("KV, D1 and R2"):
            return ipc.BindingReply(call.call, error_type="Error", error_message=refused)
        if ref.kind in AI_SEARCH_KINDS:
            return await self._ai_search(call, ctx, ref)
        stores, spec = self.services.bindings, self.spec
        try:
            if ref.kind == "do" and obj is not None:
                result = await stores.call_object_storage(
                    spec.account, spec.name, obj.class_name, obj.id, call.method, call.args, call.kwargs
                )
                if call.method in ("setAlarm", "deleteAlarm") and self.services.on_alarm is not None:
                    when = call.args[0] if call.method == "setAlarm" else None  # checked by the store
                    self.services.on_alarm((spec.account, spec.name, obj.class_name, obj.id), when)
            else:
                result = await stores.call(spec.account, ref, call.method, call.args, call.kwargs)
        except BindingError as exc:
            return ipc.BindingReply(call.call, error_type=exc.type, error_message=str(exc))
        return ipc.BindingReply(call.call, result=result)

    async def _ai_search(self, call: ipc.BindingCall, ctx: Invocation, ref: BindingRef):
        """A call of an AI Search binding (runtime.ai.search.binding): on the worker's account, in
        the namespace (and instance) its binding names, the isolate naming neither; a streamed
        answer as AIChunks ending in an AIReply, as env.AI.run's."""
        if ref.kind == AI_SEARCH_NAMESPACE:
            scope = search_binding.Scope(ref.id)
        else:
            scope = search_binding.Scope(search_binding.DEFAULT_NAMESPACE, ref.id)
        try:
            result = await search_binding.call(
                self.services.ai_search,
                self.spec.account,
                scope,
                call.method,
                call.args,
                call.kwargs,
                self._generate(ctx),
                search_binding.Staged(self._staging, call.request, self.requests),
            )
        except search_binding.Refused as exc:
            return ipc.BindingReply(call.call, error_type=exc.type, error_message=str(exc))
        if hasattr(result, "__aiter__"):
            return self._chunks(call.call, result, [])
        return ipc.BindingReply(call.call, result=result)

    async def object(self, call: ipc.ObjectCall) -> ipc.ObjectReply:
        """`env.NS.get(id).method(...)`: the runtime's Durable Objects run it in that object."""
        ctx = self.requests.get(call.request)
        if ctx is None:
            return ipc.ObjectReply(call.call, error_type="Error", error_message=ENDED)
        if refused := ctx.spend_binding_call("KV, D1, R2 and Durable Object"):
            return ipc.ObjectReply(call.call, error_type="Error", error_message=refused)
        return await self.services.objects.call(self.spec, call, ctx)


def _gateway_error(exc: Exception) -> str:
    """The name of what env.AI.gateway(id)'s getLog / patchLog raise, as workerd's: a log the
    gateway does not hold (a LookupError, or its 404 / "not found") is AiGatewayLogNotFound."""
    missing = isinstance(exc, LookupError) or (
        isinstance(exc, AIError) and (exc.code == 404 or "not found" in exc.detail.lower())
    )
    return "AiGatewayLogNotFound" if missing else "AiGatewayInternalError"


def _gateway_headers(through: GatewayAnswer, universal: bool = False) -> list[tuple[str, str]]:
    """A gateway's cf-aig-* headers, cf-aig-log-id (env.AI.aiGatewayLogId) always among them and,
    for a universal run, cf-aig-step (the step that answered, 0 first)."""
    headers = list(through.headers)
    named = {name.lower() for name, _ in headers}
    if through.log_id and "cf-aig-log-id" not in named:
        headers.append(("cf-aig-log-id", through.log_id))
    if universal and "cf-aig-step" not in named:
        headers.append(("cf-aig-step", str(through.step)))
    return headers
