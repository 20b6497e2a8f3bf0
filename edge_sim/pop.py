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
from engine import LLM, InvalidRequestError, SamplingParams, SeqEvent
from engine.serving import EngineLoop

log = logging.getLogger("edge.pop")


class ModelSpec(msgspec.Struct, frozen=True):
    name: str  # catalog name, e.g. "@edge/moonshotai/kimi-k2-mini"
    path: str  # HF-format model directory
    weights: str = "auto"
    kv_cache_dtype: str = "auto"
    kv_cache_bytes: int | None = None


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


class PopNode:
    def __init__(self, pop: PoP, engines: dict[str, LLM]):
        self.pop = pop
        self.engines = engines
        self.up = True
        self._loops = {
            name: EngineLoop(llm.engine, name=f"pop-{pop.code}-{name}") for name, llm in engines.items()
        }
        self._ids = itertools.count()
        self._waiting = 0

    @classmethod
    def load(cls, pop: PoP, models: list[ModelSpec], device: str | None = None) -> PopNode:
        engines = {}
        for spec in models:
            started = time.perf_counter()
            engines[spec.name] = LLM(
                spec.path,
                weights=spec.weights,
                kv_cache_dtype=spec.kv_cache_dtype,
                device=device,
                kv_cache_bytes=spec.kv_cache_bytes,
            )
            log.info("%s: loaded %s in %.2f s", pop.code, spec.name, time.perf_counter() - started)
        return cls(pop, engines)

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
        )

    def status(self) -> dict[str, Any]:
        """What the node is doing: per model, its formats, KV occupancy, recent steps, expert load."""
        models = {}
        for name, llm in self.engines.items():
            eng = llm.engine
            recent = list(eng.steps)[-32:]
            models[name] = {
                "weights": llm.weights_label,
                "kv_cache_dtype": llm.kv_cache_dtype,
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
        }

    def close(self) -> None:
        for loop in self._loops.values():
            loop.stop()
