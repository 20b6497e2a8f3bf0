"""The workload sampler's two hot draws, compiled with the simulator (engine.native).

Each gives exactly the numbers that `random.Random`'s own methods give from the same generator
state, compiled or not (tests/unit/test_draws.py checks it against them): the Box-Muller pairs of
`Random.gauss`, its cached second value carried in and out as it carries it, and the inverse-CDF
draw of `Random.expovariate`. So a seed's sample is the same with or without the build.
"""

from __future__ import annotations

import math
import random

TWO_PI = 2.0 * math.pi


def lognormal_lengths(rng: random.Random, mu: float, sigma: float, lo: int, hi: int, n: int) -> list[int]:
    """n draws of round(exp(mu + sigma * rng.gauss())), each clipped to [lo, hi]."""
    out: list[int] = []
    cached = rng.gauss_next  # type: ignore[attr-defined]  # random.Random's spare normal
    rand = rng.random
    for _ in range(n):
        if cached is None:
            x2pi = rand() * TWO_PI
            g2rad = math.sqrt(-2.0 * math.log(1.0 - rand()))
            z = math.cos(x2pi) * g2rad
            cached = math.sin(x2pi) * g2rad
        else:
            z = cached
            cached = None
        v = int(math.exp(mu + sigma * z) + 0.5)
        out.append(lo if v < lo else hi if v > hi else v)
    rng.gauss_next = cached  # type: ignore[attr-defined]
    return out


def poisson_times(rng: random.Random, rate: float, duration_s: float) -> list[float]:
    """Send times over [0, duration_s) of a Poisson process at `rate` per second."""
    times: list[float] = []
    t = 0.0
    rand = rng.random
    while True:
        t += -math.log(1.0 - rand()) / rate
        if t >= duration_s:
            return times
        times.append(t)
