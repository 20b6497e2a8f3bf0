"""The record of one AI call: what it was (the model as called, the account, its request id and tags,
the AI Gateway it went through) and, once answered by a generation, what it spent (tokens, draft
tokens, its latency account and the formats that served it).

The call makes it once at its door (runtime.ai.call.AICall) and completes it once from its result;
everyone who counts AI calls reads this one record instead of a figure of their own: the rate
limiter's tokens per minute, the metrics, the dashboard feed (runtime.ai.service hands it to them),
and the request's tail event, timing headers and dashboard entry (runtime.host.invocation keeps the
records of the calls a worker made). So no two of them can count a call differently.

It lives here, beside its readers, because runtime.control imports nothing of runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_sim.accounting import LatencyAccount

MODEL_CHARS = 256  # a model name as the tail shows it (a worker names models at will)


@dataclass
class AIRecord:
    model: str  # as the caller named it: its tokens are counted under this name
    account: str
    request_id: str = ""  # cf-ai-req-id (env.AI.lastRequestId); "" where the door names none
    tags: tuple[str, ...] = ()  # env.AI.run's `tags`
    # the name the tail lists it under, where that is not `model`: env.AI.run's model as the worker
    # wrote it (before its `prefix`), a universal gateway run's "gateway:ID"
    listed_as: str | None = None
    # through an AI Gateway (runtime.ai.gateway): which one, its log row, its cache's verdict
    gateway: str | None = None
    gateway_log_id: str | None = None
    cache_status: str | None = None
    # once answered: the model that served it (an alias's stand-in, a rollout's canary), what it spent
    served: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    timing: LatencyAccount | None = None  # None: no generation behind it (a cache hit, a batch, a cut stream)
    quantization: str = ""  # the formats that served it, as x-edge-quantization names them
    server_timing: str = ""  # its latency account as a server-timing entry

    def through_gateway(self, gateway: str, log_id: str, cache_status: str | None) -> None:
        """It went through AI Gateway `gateway` (runtime.ai.gateway): its log row and cache verdict."""
        self.gateway, self.gateway_log_id, self.cache_status = gateway, log_id, cache_status

    def tail_entry(self) -> dict[str, Any]:
        """Its entry in the request's tail event (`edge tail`: Cloudflare's shape, plus the gateway
        that logged it, so that `edge tail` leads to `edge gateway logs`)."""
        listed = self.model if self.listed_as is None else self.listed_as
        entry: dict[str, Any] = {"model": listed[:MODEL_CHARS], "requestId": self.request_id}
        entry["tags"] = list(self.tags)
        if self.gateway is not None:
            entry.update(gateway=self.gateway, gatewayLogId=self.gateway_log_id)
            entry["cacheStatus"] = self.cache_status
        return entry
