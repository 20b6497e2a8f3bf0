"""A GPU PoP node: one continuously batched engine per model it serves, with measured timing.

Each engine runs in its own thread (engine.serving.EngineLoop); requests join its running batch
at the next step. Queue time is arrival to first scheduling, so it includes waiting for KV room.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator

import msgspec

from edge_sim.errors import EdgeError, PopDown, from_engine
from edge_sim.load import FinishRate, PopLoad, pop_load
from edge_sim.node import NodeBase
from edge_sim.request import Formats, GenerateRequest
from edge_sim.status import ModelStatus, PopStatus
from edge_sim.topology import PoP
from engine import LLM, InvalidRequestError, ModelLoadError, SamplingParams, SeqEvent
from engine.serving import EngineLoop
from engine.structured.tool_calls import check_tools, format_for, guide_for, render_messages

log = logging.getLogger("edge.pop")


def _deliver(loop: asyncio.AbstractEventLoop, events: asyncio.Queue, event: SeqEvent) -> None:
    """Hand an engine event to the request's event loop (called from the engine thread)."""
    if not loop.is_closed():  # the client's loop may be gone (it left); the engine carries on
        loop.call_soon_threadsafe(events.put_nowait, event)


class ModelSpec(msgspec.Struct, frozen=True):
    name: str  # catalog name, e.g. "@edge/moonshotai/kimi-k2-mini"
    path: str  # HF-format model directory
    weights: str = "auto"
    kv_cache_dtype: str = "auto"
    kv_cache_bytes: int | None = None
    trusted_keys: list[str] | None = None  # None: the engine's default trust store
    allow_unsigned: bool = False
    prefix_caching: bool = True  # reuse a tenant's cached prompt prefixes (engine.kv.prefix_hash)
    # 'env' ($EDGE_SPECULATIVE), 'off', 'ngram' or 'ngram:K': the catalog entry's default wins
    speculative: str = "env"


