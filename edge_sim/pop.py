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
from typing import Any

import msgspec

from edge_sim.errors import EdgeError
from edge_sim.topology import PoP
from engine import LLM, InvalidRequestError, ModelLoadError, SamplingParams, SeqEvent
from engine.serving import EngineLoop

log = logging.getLogger("edge.pop")


class ModelSpec(msgspec.Struct, frozen=True):
    name: str  # catalog name, e.g. "@edge/moonshotai/kimi-k2-mini"
    path: str  # HF-format model directory
    weights: str = "auto"
    kv_cache_dtype: str = "auto"
    kv_cache_bytes: int | None = None
    trusted_keys: list[str] | None = None  # None: the engine's default trust store
    allow_unsigned: bool = False


class GenerateRequest(msgspec.Struct, kw_only=True):
    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    params: SamplingParams
    tenant: str = "local"


class GenerateResult(msgspec.Struct, kw_only=True):
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    queue_ms: float
    prefill_ms: float
    decode_ms: float
    pop: str
    model: str
    weights: str
    kv_cache_dtype: str
    weights_by_part: dict[str, str] = {}


class PopNode:
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
        )
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

    @property
    def code(self) -> str:
        return self.pop.code

    @property
    def queue_depth(self) -> int:
        return self._waiting

    def serves(self, model: str) -> bool:
        return model in self.engines

    def _prompt_ids(self, engine: LLM, req: GenerateRequest) -> list[int]:
        if req.messages is not None:
            return engine.encode(engine.tokenizer.apply_chat_template(req.messages))
        return engine.encode(req.prompt or "")

    async def stream(self, req: GenerateRequest) -> AsyncIterator[SeqEvent]:
        """Token events for one request as the engine produces them; the last one carries metrics.

        Validation happens before anything is queued; leaving the iterator early cancels the
        request and frees its KV blocks.
        """
        engine = self.engines.get(req.model)
        if engine is None:
            raise EdgeError("model_not_found", f"PoP {self.code} does not serve {req.model!r}")
        try:
            prompt_ids = self._prompt_ids(engine, req)
            engine.check_request(prompt_ids, req.params)
        except InvalidRequestError as exc:
            too_large = exc.param in ("prompt", "max_tokens") and (
                "context window" in str(exc) or "KV" in str(exc)
            )
            raise EdgeError("too_large" if too_large else "invalid_input", str(exc)) from None
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[SeqEvent] = asyncio.Queue()
        request_id = f"{self.code}-{next(self._ids)}"
        engine_loop = self._loops[req.model]
        self._waiting += 1
        engine_loop.submit(
            request_id,
            prompt_ids,
            req.params,
            lambda e: loop.call_soon_threadsafe(events.put_nowait, e),
            tenant=req.tenant,
        )
        finished = False
        try:
            while True:
                event = await events.get()
                if event.finish_reason is not None:
                    finished = True
                yield event
                if finished:
                    return
        finally:
            self._waiting -= 1
            if not finished:
                engine_loop.cancel(request_id)

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        engine = self.engines.get(req.model)
        pieces: list[str] = []
        last: SeqEvent | None = None
        async for event in self.stream(req):
            pieces.append(event.text)
            last = event
        assert last is not None and last.metrics is not None
        if last.finish_reason == "error":
            raise EdgeError("invalid_input", f"generation failed: {last.error}")
        m = last.metrics
        return GenerateResult(
            text="".join(pieces),
            finish_reason=last.finish_reason,
            prompt_tokens=m.prompt_tokens,
            completion_tokens=m.completion_tokens,
            queue_ms=m.queue_ms,
            prefill_ms=m.prefill_ms,
            decode_ms=m.decode_ms,
            pop=self.code,
            model=req.model,
            weights=engine.weights_label,
            kv_cache_dtype=engine.kv_cache_dtype,
            weights_by_part=engine.weight_formats,
        )

    def status(self) -> dict[str, Any]:
        """What the node is doing: per model, its formats, KV occupancy, recent steps, expert load."""
        models = {}
        for name, llm in self.engines.items():
            eng = llm.engine
            recent = list(eng.steps)[-32:]
            models[name] = {
                "weights": llm.weights_label,
                "weights_by_part": llm.weight_formats,
                "kv_cache_dtype": llm.kv_cache_dtype,
                "verification": msgspec.to_builtins(llm.verification),
                "kv_bytes_per_token": eng.cache.bytes_per_token(),
                "kv_blocks_total": eng.cache.num_blocks,
                "kv_blocks_used": eng.cache.used_blocks,
                "running": len(eng.scheduler.running),
                "waiting": len(eng.scheduler.waiting),
                "preemptions": eng.scheduler.preemptions,
                "generated_tokens": eng.total_generated_tokens,
                "recent_steps": [msgspec.to_builtins(st) for st in recent],
                "expert_load": eng.expert_load(),
            }
        return {
            "code": self.code,
            "city": self.pop.city,
            "up": self.up,
            "gpus": self.pop.gpus,
            "queue_depth": self.queue_depth,
            "models": models,
            "refused": dict(self.refused),  # model -> why its last load was refused
        }

    def close(self) -> None:
        for loop in self._loops.values():
            loop.stop()
