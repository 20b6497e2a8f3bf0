"""The AI service behind `env.AI.run` and the AI REST APIs: validates inputs once into the typed
request (edge_sim.request.GenerateRequest), routes it through the edge and hands the typed result
to runtime.ai.shapes, the only place that shapes it as Workers AI or OpenAI JSON.

Error codes are Workers AI's: 5007 no such model, 5004 invalid input, 3006 request too large,
3040 out of capacity, 3007 timeout, 3036 account limited (runtime.control.rate_limit: the account's
requests or tokens per minute for the model, checked before any work is queued).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from edge_sim.accounting import LatencyAccount
from edge_sim.affinity import check_key
from edge_sim.edge import Edge
from edge_sim.errors import EdgeError
from edge_sim.request import Delta, GenerateRequest, GenerateResult
from edge_sim.topology import PoP
from engine.fair_queue import TenantShare
from runtime.ai.inputs import SamplingFields, TextGenerationInputs
from runtime.ai.params import Inputs, generate_request, json_mode_failure
from runtime.ai.refusals import InputError, decode_inputs
from runtime.ai.shapes import Schema, shape_result, workers_ai_events
from runtime.control.rate_limit import AccountRateLimits
from runtime.control.rollout import CANARY_SUFFIX, Rollouts
from workers import AIError

ERROR_CODES = {
    "model_not_found": 5007,
    "invalid_input": 5004,
    "too_large": 3006,
    "no_capacity": 3040,
    "timeout": 3007,
}


def _ai_error(exc: EdgeError) -> AIError:
    return AIError(ERROR_CODES[exc.kind], exc.message, exc.param)


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
        share_of: Callable[[str], TenantShare] | None = None,
    ):
        """`share_of(account)`: the account's fair-share weight and KV share at the PoPs."""
        self.edge = edge
        self.schemas = schemas or {}
        self.aliases = aliases or {}
        self.rate_limits = rate_limits
        self.share_of = share_of
        self.rollouts: Rollouts | None = None  # canaries in progress (control.rollout); the app sets it

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
        return [*served, *(a for a, (target, _) in self.aliases.items() if target in served)]

    def prepare(
        self, model: str, inputs: Any, account: str, session: str | None = None, responses: bool = False
    ) -> tuple[GenerateRequest, Inputs]:
        """Validate a call before any work is queued, once, into the typed request that flows down
        to the PoP (which only checks that it fits); raises AIError with the Workers AI code.
        `session`: the client's x-session-affinity key (edge_sim.affinity); `responses`: the answer
        takes the Responses shape (which carries logprobs), whatever the model's own schema."""
        asked, model = model, self.resolve(model)  # an alias is served by its stand-in
        if model not in self.served():
            refusal = self.edge.refusal(model)
            name = repr(asked) if model == asked else f"{asked!r} (served here by {model!r})"
            if refusal:
                raise AIError(5007, f"model {name} is not being served: it failed to load ({refusal})")
            if not self.edge.nodes and model in self.schemas:  # in the catalog; the edge has no GPU PoP
                raise AIError(3040, f"no PoP serving {name} is up: this edge has no GPU PoP ([edge] pops)")
            known = ", ".join(self.names()) or "none"
            raise AIError(5007, f"no such model {name}; available: {known}")
        if self.rate_limits is not None:  # before the inputs are even read: a limited call costs nothing
            self.rate_limits.check(account, model, asked)
        if isinstance(inputs, SamplingFields):  # decoded already, by an API of its own (OpenAI's)
            parsed = inputs
        else:
            parsed = decode_inputs(inputs, TextGenerationInputs, "Workers AI")
        try:
            session = check_key(session)
        except ValueError as exc:
            raise AIError(5004, str(exc)) from None
        if self.rollouts is not None:  # a session in a canary's share is served by the new version
            model = self.rollouts.route(model, session)
        share = self.share_of(account) if self.share_of is not None else TenantShare()
        req = generate_request(parsed, model=model, tenant=account, share=share, session=session)
        if not responses:
            self._fits_schema(parsed, self.schema(asked))
        if isinstance(parsed, TextGenerationInputs) and parsed.model not in (None, asked):
            raise InputError("model", f"names {parsed.model!r}, but this call is to {asked!r}; leave it out")
        return req, parsed

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
        """Run `model` on `inputs` for a request that entered at `ingress`, shaped in the model's
        schema, with its latency account; raises AIError."""
        req, _ = self.prepare(model, inputs, account, session)
        try:
            result = await self.generate(req, ingress=ingress, client_rtt_ms=client_rtt_ms)
        except AIError as exc:
            raise json_mode_failure(req, exc) from None
        return shape_result(self.schema(model), model, result), result.timing

    async def generate(self, req: GenerateRequest, *, ingress: PoP, client_rtt_ms: float) -> GenerateResult:
        """The whole answer to a prepared request, its timing set; errors raise AIError."""
        try:
            result = await self.edge.run(req, ingress, client_rtt_ms)
        except EdgeError as exc:
            raise _ai_error(exc) from None
        self._used(req, result)
        return result

    async def stream(
        self, req: GenerateRequest, *, ingress: PoP, client_rtt_ms: float
    ) -> AsyncIterator[Delta | GenerateResult]:
        """Deltas (edge_sim.request.Delta: text, choice index, logprobs, tool-call pieces), then the
        whole result; errors raise AIError (a prepared request)."""
        deltas, counted = 0, False
        try:
            async for item in self.edge.stream(req, ingress, client_rtt_ms):
                if isinstance(item, GenerateResult):
                    self._used(req, item)
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

    def _used(self, req: GenerateRequest, result: GenerateResult) -> None:
        """The result's tokens, counted against its account's tokens per minute."""
        if self.rate_limits is not None:
            self.rate_limits.used(req.tenant, req.model, result.total_tokens)


async def workers_ai_sse(
    service: AIService, req: GenerateRequest, model: str, *, ingress: PoP, client_rtt_ms: float
) -> AsyncIterator[bytes]:
    """Workers AI streaming of a prepared request (ai_shapes.workers_ai_events)."""
    items = service.stream(req, ingress=ingress, client_rtt_ms=client_rtt_ms)
    async for data in workers_ai_events(items, model, chat=service.schema(model) == "chat-completions"):
        yield data
