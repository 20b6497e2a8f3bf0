"""Sampling parameters (validated before any work is queued) and the sampler."""

from __future__ import annotations

import msgspec
import torch

from engine.errors import InvalidRequestError


class SamplingParams(msgspec.Struct, kw_only=True):
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = no limit
    seed: int | None = None
    ignore_eos: bool = False

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise InvalidRequestError("max_tokens", f"must be at least 1, got {self.max_tokens}")
        if not self.temperature >= 0:
            raise InvalidRequestError("temperature", f"must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequestError("top_k", f"must be >= 0 (0 means no limit), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Picks the next token of one sequence; a seeded request gets its own generator."""

    def __init__(self, params: SamplingParams, device: torch.device):
        self.params = params
        self._gen: torch.Generator | None = None
        if not params.greedy:
            self._gen = torch.Generator(device=device)
            if params.seed is not None:
                self._gen.manual_seed(params.seed)
            else:
                self._gen.seed()

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: [vocab] float32."""
        p = self.params
        if p.greedy:
            return int(logits.argmax())
        logits = logits / p.temperature
        if p.top_k and p.top_k < logits.numel():
            kth = logits.topk(p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1:
            sorted_probs, order = probs.sort(descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop = sorted_probs.cumsum(0) - sorted_probs >= p.top_p
            sorted_probs[drop] = 0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self._gen))
