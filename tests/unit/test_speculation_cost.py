"""Speculative decoding in the roofline and the capacity simulator (edge_sim.speculation_cost)."""

from __future__ import annotations

import json
import math
import random

import pytest

from capacity import cli as capacity_cli
from capacity.costmodel import RooflineCostModel
from capacity.report import summarize
from capacity.simulator import simulate
from capacity.workload import Arrivals, Lengths, TopologySetup, Workload, load_topology
from edge_sim.roofline import RooflineModel, SimulationError, gpu_type
from edge_sim.speculation_cost import (
    DEFAULT_ACCEPTANCE,
    SpeculationSpec,
    SpeculativeStepTimes,
    expected_tokens,
    parse_speculative,
)
from edge_sim.target_models import GLM_4_5, KIMI_K2
from edge_sim.topology import Topology


def _kimi_on_h200(gpus: int = 8) -> RooflineModel:
    return RooflineModel(KIMI_K2, gpu_type("H200"), gpus, "fp8", "fp8")


def test_expected_tokens_closed_form():
    assert expected_tokens(()) == 1.0
    assert expected_tokens((0.85,)) == pytest.approx(1.85)
    assert expected_tokens((0.9, 0.5)) == pytest.approx(1 + 0.9 + 0.45)
    rng = random.Random(26)
    for _ in range(20):  # one rate a: a geometric series, 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)
        a, k = rng.uniform(0.05, 0.95), rng.randint(1, 14)
        assert expected_tokens((a,) * k) == pytest.approx((1 - a ** (k + 1)) / (1 - a), rel=1e-12)
    assert expected_tokens((1.0,) * 5) == 6.0 and expected_tokens((0.0, 1.0)) == 1.0


def test_parse_speculative_and_its_errors():
    spec = parse_speculative("mtp:1")
    assert (spec.method, spec.num_tokens, spec.acceptance) == ("mtp", 1, (DEFAULT_ACCEPTANCE["mtp"],))
    spec = parse_speculative("ngram", "0.7")
    assert spec.num_tokens == 5 and spec.acceptance == (0.7,) * 5
    assert parse_speculative("ngram:2", "0.9,0.6").acceptance == (0.9, 0.6)
    assert parse_speculative("off") is None
    for bad, words in (
        ("eagle:3", "use off, mtp"),
        ("mtp:x", "use off, mtp"),
        ("mtp:0", "1-14"),
        ("ngram:20", "1-14"),
    ):
        with pytest.raises(SimulationError, match=words):
            parse_speculative(bad)
    with pytest.raises(SimulationError, match="rates for 3 draft tokens"):
        parse_speculative("ngram:3", "0.9,0.8")
    with pytest.raises(SimulationError, match=r"in \[0, 1\]"):
        parse_speculative("mtp", "1.5")
    with pytest.raises(SimulationError, match="give a rate"):
        parse_speculative("mtp", "high")


def _terms(t, rows: float, kv: float, q: int = 1) -> tuple[float, float, float]:
    """The roofline's own compute, memory and communication terms for `rows` positions."""
    compute = (t.c0 + t.c1) * rows + t.c3 * kv * q
    memory = t.c4 + t.c5 * (1 - t.c6**rows) + t.c7 * kv
    return compute, memory, t.c8 + t.c9 * rows


def test_verify_costs_a_decode_step_when_memory_bound_and_k_plus_1_when_compute_bound():
    target = _kimi_on_h200()
    t, k = target.times, 3
    spec = SpeculativeStepTimes(target, SpeculationSpec("ngram", k, (0.5,) * k))
    comm = lambda b: t.c8 + t.c9 * b  # noqa: E731 (the plain step's communication)
    # memory-bound with every routed expert read by the plain step already: the verify reads the
    # same weights and KV, so apart from communication (per position) it costs a decode step
    b = next(b for b in (2**i for i in range(14)) if 1 - t.c6**b > 0.9999)
    kv = b * 512
    compute, memory, _ = _terms(t, b * (k + 1), kv, k + 1)
    assert compute < memory  # the regime, by the roofline's own terms
    verify_compute_free = spec.verify_ms(b, kv) - (t.c8 + t.c9 * b * (k + 1))
    assert verify_compute_free == pytest.approx(t.decode_ms(b, kv) - comm(b), rel=1e-3)
    # a large batch: compute-bound, every FLOP term times k+1
    b, kv = 16384, 16384 * 64
    compute, memory, _ = _terms(t, b, kv)
    assert compute > memory
    verify_compute = spec.verify_ms(b, kv) - (t.c8 + t.c9 * b * (k + 1))
    assert verify_compute == pytest.approx((k + 1) * (t.decode_ms(b, kv) - comm(b)), rel=1e-9)
    # batch 1: each position routes on its own, so the verify reads more experts, not k+1 x weights
    b, kv = 1, 1024
    extra = t.c5 * ((1 - t.c6 ** (k + 1)) - (1 - t.c6)) + t.c7 * k + t.c9 * k
    assert spec.verify_ms(b, kv) == pytest.approx(t.decode_ms(b, kv) + extra, rel=1e-9)
    assert spec.verify_ms(b, kv) < (k + 1) * 0.5 * t.decode_ms(b, kv)
    assert spec.draft_ms(b, kv) == 0.0  # n-gram drafts need no model


