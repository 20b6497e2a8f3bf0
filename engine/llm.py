"""The engine's Python API: `LLM(path).generate(prompts, SamplingParams(...))`, `LLM.logits(ids)`.

`LLM.engine` is the continuously batched LLMEngine the PoP node drives from its own thread
(engine.serving.EngineLoop); `stream()` drives it in the caller's thread for one request.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import msgspec
import torch

from engine.arch.config import ModelConfig, load_config
from engine.engine import EngineStats, LLMEngine, StepStats, default_kv_budget
from engine.errors import EngineError, InvalidRequestError, ModelLoadError, RequestTooLargeError
from engine.kv.batch import SeqSlice, StepBatch
from engine.kv.kv_cache import BLOCK_SIZE, KV_CACHE_DTYPES, PagedKVCache
from engine.load.verified_load import load_verified
from engine.load.weight_parts import (
    apply_weight_format,
    check_format,
    dense_path,
    formats_by_part,
    is_bf16_matrix,
    parse_parts,
    weights_label,
)
from engine.load.weights import Checkpoint, load_tensors
from engine.models import causal_lm, expected_tensors, float32_tensors
from engine.models.mtp import mtp_layers, mtp_prefix
from engine.outputs import Logprobs, RequestMetrics, SeqEvent
from engine.sampling import SamplingParams
from engine.sched.policy import SchedulerConfig
from engine.sched.policy_types import preemption_from_env
from engine.speculation import SpeculativeConfig, parse_speculative, speculative_from_env
from engine.step.compiled_step import compile_from_env
from engine.tokenizer import TextTokenizer
from kernels import dispatch


class Generation(msgspec.Struct):
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    prefill_ms: float
    decode_ms: float
    metrics: RequestMetrics | None = None
    index: int = 0  # which of the request's n choices
    logprobs: list[Logprobs] | None = None  # per token, when SamplingParams.logprobs asked for them

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


def _pick_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


SCHEDULING_ENV = "EDGE_SCHEDULING"
# a text this many characters per token of the window long is tokenized in part first: the work a
# prompt far over the window costs before it is refused is bounded by the window, not the prompt
PROBE_CHARS_PER_TOKEN = 8


def scheduling_fair_share() -> bool:
    """$EDGE_SCHEDULING: "fair" (the default: fair shares between tenants) or "fcfs" (arrival order,
    the baseline bench/fairness.py measures against)."""
    value = os.environ.get(SCHEDULING_ENV, "fair").strip().lower()
    if value not in ("fair", "fcfs"):
        raise ModelLoadError(f"${SCHEDULING_ENV} must be 'fair' or 'fcfs', got {value!r}")
    return value == "fair"


class LLM:
    def __init__(
        self,
        model: str | Path,
        *,
        weights: str = "auto",
        kv_cache_dtype: str = "auto",
        device: str | torch.device | None = None,
        weight_parts: str | tuple[str, ...] | None = None,
        kv_cache_bytes: int | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 512,
        trusted_keys: list[str | Path] | None = None,
        allow_unsigned: bool = False,
        fair_share: bool | None = None,
        preemption: str | None = None,
        prefix_caching: bool = True,
        speculative: SpeculativeConfig | None | str = "env",
        compile: bool | str = "env",
    ):
        """`weights`: 'auto' (as stored), 'bf16', 'fp8', 'int8' or 'int4'; a compressed format
        applies to `weight_parts` (default: routed and shared experts). `kv_cache_dtype`: 'auto'
        (the model dtype), 'bf16', 'fp8', 'int8' or 'int4'; `kv_cache_bytes` is the KV budget.

        The model's signed manifest is verified while its files are read, against `trusted_keys`
        (default: $EDGE_TRUSTED_KEYS, else the project's models/keys/*.pub); an unsigned model
        loads only with `allow_unsigned=True`, with a warning. `fair_share`: tenants share the
        engine by virtual token counters (default: $EDGE_SCHEDULING, else fair). `preemption`: how a
        sequence preempted for another tenant's seat gives it up, "pause" (its KV blocks kept while
        it waits) or "recompute" (default: $EDGE_PREEMPTION, else engine.sched.policy_types's default).

        `prefix_caching`: full KV blocks of a tenant's earlier requests are reused by its later ones
        that start with the same tokens (salted per tenant; see engine.kv.prefix_hash).

        `speculative`: drafts verified in the decode step (engine.speculation), a
        SpeculativeConfig, None (one token a step), "env" ($EDGE_SPECULATIVE, off by default) or
        that variable's syntax ('off', 'ngram', 'ngram:K', 'mtp', 'mtp:K'), as a catalog entry sets
        it. 'mtp' loads the checkpoint's MTP layer (and caches its keys and values as one more
        layer); a checkpoint without one is refused.

        `compile`: decode steps as a compiled graph per batch bucket (engine.step.compiled_step), True,
        False or "env" ($EDGE_COMPILE; unset: on a CPU). Buckets compile on first use of
        `engine.compiled_decode.warm_up()`; until then steps run eagerly."""
        self.path = Path(model)
        if not self.path.is_dir():
            raise ModelLoadError(f"{self.path}: not a model directory (expected config.json and safetensors)")
        check_format(weights)
        parts = parse_parts(weight_parts)
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ModelLoadError(
                f"kv_cache_dtype={kv_cache_dtype!r} is unknown; use one of {', '.join(KV_CACHE_DTYPES)}"
            )
        self.device = _pick_device(device)
        # bf16 is the serving dtype; the CPU computes in float32 (torch's bf16 matmuls are slow and less
        # exact there), its bf16 matrices kept bf16 where the native ops read them (half the bytes a
        # token reads), or widened to float32 at load ($EDGE_CPU_BF16=f32, or no build)
        self.dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        try:
            self.bf16_kept = dispatch.keeps_bf16(self.device)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        self.weights = weights
        self.kv_cache_dtype = kv_cache_dtype
        self.config: ModelConfig
        # files are proven before any of them (config.json included) is parsed
        self.verification, checkpoint = load_verified(self.path, trusted_keys, allow_unsigned)
        self.config, self.raw_config = load_config(self.path)
        spec_config = (
            speculative_from_env()
            if speculative == "env"
            else parse_speculative(speculative)
            if isinstance(speculative, str)
            else speculative
        )
        with_mtp = spec_config is not None and spec_config.method == "mtp"
        if with_mtp:
            self._check_mtp(checkpoint)
        first_unused = self.config.num_hidden_layers + with_mtp
        tensors = load_tensors(
            self.path,
            expected_tensors(self.config, with_mtp),
            self.dtype,
            self.device,
            keep_float32=float32_tensors(self.config, with_mtp),
            ignore_prefixes=tuple(
                f"model.layers.{i}." for i in range(first_unused, self.config.num_hidden_layers + 8)
            ),  # multi-token-prediction layers this engine does not run
            checkpoint=checkpoint,
            keep_bf16=self.device.type == "cpu",  # widened below unless kept
        )
        stored_bf16 = any(is_bf16_matrix(t) for t in tensors.values())
        if not self.bf16_kept:
            tensors = {n: t.to(self.dtype) if is_bf16_matrix(t) else t for n, t in tensors.items()}
        tensors = apply_weight_format(tensors, weights, parts, self.dtype)
        self.weight_formats = formats_by_part(tensors)
        self.weights_label = weights_label(self.weight_formats)
        self.dense_path = dense_path(tensors, self.dtype, stored_bf16)
        self.model = causal_lm(self.config, tensors, with_mtp, self.dtype)
        self._tokenizer: TextTokenizer | None = None
        eos = set(self.config.eos_token_ids)
        if (self.path / "tokenizer.json").is_file():
            self._tokenizer = TextTokenizer(self.path)
            if self._tokenizer.eos_token_id is not None:
                eos.add(self._tokenizer.eos_token_id)
        eos_ids = frozenset(eos)

        try:
            scheduler = SchedulerConfig(
                max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs,
                fair_share=scheduling_fair_share() if fair_share is None else fair_share,
                preemption=preemption_from_env() if preemption is None else preemption,
            )
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        probe = self._new_cache(budget=None)
        budget = kv_cache_bytes or default_kv_budget(
            self.device, probe.bytes_per_token(), self.context_window
        )
        self.engine = LLMEngine(
            self.model,
            # a staging slot for every sequence that may hold blocks (paused ones too)
            self._new_cache(budget, scheduler.kv_slots),
            self._tokenizer,
            eos_ids,
            self.context_window,
            self.config.vocab_size,
            scheduler,
            prefix_caching=prefix_caching,
            speculative=spec_config,
            compiled=compile_from_env(self.device) if compile == "env" else bool(compile),
        )

    def _check_mtp(self, checkpoint: Checkpoint | None) -> None:
        """Speculative method 'mtp' needs the checkpoint's multi-token-prediction layer."""
        declared = mtp_layers(self.config)
        names = (checkpoint or Checkpoint(self.path)).where
        why = None
        if declared < 1:
            why = "its config.json has num_nextn_predict_layers = 0"
        elif f"{mtp_prefix(self.config)}.eh_proj.weight" not in names:
            why = f"config.json declares {declared}, but it holds no {mtp_prefix(self.config)}.* tensors"
        if why is not None:
            raise ModelLoadError(
                f"{self.path}: speculative method 'mtp' needs the checkpoint's multi-token-prediction "
                f"layer, and {why}; use 'ngram' or 'off'"
            )

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tokenizer is None:
            raise ModelLoadError(f"{self.path}: no tokenizer.json; only token-id APIs (logits) work")
        return self._tokenizer

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.engine.eos_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: frozenset[int]) -> None:
        self.engine.eos_ids = frozenset(ids)

    @property
    def context_window(self) -> int:
        return self.config.max_position_embeddings

    def _new_cache(self, budget: int | None, max_seqs: int = 4, tokens: int | None = None) -> PagedKVCache:
        """A paged cache in this LLM's KV dtype; budget None sizes it for `tokens` (default: a full
        context) per sequence."""
        components = self.model.kv_components()
        if budget is None:
            block, staging = PagedKVCache.layout_bytes(
                components, self.model.cached_layers, self.kv_cache_dtype, self.dtype
            )
            blocks = -(-(tokens or self.context_window) // BLOCK_SIZE) + -(-staging // block) + 1
            budget = blocks * block * max_seqs
        return PagedKVCache(
            components,
            self.model.cached_layers,
            self.kv_cache_dtype,
            budget,
            self.dtype,
            self.device,
            max_seqs=max_seqs,
        )

    # --- public API -----------------------------------------------------------------------------

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt)

    def encode_prompt(self, prompt: str) -> list[int]:
        """A request's prompt tokens; a text too long to fit the window in any tokenization is
        refused before it is tokenized whole (a megabyte prompt would hold the caller for a second)."""
        self.check_prompt_chars(len(prompt))
        window = self.context_window
        probe = PROBE_CHARS_PER_TOKEN * window
        if len(prompt) > probe:  # long text: its first part alone may already be over the window
            head = len(self.tokenizer.encode(prompt[:probe]))
            if head > window + 1:  # (a word cut in two is at most one token more)
                why = f"its first {probe} characters alone are {head} tokens; the context window is {window}"
                raise RequestTooLargeError("prompt", why)
        return self.tokenizer.encode(prompt)

    def check_prompt_chars(self, chars: int) -> None:
        # twice the bound, for normalizers that fold characters together
        limit = 2 * self.context_window * self.tokenizer.max_token_chars
        if chars > limit:
            raise RequestTooLargeError(
                "prompt",
                f"{chars} characters cannot fit the {self.context_window}-token context window "
                f"(at most {limit} characters); shorten the prompt",
            )

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raises InvalidRequestError naming the parameter; call before queueing any work."""
        self.engine.check_request(prompt_ids, params)

    def stats(self) -> EngineStats:
        """Queue and KV cache occupancy now; read from another thread than the one stepping, the
        counts are each current but may straddle a step."""
        return self.engine.stats()

    def recent_steps(self, n: int) -> list[StepStats]:
        return self.engine.recent_steps(n)

    def expert_load(self) -> list[list[int]]:
        return self.engine.expert_load()

    @torch.inference_mode()
    def logits(self, token_ids: list[int], chunk: int = 512) -> torch.Tensor:
        """Next-token logits at every position, [len(token_ids), vocab] float32.

        Runs through a private paged cache in this LLM's KV dtype, in chunks, reading keys and
        values back from the cache: exactly what decoding would see, so quantization costs show.
        """
        if not token_ids:
            raise InvalidRequestError("token_ids", "must not be empty")
        if len(token_ids) > self.context_window:
            raise InvalidRequestError(
                "token_ids", f"{len(token_ids)} exceed the {self.context_window}-token window"
            )
        cache = self._new_cache(budget=None, max_seqs=1, tokens=len(token_ids))
        seq = cache.pool.new_sequence()
        cache.pool.grow(seq, len(token_ids))
        out = []
        for start in range(0, len(token_ids), chunk):
            ids = token_ids[start : start + chunk]
            hidden = self.model.forward(
                torch.tensor(ids, dtype=torch.long, device=self.device),
                torch.arange(start, start + len(ids), device=self.device),
                StepBatch([SeqSlice(seq, 0, len(ids), start)], self.device, cache.layers),
            )
            seq.length = start + len(ids)
            out.append(self.model.logits(hidden).cpu())
        return torch.cat(out)

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[SeqEvent]:
        """Generate for one prompt on this engine, yielding an event per token; with n > 1 the
        events of all n sequences interleave (event.index says whose), and each index's last event
        is final. Ends after the last of them.

        Drives the engine in the caller's thread; for concurrent serving use engine.serving.EngineLoop.
        """
        request_id = self.engine.add_request(prompt_ids, params)
        left = params.n
        while True:
            for event in self.engine.step():
                if event.request_id == request_id:
                    yield event
                    left -= event.finish_reason is not None
                    if not left:
                        return

    def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None) -> Generation:
        """Generate the assistant's reply to `messages`, rendered with the model's chat template."""
        return self.generate(self.tokenizer.apply_chat_template(messages), params)[0]

    def generate(self, prompts: str | list[str], params: SamplingParams | None = None) -> list[Generation]:
        """Generate for every prompt at once (continuously batched); results in prompt order. For
        n > 1 (several choices per prompt) use generate_choices."""
        params = params or SamplingParams()
        if params.n > 1:
            raise InvalidRequestError(
                "n", f"generate returns one choice per prompt; use generate_choices for n={params.n}"
            )
        return [choices[0] for choices in self.generate_choices(prompts, params)]

    def generate_choices(
        self, prompts: str | list[str], params: SamplingParams | None = None
    ) -> list[list[Generation]]:
        """Per prompt, its params.n choices in index order (the prompt computed once for all n)."""
        params = params or SamplingParams()
        prompts = [prompts] if isinstance(prompts, str) else prompts
        encoded = [self.encode(p) for p in prompts]
        for ids in encoded:  # reject a bad request before doing any work
            self.check_request(ids, params)
        order = [self.engine.add_request(ids, params) for ids in encoded]
        keys = [(rid, index) for rid in order for index in range(params.n)]
        tokens: dict[tuple[str, int], list[int]] = {key: [] for key in keys}
        text: dict[tuple[str, int], list[str]] = {key: [] for key in keys}
        logprobs: dict[tuple[str, int], list[Logprobs]] = {key: [] for key in keys}
        done: dict[tuple[str, int], SeqEvent] = {}
        while len(done) < len(keys):
            for event in self.engine.step():
                key = (event.request_id, event.index)
                if event.token_id is not None and not (
                    event.finish_reason == "stop" and event.token_id in self.eos_token_ids
                ):
                    tokens[key].append(event.token_id)
                    if event.logprobs is not None:
                        logprobs[key].append(event.logprobs)
                text[key].append(event.text)
                if event.finish_reason is not None:
                    done[key] = event
        results = []
        for rid, ids in zip(order, encoded, strict=True):
            choices = []
            for index in range(params.n):
                end = done[rid, index]
                if end.finish_reason == "error":
                    raise EngineError(f"request {rid}: {end.error}")
                m = end.metrics
                choices.append(
                    Generation(
                        ids,
                        tokens[rid, index],
                        "".join(text[rid, index]),
                        end.finish_reason,
                        m.prefill_ms,
                        m.decode_ms,
                        m,
                        index=index,
                        logprobs=logprobs[rid, index] if params.logprobs is not None else None,
                    )
                )
            results.append(choices)
        return results
