"""The serving fit says when its steps cannot support it instead of producing a wild replay, its
step times past the largest batch it saw grow no faster than its data, and a simulator run on it
serves every request of a load beyond that batch (or says how many it refused, and why)."""

from __future__ import annotations

import math
import random

import pytest

from capacity import serving_fit
from capacity.profile import ProfiledCostModel, ProfileFit
from capacity.serving_fit import fit_serving_steps
from capacity.simulator import SERVED, refusals, simulate
from capacity.workload import Arrivals, Lengths, Workload, WorkloadSample
from edge_sim.roofline import SimulationError
from edge_sim.topology import Topology


def base_profile() -> ProfiledCostModel:
    fit = ProfileFit(
        kv="auto", decode_fixed_ms=1.0, decode_seq_ms=0.1, decode_kv_ms_per_1k=0.0, prefill_fixed_ms=1.0,
        prefill_token_ms=0.01, prefill_pair_ms_per_1m=0.0, kv_bytes_per_token=100.0, block_bytes=1600,
        num_blocks=4000, staging_blocks=0, max_num_seqs=64, max_batched_tokens=512, context_window=4096,
    )  # fmt: skip
    return ProfiledCostModel("tiny", "cpu", {"auto": fit})


def true_ms(b: int, context: int, prefill: int) -> float:
    """A CPU miniature's step: a fixed part, a per-sequence part that falls with the batch (an MoE
    wakes fewer new experts per added sequence), the cache read and the prefill."""
    decode = 6.0 + 2.0 * b**0.8 if b else 3.0
    return decode + 0.5 * context / 1e3 + 0.04 * prefill + (1.0 if b and prefill else 0.0)


def serving_steps(seed: int = 7, n: int = 1500, stalls: float = 0.04) -> list[dict]:
    """Steps as a busy slow host records them: mostly small batches, a sparse tail of larger ones,
    and now and then a step stalled by another process (tens of ms)."""
    rng = random.Random(seed)
    steps, t = [], 0.0
    for _ in range(n):
        b = min(12, int(rng.expovariate(1 / 3.0)))
        prefill = rng.choice([0, 0, 0, 120, 300])
        if not b and not prefill:
            prefill = 64
        context = sum(rng.randrange(100, 500) for _ in range(b))
        ms = true_ms(b, context, prefill)
        if rng.random() < stalls:
            ms += rng.uniform(20.0, 60.0)
        steps.append(
            {"engine": "e", "batch_size": b + bool(prefill), "prefill_tokens": prefill, "decode_tokens": b,
             "duration_ms": ms, "started": t, "prefill_pairs": prefill * (prefill + 1) / 2,
             "decode_context": context}
        )  # fmt: skip
        t += ms / 1000.0
    return steps


def test_too_few_steps_or_one_batch_size_is_refused_saying_what_is_missing():
    steps = serving_steps()
    with pytest.raises(SimulationError, match=r"holds 5 decode steps; a fit needs at least 16"):
        fit_serving_steps([s for s in steps if s["decode_tokens"]][:5], base_profile())
    only_three = [s for s in steps if s["decode_tokens"] in (0, 3)]
    with pytest.raises(SimulationError, match=r"all at batch 3: the batch term cannot be fitted"):
        fit_serving_steps(only_three, base_profile())


def wild_regression(monkeypatch, column_from_end: int, value: float) -> None:
    """The fit's regression with one coefficient replaced, as collinear columns can make it."""
    real = serving_fit.least_squares
    calls = []

    def wild(rows, ys):
        coef = real(rows, ys)
        if not calls:  # the first regression, every column free
            coef[len(coef) - column_from_end] = value
        calls.append(1)
        return coef

    monkeypatch.setattr(serving_fit, "least_squares", wild)


def test_a_term_longer_than_any_step_recorded_is_refused(monkeypatch):
    wild_regression(monkeypatch, 3, 5000.0)  # a mixed step's fixed cost of 5 s
    with pytest.raises(
        SimulationError, match=r"its mixed step's fixed cost comes out at 5000.0 ms, longer than"
    ):
        fit_serving_steps(serving_steps(), base_profile())


