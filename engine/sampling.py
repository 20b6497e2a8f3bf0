"""Sampling parameters (validated before any work is queued) and the per-sequence sampler.

Order of operations, as in vLLM: repetition penalty (prompt and output tokens), frequency and
presence penalties (output tokens), temperature, then top-k, top-p and min-p filtering.

Every parameter is bounded to a finite, published range (Workers AI's schema for the Kimi and GLM
entries; OpenAI's limits on stop sequences), because a batch is shared by every tenant: a value
that turns one row's probabilities into NaN must be refused where it enters, and whatever still
goes wrong inside the sampler ends that one sequence (SamplingError), never the batch.
"""

from __future__ import annotations

import math

import msgspec
import torch

from engine.errors import InvalidRequestError
from engine.structured.guide import Guide

MAX_STOP_STRINGS = 4  # as OpenAI
MAX_STOP_CHARS = 256  # per stop string: matching a new token costs O(this), not O(output)
MAX_STOP_TOKEN_IDS = 64
MAX_TEMPERATURE = 5.0  # Workers AI's range is 0-5
# Below this a positive temperature samples as greedy does (vLLM's epsilon): dividing logits by
# 1e-320 overflows them to inf, and the softmax of that row is NaN.
GREEDY_BELOW_TEMPERATURE = 1e-5
REPETITION_PENALTY_RANGE = (0.01, 2.0)  # Workers AI's range is 0-2; 0 would divide by zero
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes (OpenAI: int64)
MAX_LOGPROBS = 20  # OpenAI's top_logprobs range is 0-20
PRIORITY_RANGE = (-(2**31), 2**31 - 1)  # a request's priority within its account (vLLM: an int)
MAX_N = 8  # choices per request (each is a sequence of its own after the shared prompt)
MAX_LOGIT_BIAS = 300  # entries, as OpenAI documents
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # OpenAI's: -100 bans a token, 100 all but forces it


class SamplingError(RuntimeError):
    """Sampling one sequence failed (its probabilities were not a distribution); the engine ends
    that sequence with an error and the rest of the batch goes on."""


