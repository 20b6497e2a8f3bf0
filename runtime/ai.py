"""The AI service behind `env.AI.run`: validates inputs, routes through the edge, shapes the result.

Error codes are Workers AI's: 5007 no such model, 5004 invalid input, 3006 request too large,
3040 out of capacity, 3007 timeout.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from edge_sim.accounting import LatencyAccount
from edge_sim.edge import Edge
from edge_sim.errors import EdgeError
from edge_sim.pop import GenerateRequest
from edge_sim.topology import PoP
from engine import SamplingParams
from runtime.validation import describe
from workers import AIError

ERROR_CODES = {
    "model_not_found": 5007,
    "invalid_input": 5004,
    "too_large": 3006,
    "no_capacity": 3040,
    "timeout": 3007,
}


class ChatMessage(msgspec.Struct):
    role: Literal["system", "user", "assistant"]
    content: str


class TextGenerationInputs(msgspec.Struct, kw_only=True):
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    max_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stream: bool = False


def _decode_inputs(inputs: Any) -> TextGenerationInputs:
    if not isinstance(inputs, dict):
        raise AIError(
            5004, f"inputs must be an object such as {{'prompt': '...'}}, got {type(inputs).__name__}"
        )
    try:
        parsed = msgspec.convert(inputs, TextGenerationInputs)
    except msgspec.ValidationError as exc:
        raise AIError(5004, f"invalid input: {describe(exc)}") from None
    if (parsed.prompt is None) == (parsed.messages is None):
        raise AIError(5004, "invalid input: give exactly one of 'prompt' (a string) or 'messages' (a list)")
    if parsed.messages is not None and not parsed.messages:
        raise AIError(5004, "invalid input: 'messages' must not be empty")
    if parsed.stream:
        raise AIError(5004, "invalid input: 'stream' is not supported by this runtime yet; omit it")
    return parsed


class AIService:
    def __init__(self, edge: Edge):
        self.edge = edge

    async def run(
        self, model: str, inputs: Any, *, ingress: PoP, client_rtt_ms: float, account: str = "local"
    ) -> tuple[dict[str, Any], LatencyAccount]:
        """Run `model` on `inputs` for a request that entered at `ingress`; raises AIError."""
        if model not in self.edge.models():
            refusal = self.edge.refusal(model)
            if refusal:
                raise AIError(5007, f"model {model!r} is not being served: it failed to load ({refusal})")
            known = ", ".join(self.edge.models()) or "none"
            raise AIError(5007, f"no such model {model!r}; available: {known}")
        parsed = _decode_inputs(inputs)
        req = GenerateRequest(
            model=model,
            prompt=parsed.prompt,
            messages=[msgspec.to_builtins(m) for m in parsed.messages] if parsed.messages else None,
            params=SamplingParams(
                max_tokens=parsed.max_tokens,
                temperature=parsed.temperature,
                top_p=parsed.top_p,
                top_k=parsed.top_k,
                seed=parsed.seed,
            ),
            tenant=account,
        )
        try:
            result, latency = await self.edge.run(req, ingress, client_rtt_ms)
        except EdgeError as exc:
            raise AIError(ERROR_CODES[exc.kind], exc.message) from None
        body = {
            "response": result.text,
            "usage": {
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            },
            "finish_reason": result.finish_reason,
            "model": model,
            "quantization": {
                "weights": result.weights,
                "weights_by_part": result.weights_by_part,
                "kv_cache": result.kv_cache_dtype,
            },
            "timing": msgspec.to_builtins(latency),
        }
        return body, latency
