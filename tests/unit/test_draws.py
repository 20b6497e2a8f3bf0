"""capacity.draws gives the numbers random.Random's own methods give, from the same state."""

from __future__ import annotations

import math
import random

from capacity.draws import lognormal_lengths, poisson_times


def _by_gauss(rng: random.Random, mu: float, sigma: float, lo: int, hi: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        v = int(math.exp(mu + sigma * rng.gauss()) + 0.5)
        out.append(lo if v < lo else hi if v > hi else v)
    return out


def test_lognormal_lengths_are_random_gauss_draws_and_leave_the_same_state():
    for seed in (0, 1, 12345, random.randrange(1 << 30)):
        for n in (0, 1, 2, 7, 1000):  # odd counts leave a cached second normal behind
            a, b = random.Random(seed), random.Random(seed)
            a.gauss()  # start with a spare normal cached, as a second call in a sample does
            b.gauss()
            assert lognormal_lengths(a, 6.0, 0.8, 16, 8192, n) == _by_gauss(b, 6.0, 0.8, 16, 8192, n)
            assert a.gauss() == b.gauss() and a.random() == b.random()  # the generators agree after
            got = lognormal_lengths(a, 4.0, 1.5, 1, 100, n)
            assert got == _by_gauss(b, 4.0, 1.5, 1, 100, n) and all(1 <= v <= 100 for v in got)


def test_poisson_times_are_expovariate_draws():
    for seed in (0, 7, random.randrange(1 << 30)):
        a, b = random.Random(seed), random.Random(seed)
        want, t = [], 0.0
        while True:
            t += b.expovariate(40.0)
            if t >= 30.0:
                break
            want.append(t)
        assert poisson_times(a, 40.0, 30.0) == want
        assert a.random() == b.random()
        assert 900 < len(want) < 1500  # about 40/s for 30 s
