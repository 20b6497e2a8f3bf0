"""A GPU PoP node: one engine per model it serves, a queue in front of them, measured timing.

The engine runs in the node's own worker thread, so the event loop keeps serving while a request
is computed and the time a request waits for that thread is its queue time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from edge_sim.errors import EdgeError
from edge_sim.topology import PoP
from engine import LLM, InvalidRequestError, SamplingParams, StreamTiming

log = logging.getLogger("edge.pop")


class ModelSpec(msgspec.Struct, frozen=True):
    name: str  # catalog name, e.g. "@edge/moonshotai/kimi-k2-mini"
    path: str  # HF-format model directory
    weights: str = "auto"
    kv_cache_dtype: str = "auto"


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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"pop-{pop.code}")
        self._waiting = 0

    @classmethod
    def load(cls, pop: PoP, models: list[ModelSpec], device: str | None = None) -> PopNode:
        engines = {}
        for spec in models:
            started = time.perf_counter()
            engines[spec.name] = LLM(
                spec.path, weights=spec.weights, kv_cache_dtype=spec.kv_cache_dtype, device=device
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

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        engine = self.engines.get(req.model)
        if engine is None:
            raise EdgeError("model_not_found", f"PoP {self.code} does not serve {req.model!r}")
        try:  # validate before queueing any work
            prompt_ids = self._prompt_ids(engine, req)
            engine.check_request(prompt_ids, req.params)
        except InvalidRequestError as exc:
            kind = (
                "too_large"
                if exc.param in ("prompt", "max_tokens") and "context window" in str(exc)
                else "invalid_input"
            )
            raise EdgeError(kind, str(exc)) from None
        enqueued = time.perf_counter()
        self._waiting += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, self._run, engine, req, prompt_ids, enqueued
            )
        finally:
            self._waiting -= 1

    def _run(
        self, engine: LLM, req: GenerateRequest, prompt_ids: list[int], enqueued: float
    ) -> GenerateResult:
        queue_ms = (time.perf_counter() - enqueued) * 1000
        timing = StreamTiming()
        pieces, count, finish = [], 0, "length"
        for event in engine.stream(prompt_ids, req.params, timing):
            pieces.append(event.text)
            count += 1
            finish = event.finish_reason or finish
        return GenerateResult(
            text="".join(pieces),
            finish_reason=finish,
            prompt_tokens=len(prompt_ids),
            completion_tokens=count,
            queue_ms=queue_ms,
            prefill_ms=timing.prefill_ms,
            decode_ms=timing.decode_ms,
            pop=self.code,
            model=req.model,
            weights=engine.weights_label,
            kv_cache_dtype=engine.kv_cache_dtype,
        )

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
