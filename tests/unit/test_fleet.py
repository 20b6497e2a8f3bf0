"""`edge sim --fleet`: every GPU PoP in the planner's layout, the knee per PoP."""

from __future__ import annotations

import math

import pytest

from capacity.cli import main
from capacity.fleet import FleetCostModel, FleetRow, PopPoint, knees, parse_models, run_fleet
from capacity.planner import plan
from edge_sim.roofline import SimulationError


def test_a_pop_runs_as_many_replicas_of_the_planned_layout_as_its_gpus_allow():
    cost = FleetCostModel("glm-4.5", "fp8", context=32768, concurrency=32)
    planned = plan("glm-4.5", "H200", "fp8", "fp8", 32768, 32).layout
    pop = cost.plan_pop({"H200": 16}, "fp8", 4096)
    assert pop.gpus == planned.gpus
    assert pop.replicas == 16 // planned.gpus
    assert pop.max_num_seqs == 32  # the launch command's --max-num-seqs
    assert pop.max_context == 32768  # and its --max-model-len
    assert pop.num_blocks * 16 >= 32 * 32768  # room for the planned sequences


def test_a_pop_too_small_for_one_replica_says_how_many_gpus_it_needs():
    cost = FleetCostModel("kimi-k2", "fp8", context=32768, concurrency=32)
    need = plan("kimi-k2", "H100-SXM", "fp8", "fp8", 32768, 32).layout.gpus
    pop = cost.plan_pop({"H100-SXM": 8}, "fp8", 4096)
    assert pop.replicas == 0
    assert f"needs {need} x H100-SXM" in pop.note and "the PoP has 8" in pop.note


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_fleet_sizes_are_refused(bad):
    with pytest.raises(SimulationError, match="fleet concurrency"):
        FleetCostModel("glm-4.5", "fp8", context=4096, concurrency=bad)


def test_parse_models_defaults_to_fp8_and_refuses_empty():
    assert parse_models("kimi-k2:int4, glm-4.5") == [("kimi-k2", "int4"), ("glm-4.5", "fp8")]
    with pytest.raises(SimulationError, match="--fleet-models"):
        parse_models(" , ")


def _row(load: float, **pops: PopPoint) -> FleetRow:
    nan = {"p50": math.nan, "p90": math.nan, "p99": math.nan}
    return FleetRow("m", "fp8", "fp8", "chat", load, 1.0, 1, 1, 0, 0, nan, nan, 1.0, 1.0, 1.0, 1.0, pops)


def test_the_knee_is_the_first_load_whose_p99_ttft_or_goodput_crosses_the_slo():
    ok = PopPoint(10, 500.0, 20.0, 1.0, 1.0)
    slow = PopPoint(10, 2500.0, 20.0, 1.0, 1.0)
    starved = PopPoint(10, 900.0, 150.0, 0.5, 0.5)  # TTFT within the SLO, goodput not
    rows = [_row(1, A=ok, B=ok, C=ok), _row(2, A=slow, B=ok, C=starved), _row(5, A=slow, B=ok, C=slow)]
    layouts = {"m:fp8": {"A": "1x8 H200", "B": "1x8 H200", "C": "1x8 H100-SXM"}}
    got = {k.pop: k for k in knees(rows, layouts, 2000.0)}
    assert got["A"].knee_load == 2 and "p99 TTFT" in got["A"].why
    assert got["B"].knee_load is None  # never within the loads run
    assert got["C"].knee_load == 2 and "goodput" in got["C"].why
    assert got["C"].layout == "1x8 H100-SXM"


def test_a_short_fleet_run_reports_every_load_and_the_planned_layouts():
    r = run_fleet([("glm-4.5", "fp8")], ["chat"], [1, 10], duration_s=4.0, seed=3)
    assert [x.load for x in r.rows] == [1.0, 10.0]
    one, ten = r.rows
    assert ten.offered_rps == pytest.approx(10 * one.offered_rps, rel=0.25)
    assert ten.ttft_ms["p99"] > one.ttft_ms["p99"]  # 10x the load queues
    assert one.served > 0 and math.isfinite(one.cost_per_million_busy)
    assert one.cost_per_million_all_in >= one.cost_per_million_busy
    h200 = plan("glm-4.5", "H200", "fp8", "fp8", r.context, r.concurrency).layout.gpus
    assert r.layouts["glm-4.5:fp8"]["ICN"] == f"{8 // h200}x{h200} H200"  # ICN has 8 H200
    assert r.layouts["glm-4.5:fp8"]["GRU"].startswith("none (one replica needs")  # 4 L40S
    assert {k.pop for k in r.knees} == set(one.pops)


def test_the_fleet_is_bounded():
    with pytest.raises(SimulationError, match="at most"):
        run_fleet([("glm-4.5", "fp8")] * 9, ["chat", "rag", "code", "agent"], list(range(1, 9)), duration_s=1)


def test_edge_sim_fleet_prints_the_tables(capsys):
    rc = main(["sim", "--fleet", "--fleet-models", "glm-4.5:fp8", "--fleet-workloads", "agent",
               "--fleet-loads", "1,2", "--duration", "3", "--quiet"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "| glm-4.5 fp8 | agent | 1x |" in out and "| glm-4.5 fp8 | agent | 2x |" in out
    assert "knee per PoP" in out and "not serving:" in out
    assert main(["sim", "--fleet", "--kv", "fp8,int4"]) == 2
