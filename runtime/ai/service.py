"""The AI service behind every AI door: env.AI.run, POST /ai/run, the OpenAI-compatible and
Responses APIs, AI Gateway's doors and the batch queue. Each door makes one call object
(runtime.ai.call.AICall: its mode and answer shape decided as it is made) and hands it to `answer`,
the one way in:

- `check` validates it once, before any work is queued, into the typed request
  (edge_sim.request.GenerateRequest) that flows down to the PoP: the model served, the account's
  settings read once (its rate limits, its fair-share weight and KV share at the PoPs), its rate
  limit, the inputs, the priority header, the session key, a rollout's canary;
- the edge runs it; its result completes the call's record once (runtime.control.ai_record), and
  the rate limiter, the metrics and the dashboard feed each read that one record (the request's
  tail reads it too: runtime.host.invocation);
- its answer is shaped once from the typed result, in its door's shape (runtime.ai.shapes,
  runtime.ai.responses_shapes). An engine failure that is not an AIError becomes 3007 here, the one
  place that answers it.

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
from engine.structured.choices import Delta
from runtime.ai.call import (
    BATCH,
    CHAT,
    COMPLETION,
    EMBEDDINGS,
    POLL,
    RESPONSES,
    STREAM,
    WORKERS_AI,
    AICall,
    is_responses,
)
from runtime.ai.embeddings import (
    EMBEDDING_MODELS,
    Embeddings,
    embed_slices,
    texts_of,
    workers_ai_answer,
    workers_ai_inputs,
)
from runtime.ai.embeddings import openai_answer as openai_embeddings
from runtime.ai.inputs import SamplingFields, TextGenerationInputs
from runtime.ai.params import Inputs, generate_request, json_mode_failure
from runtime.ai.refusals import InputError, decode_inputs
from runtime.ai.responses_inputs import bad, chat_inputs, decode_request
from runtime.ai.responses_shapes import response_events, response_object
from runtime.ai.shapes import Schema, openai_events, shape_result, text_completion, workers_ai_events
from runtime.control.accounts import AccountSettings
from runtime.control.ai_record import AIRecord
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
    "busy": 3040,  # rejectIfBusy with every PoP full: Cloudflare's "Capacity temporarily exceeded" (429)
}


def _ai_error(exc: EdgeError) -> AIError:
    return AIError(ERROR_CODES[exc.kind], exc.message, exc.param)


def _run_shape(inputs: Any) -> str:
    """The shape of a call run or checked whole, never polled or queued (a batch's items): the
    Responses shape when its inputs take it, whatever else they hold, else Workers AI's."""
    return RESPONSES if is_responses(inputs) else WORKERS_AI


class Batches(Protocol):
    """The batch queue as the door uses it (runtime.ai.batch.Batches; named by shape, since
    the queue runs its requests through this service)."""

    def submit(self, model: str, inputs: Any, account: str, ingress: PoP, client_rtt_ms: float) -> dict: ...

    def poll(self, model: str, inputs: Any, account: str) -> dict: ...


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

    # --- the one way in ---------------------------------------------------------------------------

    async def answer(self, call: AICall) -> Answer:
        """An AI call through any door, by the mode decided when it was made; raises AIError."""
        if call.embedding and call.shape == EMBEDDINGS:  # OpenAI's, its body checked by the door
            texts = texts_of(call.inputs["input"], "input")
            encoding = call.inputs.get("encoding_format") or "float"
            return Answer(body=openai_embeddings(await self.embed(call, texts), call.model, encoding))
        if call.embedding:
            texts, pooling = workers_ai_inputs(call.model, call.inputs)
            return Answer(body=workers_ai_answer(await self.embed(call, texts, pooling)))
        if call.mode == BATCH:
            if not call.queue:
                raise AIError(5004, "requests: a batch is queued: send it with queueRequest (true)")
            return Answer(
                body=self._batches("queueRequest").submit(
                    call.model, call.inputs, call.account, call.ingress, call.client_rtt_ms
                )
            )
        if call.mode == POLL:
            return Answer(body=self._batches("request_id").poll(call.model, call.inputs, call.account))
        self.check(call)
        if call.mode == STREAM or (call.responses is not None and call.responses.stream):
            return Answer(stream=self._events(call))
        return await self._whole(call)

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
        """Run `model` on `inputs` now, whole, whatever else the inputs hold (a batch's items run
        this way: an item never polls, queues or streams; one in the Responses shape is answered
        in it), with its latency account; raises AIError."""
        call = AICall(model, inputs, account, session, ingress, client_rtt_ms, shape=_run_shape(inputs))
        self.check(call)
        answer = await self._whole(call)
        assert answer.body is not None and answer.result is not None
        return answer.body, answer.result.timing

    def check(self, call: AICall) -> GenerateRequest:
        """Validate a call before any work is queued, once, into the typed request that flows down
        to the PoP (which only checks that it fits); the call carries it from here. Raises AIError
        with the Workers AI code (a Responses body's refusals: ResponsesInputError)."""
        inputs, priority = call.inputs, call.priority
        if call.mode == RESPONSES:  # translated into the chat inputs every chat call meets
            call.responses = decode_request(call.inputs)
            named = call.responses.model
            if named is not None and named != call.model:
                why = f"names {named!r}, but the call is to {call.model!r}; leave it out or make them one"
                raise bad("model", why)
            inputs, priority = chat_inputs(call.responses), None
        call.request = self._checked(call, inputs, priority)
        return call.request

    def prepare(
        self,
        model: str,
        inputs: Any,
        account: str,
        session: str | None = None,
        priority: str | None = None,
    ) -> tuple[GenerateRequest, AICall]:
        """The checks of a call to `model` on `inputs` made here, without running it (a batch's
        requests as they are queued, a test): its typed request, and the call; raises AIError."""
        call = AICall(model, inputs, account, session, priority=priority, shape=_run_shape(inputs))
        return self.check(call), call

    def _checked(self, call: AICall, inputs: Any, priority: str | None) -> GenerateRequest:
        """The checks of `call` on `inputs` (its own, or what a Responses body translates to), in
        the order a call meets them: the model served, the account's rate limit (before the inputs
        are even read: a limited call costs nothing), the inputs, the priority header, the session
        key, a rollout's canary, the answer's schema."""
        account = call.account
        asked, model = call.model, self.resolve(call.model)  # an alias is served by its stand-in
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
        if self.rate_limits is not None:
            self.rate_limits.check(account, model, asked, terms)  # the settings hold its rpm and tpm
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
            session = check_key(call.session)
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
        req.reject_if_busy = call.reject_if_busy
        if call.mode != RESPONSES:  # the Responses shape carries logprobs, whatever the model's own schema
            self._fits_schema(parsed, self.schema(asked))
        if isinstance(parsed, TextGenerationInputs) and parsed.model not in (None, asked):
            raise InputError("model", f"names {parsed.model!r}, but this call is to {asked!r}; leave it out")
        return req

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

    def _batches(self, field: str) -> Batches:
        if self.batches is None:
            raise AIError(5004, f"{field}: this runtime has no batch queue")
        return self.batches

    # --- running a checked call -------------------------------------------------------------------

    async def generate(self, call: AICall) -> GenerateResult:
        """The whole answer to a checked call, its timing set, its record completed; errors raise
        AIError (an engine bug as 3007, so that no door has to catch it)."""
        assert call.request is not None, "a call is checked before it runs"
        try:
            result = await self.edge.run(call.request, call.ingress, call.client_rtt_ms)
        except EdgeError as exc:
            raise _ai_error(exc) from None
        except AIError:
            raise
        except Exception as exc:  # an engine bug must not take the runtime down with it
            log.exception("AI call failed")
            raise AIError(3007, f"internal error: {type(exc).__name__}: {exc}") from None
        self._record(call.answered(result))
        return result

    async def stream(self, call: AICall) -> AsyncIterator[Delta | GenerateResult]:
        """Deltas (edge_sim.request.Delta: text, choice index, logprobs, tool-call pieces), then the
        whole result, which completes the call's record; errors raise AIError (a checked call)."""
        req = call.request
        assert req is not None, "a call is checked before it streams"
        deltas, counted = 0, False
        try:
            async for item in self.edge.stream(req, call.ingress, call.client_rtt_ms):
                if isinstance(item, GenerateResult):
                    self._record(call.answered(item))
                    counted = True
                else:
                    deltas += 1
                yield item
        except EdgeError as exc:
            raise _ai_error(exc) from None
        except (GeneratorExit, asyncio.CancelledError):
            # a client that drops the stream before its end still spent what ran: the prompt (as
            # estimated) and a token per delta, so dropping streams cannot lift tokens per minute
            if not counted:
                self._record(call.cut(req.estimated_tokens() + deltas), whole=False)
            raise

    async def embed(self, call: AICall, texts: list[str] | None = None, pooling: str = "mean") -> Embeddings:
        """Checked `texts` (runtime.ai.embeddings.texts_of; by default the call's inputs) embedded by
        the call's model's stand-in, in a thread of its own; counted against the account's requests
        and tokens per minute and in the metrics, as every AI call is."""
        model, account = call.model, call.account
        if not self.serve_embeddings:
            raise AIError(
                5007,
                f"{model} is not shipped here and [edge] strict_models = true refuses its stand-in "
                "(a hashed n-gram embedding); set strict_models = false to embed with it",
            )
        terms = self.settings_of(account) if self.settings_of is not None else None
        if self.rate_limits is not None:
            self.rate_limits.check(account, model, model, terms)
        texts = call.inputs if texts is None else texts
        if call.reject_if_busy and self.embed_pool.waiting():  # texts queued ahead of this call's
            raise AIError(
                3040,
                f"Capacity temporarily exceeded, please try again: {model}'s stand-in has texts queued "
                "ahead of this call, and it asked not to wait (rejectIfBusy)",
            )
        result = await self.embed_pool.run(account, embed_slices, model, texts, pooling)
        self._record(call.embedded(result.tokens))
        return result

    def _record(self, record: AIRecord, whole: bool = True) -> None:
        """A call's one record, read by each counter: the rate limiter's tokens per minute, the
        metrics and the dashboard feed (what a generation answered; a stream cut short counts
        only against tokens per minute)."""
        if self.rate_limits is not None:
            tokens = record.prompt_tokens + record.completion_tokens
            self.rate_limits.used(record.account, record.served, tokens)
        if not whole:
            return
        if self.metrics is not None:
            self.metrics.ai_record(record)
        if self.feed is not None:
            self.feed.ai_record(record)

    # --- its answer, shaped once in its door's shape ----------------------------------------------

    async def _whole(self, call: AICall) -> Answer:
        try:
            result = await self.generate(call)
        except AIError as exc:
            if call.mode == RESPONSES:
                raise
            assert call.request is not None
            raise json_mode_failure(call.request, exc) from None
        return Answer(body=self._shaped(call, result), result=result)

    def _shaped(self, call: AICall, result: GenerateResult) -> dict[str, Any]:
        if call.mode == RESPONSES:
            return response_object(call.model, call.responses, result)
        if call.shape == CHAT:
            return shape_result("chat-completions", call.model, result)
        if call.shape == COMPLETION:
            return text_completion(call.model, result)
        guide = call.request.params.guide if call.request is not None else None
        json_mode = guide is not None and guide.kind in ("json", "json_schema")
        return shape_result(self.schema(call.model), call.model, result, json_mode=json_mode)

    def _events(self, call: AICall) -> AsyncIterator[bytes]:
        items, model = self.stream(call), call.model
        if call.mode == RESPONSES:
            return response_events(items, model, call.responses)
        if call.shape in (CHAT, COMPLETION):
            assert call.request is not None
            options, n = call.inputs.stream_options, call.request.params.n
            usage_chunk = options is not None and options.include_usage
            return openai_events(items, model, call.shape == CHAT, include_usage=usage_chunk, n=n)
        return workers_ai_events(items, model, chat=self.schema(model) == "chat-completions")


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
