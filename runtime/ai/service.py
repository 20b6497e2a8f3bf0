"""The AI service behind `env.AI.run` and the AI REST APIs: validates inputs once into the typed
request (edge_sim.request.GenerateRequest), routes it through the edge and hands the typed result
to runtime.ai.shapes, the only place that shapes it as Workers AI or OpenAI JSON.

`answer` is the one door both Workers AI entrances (env.AI.run and POST /ai/run) go through: it
decides a call's mode once (a plain run, a stream, a queued batch, a batch poll, the Responses
shape), and counts its tokens in the metrics from the typed result. An engine failure that is not
an AIError becomes 3007 here, the one place that answers it.

An embedding model's call (runtime.ai.embeddings) is answered here too, by its stand-in, computed
in the runtime's own threads (no PoP serves it); its inputs refused with 5006.

Error codes are Workers AI's: 5007 no such model, 5004 invalid input, 5006 an embedding call's
input refused, 3006 request too large,
3040 out of capacity, 3007 timeout, 3036 account limited (runtime.control.rate_limit: the account's
requests or tokens per minute for the model, checked before any work is queued).
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from edge_sim.accounting import LatencyAccount
from edge_sim.affinity import check_key
from edge_sim.edge import Edge
from edge_sim.errors import EdgeError
from edge_sim.request import GenerateRequest, GenerateResult
from edge_sim.topology import PoP
from engine.sched.fair_queue import TenantShare
from engine.structured.answer import Delta
from runtime.ai.embeddings import (
    EMBEDDING_MODELS,
    Embeddings,
    embed_slices,
    is_embedding_model,
    workers_ai_answer,
    workers_ai_inputs,
)
from runtime.ai.inputs import SamplingFields, TextGenerationInputs
from runtime.ai.params import Inputs, generate_request, json_mode_failure
from runtime.ai.refusals import InputError, decode_inputs
from runtime.ai.responses_run import is_responses, prepare_responses, run_responses, stream_responses
from runtime.ai.shapes import Schema, shape_result, workers_ai_events
from runtime.control.accounts import AccountSettings
from runtime.control.dashboard_feed import DashboardFeed
from runtime.control.fair_pool import FairPool
from runtime.control.rate_limit import AccountRateLimits
from runtime.control.rollout import CANARY_SUFFIX, Rollouts
from workers import AIError

if TYPE_CHECKING:
    from runtime.control.metrics import Metrics

log = logging.getLogger("edge.ai")

# embedding texts computed at once, all accounts: one, since the stand-in is pure Python (it holds the
# GIL, so a second thread adds no speed, only takes the GIL from the event loop that serves requests)
EMBED_THREADS = 1

ERROR_CODES = {
    "model_not_found": 5007,
    "invalid_input": 5004,
    "too_large": 3006,
    "no_capacity": 3040,
    "timeout": 3007,
}


def _ai_error(exc: EdgeError) -> AIError:
    return AIError(ERROR_CODES[exc.kind], exc.message, exc.param)


class Batches(Protocol):
    """The batch queue as the door uses it (runtime.ai.batch.Batches; named by shape, since
    the queue runs its requests through this service)."""

    def submit(self, model: str, inputs: Any, account: str, ingress: PoP, client_rtt_ms: float) -> dict: ...

    def poll(self, model: str, inputs: Any, account: str) -> dict: ...


@dataclass
class AICall:
    """One Workers AI call as a door received it: env.AI.run's (model, inputs, options) or
    POST /ai/run's path, body and `queueRequest` query, with where it came from."""

    model: str
    inputs: Any
    account: str
    session: str | None  # the x-session-affinity key (edge_sim.affinity)
    ingress: PoP
    client_rtt_ms: float
    queue: bool = False  # queueRequest: a batch to queue, not to run now
    priority: str | None = None  # the x-edge-priority header as given (priority_of checks it)


