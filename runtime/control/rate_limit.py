"""Requests and tokens per minute per (account, model), as Workers AI limits them: a sliding-window
log of the last minute, kept per key. Pure: the clock is injected (tests advance it by hand).

A request is admitted when, over the last WINDOW_S seconds, the key has made fewer than `rpm`
admitted requests and used fewer than `tpm` tokens (prompt + completion, counted when a result's
usage is known, so requests already running may carry the total past `tpm`; the next one waits).
A refused request is not counted: a client that retries after `retry_after` gets through.
One key's window never touches another's, so one account over its limit slows no other.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from workers import AIError

WINDOW_S = 60.0
DEFAULT_RPM = 300  # Workers AI: 300 text-generation requests per minute (per model), an account's default
ACCOUNT_LIMITED = 3036  # Workers AI's "Account limited"

Limit = Literal["rpm", "tpm"]
_WHAT = {"rpm": "requests per minute", "tpm": "tokens per minute"}


@dataclass(frozen=True)
class Limits:
    rpm: int | None = None  # None: no limit
    tpm: int | None = None


class PerMinute(Protocol):
    """What the limiter reads of a key's limits: Limits, or an account's settings themselves
    (runtime.control.accounts.AccountSettings, which a call has read once already)."""

    @property
    def rpm(self) -> int | None: ...

    @property
    def tpm(self) -> int | None: ...


@dataclass(frozen=True)
class Refusal:
    limit: Limit
    allowed: int  # the limit
    used: int  # requests or tokens in the window now
    retry_after: int  # whole seconds (>= 1) until a request would be admitted

    def message(self, account: str, model: str) -> str:
        return (
            f"Account limited: account {account!r} has used {self.used} of its {self.allowed} "
            f"{_WHAT[self.limit]} for model {model!r}; retry in {self.retry_after} s, or raise the "
            f"limit (edge accounts update {account} --{self.limit} N)"
        )


class AccountLimited(AIError):
    """An AI call refused by its account's rate limit: code 3036, with the seconds to wait."""

    def __init__(self, refusal: Refusal, account: str, model: str):
        super().__init__(ACCOUNT_LIMITED, refusal.message(account, model))
        self.refusal = refusal
        self.retry_after = refusal.retry_after


class _Window:
    __slots__ = ("requests", "tokens", "token_sum")

    def __init__(self) -> None:
        self.requests: deque[float] = deque()  # when each admitted request started
        self.tokens: deque[tuple[float, int]] = deque()  # (when its usage was known, tokens)
        self.token_sum = 0


def _seconds(until: float) -> int:
    return max(1, math.ceil(until))


class RateLimiter:
    """Sliding windows per (account, model). Not thread-safe: the runtime's event loop calls it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S):
        self.clock, self.window_s = clock, window_s
        self._windows: dict[tuple[str, str], _Window] = {}

    def _window(self, account: str, model: str, now: float) -> _Window:
        w = self._windows.get((account, model))
        if w is None:
            w = self._windows[(account, model)] = _Window()
        start = now - self.window_s
        while w.requests and w.requests[0] <= start:
            w.requests.popleft()
        while w.tokens and w.tokens[0][0] <= start:
            w.token_sum -= w.tokens.popleft()[1]
        return w

    def admit(self, account: str, model: str, limits: PerMinute) -> Refusal | None:
        """None (and the request counted) if the key is under its limits now, else why not."""
        now = self.clock()
        w = self._window(account, model, now)
        if limits.rpm is not None and len(w.requests) >= limits.rpm:
            # admitted again once all but rpm - 1 of the window's requests have left it
            frees_at = w.requests[len(w.requests) - limits.rpm] + self.window_s
            return Refusal("rpm", limits.rpm, len(w.requests), _seconds(frees_at - now))
        if limits.tpm is not None and w.token_sum >= limits.tpm:
            left, frees_at = w.token_sum, now + self.window_s
            for at, tokens in w.tokens:  # oldest first: when enough have left to be under tpm
                left -= tokens
                if left < limits.tpm:
                    frees_at = at + self.window_s
                    break
            return Refusal("tpm", limits.tpm, w.token_sum, _seconds(frees_at - now))
        w.requests.append(now)
        return None

    def count_tokens(self, account: str, model: str, tokens: int) -> None:
        """A result's usage (prompt + completion tokens), counted against the key's tpm."""
        if tokens <= 0:
            return
        now = self.clock()
        w = self._window(account, model, now)
        w.tokens.append((now, tokens))
        w.token_sum += tokens


class AccountRateLimits:
    """The rate limits AIService applies: each call's account limits are looked up as it comes
    (`limits_of`, from the accounts' settings, so an update applies at once); `on_refused(account,
    model, limit)` counts each refusal (runtime.control.metrics)."""

    def __init__(
        self,
        limits_of: Callable[[str], Limits],
        limiter: RateLimiter | None = None,
        on_refused: Callable[[str, str, str], None] | None = None,
    ):
        self.limits_of, self.on_refused = limits_of, on_refused
        self.limiter = limiter or RateLimiter()

    def check(
        self, account: str, model: str, asked: str | None = None, limits: PerMinute | None = None
    ) -> None:
        """Count a call of `model` (the serving name; `asked`: the name the caller used, for the
        message) or raise AccountLimited. `limits`: the account's, when the caller has read them."""
        refusal = self.limiter.admit(account, model, limits or self.limits_of(account))
        if refusal is None:
            return
        if self.on_refused is not None:
            self.on_refused(account, model, refusal.limit)
        raise AccountLimited(refusal, account, asked or model)

    def used(self, account: str, model: str, tokens: int) -> None:
        self.limiter.count_tokens(account, model, tokens)
