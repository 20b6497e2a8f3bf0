"""When each request is sent: vLLM's arrival process.

Gaps between requests are gamma-distributed with shape `burstiness` and mean 1 / rate: burstiness
1 is a Poisson process, below 1 burstier, above 1 more regular, `inf` evenly spaced; a rate of
`inf` sends everything at once. With a ramp-up the rate of request i goes from the start rate to
the end rate over the run (linearly, or geometrically for "exponential"). Without one the times
are rescaled so the last request is sent at n / rate, as vLLM does, so the offered rate is the
one asked for whatever the seed."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import Literal, NamedTuple

RampStrategy = Literal["linear", "exponential"]


class Ramp(NamedTuple):
    strategy: RampStrategy
    start_rps: float
    end_rps: float


def check_load(rate: float, burstiness: float, ramp: Ramp | None) -> None:
    """ValueError naming the flag when the load cannot be generated."""
    if not burstiness > 0:
        raise ValueError(f"--burstiness must be > 0, got {burstiness!r}")
    if ramp is None:
        if not rate > 0:
            raise ValueError(f"--request-rate must be > 0 (or inf), got {rate!r}")
        return
    if not (0 <= ramp.start_rps and math.isfinite(ramp.end_rps) and ramp.start_rps < ramp.end_rps):
        raise ValueError("--ramp-up-start-rps must be >= 0 and below --ramp-up-end-rps (a finite rate)")
    if ramp.strategy == "exponential" and ramp.start_rps == 0:
        raise ValueError("an exponential ramp-up cannot start at 0 req/s: give --ramp-up-start-rps > 0")


def request_rates(n: int, rate: float, ramp: Ramp | None = None) -> list[float]:
    """The rate each of `n` requests is drawn at."""
    if ramp is None:
        return [rate] * n
    out = []
    for i in range(n):
        progress = i / max(n - 1, 1)
        if ramp.strategy == "linear":
            out.append(ramp.start_rps + (ramp.end_rps - ramp.start_rps) * progress)
        else:
            out.append(ramp.start_rps * (ramp.end_rps / ramp.start_rps) ** progress)
    return out


def send_times(
    n: int, rate: float, burstiness: float = 1.0, seed: int = 0, ramp: Ramp | None = None
) -> list[float]:
    """Seconds from the start at which each of `n` requests is sent (non-decreasing, seeded)."""
    check_load(rate, burstiness, ramp)
    rng = random.Random(seed)
    times, t = [], 0.0
    for r in request_rates(n, rate, ramp):
        if math.isinf(r):
            gap = 0.0
        elif r == 0:  # a linear ramp's first request: sent at once
            gap = 0.0
        elif math.isinf(burstiness):
            gap = 1.0 / r
        else:
            gap = rng.gammavariate(burstiness, 1.0 / (r * burstiness))
        t += gap
        times.append(t)
    if ramp is None and times and times[-1] > 0:
        scale = (n / rate) / times[-1]
        times = [x * scale for x in times]
    return times


class Sent(NamedTuple):
    index: int
    rate: float  # the rate it was drawn at (a ramp's current rate)


async def paced(times: Sequence[float], rates: Sequence[float]) -> AsyncIterator[Sent]:
    """Yields each request's index at its send time (monotonic clock from the first call)."""
    start = time.perf_counter()
    for i, at in enumerate(times):
        wait = start + at - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        yield Sent(i, rates[i])