def test_mtp_draft_is_one_layer_and_the_lm_head_per_draft_token():
    target = _kimi_on_h200()
    one = SpeculativeStepTimes(target, parse_speculative("mtp:1"))
    three = SpeculativeStepTimes(target, parse_speculative("mtp:3"))
    layer = one.draft_model
    assert layer.model.num_layers == 1 and layer.model.moe_layers == 1
    assert layer.model.hidden_size == KIMI_K2.hidden_size and layer.model.vocab_size == KIMI_K2.vocab_size
    assert layer.weight_bytes.bytes["lm_head"] == target.weight_bytes.bytes["lm_head"]
    assert three.draft_ms(8, 8 * 2048) == pytest.approx(3 * one.draft_ms(8, 8 * 2048))
    # the draft is a fraction of a 61-layer step, more than nothing
    assert 0 < one.draft_ms(1, 2048) < 0.2 * target.times.decode_ms(1, 2048)


def test_speculation_pays_at_batch_1_and_stops_paying_at_a_crossover():
    glm = RooflineModel(GLM_4_5, gpu_type("H200"), 4, "fp8", "fp8")
    for target in (_kimi_on_h200(), glm):
        spec = SpeculativeStepTimes(target, parse_speculative("mtp:1", "0.85"), context=2048)
        assert 1.2 < spec.gain(1, 2048) < spec.expected == pytest.approx(1.85)  # bounded by the tokens
        assert spec.decode_ms(1, 2048) < target.times.decode_ms(1, 2048)
    spec = SpeculativeStepTimes(_kimi_on_h200(), parse_speculative("mtp:1", "0.85"), context=2048)
    c = spec.crossover  # compute-bound at last: the verify's 2x FLOPs outgrow 1.85 tokens
    assert c is not None and c > 1
    assert spec.gain(c - 1, 2048) > 1.0 >= spec.gain(c, 2048)
    assert all(spec.gain(b, 2048) > 1.0 for b in range(1, c))
    assert spec.max_decoders == c - 1
    assert spec.decode_ms(c + 10, (c + 10) * 2048) == spec.plain.decode_ms(c + 10, (c + 10) * 2048)
    # five n-gram drafts at 0.5: at batch 1 the verify reads ~6x the experts for 1.97 tokens; it pays
    # again once a decode step reads nearly every expert anyway
    ngram = SpeculativeStepTimes(_kimi_on_h200(), parse_speculative("ngram:5", "0.5"), context=2048)
    assert ngram.crossover == 1 and ngram.max_decoders == 0
    again = ngram.pays_again
    assert again is not None and ngram.gain(again, 2048) > 1.0 >= ngram.gain(again - 1, 2048)
    for times in (spec, ngram):  # the ranges agree with the gain at their edges
        assert times.paying and times.paying[0][0] == (1 if times is spec else again)
        for first, last in times.paying:
            assert times.gain(first, 2048) > 1.0 and times.gain(last, 2048) > 1.0
            assert first == 1 or times.gain(first - 1, 2048) <= 1.0
            assert last == 4096 or times.gain(last + 1, 2048) <= 1.0
    never = SpeculativeStepTimes(_kimi_on_h200(), parse_speculative("mtp:1", "0.0"))
    assert never.crossover == 1 and never.pays_again is None and never.paying == []


# --- the simulator -----------------------------------------------------------------------------

ONE_POP = TopologySetup(
    Topology.default().with_overrides(gpu_pops={"FRA": {"H200": 8}}), load_topology(None).network, {}
)


def _workload(rate: float) -> Workload:
    return Workload(
        name="spec",
        arrivals=Arrivals(rate=rate),
        prompt=Lengths(mean=1000.0, sigma=0.3, min=64, max=4096),
        output=Lengths(mean=200.0, sigma=0.3, min=16, max=1024),
        clients={"Paris": 1},
    )


