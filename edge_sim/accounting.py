"""The latency account attached to every AI answer.

Network parts come from the RTT model; queue, prefill and decode are measured on the machine that
runs the engine. The parts add up to the total by construction, so a client can see where time went.
"""

from __future__ import annotations

import msgspec

from edge_sim.target import ModeledTimes


class LatencyAccount(msgspec.Struct, kw_only=True):
    client_rtt_ms: float  # client <-> ingress PoP (anycast: the nearest PoP)
    backbone_rtt_ms: float  # ingress PoP <-> GPU PoP (0 when they are the same PoP)
    ingress: str  # ingress PoP code (request.cf.colo)
    pop: str  # GPU PoP that ran the model
    queue_ms: float  # waiting at the GPU PoP before the engine took the request
    prefill_ms: float  # prompt forward pass and the first token
    decode_ms: float  # every later token
    tpot_ms: float = 0.0  # mean time per output token after the first (measured)
    ttft_ms: float = 0.0  # what the client waits for the first token: network + queue + prefill
    total_ms: float = 0.0
    cached_tokens: int = 0  # prompt tokens the PoP's prefix cache held: prefill_ms ran only the rest
    draft_tokens: int = 0  # speculative draft tokens verified for this request (all its choices)
    accepted_tokens: int = 0  # of those, kept: tokens that took no decode step of their own
    # the same request on the PoP's GPUs running the catalog entry's full-size target (roofline)
    modeled: ModeledTimes | None = None

    def __post_init__(self) -> None:
        for name in ("client_rtt_ms", "backbone_rtt_ms", "queue_ms", "prefill_ms", "decode_ms", "tpot_ms"):
            setattr(self, name, round(getattr(self, name), 3))
        self.ttft_ms = round(self.client_rtt_ms + self.backbone_rtt_ms + self.queue_ms + self.prefill_ms, 3)
        self.total_ms = round(self.ttft_ms + self.decode_ms, 3)

    def server_timing(self) -> str:
        """The same parts as a Server-Timing header value (durations in ms)."""
        parts = [
            ("client-rtt", self.client_rtt_ms, self.ingress),
            ("backbone-rtt", self.backbone_rtt_ms, f"{self.ingress}-{self.pop}"),
            ("queue", self.queue_ms, self.pop),
            ("prefill", self.prefill_ms, self.pop),
            ("decode", self.decode_ms, self.pop),
            ("ttft", self.ttft_ms, self.pop),
            ("total", self.total_ms, self.pop),
        ]
        return ", ".join(f'{name};dur={dur:.3f};desc="{desc}"' for name, dur, desc in parts)