def test_a_context_slope_above_the_plausible_bound_is_the_profiles(monkeypatch):
    # ms per 1k cached tokens: more than a whole step costs per cached token at the log's context
    wild_regression(monkeypatch, 4, 500.0)
    fit = fit_serving_steps(serving_steps(), base_profile()).fits["auto"]
    assert fit.decode_kv_ms_per_1k == base_profile().fits["auto"].decode_kv_ms_per_1k
    assert any("context slope 500.00 ms/1k over the plausible" in note for note in fit.serving_notes)


def test_a_term_with_too_few_steps_keeps_the_profiles_value():
    steps = [s for s in serving_steps() if s["decode_tokens"]]  # no prefill-only step
    fit = fit_serving_steps(steps, base_profile()).fits["auto"]
    assert fit.prefill_fixed_ms == base_profile().fits["auto"].prefill_fixed_ms
    assert "0 prefill-only steps: column prefill fixed kept from the profile" in fit.serving_notes


def test_past_the_largest_batch_seen_the_fit_grows_no_faster_than_its_data():
    fit = fit_serving_steps(serving_steps(), base_profile()).fits["auto"]
    table = fit.decode_batch_ms
    assert all(t0 <= t1 for (_, t0), (_, t1) in zip(table, table[1:], strict=False))  # monotone
    assert table[-1][0] == 12  # the sparse tail shares a segment instead of being dropped
    for b in (16, 32, 64):  # beyond the data: within a factor of the truth, never a runaway
        ratio = fit.decode_ms(b, b * 300) / true_ms(b, b * 300, 0)
        assert 0.7 < ratio < 1.6, (b, ratio)


def test_the_simulator_serves_every_request_of_a_load_beyond_the_fitted_batches():
    # bursts that put more sequences in the batch than the calibration log ever had (12)
    cost = fit_serving_steps(serving_steps(), base_profile())
    rng = random.Random(2)
    times = sorted(rng.uniform(0.0, 60.0) for _ in range(600))
    n = len(times)
    sample = WorkloadSample(
        times, [rng.randrange(50, 400) for _ in range(n)], [rng.randrange(16, 96) for _ in range(n)],
        [0] * n, [Topology.default().resolve_location("Seoul")],
    )  # fmt: skip
    workload = Workload(
        name="burst", arrivals=Arrivals(rate=10.0), prompt=Lengths(mean=200.0), output=Lengths(mean=50.0)
    )
    result = simulate(workload, cost, duration_s=60.0, sample=sample)
    assert refusals(result) == ""
    assert all(s == SERVED for s in result.status) and max(r.max_running for r in result.replicas) > 12
    assert all(math.isfinite(x) for x in result.e2e_ms)


def test_a_refusal_is_counted_and_explained():
    cost = fit_serving_steps(serving_steps(), base_profile())
    rng = random.Random(3)
    n = 2000  # in 2 s, against an admission limit of 50 ms of expected wait
    sample = WorkloadSample(
        sorted(rng.uniform(0.0, 2.0) for _ in range(n)), [300] * n, [90] * n, [0] * n,
        [Topology.default().resolve_location("Seoul")],
    )  # fmt: skip
    workload = Workload(name="flood", prompt=Lengths(mean=300.0), output=Lengths(mean=90.0))
    result = simulate(workload, cost, duration_s=2.0, sample=sample, max_queue_ms=50.0)
    refused = sum(1 for s in result.status if s != SERVED)
    assert refused > 0
    assert refusals(result).startswith(f"{refused} refused for capacity (3040)")
    assert "admission limit of 50 ms" in refusals(result)


def test_a_host_whose_speed_moved_during_the_log_is_said_so():
    steps = serving_steps(stalls=0.0)
    middle = steps[len(steps) // 2]["started"]
    for s in steps:  # another process took half the core for the log's second half
        if s["started"] >= middle:
            s["duration_ms"] *= 1.5
    fit = fit_serving_steps(steps, base_profile()).fits["auto"]
    assert fit.serving_drift > 0.1
    assert any(note.startswith("the host's speed moved by") for note in fit.serving_notes)
    steady = fit_serving_steps(serving_steps(stalls=0.0), base_profile()).fits["auto"]
    assert steady.serving_drift < 0.05 and not any("speed moved" in n for n in steady.serving_notes)