def _tpot_p50(workload, cost) -> float:
    r = simulate(workload, cost, "fp8", duration_s=120, seed=3, setup=ONE_POP, max_queue_ms=1e12)
    return summarize(r)["overall"]["tpot_ms"]["p50"]


def test_simulator_speculation_shortens_tpot_at_low_load_and_not_beyond_max_decoders():
    # int4 weights: Kimi K2's fp8 weights leave 2 GiB per H200 of eight, less than the MTP layer
    plain = RooflineCostModel("kimi-k2", "int4")
    mtp = parse_speculative("mtp:1", "0.85")
    fast = RooflineCostModel("kimi-k2", "int4", speculation=mtp)
    light = _workload(0.02)  # about one request at a time: batch 1
    a, b = _tpot_p50(light, plain), _tpot_p50(light, fast)
    target = RooflineModel(KIMI_K2, gpu_type("H200"), 8, "int4", "fp8")
    expected_ratio = SpeculativeStepTimes(target, mtp).decode_ms(1, 1100) / target.times.decode_ms(1, 1100)
    assert b < a and b / a == pytest.approx(expected_ratio, rel=0.05)
    # the MTP layer's weights and its own KV leave fewer KV blocks
    fra = {"H200": 8}
    assert 0 < fast.plan_pop(fra, "fp8", 4096).num_blocks < plain.plan_pop(fra, "fp8", 4096).num_blocks
    tight = RooflineCostModel("kimi-k2", "fp8", speculation=mtp).plan_pop(fra, "fp8", 4096)
    assert tight.replicas == 0 and "raise --usable-fraction, use int4 weights" in tight.note
    # n-gram drafts (no weights) capped at 2 decoders: beyond that every step is a plain step, so a
    # load that keeps more than 2 decoding most of the time gets nearly the plain TPOT, capped at 0
    # exactly the plain run
    heavy = _workload(2.0)
    ngram = parse_speculative("ngram:3", "0.6", max_decoders=0)
    off = RooflineCostModel("kimi-k2", "int4", speculation=ngram)
    assert _tpot_p50(heavy, off) == _tpot_p50(heavy, plain)
    light_ngram = RooflineCostModel("kimi-k2", "int4", speculation=parse_speculative("ngram:3", "0.6"))
    assert _tpot_p50(light, light_ngram) != _tpot_p50(light, plain)  # it did speculate below the cap


def test_edge_sim_speculative_prints_with_and_without(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["sim", "--workload", "chat", "--kv", "fp8", "--duration", "20", "--knee", "none", "--quiet"]
    argv += ["--no-plots", "--out", str(out), "--weights", "int4"]
    assert capacity_cli.main([*argv, "--speculative", "mtp:1", "--acceptance", "0.85"]) == 0
    text = capsys.readouterr().out
    assert "speculative decoding, roofline: kimi-k2" in text and "stops paying at batch" in text
    assert "it pays at batches 1-" in text
    assert "DeepSeek-V3-layout MTP layer on kimi-k2's shape" in text and "KV blocks per replica" in text
    assert "simulated, chat, KV fp8, mtp:1" in text and "TPOT p50 ms" in text
    report = json.loads((out / "report.json").read_text())
    run = report["speculation"]["runs"][0]
    assert [r["batch"] for r in run["roofline"]] == [1, 8, 64]
    assert run["roofline"][0]["speedup"] > 1.0 and math.isclose(run["expected_tokens"], 1.85)
    assert run["with"]["tpot_ms"]["p50"] < run["without"]["tpot_ms"]["p50"]
    assert run["max_decoders"] == run["crossover_batch"] - 1  # the automatic back-off

    # capped at 0 decoders from the command line: the same run as without
    assert capacity_cli.main([*argv, "--speculative", "mtp:1", "--spec-max-decoders", "0", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["speculation"]["runs"][0]
    assert run["max_decoders"] == 0 and run["with"]["tpot_ms"] == run["without"]["tpot_ms"]

    for bad, words in (
        (["--speculative", "eagle"], "use off, mtp"),
        (["--speculative", "ngram:3", "--acceptance", "0.9,0.1"], "rates for 3 draft tokens"),
        (["--acceptance", "0.8"], "need --speculative"),
        (["--speculative", "mtp", "--cost", "profiled"], "--cost roofline"),
        (["--speculative", "mtp", "--fleet"], "without --fleet"),
        (["--speculative", "mtp", "--spec-batches", "0,8"], "batch sizes must be >= 1"),
        (["--speculative", "mtp", "--spec-max-decoders", "-1"], "max_decoders must be >= 0"),
    ):
        assert capacity_cli.main([*argv, *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("edge: error:") and words in err, err
