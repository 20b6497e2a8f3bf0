"""What the engine emits for a request: one event per step (a token and its text delta, or the end),
the token's logprobs when asked for, and the request's metrics on its last event. The types every
room above reads (the edge, the structured answer's choices, the runtime's shapes), kept apart from
the Sequence that makes them so that reading them imports nothing of the step."""

from __future__ import annotations

import msgspec


class RequestMetrics(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    queue_ms: float  # arrival -> first scheduled
    prefill_ms: float  # first scheduled -> first token
    decode_ms: float  # first token -> finished
    ttft_ms: float  # arrival -> first token
    tpot_ms: float  # mean time per output token after the first
    finish_reason: str | None
    preemptions: int
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission (not run again)
    draft_tokens: int = 0  # speculative draft tokens verified for it
    accepted_tokens: int = 0  # of those, kept (each one a token that took no step of its own)


class TokenLogprob(msgspec.Struct, array_like=True):
    """One token as OpenAI's logprobs show it: its text, log-probability and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int]


class Logprobs(msgspec.Struct):
    """The sampled token's log-probability and the `k` likeliest tokens at that step (k of
    SamplingParams.logprobs), from the model's distribution before any penalty or filter."""

    chosen: TokenLogprob
    top: list[TokenLogprob]


class SeqEvent(msgspec.Struct):
    """What a step produced for one request: a token and its text delta, or the end. A request
    with n > 1 has n sequences; `index` says which one (each ends with its own last event)."""

    request_id: str
    token_id: int | None
    text: str
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None
    metrics: RequestMetrics | None = None  # on the last event
    index: int = 0  # which of the request's n sequences
    logprobs: Logprobs | None = None  # when asked for (SamplingParams.logprobs)