def priority_of(header: str | None) -> int | None:
    """The x-edge-priority header (an integer, lower first, as the body's `priority`), or None;
    AIError 5004 saying what to send."""
    if header is None:
        return None
    if re.fullmatch(r"[+-]?[0-9]{1,10}", header.strip()) is None:
        got = repr(header[:40])
        raise AIError(5004, f"x-edge-priority: expected an integer (lower is served first), got {got}")
    return int(header)


@dataclass
class Answer:
    """A call's answer: a JSON body (with `result`, the generation behind it, for its latency
    account and quantization), or an event stream."""

    body: dict[str, Any] | None = None
    result: GenerateResult | None = None
    stream: AsyncIterator[bytes] | None = None


def mode_of(call: AICall) -> str:
    """ "batch", "poll", "responses", "stream" or "run", told apart by the inputs and options once."""
    inputs = call.inputs if isinstance(call.inputs, dict) else {}
    if call.queue or "requests" in inputs:
        return "batch"
    if "request_id" in inputs:
        return "poll"
    if is_responses(inputs):  # OpenAI's Responses shape: {"input": ..., "instructions": ...}
        return "responses"
    return "stream" if inputs.get("stream") is True else "run"


class AIService:
    """`aliases` maps another provider's model name to (the catalog name that serves it, the
    schema its answers take, None for the serving model's own). `rate_limits`: the accounts'
    limits per model (None: none; the runtime always gives them)."""

    def __init__(
        self,
        edge: Edge,
        schemas: dict[str, Schema] | None = None,
        aliases: dict[str, tuple[str, Schema | None]] | None = None,
        rate_limits: AccountRateLimits | None = None,
        settings_of: Callable[[str], AccountSettings] | None = None,
    ):
        """`settings_of(account)`: the account's settings (its rate limits, its fair-share weight
        and KV share at the PoPs), read once per call."""
        self.edge = edge
        self.schemas = schemas or {}
        self.aliases = aliases or {}
        self.rate_limits = rate_limits
        self.settings_of = settings_of
        self.rollouts: Rollouts | None = None  # canaries in progress (control.rollout); the app sets it
        self.batches: Batches | None = None  # queued batch requests (runtime.ai.batch); the app sets it
        self.metrics: Metrics | None = None  # tokens per model; the app sets it
        self.feed: DashboardFeed | None = None  # the live dashboard's windows; the app sets it
        # Cloudflare names served by a stand-in of another family (runtime.ai.cloudflare_names): warned once
        self.stand_ins: frozenset[str] = frozenset()
        # the embedding names' stand-in (runtime.ai.embeddings); [edge] strict_models turns it off
        self.serve_embeddings = True
        # the stand-in's threads, shared by every account fairly (a call a text a turn); the app closes it
        self.embed_pool = FairPool(EMBED_THREADS, name="edge-embed")
        # the seed of every generation that sets none (runtime.testing sets it, so that a worker's
        # tests see the real model sample the same answer each time); None: unseeded
        self.default_seed: int | None = None
        self._warned: set[str] = set()

    def resolve(self, model: str) -> str:
        """The catalog name that serves calls to `model` (itself, unless it is an alias)."""
        alias = self.aliases.get(model)
        return alias[0] if alias else model

    def schema(self, model: str) -> Schema:
        alias = self.aliases.get(model)
        if alias and alias[1]:
            return alias[1]
        return self.schemas.get(self.resolve(model), "text-generation")

    def served(self) -> list[str]:
        """The models a call may name: those the PoPs serve, less a rollout's canaries (which only
        the runtime routes to, by session key, so that a client can neither pick the new version
        nor count its calls to it against another rate-limit bucket than the model's)."""
        return [m for m in self.edge.models() if not m.endswith(CANARY_SUFFIX)]

    def names(self) -> list[str]:
        """Every name a call can use now: the models served and the aliases they answer to."""
        served = self.served()
        aliases = [a for a, (target, _) in self.aliases.items() if target in served]
        return [*served, *aliases, *(EMBEDDING_MODELS if self.serve_embeddings else ())]

    def prepare(
        self,
        model: str,
        inputs: Any,
        account: str,
        session: str | None = None,
        responses: bool = False,
        priority: str | None = None,
    ) -> tuple[GenerateRequest, Inputs]:
        """Validate a call before any work is queued, once, into the typed request that flows down
        to the PoP (which only checks that it fits); raises AIError with the Workers AI code.
        `session`: the client's x-session-affinity key (edge_sim.affinity); `responses`: the answer
        takes the Responses shape (which carries logprobs), whatever the model's own schema;
        `priority`: the x-edge-priority header, over the inputs' own `priority`."""
        asked, model = model, self.resolve(model)  # an alias is served by its stand-in
        if model not in self.served():
            refusal = self.edge.refusal(model)
            name = repr(asked) if model == asked else f"{asked!r} (served here by {model!r})"
            if refusal:
                raise AIError(5007, f"model {name} is not being served: it failed to load ({refusal})")
            if not self.edge.nodes and model in self.schemas:  # in the catalog; the edge has no GPU PoP
                raise AIError(3040, f"no PoP serving {name} is up: this edge has no GPU PoP ([edge] pops)")
            raise AIError(5007, f"no such model {name}; {self._nearest(asked)}")
        if asked in self.stand_ins and asked not in self._warned:
            self._warned.add(asked)
            log.warning(
                "%s is not shipped here: the stand-in %s answers it (closest by architecture; "
                "[edge] strict_models = true refuses such names)", asked, model,
            )  # fmt: skip
        terms = self.settings_of(account) if self.settings_of is not None else None
        if self.rate_limits is not None:  # before the inputs are even read: a limited call costs nothing
            self.rate_limits.check(account, model, asked, terms.limits() if terms else None)
        if isinstance(inputs, SamplingFields):  # decoded already, by an API of its own (OpenAI's)
            parsed = inputs
        else:
            parsed = decode_inputs(inputs, TextGenerationInputs, "Workers AI")
        given = priority_of(priority)
        if given is not None:
            parsed = msgspec.structs.replace(parsed, priority=given)
        if self.default_seed is not None and parsed.seed is None:  # pytest's plugin: answers repeat
            parsed = msgspec.structs.replace(parsed, seed=self.default_seed)
        try:
            session = check_key(session)
        except ValueError as exc:
            raise AIError(5004, str(exc)) from None
        if self.rollouts is not None:  # a session in a canary's share is served by the new version
            model = self.rollouts.route(model, session)
        req = generate_request(
            parsed,
            model=model,
            tenant=account,
            share=TenantShare(terms.weight, terms.kv_share) if terms else TenantShare(),
            session=session,
        )
        if not responses:
            self._fits_schema(parsed, self.schema(asked))
        if isinstance(parsed, TextGenerationInputs) and parsed.model not in (None, asked):
            raise InputError("model", f"names {parsed.model!r}, but this call is to {asked!r}; leave it out")
        return req, parsed

    def _nearest(self, asked: str) -> str:
        """What a 5007 for an unknown name suggests: the nearest names, or all when they are few."""
        names = self.names()
        if len(names) <= 8:
            return f"available: {', '.join(names) or 'none'}"
        near = difflib.get_close_matches(asked, names, n=3, cutoff=0.6)
        listed = f"GET /ai/models/search lists all {len(names)}"
        return f"nearest: {', '.join(near)} ({listed})" if near else f"none is near it ({listed})"

    @staticmethod
    def _fits_schema(parsed: Inputs, schema: Schema) -> None:
        """Workers AI's text-generation answer ({"response", "tool_calls", "usage"}) has room for
        one answer and no logprobs: ask a chat-completions model, or the OpenAI API, for those."""
        if not isinstance(parsed, TextGenerationInputs) or schema != "text-generation":
            return
        elsewhere = "call it through /ai/v1/chat/completions (OpenAI's shape) for that"
        if parsed.n != 1:
            raise InputError(
                "n", f"this model answers in Workers AI's text-generation shape, one response; {elsewhere}"
            )
        if parsed.logprobs or parsed.top_logprobs is not None:
            raise InputError(
                "logprobs", f"Workers AI's text-generation shape carries no logprobs; {elsewhere}"
            )

    async def answer(self, call: AICall) -> Answer:
        """A Workers AI call through either door, its mode decided here once; raises AIError."""
        if is_embedding_model(call.model):
            texts, pooling = workers_ai_inputs(call.model, call.inputs)
            return Answer(body=workers_ai_answer(await self.embed(call.model, texts, call.account, pooling)))
        mode, model = mode_of(call), call.model
        if mode == "batch":
            if not call.queue:
                raise AIError(5004, "requests: a batch is queued: send it with queueRequest (true)")
            return Answer(
                body=self._batches("queueRequest").submit(
                    model, call.inputs, call.account, call.ingress, call.client_rtt_ms
                )
            )
        if mode == "poll":
            return Answer(body=self._batches("request_id").poll(model, call.inputs, call.account))
        where = {"ingress": call.ingress, "rtt": call.client_rtt_ms}
        if mode == "responses":
            prepared, req = prepare_responses(self, model, call.inputs, call.account, call.session)
            if req.stream:
                return Answer(stream=stream_responses(self, model, prepared, req, **where))
            body, result = await run_responses(self, model, prepared, req, **where)
            return Answer(body=body, result=result)
        if mode == "stream":
            req, _ = self.prepare(model, call.inputs, call.account, call.session, priority=call.priority)
            return Answer(
                stream=workers_ai_sse(
                    self, req, model, ingress=call.ingress, client_rtt_ms=call.client_rtt_ms
                )
            )
        return await self._run_now(call)

    async def embed(self, model: str, texts: list[str], account: str, pooling: str = "mean") -> Embeddings:
        """Checked `texts` (runtime.ai.embeddings.texts_of) embedded by `model`'s stand-in, in a
        thread of its own; counted against the account's requests and tokens per minute and in the
        metrics, as every AI call is."""
        if not self.serve_embeddings:
            raise AIError(
                5007,
                f"{model} is not shipped here and [edge] strict_models = true refuses its stand-in "
                "(a hashed n-gram embedding); set strict_models = false to embed with it",
            )
        terms = self.settings_of(account) if self.settings_of is not None else None
        if self.rate_limits is not None:
            self.rate_limits.check(account, model, model, terms.limits() if terms else None)
        result = await self.embed_pool.run(account, embed_slices, model, texts, pooling)
        if self.rate_limits is not None:
            self.rate_limits.used(account, model, result.tokens)
        if self.metrics is not None:
            self.metrics.ai_tokens(model, result.tokens, 0)
        return result

    async def _run_now(self, call: AICall) -> Answer:
        """A plain run: validated, generated, shaped in the model's schema."""
        req, _ = self.prepare(call.model, call.inputs, call.account, call.session, priority=call.priority)
        try:
            result = await self.generate(
                req, ingress=call.ingress, client_rtt_ms=call.client_rtt_ms, count_as=call.model
            )
        except AIError as exc:
            raise json_mode_failure(req, exc) from None
        return Answer(body=shape_result(self.schema(call.model), call.model, result), result=result)

    def _batches(self, field: str) -> Batches:
        if self.batches is None:
            raise AIError(5004, f"{field}: this runtime has no batch queue")
        return self.batches

    async def run(
        self,
        model: str,
        inputs: Any,
        *,
        ingress: PoP,
        client_rtt_ms: float,
        account: str = "local",
        session: str | None = None,
    ) -> tuple[dict[str, Any], LatencyAccount]:
        """Run `model` on `inputs` now, as a plain call whatever the inputs hold (a batch's items
        run this way: an item never polls or queues), shaped in the model's schema, with its latency
        account; raises AIError."""
        answer = await self._run_now(AICall(model, inputs, account, session, ingress, client_rtt_ms))
        assert answer.body is not None and answer.result is not None
        return answer.body, answer.result.timing

    async def generate(
        self, req: GenerateRequest, *, ingress: PoP, client_rtt_ms: float, count_as: str | None = None
    ) -> GenerateResult:
        """The whole answer to a prepared request, its timing set; errors raise AIError (an engine
        bug as 3007, so that no door has to catch it). `count_as`: the model name the caller used,
        under which its tokens are counted in the metrics."""
        try:
            result = await self.edge.run(req, ingress, client_rtt_ms)
        except EdgeError as exc:
            raise _ai_error(exc) from None
        except AIError:
            raise
        except Exception as exc:  # an engine bug must not take the runtime down with it
            log.exception("AI call failed")
            raise AIError(3007, f"internal error: {type(exc).__name__}: {exc}") from None
        self._used(req, result, count_as)
        return result

    async def stream(
        self, req: GenerateRequest, *, ingress: PoP, client_rtt_ms: float, count_as: str | None = None
    ) -> AsyncIterator[Delta | GenerateResult]:
        """Deltas (edge_sim.request.Delta: text, choice index, logprobs, tool-call pieces), then the
        whole result; errors raise AIError (a prepared request)."""
        deltas, counted = 0, False
        try:
            async for item in self.edge.stream(req, ingress, client_rtt_ms):
                if isinstance(item, GenerateResult):
                    self._used(req, item, count_as)
                    counted = True
                else:
                    deltas += 1
                yield item
        except EdgeError as exc:
            raise _ai_error(exc) from None
        except (GeneratorExit, asyncio.CancelledError):
            # a client that drops the stream before its end still spent what ran: the prompt (as
            # estimated) and a token per delta, so dropping streams cannot lift tokens per minute
            if not counted and self.rate_limits is not None:
                self.rate_limits.used(req.tenant, req.model, req.estimated_tokens() + deltas)
            raise

    def _used(self, req: GenerateRequest, result: GenerateResult, count_as: str | None = None) -> None:
        """The result's tokens, counted against its account's tokens per minute, and in the
        metrics under the name the caller used (`count_as`, when given)."""
        if self.rate_limits is not None:
            self.rate_limits.used(req.tenant, req.model, result.total_tokens)
        if count_as is not None and self.metrics is not None:
            self.metrics.ai_tokens(count_as, result.prompt_tokens, result.completion_tokens)
            if result.timing is not None:
                self.metrics.ai_speculation(
                    count_as, result.timing.draft_tokens, result.timing.accepted_tokens
                )
        if self.metrics is not None:
            timing = result.timing
            self.metrics.ai_ttft(req.tenant, (timing.queue_ms + timing.prefill_ms) / 1000.0)
        if self.feed is not None and result.timing is not None:
            t = result.timing
            self.feed.ai_call(
                req.tenant,
                req.model,
                result.prompt_tokens,
                result.completion_tokens,
                t.ttft_ms,
                t.tpot_ms,
                t.total_ms,
            )


def account_rows(edge: Edge) -> list[tuple[str, str, str, int, int, int, int]]:
    """Each account at each engine of the edge, from the engines' own stats (ModelStatus.accounts):
    (pop, model, account, seats, KV blocks, waiting, preemptions), for runtime.control.metrics."""
    rows = []
    for code, node in list(edge.nodes.items()):
        try:
            status = node.status()
        except Exception:  # a node going away mid-scrape has nothing to report
            continue
        for model, m in status.models.items():
            for account, a in m.accounts.items():
                rows.append((code, model, account, a.running, a.kv_blocks, a.waiting, a.preemptions))
    return rows


async def workers_ai_sse(
    service: AIService, req: GenerateRequest, model: str, *, ingress: PoP, client_rtt_ms: float
) -> AsyncIterator[bytes]:
    """Workers AI streaming of a prepared request (ai_shapes.workers_ai_events)."""
    items = service.stream(req, ingress=ingress, client_rtt_ms=client_rtt_ms, count_as=model)
    async for data in workers_ai_events(items, model, chat=service.schema(model) == "chat-completions"):
        yield data
