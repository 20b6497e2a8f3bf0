"""A PoP's status as one typed struct: what `/cdn-cgi/edge/pops` shows, what a remote node serves
on `/v1/health` and what the router ranks a remote node by (msgspec, so both ends share one shape)."""

from __future__ import annotations

import msgspec

from edge_sim.load import PopLoad, pop_load
from edge_sim.request import Formats
from engine import StepStats
from engine.engine import AccountStats
from engine.load.verified_load import VerificationRecord


class ModelStatus(msgspec.Struct, kw_only=True):
    """One engine at a PoP: its formats, queue, KV cache, recent steps and expert load."""

    weights: str
    weights_by_part: dict[str, str]
    kv_cache_dtype: str
    verification: VerificationRecord
    kv_bytes_per_token: float
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_free: int
    running: int
    waiting: int
    preemptions: int  # pauses included
    pauses: int = 0  # of the preemptions, paused with their KV blocks kept (not recomputed)
    generated_tokens: int
    draft_tokens: int = 0  # speculative draft tokens verified since start
    accepted_tokens: int = 0  # of those, kept (acceptance rate: accepted / drafted)
    prompt_tokens: int = 0  # prompt tokens run through the model since start (prefix-cache hits not)
    prefill_ms_per_token: float  # measured over recent steps (a default before any)
    pending_tokens: int  # prompt tokens submitted at the PoP that have not started yet
    step_ms: float = 0.0  # the step in progress (the last step's time while it runs anything)
    seat_limit: int = 0  # running sequences at most
    finish_per_s: float = 0.0  # recent rate of finished requests
    recent_steps: list[StepStats] = []
    expert_load: list[list[int]] = []
    tool_format: str = ""  # engine.structured.tool_calls' format of the model ("" for none)
    reasoning_format: str = ""  # the family whose reasoning it writes (engine.structured.reasoning_parser)
    upstream_model: str | None = None  # an upstream PoP's: the name its server serves the model under
    accounts: dict[str, AccountStats] = {}  # by account: seats and blocks held, waiting, preemptions
    compiled_buckets: list[int] = []  # decode batch buckets compiled (engine.step.compiled_step); [] eager
    compiled_steps: int = 0  # decode steps run compiled since start
    dense_path: str = ""  # how its uncompressed matrices are held and multiplied (Formats.dense_path)

    def formats(self) -> Formats:
        return Formats(
            self.weights,
            self.kv_cache_dtype,
            self.weights_by_part,
            self.tool_format,
            self.reasoning_format,
            self.dense_path,
        )

    def load(self) -> PopLoad:
        """What the router ranks this engine by (edge_sim.router.route_score)."""
        return pop_load(
            step_ms=self.step_ms, pending_tokens=self.pending_tokens,
            prefill_ms_per_token=self.prefill_ms_per_token, waiting=self.waiting, running=self.running,
            seat_limit=self.seat_limit, kv_blocks_free=self.kv_blocks_free,
            kv_blocks_used=self.kv_blocks_used, finish_per_ms=self.finish_per_s / 1000.0,
        )  # fmt: skip


class PopStatus(msgspec.Struct, kw_only=True, omit_defaults=True):
    code: str
    city: str
    up: bool
    gpus: dict[str, int]
    in_flight: int  # requests submitted and not finished
    queue_depth: int  # of those, the ones that have not produced a token yet
    max_in_flight: int  # admission limit: beyond it the router spills elsewhere
    models: dict[str, ModelStatus]
    refused: dict[str, str]  # model -> why its last load was refused
    # set only for a remote node, by the runtime's side (omitted otherwise)
    remote: str | None = None
    reachable: bool | None = None
    backend: str | None = None  # an upstream PoP's backend ("openai"); omitted for our own engine