class PopNode(NodeBase):
    def __init__(self, pop: PoP, engines: dict[str, LLM], refused: dict[str, str] | None = None):
        self.pop = pop
        self.engines = engines
        self.refused = refused or {}  # model -> why its last load was refused (verification, say)
        self.up = True
        self._loops = {
            name: EngineLoop(llm.engine, name=f"pop-{pop.code}-{name}") for name, llm in engines.items()
        }
        self._ids = itertools.count()
        self._waiting = 0
        self._finishes: dict[str, FinishRate] = {}  # per model: what the router reads as seats free up
        # requests submitted that have not produced a token yet: request id -> (model, prompt
        # tokens, their event queue); a PoP taken down hands these back to be re-routed
        self._pending: dict[str, tuple[str, int, asyncio.Queue]] = {}
        # requests that have produced a token: request id -> (model, their event queue); a PoP
        # taken down cuts these (the edge ends each with an error event: it cannot re-route them)
        self._started: dict[str, tuple[str, asyncio.Queue]] = {}
        self.max_in_flight = 256  # admission limit per PoP: beyond it the router spills elsewhere

    @classmethod
    def load(cls, pop: PoP, models: list[ModelSpec], device: str | None = None) -> PopNode:
        """Load an engine per model; a model that fails to load (or to verify) is refused and
        reported, and the node serves the others."""
        engines, refused = {}, {}
        for spec in models:
            try:
                engines[spec.name] = cls._load_engine(pop, spec, device)
            except ModelLoadError as exc:
                refused[spec.name] = str(exc)
                log.error("%s: refused %s: %s", pop.code, spec.name, exc)
        return cls(pop, engines, refused)

    @staticmethod
    def _load_engine(pop: PoP, spec: ModelSpec, device: str | None) -> LLM:
        started = time.perf_counter()
        llm = LLM(
            spec.path,
            weights=spec.weights,
            kv_cache_dtype=spec.kv_cache_dtype,
            device=device,
            kv_cache_bytes=spec.kv_cache_bytes,
            trusted_keys=spec.trusted_keys,
            allow_unsigned=spec.allow_unsigned,
            prefix_caching=spec.prefix_caching,
            speculative=spec.speculative,
        )
        if llm.engine.compiled_decode is not None:  # steps run eagerly until their bucket compiles
            llm.engine.compiled_decode.warm_up_in_background()
        log.info(
            "%s: loaded %s in %.2f s (verification %.3f s)",
            pop.code,
            spec.name,
            time.perf_counter() - started,
            llm.verification.seconds,
        )
        return llm

    def reload(self, spec: ModelSpec, device: str | None = None) -> str | None:
        """Load a new version of a model; on failure keep serving the current one and return why."""
        try:
            llm = self._load_engine(self.pop, spec, device)
        except ModelLoadError as exc:
            self.refused[spec.name] = str(exc)
            log.error(
                "%s: refused new version of %s, still serving the previous one: %s", self.code, spec.name, exc
            )
            return str(exc)
        old = self._loops.get(spec.name)
        self.engines[spec.name] = llm
        self._loops[spec.name] = EngineLoop(llm.engine, name=f"pop-{self.code}-{spec.name}")
        self.refused.pop(spec.name, None)
        if old is not None:
            old.retire()  # requests already running there finish there
        return None

    def unload(self, name: str) -> None:
        """Stop serving a model here (a rolled-back canary); requests running there finish first."""
        loop = self._loops.pop(name, None)
        self.engines.pop(name, None)
        self.refused.pop(name, None)
        if loop is not None:
            loop.retire()

    @property
    def in_flight(self) -> int:
        return self._waiting

    def has_room(self) -> bool:
        return self.up and self._waiting < self.max_in_flight

    def prefill_ms_per_token(self, model: str) -> float:
        """Measured prefill cost per token (recent steps), or a conservative default."""
        steps = [s for s in self.engines[model].recent_steps(64) if s.prefill_tokens]
        tokens = sum(s.prefill_tokens for s in steps)
        return sum(s.duration_ms for s in steps) / tokens if tokens else 0.05

    def route_load(self, model: str) -> PopLoad:
        """What the router ranks this PoP by for `model` (edge_sim.load.route_score)."""
        stats = self.engines[model].stats()
        return pop_load(
            step_ms=stats.last_step_ms if stats.running else 0.0,
            pending_tokens=self.pending_tokens(model), prefill_ms_per_token=self.prefill_ms_per_token(model),
            waiting=stats.waiting, running=stats.running, seat_limit=stats.seat_limit,
            kv_blocks_free=stats.kv_blocks_free, kv_blocks_used=stats.kv_blocks_used,
            finish_per_ms=self._finishes[model].rate if model in self._finishes else 0.0,
        )  # fmt: skip

    def pending_tokens(self, model: str) -> int:
        """Prompt tokens submitted for `model` here that have not started yet."""
        return sum(n for m, n, _ in self._pending.values() if m == model)

    async def refresh(self) -> bool:
        return True  # in-process: what the router ranks by is always current

    async def take_down(self) -> int:
        """Stop taking requests, as a PoP that fails does: the ones still queued here are handed
        back to be re-routed, the ones already generating are cut (each ends with an error event
        upstream). Returns how many were handed back."""
        self.up = False
        cut = [(rid, model, events) for rid, (model, events) in self._started.items()]
        queued = [(rid, model, events) for rid, (model, _, events) in self._pending.items()]
        for request_id, model, events in cut + queued:
            self._loops[model].cancel(request_id)
            events.put_nowait(PopDown(self.code))
        self._started.clear()
        return len(queued)

    async def bring_up(self) -> None:
        self.up = True

    def _prompt_ids(self, engine: LLM, req: GenerateRequest) -> list[int]:
        """The request's prompt tokens: the one place on the path that renders and tokenizes it.
        Chat messages (a tool round trip too) and the declared tools are written in the model's
        own tool-call format (engine.structured.tool_calls), then through its chat template."""
        tools = req.tools if req.tools and req.tool_choice != "none" else None
        if req.messages is None:
            if tools:
                raise InvalidRequestError(
                    "tools", "a raw prompt has no chat template to declare tools in; send messages"
                )
            return engine.encode_prompt(req.prompt or "")
        # bounded before anything renders it (the tools' size is bounded by check_tools)
        engine.check_prompt_chars(sum(len(str(m.get("content", ""))) for m in req.messages))
        fmt = format_for(engine.config.model_type)
        if tools:
            check_tools(tools, fmt)
        messages = render_messages(fmt, req.messages, tools)
        return engine.encode_prompt(engine.tokenizer.apply_chat_template(messages, thinking=req.thinking))

    @staticmethod
    def _params(engine: LLM, req: GenerateRequest) -> SamplingParams:
        """The engine's parameters: with tools, the guide of their format (it wins over a
        response_format guide, which the runtime refuses beside tools anyway)."""
        guide = guide_for(
            format_for(engine.config.model_type), req.tools, req.tool_choice, req.parallel_tool_calls
        )
        return req.params if guide is None else msgspec.structs.replace(req.params, guide=guide)

    async def stream(self, req: GenerateRequest) -> AsyncIterator[SeqEvent]:
        """Token events for one request as the engine produces them, for each of its n sequences
        (SeqEvent.index); each sequence's last event carries metrics, and the stream ends when
        every sequence has ended.

        The request was validated where it entered; here it is only checked to fit (which needs
        its tokens) before anything is queued; leaving the iterator early cancels the
        request and frees its KV blocks.
        """
        engine = self.engines.get(req.model)
        if engine is None:
            raise EdgeError("model_not_found", f"PoP {self.code} does not serve {req.model!r}")
        try:
            prompt_ids = self._prompt_ids(engine, req)
            params = self._params(engine, req)
            engine.check_request(prompt_ids, params)
        except InvalidRequestError as exc:
            raise from_engine(exc) from None
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[SeqEvent] = asyncio.Queue()
        request_id = f"{self.code}-{next(self._ids)}"
        engine_loop = self._loops[req.model]
        if not self.up:
            raise PopDown(self.code)
        self._waiting += 1
        self._pending[request_id] = (req.model, len(prompt_ids), events)
        engine_loop.submit(
            request_id,
            prompt_ids,
            params,
            lambda e: _deliver(loop, events, e),
            tenant=req.tenant,
            share=req.share,
        )
        finished = False
        running = set(range(params.n))  # each of the n sequences ends with its own last event
        try:
            while True:
                event = await events.get()
                if isinstance(event, PopDown):
                    finished = True  # already cancelled by take_down
                    raise event
                if self._pending.pop(request_id, None) is not None:
                    self._started[request_id] = (req.model, events)
                if event.finish_reason is not None:
                    running.discard(event.index)
                    finished = not running
                    if finished:
                        self._finishes.setdefault(req.model, FinishRate()).tick(time.perf_counter() * 1000.0)
                yield event
                if finished:
                    return
        finally:
            self._waiting -= 1
            self._pending.pop(request_id, None)
            self._started.pop(request_id, None)
            if not finished:
                engine_loop.cancel(request_id)

    def models(self) -> list[str]:
        return list(self.engines)

    def formats(self, model: str) -> Formats:
        llm = self.engines.get(model)
        return Formats.of(llm) if llm is not None else Formats.unknown()

    def status(self) -> PopStatus:
        """What the node is doing: per model, its formats, queue, KV occupancy, recent steps and
        expert load; also what a remote node serves the router."""
        return PopStatus(
            code=self.code,
            city=self.pop.city,
            up=self.up,
            gpus=dict(self.pop.gpus),
            in_flight=self._waiting,
            queue_depth=len(self._pending),
            max_in_flight=self.max_in_flight,
            models={name: self._model_status(name, llm) for name, llm in self.engines.items()},
            refused=dict(self.refused),
        )

    def _model_status(self, name: str, llm: LLM) -> ModelStatus:
        stats, formats = llm.stats(), Formats.of(llm)
        return ModelStatus(
            weights=formats.weights,
            weights_by_part=formats.weights_by_part,
            kv_cache_dtype=formats.kv_cache,
            tool_format=formats.tool_format,
            reasoning_format=formats.reasoning_format,
            dense_path=formats.dense_path,
            verification=llm.verification,
            kv_bytes_per_token=stats.kv_bytes_per_token,
            kv_blocks_total=stats.kv_blocks_total,
            kv_blocks_used=stats.kv_blocks_used,
            kv_blocks_free=stats.kv_blocks_free,
            running=stats.running,
            waiting=stats.waiting,
            preemptions=stats.preemptions,
            pauses=stats.pauses,
            generated_tokens=stats.generated_tokens,
            draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens,
            prompt_tokens=stats.prompt_tokens,
            prefill_ms_per_token=self.prefill_ms_per_token(name),
            pending_tokens=self.pending_tokens(name),
            step_ms=stats.last_step_ms if stats.running else 0.0,
            seat_limit=stats.seat_limit,
            finish_per_s=self._finishes[name].rate * 1000.0 if name in self._finishes else 0.0,
            accounts=stats.accounts,
            compiled_buckets=stats.compiled_buckets,
            compiled_steps=stats.compiled_steps,
            recent_steps=llm.recent_steps(32),
            expert_load=llm.expert_load(),
        )

    def wait_compiled(self) -> None:
        """Until the decode steps each engine compiles in the background are ready: what follows runs
        the path a warm PoP serves (a benchmark or an evaluation, not serving, which never waits)."""
        for llm in self.engines.values():
            if llm.engine.compiled_decode is not None:
                llm.engine.compiled_decode.wait_warm()

    def close(self) -> None:
        for loop in self._loops.values():
            loop.stop()
