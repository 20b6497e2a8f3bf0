"""Speculative decoding's drafts and their settings: n-gram (prompt lookup) drafts, which need no
weights, and the settings of MTP drafts (the checkpoint's multi-token-prediction layer,
engine.models.mtp; the engine runs it, engine.engine).

A sequence's next tokens are guessed from its own context: the longest n-gram (up to `max_n`
tokens) that ends the sequence and also occurred earlier predicts that the tokens which followed it
then follow it now (vLLM's `ngram` method, llama.cpp's `llama-lookup`). Code, RAG answers and
edits repeat their context, so the guesses are often right; the engine verifies every draft
token with the model in the same forward pass as the real one, and keeps only what the model
itself would have produced, so the output is unchanged.

Each sequence keeps an index of its n-grams, extended as its tokens grow: a proposal costs O(new
tokens + max_n), never a scan of the context.
"""

from __future__ import annotations

import os

import msgspec

from engine.errors import ModelLoadError

SPECULATIVE_ENV = "EDGE_SPECULATIVE"


METHODS = ("ngram", "mtp")


class SpeculativeConfig(msgspec.Struct, frozen=True):
    """`method`: "ngram" (drafts from the sequence's own tokens) or "mtp" (the checkpoint's MTP
    layer drafts, chained when num_tokens > 1). `num_tokens`: draft tokens proposed per step at
    most; n-grams of `min_n` to `max_n` tokens are looked up (longest first); only batches of at
    most `max_decoders` decoding sequences speculate (a verify costs little more than a decode step
    only while the step is overhead-bound)."""

    num_tokens: int = 5
    method: str = "ngram"
    min_n: int = 2
    max_n: int = 4
    max_decoders: int = 4
    # back-off: a sequence whose last `backoff_window` drafts kept under `backoff_below` of their
    # tokens stops drafting for `backoff_steps` decode steps (a rejected draft costs verify rows)
    backoff_window: int = 4
    backoff_below: float = 0.2
    backoff_steps: int = 16

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            known = ", ".join(METHODS)
            raise ModelLoadError(f"speculative method must be one of {known}, got {self.method!r}")
        if not 1 <= self.num_tokens <= 14:
            raise ModelLoadError(
                f"speculative num_tokens must be 1-14 (a KV block's room), got {self.num_tokens}"
            )
        if not 1 <= self.min_n <= self.max_n <= 8:
            raise ModelLoadError(
                f"speculative n-grams need 1 <= min_n <= max_n <= 8, got {self.min_n}-{self.max_n}"
            )


# draft tokens per step when the setting names none: an MTP layer is trained for the next token
# but one (chained drafts decay), n-gram drafts cost nothing to propose
DEFAULT_TOKENS = {"ngram": 5, "mtp": 1}


def speculative_from_env() -> SpeculativeConfig | None:
    """$EDGE_SPECULATIVE: "ngram" (n-gram drafts with the defaults), "ngram:K" (K draft tokens per
    step), "mtp" / "mtp:K" (the checkpoint's MTP layer drafts K tokens, default 1) or "off" (the
    default)."""
    return parse_speculative(os.environ.get(SPECULATIVE_ENV, "off"), f"${SPECULATIVE_ENV}")


def parse_speculative(value: str, where: str = "speculative") -> SpeculativeConfig | None:
    """'off', 'ngram', 'ngram:K', 'mtp' or 'mtp:K' (as $EDGE_SPECULATIVE and a catalog entry's
    setting say it)."""
    value = value.strip().lower()
    if value in ("", "off", "0", "none"):
        return None
    method, _, k = value.partition(":")
    if method not in METHODS or (k and not k.isdigit()):
        raise ModelLoadError(f"{where} must be 'off', 'ngram', 'ngram:K', 'mtp' or 'mtp:K', got {value!r}")
    return SpeculativeConfig(num_tokens=int(k) if k else DEFAULT_TOKENS[method], method=method)


class AcceptanceBackoff:
    """One sequence's recent acceptance: after `backoff_window` drafts that kept fewer than
    `backoff_below` of their tokens, its drafts pause for `backoff_steps` decode steps, then it
    tries again with a fresh window (its text may have come back to something that repeats)."""

    __slots__ = ("config", "_recent", "_pause")

    def __init__(self, config: SpeculativeConfig):
        self.config = config
        self._recent: list[tuple[int, int]] = []  # (drafted, accepted) of its latest drafts
        self._pause = 0

    def paused(self) -> bool:
        """Whether this decode step goes without a draft (counting the paused step)."""
        if self._pause > 0:
            self._pause -= 1
            return True
        return False

    def record(self, drafted: int, accepted: int) -> None:
        c = self.config
        self._recent.append((drafted, accepted))
        if len(self._recent) < c.backoff_window:
            return
        del self._recent[: -c.backoff_window]
        total = sum(d for d, _ in self._recent)
        if sum(a for _, a in self._recent) < c.backoff_below * total:
            self._pause, self._recent = c.backoff_steps, []


class NgramDrafter:
    """The n-gram index of one sequence's tokens, and the drafts it proposes."""

    __slots__ = ("config", "_last_end", "_indexed")

    def __init__(self, config: SpeculativeConfig):
        self.config = config
        # n -> n-gram -> the latest index where it ended, before the sequence's last token
        self._last_end: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(config.min_n, config.max_n + 1)
        }
        self._indexed = 0  # n-grams ending before this index are in the index

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """Up to `limit` (and num_tokens) tokens guessed to follow `tokens`; [] when no n-gram that
        ends `tokens` occurred before."""
        limit = min(limit, self.config.num_tokens)
        end = len(tokens) - 1  # the last token: n-grams ending here are the query, not yet indexed
        if limit <= 0 or end < self.config.min_n:
            return []
        for e in range(self._indexed, end):
            for n, seen in self._last_end.items():
                if e + 1 >= n:
                    seen[tuple(tokens[e + 1 - n : e + 1])] = e
        self._indexed = max(self._indexed, end)
        for n in range(self.config.max_n, self.config.min_n - 1, -1):
            if end + 1 < n:
                continue
            found = self._last_end[n].get(tuple(tokens[end + 1 - n :]))
            if found is not None:
                return tokens[found + 1 : found + 1 + limit]
        return []


class MTPDraft:
    """One sequence's latest MTP draft (engine.step.mtp_drafts makes it), made when its tokens
    numbered `made_for`."""

    __slots__ = ("made_for", "tokens")

    def __init__(self) -> None:
        self.made_for = -1
        self.tokens: list[int] = []

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """The draft, if it was made for exactly these tokens (else [])."""
        return self.tokens[:limit] if self.made_for == len(tokens) else []


def accepted_prefix(draft: list[int], predicted: list[int]) -> int:
    """How many draft tokens the model agrees with: predicted[i] is the model's own token after the
    real token and draft[:i] (len(predicted) == len(draft) + 1)."""
    n = 0
    while n < len(draft) and predicted[n] == draft[n]:
        n += 1
    return n