class SamplingParams(msgspec.Struct, kw_only=True):
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = no limit
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = msgspec.field(default_factory=list)  # never part of the returned text
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    guide: Guide | None = None  # a grammar the output must follow (engine.structured.guide)
    logprobs: int | None = None  # None: none; k: each token's log-probability and the k likeliest
    n: int = 1  # sequences sampled from the one prompt (its KV computed once)
    # token id -> what is added to its logit before sampling (OpenAI's logit_bias); the row's own
    logit_bias: dict[int, float] = msgspec.field(default_factory=dict)
    # within its account: lower is scheduled first (vLLM's convention); never above the account's share
    priority: int = 0
    # False: never drafted for, even where the engine speculates (the output is the same either way)
    speculative: bool = True

    def validate(self) -> None:
        def bad(param: str, message: str) -> InvalidRequestError:
            return InvalidRequestError(param, message)

        if self.max_tokens < 1:
            raise bad("max_tokens", f"must be at least 1, got {self.max_tokens}")
        if not 0 <= self.temperature <= MAX_TEMPERATURE:  # NaN fails both comparisons
            top = MAX_TEMPERATURE
            raise bad("temperature", f"must be in [0, {top:g}] (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise bad("top_k", f"must be >= 0 (0 means no limit), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise bad("min_p", f"must be in [0, 1], got {self.min_p}")
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:
            got = self.repetition_penalty
            raise bad("repetition_penalty", f"must be in [{low:g}, {high:g}] (1 is none), got {got}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                raise bad(name, f"must be in [-2, 2], got {value}")
        if len(self.stop) > MAX_STOP_STRINGS or any(not s or len(s) > MAX_STOP_CHARS for s in self.stop):
            raise bad(
                "stop",
                f"give at most {MAX_STOP_STRINGS} non-empty strings of at most {MAX_STOP_CHARS} characters "
                f"each (got {len(self.stop)}, longest {max(map(len, self.stop), default=0)})",
            )
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise bad("stop_token_ids", f"give at most {MAX_STOP_TOKEN_IDS}, got {len(self.stop_token_ids)}")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise bad("seed", f"must be a 64-bit integer, in [-2**63, 2**64 - 1], got {self.seed}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise bad("top_logprobs", f"must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if not 1 <= self.n <= MAX_N:
            raise bad("n", f"must be in [1, {MAX_N}], got {self.n}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise bad("logit_bias", f"give at most {MAX_LOGIT_BIAS} tokens, got {len(self.logit_bias)}")
        low, high = LOGIT_BIAS_RANGE
        for token, bias in self.logit_bias.items():
            if token < 0:
                raise bad("logit_bias", f"token ids are >= 0, got {token}")
            if not low <= bias <= high:  # NaN fails both comparisons
                raise bad("logit_bias", f"biases are in [{low:g}, {high:g}], got {bias} for token {token}")
        if not PRIORITY_RANGE[0] <= self.priority <= PRIORITY_RANGE[1]:
            low, high = PRIORITY_RANGE
            raise bad(
                "priority",
                f"must be an integer in [{low}, {high}] (lower is served first), got {self.priority}",
            )
        if self.guide is not None:
            self.guide.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    def check_vocab(self, vocab: int) -> None:
        """Token ids the request names must be the model's."""
        if self.logit_bias and (top := max(self.logit_bias)) >= vocab:
            raise InvalidRequestError(
                "logit_bias", f"token {top} is not in this model's vocabulary of {vocab} tokens"
            )

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0


def apply_logit_bias(logits: torch.Tensor, biases: list[dict[int, float]]) -> None:
    """Add each row's logit bias to its row of `logits` [rows, vocab], in place, in one scatter:
    the greedy argmax, the grammar masks and the sampler all see the biased logits. A row with no
    bias is untouched, so one request's bias never reaches another's row."""
    rows: list[int] = []
    ids: list[int] = []
    values: list[float] = []
    for row, bias in enumerate(biases):
        if bias:
            rows += [row] * len(bias)
            ids += bias.keys()
            values += bias.values()
    if rows:
        at = (torch.tensor(rows, device=logits.device), torch.tensor(ids, device=logits.device))
        logits.index_put_(at, torch.tensor(values, dtype=logits.dtype, device=logits.device), accumulate=True)


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice `index` of a seeded request with n > 1 samples with seed s + index (wrapped into the
    seed range), so a seeded n is reproducible and each choice differs."""
    if seed is None:
        return None
    low, high = SEED_RANGE
    return (seed + index - low) % (high - low + 1) + low


class Sampler:
    """Picks the next token of one sequence; a request with a seed gets its own generator."""

    def __init__(self, params: SamplingParams, vocab: int, prompt_ids: list[int], device: torch.device):
        self.params = params
        self._gen: torch.Generator | None = None
        if not params.greedy:
            self._gen = torch.Generator(device=device)
            if params.seed is not None:
                self._gen.manual_seed(params.seed)
            else:
                self._gen.seed()
        self._counts: torch.Tensor | None = None
        self._seen: torch.Tensor | None = None
        if params.penalised:
            self._counts = torch.zeros(vocab, dtype=torch.float32, device=device)
            self._seen = torch.zeros(vocab, dtype=torch.bool, device=device)
            ids = torch.tensor([i for i in prompt_ids if 0 <= i < vocab], dtype=torch.long, device=device)
            self._seen[ids] = True

    def observe(self, token: int) -> None:
        """Record a generated token (for the penalties)."""
        if self._counts is not None and 0 <= token < self._counts.numel():
            self._counts[token] += 1
            self._seen[token] = True

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: [vocab] float32."""
        p = self.params
        if self._counts is not None:
            logits = logits.clone()
            if p.repetition_penalty != 1:
                seen = logits[self._seen]
                logits[self._seen] = torch.where(
                    seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty
                )
            logits -= p.frequency_penalty * self._counts + p.presence_penalty * (self._counts > 0).float()
        if p.greedy:
            return int(logits.argmax())
        logits = logits / p.temperature
        if p.top_k and p.top_k < logits.numel():
            kth = logits.topk(p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.min_p > 0:
            probs = probs.masked_fill(probs < p.min_p * probs.max(), 0)
        if p.top_p < 1:
            sorted_probs, order = probs.sort(descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop = sorted_probs.cumsum(0) - sorted_probs >= p.top_p * sorted_probs.sum()
            sorted_probs[drop] = 0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        total = float(probs.sum())
        if not (total > 0 and math.isfinite(total)):  # a NaN or inf anywhere shows in the sum
            raise SamplingError("the sampling probabilities are not finite for this request")
        return int(torch.multinomial(probs, 1, generator=self._gen))

    def verify(self, rows: torch.Tensor, draft: list[int]) -> list[int]:
        """Speculative rejection sampling of a point-mass draft: row i [rows, vocab] holds the logits
        after the context and draft[:i]; returns the accepted draft tokens, then one token of the
        model's own (the correction at the first rejection, or the bonus after the last row).

        Row i's token y is picked exactly as one decoding step picks it (penalties counting the
        draft tokens before it, temperature, top-k, min-p, top-p, the sequence's generator), and
        draft[i] is kept iff y == draft[i]. For a draft q that is a point mass on x this is the
        standard rule: x is accepted with probability p(x) = min(1, p(x)/q(x)), and a rejection's
        y is distributed as p with x removed and renormalised (max(0, p - q), normalised). The
        generator draws once per emitted token in the same order as without speculation, so a
        seeded request gives the tokens it gives without it. Rows past `rows` (non-finite ones
        the caller cut) end the step after the drafts they would have judged; a SamplingError on
        a later row does too (the next step meets that row again, alone)."""
        saved = (self._counts.clone(), self._seen.clone()) if self._counts is not None else None
        out: list[int] = []
        try:
            for i in range(min(len(rows), len(draft) + 1)):
                try:
                    token = self(rows[i])
                except SamplingError:
                    if i == 0:
                        raise
                    break
                out.append(token)
                if i == len(draft) or token != draft[i]:
                    break
                self.observe(token)  # the next row's penalties count it, as its context does
        finally:
            if saved is not None:  # the tokens are observed again as they are emitted
                self._counts, self._seen = saved
        return out
