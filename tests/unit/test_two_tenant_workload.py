"""The two-tenant workload (a light account and a heavy one at 10x, as bench/fairness.py sends
them): its shape, its file form, and the per-account latencies `edge sim` reports for it."""

from __future__ import annotations

import statistics

import pytest

from capacity.costmodel import RooflineCostModel
from capacity.report import summarize
from capacity.report_table import format_table
from capacity.sampling import sample_requests
from capacity.simulator import refusals, simulate
from capacity.workload import PROFILES, load_workload, two_tenant_workload
from edge_sim.roofline import SimulationError
from edge_sim.topology import Topology


def gaps_cv(times: list[float]) -> float:
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return statistics.pstdev(gaps) / statistics.mean(gaps)


def test_the_heavy_account_sends_ten_times_the_light_ones_rate_each_poisson():
    w = two_tenant_workload(light_rate=2.0, ratio=10.0)
    duration = 2000.0
    sample = sample_requests(w, Topology.default(), duration, seed=3)
    assert sample.tenants is not None and set(sample.tenants) == {"light", "heavy"}
    light = [t for t, who in zip(sample.times, sample.tenants, strict=True) if who == "light"]
    heavy = [t for t, who in zip(sample.times, sample.tenants, strict=True) if who == "heavy"]
    # 4,000 light and 40,000 heavy expected: counts within 5 standard deviations
    assert abs(len(light) - 4000) < 5 * 4000**0.5
    assert abs(len(heavy) - 40000) < 5 * 40000**0.5
    for times in (light, heavy):  # each account's own arrivals are Poisson: gaps with CV 1
        assert gaps_cv(times) == pytest.approx(1.0, abs=0.05)
    assert all(40 <= p <= 160 for p in sample.prompts) and set(sample.outputs) == {96}
    assert {sample.locations[c].name for c in sample.clients} == {"Seoul"}
    assert sample_requests(w, Topology.default(), 60.0, seed=3) == sample_requests(
        w, Topology.default(), 60.0, seed=3
    )  # deterministic for a seed


def test_tenants_in_a_workload_file_and_a_profile(tmp_path):
    assert PROFILES["two-tenant"].tenants == {"light": 1.0, "heavy": 10.0}
    spec = tmp_path / "pair.toml"
    spec.write_text('profile = "chat"\n[arrivals]\nrate = 30\n[tenants]\na = 1\nb = 2\n')
    w = load_workload(str(spec))
    assert w.tenants == {"a": 1.0, "b": 2.0}  # replaces, not merges with, the profile's
    sample = sample_requests(w, Topology.default(), 100.0, seed=1)
    assert abs(sample.tenants.count("b") / len(sample.times) - 2 / 3) < 0.05
    spec.write_text("[tenants]\na = 0\n")
    with pytest.raises(SimulationError, match=r"tenants\.a: weight must be > 0"):
        load_workload(str(spec))
    # a workload without tenants draws exactly what it drew before they existed
    chat = PROFILES["chat"]
    assert sample_requests(chat, Topology.default(), 30.0, seed=1).tenants is None


def test_edge_sim_reports_the_light_accounts_latency_beside_the_heavy_one():
    w = two_tenant_workload(light_rate=2.0, ratio=10.0)
    result = simulate(w, RooflineCostModel("kimi-k2", "fp8"), duration_s=60.0, seed=1)
    assert refusals(result) == ""
    report = summarize(result)
    tenants = report["tenants"]
    assert set(tenants) == {"light", "heavy"}
    assert tenants["light"]["served"] == tenants["light"]["requests"] > 0
    assert tenants["heavy"]["requests"] > 5 * tenants["light"]["requests"]
    for t in tenants.values():  # the server part is TTFT without the network
        assert 0 < t["server_ttft_ms"]["p99"] < t["ttft_ms"]["p99"]
    table = format_table({"meta": _meta(w, result), "runs": [report], "knee": None})
    assert "per account" in table and "light" in table


def _meta(w, r) -> dict:
    from capacity.report import build_report

    return build_report([r], w)["meta"]


def test_edge_sim_prints_the_accounts_of_the_two_tenant_profile(tmp_path, capsys):
    from capacity import cli as capacity_cli

    argv = ["sim", "--workload", "two-tenant", "--duration", "20", "--knee", "none", "--no-plots"]
    assert capacity_cli.main([*argv, "--out", str(tmp_path)]) == 0  # PoPs that serve nobody print "-"
    out = capsys.readouterr().out
    assert "per account" in out and "light" in out and "heavy" in out
