"""What the router ranks a GPU PoP's engine by, and the score: one formula for the live router
(edge_sim.router) and the capacity simulator (capacity.replica), so simulated routing is live routing.

The score is the expected time to the first token through that PoP: the backbone RTT, the expected
queue wait, and this prompt's prefill at the PoP's measured rate."""

from __future__ import annotations

import math

FINISH_RATE_TAU_MS = 5000.0  # time constant of the finish-rate estimate


_LOAD_FIELDS = ("step_ms", "pending_tokens", "prefill_ms_per_token", "waiting", "seats", "finish_per_ms")


class PopLoad:
    """What routing knows of one engine at a PoP now."""

    __slots__ = ("step_ms", "pending_tokens", "prefill_ms_per_token", "waiting", "seats", "finish_per_ms")

    def __init__(
        self,
        step_ms: float,
        pending_tokens: float,
        prefill_ms_per_token: float,
        waiting: int,
        seats: float,
        finish_per_ms: float,
    ):
        self.step_ms = step_ms  # the step in progress (0 when idle): a newcomer waits for it
        self.pending_tokens = pending_tokens  # prompt tokens queued or still prefilling there
        self.prefill_ms_per_token = prefill_ms_per_token
        self.waiting = waiting  # requests not yet admitted
        self.seats = seats  # more sequences it can admit now (sequence cap or KV room)
        self.finish_per_ms = finish_per_ms  # its recent rate of finished requests (> 0)

    def as_tuple(self) -> tuple[float, float, float, int, float, float]:
        return (
            self.step_ms, self.pending_tokens, self.prefill_ms_per_token, self.waiting, self.seats,
            self.finish_per_ms,
        )  # fmt: skip

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{name}={value!r}" for name, value in zip(_LOAD_FIELDS, self.as_tuple(), strict=True)
        )
        return f"PopLoad({fields})"


def pop_load(
    step_ms: float,
    pending_tokens: float,
    prefill_ms_per_token: float,
    waiting: int,
    running: int,
    seat_limit: int,
    kv_blocks_free: int,
    kv_blocks_used: int,
    finish_per_ms: float,
) -> PopLoad:
    """A PopLoad from an engine's counters (the live PoP's and the simulated replica's alike):
    its seats are the sequence cap left or, when fewer, the sequences that the free KV blocks hold
    at the running ones' average size."""
    seats = float(seat_limit - running)
    if running and kv_blocks_used:
        kv_seats = kv_blocks_free * running / kv_blocks_used
        if kv_seats < seats:
            seats = kv_seats
    return PopLoad(
        step_ms, pending_tokens, prefill_ms_per_token, waiting, seats,
        finish_per_ms if finish_per_ms > 0 else 1.0 / FINISH_RATE_TAU_MS,
    )  # fmt: skip


class FinishRate:
    """Requests finished per ms, an exponentially decaying count (time constant FINISH_RATE_TAU_MS)."""

    __slots__ = ("rate", "last")

    def __init__(self) -> None:
        self.rate, self.last = 0.0, 0.0

    def tick(self, now_ms: float) -> None:
        """One more finished at `now_ms` (the rate is read as of the last finish)."""
        tau = FINISH_RATE_TAU_MS
        self.rate = self.rate * math.exp((self.last - now_ms) / tau) + 1.0 / tau
        self.last = now_ms


def expected_wait_ms(load: PopLoad) -> float:
    """A newcomer waits for the step in progress, for the prefill queued ahead of it, and, when more
    requests wait than there are seats, for that many finishes."""
    wait = load.step_ms + load.pending_tokens * load.prefill_ms_per_token
    if load.waiting > load.seats:
        wait += (load.waiting - load.seats) / load.finish_per_ms
    return wait


def route_score(
    backbone_rtt_ms: float, load: PopLoad, prompt_tokens: int, wait_ms: float | None = None
) -> float:
    """Expected time to the first token through this PoP, network included (lower is better);
    `wait_ms`: expected_wait_ms(load), when the caller has it already."""
    if wait_ms is None:
        wait_ms = expected_wait_ms(load)
    return backbone_rtt_ms + wait_ms + prompt_tokens * load.prefill_ms_per_token
