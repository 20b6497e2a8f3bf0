"""The engine's Python API: `LLM(path).generate(prompts, SamplingParams(...))`, `LLM.logits(ids)`.

`stream()` is the serving entry point the PoP node uses: it yields one event per generated token
with the text delta, and measures prefill and decode time as it goes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import torch

from engine.batch import SeqSlice
from engine.config import ModelConfig, load_config
from engine.errors import InvalidRequestError, ModelLoadError
from engine.kv_cache import SequenceKVCache
from engine.models import architecture
from engine.sampling import Sampler, SamplingParams
from engine.tokenizer import IncrementalDetokenizer, TextTokenizer
from engine.weight_parts import apply_weight_format, check_format, formats_by_part, parse_parts, weights_label
from engine.weights import load_tensors

KV_CACHE_DTYPES = ("auto",)


class TokenEvent(msgspec.Struct):
    token_id: int
    text: str  # detokenized delta (may be empty while a multi-byte character is incomplete)
    finish_reason: str | None = None  # set on the last event: "stop" (EOS) or "length"


class Generation(msgspec.Struct):
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    prefill_ms: float
    decode_ms: float

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


class StreamTiming(msgspec.Struct):
    """Filled in by `LLM.stream` while it runs: measured on the machine that runs the engine."""

    prefill_ms: float = 0.0
    decode_ms: float = 0.0


def _pick_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class LLM:
    def __init__(
        self,
        model: str | Path,
        *,
        weights: str = "auto",
        kv_cache_dtype: str = "auto",
        device: str | torch.device | None = None,
        weight_parts: str | tuple[str, ...] | None = None,
    ):
        """`weights`: 'auto' (as stored), 'bf16', 'fp8', 'int8' or 'int4'; a compressed format
        applies to `weight_parts` (default: routed and shared experts)."""
        self.path = Path(model)
        if not self.path.is_dir():
            raise ModelLoadError(f"{self.path}: not a model directory (expected config.json and safetensors)")
        check_format(weights)
        parts = parse_parts(weight_parts)
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ModelLoadError(
                f"kv_cache_dtype={kv_cache_dtype!r} is not supported; use one of {', '.join(KV_CACHE_DTYPES)}"
            )
        self.device = _pick_device(device)
        # bf16 is the serving dtype; the CPU runs float32 (its bf16 matmuls are slow and less exact).
        self.dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        self.weights = weights
        self.kv_cache_dtype = kv_cache_dtype
        self.config: ModelConfig
        self.config, self.raw_config = load_config(self.path)
        arch = architecture(self.config)
        tensors = load_tensors(
            self.path,
            arch.expected_tensors(self.config),
            self.dtype,
            self.device,
            keep_float32=arch.float32_tensors(self.config),
            ignore_prefixes=tuple(
                f"model.layers.{i}."
                for i in range(self.config.num_hidden_layers, self.config.num_hidden_layers + 8)
            ),  # multi-token-prediction layers, which serving does not use
        )
        tensors = apply_weight_format(tensors, weights, parts, self.dtype)
        self.weight_formats = formats_by_part(tensors)
        self.weights_label = weights_label(self.weight_formats)
        self.model = arch.CausalLM(self.config, tensors)
        self._tokenizer: TextTokenizer | None = None
        eos = set(self.config.eos_token_ids)
        if (self.path / "tokenizer.json").is_file():
            self._tokenizer = TextTokenizer(self.path)
            if self._tokenizer.eos_token_id is not None:
                eos.add(self._tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tokenizer is None:
            raise ModelLoadError(f"{self.path}: no tokenizer.json; only token-id APIs (logits) work")
        return self._tokenizer

    @property
    def context_window(self) -> int:
        return self.config.max_position_embeddings

    def _new_cache(self) -> SequenceKVCache:
        return SequenceKVCache(
            self.config.num_hidden_layers, self.model.cache_widths(), self.dtype, self.device
        )

    def _step(self, cache: SequenceKVCache, ids: list[int]) -> torch.Tensor:
        """Run `ids` through the model after what `cache` holds; hidden states of the new tokens."""
        past = cache.length
        t_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        positions = torch.arange(past, past + len(ids), device=self.device)
        hidden = self.model.forward(t_ids, positions, [SeqSlice(cache, 0, len(ids), past)])
        cache.length = past + len(ids)
        return hidden

    # --- public API -----------------------------------------------------------------------------

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt)

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raises InvalidRequestError naming the parameter; call before queueing any work."""
        params.validate()
        if not prompt_ids:
            raise InvalidRequestError("prompt", "must not be empty")
        if len(prompt_ids) >= self.context_window:
            raise InvalidRequestError(
                "prompt", f"is {len(prompt_ids)} tokens; the context window is {self.context_window} tokens"
            )
        if len(prompt_ids) + params.max_tokens > self.context_window:
            room = self.context_window - len(prompt_ids)
            raise InvalidRequestError(
                "max_tokens",
                f"{params.max_tokens} does not fit: the prompt takes {len(prompt_ids)} of the "
                f"{self.context_window}-token context window; ask for at most {room}",
            )

    @torch.inference_mode()
    def logits(self, token_ids: list[int]) -> torch.Tensor:
        """Next-token logits at every position, [len(token_ids), vocab] float32."""
        if not token_ids:
            raise InvalidRequestError("token_ids", "must not be empty")
        return self.model.logits(self._step(self._new_cache(), list(token_ids))).cpu()

    def stream(
        self, prompt_ids: list[int], params: SamplingParams, timing: StreamTiming | None = None
    ) -> Iterator[TokenEvent]:
        """Generate for one prompt, yielding a TokenEvent per token; the last one has finish_reason."""
        self.check_request(prompt_ids, params)
        timing = timing if timing is not None else StreamTiming()
        sampler = Sampler(params, self.device)
        detok = IncrementalDetokenizer(self.tokenizer) if self._tokenizer is not None else None
        cache = self._new_cache()
        next_ids = list(prompt_ids)
        for n in range(params.max_tokens):
            start = time.perf_counter()
            with torch.inference_mode():
                hidden = self._step(cache, next_ids)
                token = sampler(self.model.logits(hidden[-1:])[0])
            elapsed = (time.perf_counter() - start) * 1000
            if n == 0:
                timing.prefill_ms += elapsed
            else:
                timing.decode_ms += elapsed
            finish = None
            if token in self.eos_token_ids and not params.ignore_eos:
                finish = "stop"
            elif n + 1 == params.max_tokens:
                finish = "length"
            text = ""
            if detok is not None:
                text = detok.push(token) if finish != "stop" else ""
                if finish is not None:
                    text += detok.flush()
            yield TokenEvent(token, text, finish)
            if finish is not None:
                return
            next_ids = [token]

    def generate(self, prompts: str | list[str], params: SamplingParams | None = None) -> list[Generation]:
        params = params or SamplingParams()
        prompts = [prompts] if isinstance(prompts, str) else prompts
        encoded = [self.encode(p) for p in prompts]
        for ids in encoded:  # reject a bad request before doing any work
            self.check_request(ids, params)
        results = []
        for ids in encoded:
            timing = StreamTiming()
            tokens, text, finish = [], [], "length"
            for event in self.stream(ids, params, timing):
                if event.finish_reason != "stop":
                    tokens.append(event.token_id)
                text.append(event.text)
                finish = event.finish_reason or finish
            results.append(
                Generation(ids, tokens, "".join(text), finish, timing.prefill_ms, timing.decode_ms)
            )
        return results
