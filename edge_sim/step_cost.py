"""The roofline's step times as ten folded coefficients: the one formula that the capacity simulator
calls for every step it models (edge_sim.roofline.RooflineModel builds it; engine.native compiles it).

A step is bound by compute or by memory, whichever is longer, plus communication between the GPUs:
    compute = c0 * tokens + c1 * sampled rows + c2 * prefill (query, key) pairs + c3 * decode KV tokens
    memory  = c4 + c5 * (1 - c6 ** tokens) + c7 * KV tokens read     (c5 term: the experts touched)
    step    = max(compute, memory) + c8 + c9 * tokens
"""

from __future__ import annotations


class RooflineStepTimes:
    """step_ms and decode_ms of one layout (model, GPUs, formats), in ms."""

    def __init__(self, coefficients: tuple[float, ...]):
        if len(coefficients) != 10:
            raise ValueError(f"ten coefficients, got {len(coefficients)}")
        c = [float(x) for x in coefficients]
        self.c0, self.c1, self.c2, self.c3, self.c4 = c[0], c[1], c[2], c[3], c[4]
        self.c5, self.c6, self.c7, self.c8, self.c9 = c[5], c[6], c[7], c[8], c[9]

    def step_ms(
        self,
        prefill_tokens: float,
        prefill_pairs: float,
        prefill_kv: float,
        decode_seqs: float,
        decode_kv: float,
    ) -> float:
        """One step: `prefill_tokens` prompt tokens whose attention covers `prefill_pairs`
        (query, key) pairs and reads `prefill_kv` cached tokens, plus `decode_seqs` decoding
        sequences reading `decode_kv` cached tokens in all."""
        t = prefill_tokens + decode_seqs
        if t <= 0:
            return 0.0
        compute = (
            self.c0 * t
            + self.c1 * (decode_seqs + (1.0 if prefill_tokens else 0.0))
            + self.c2 * prefill_pairs
            + self.c3 * decode_kv
        )
        memory = self.c4 + self.c5 * (1.0 - self.c6**t) + self.c7 * (prefill_kv + decode_kv)
        return (compute if compute > memory else memory) + self.c8 + self.c9 * t

    def decode_ms(self, batch: float, kv_tokens: float) -> float:
        """One decode step of `batch` sequences holding `kv_tokens` cached tokens in all."""
        if batch <= 0:
            return 0.0
        compute = (self.c0 + self.c1) * batch + self.c3 * kv_tokens
        memory = self.c4 + self.c5 * (1.0 - self.c6**batch) + self.c7 * kv_tokens
        return (compute if compute > memory else memory) + self.c8 + self.c9 * batch
