"""Workloads, the discrete-event capacity simulator, its reports, `edge sim`, the profiled cost model."""

from __future__ import annotations

import json
import math
import statistics

import msgspec
import pytest

from capacity import cli as capacity_cli
from capacity.costmodel import BLOCK_TOKENS, RooflineCostModel
from capacity.profile import ProfiledCostModel
from capacity.report import build_report, summarize
from capacity.sampling import sample_requests
from capacity.simulator import REJECTED_CAPACITY, SERVED, simulate
from capacity.workload import (
    PROFILES,
    Arrivals,
    Lengths,
    TopologySetup,
    Workload,
    load_topology,
    load_workload,
)
from edge_sim.roofline import SimulationError
from edge_sim.topology import Topology
from tests.conftest import SHIPPED_KIMI

KIMI = RooflineCostModel("kimi-k2", "fp8")
KIMI_NETWORK = load_topology(None).network


def test_block_size_matches_the_engine():
    from engine.kv.kv_cache import BLOCK_SIZE

    assert BLOCK_TOKENS == BLOCK_SIZE


# --- workloads --------------------------------------------------------------------------------


def test_profiles_and_files_decode(tmp_path):
    for name in ("chat", "rag", "code"):
        w = load_workload(name)
        assert w.name == name and w.arrivals.rate > 0
    assert load_workload("rag").prompt.min >= 8192  # long context
    sample = sample_requests(load_workload("rag"), Topology.default(), 300, seed=2)
    assert 8192 <= min(sample.prompts) and max(sample.prompts) <= 32768
    assert abs(len(sample.times) / 300 - 4.0) < 0.6  # Poisson at 4 req/s

    toml = tmp_path / "bot.toml"
    toml.write_text(
        'profile = "chat"\n[arrivals]\nprocess = "gamma"\nrate = 3.5\ncv = 2.0\n'
        '[output]\ndist = "fixed"\nmean = 100\n[clients]\nSeoul = 3\n"New York" = 1\n"48.1,11.6" = 1\n'
    )
    w = load_workload(str(toml))
    assert (w.name, w.arrivals.process, w.arrivals.rate, w.arrivals.cv) == ("chat", "gamma", 3.5, 2.0)
    assert w.prompt.mean == PROFILES["chat"].prompt.mean  # kept from the profile
    assert w.clients == {"Seoul": 3, "New York": 1, "48.1,11.6": 1}
    s = sample_requests(w, Topology.default(), 200, seed=1)
    assert set(s.outputs) == {100}
    gaps = [b - a for a, b in zip(s.times, s.times[1:], strict=False)]
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert 1.5 < cv < 2.5  # gamma arrivals with the asked-for burstiness

    js = tmp_path / "w.json"
    js.write_text(json.dumps({"arrivals": {"rate": 2}, "prompt": {"dist": "uniform", "min": 10, "max": 20}}))
    w = load_workload(str(js))
    assert w.name == "w" and w.prompt.dist == "uniform"
    assert set(sample_requests(w, Topology.default(), 100, 0).prompts) <= set(range(10, 21))


@pytest.mark.parametrize(
    "text, key",
    [
        ("[arrivals]\nrate = -2\n", "arrivals.rate"),
        ("[arrivals]\nrate = 'fast'\n", "arrivals.rate: expected float, got str"),
        ("[prompt]\nmean = -500\n", "prompt.mean"),
        ("[output]\nmin = -1\n", "output.min"),
        ("[output]\nmax = 'lots'\n", "output.max: expected int, got str"),
        ("[prompt]\ndist = 'zipf'\n", "prompt.dist"),
        ("[clients]\nSeoul = -1\n", "clients.Seoul"),
        ("[slo]\nttft_ms = 0\n", "slo.ttft_ms"),
        ("profile = 'batch'\n", "'batch'"),
        ("rate = [\n", "invalid TOML"),
    ],
)
def test_bad_workload_files_name_the_key(tmp_path, text, key):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SimulationError) as err:
        load_workload(str(path))
    assert key in str(err.value) and "bad.toml" in str(err.value)


def test_unknown_keys_warn_and_unknown_names_fail(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text("[arrivals]\nrate = 1.0\nburst = 3\n")
    with pytest.warns(UserWarning, match="arrivals.burst"):
        load_workload(str(path))
    with pytest.raises(SimulationError, match="'nope'.*chat"):
        load_workload("nope")


# --- the simulator ----------------------------------------------------------------------------


def chat(rate: float, **changes) -> Workload:
    w = PROFILES["chat"]
    return msgspec.structs.replace(w, arrivals=Arrivals(rate=rate), **changes)


def test_deterministic_for_a_seed():
    a = simulate(chat(20), KIMI, "auto", duration_s=60, seed=7)
    b = simulate(chat(20), KIMI, "auto", duration_s=60, seed=7)
    c = simulate(chat(20), KIMI, "auto", duration_s=60, seed=8)
    assert a.ttft_ms == b.ttft_ms and a.e2e_ms == b.e2e_ms and a.pop == b.pop
    assert a.send_ms != c.send_ms


def test_a_recorded_trace_replays_exactly_and_its_lengths_are_used():
    w = chat(20)
    drawn = simulate(w, KIMI, "auto", duration_s=60, seed=7)
    trace = sample_requests(w, Topology.default(), 60, seed=7)
    replayed = simulate(w, KIMI, "auto", duration_s=60, seed=99, sample=trace)
    assert replayed.ttft_ms == drawn.ttft_ms and replayed.e2e_ms == drawn.e2e_ms
    # what a live run actually produced (shorter outputs) is what gets simulated
    shorter = msgspec.structs.replace(trace, outputs=[max(1, n // 2) for n in trace.outputs])
    r = simulate(w, KIMI, "auto", duration_s=60, seed=7, sample=shorter)
    assert r.output == shorter.outputs
    assert statistics.median(r.e2e_ms) < statistics.median(drawn.e2e_ms)


def test_littles_law():
    r = simulate(chat(20), KIMI, "auto", duration_s=300, seed=3)
    o = summarize(r)["overall"]
    assert o["rejected_3040"] == 0
    little = o["throughput_rps"] * o["e2e_ms"]["mean"] / 1000
    assert o["mean_in_flight"] == pytest.approx(little, rel=0.1)


def test_low_load_ttft_is_network_plus_prefill():
    w = chat(0.5)
    r = simulate(w, KIMI, "auto", duration_s=400, seed=5)
    model = KIMI.plan_pop({"H200": 8}, "auto", w.max_context)
    served = [i for i in range(len(r.send_ms)) if r.status[i] == SERVED]
    assert len(served) > 100
    extra = []
    for i in served:
        prefill = model.step_ms(r.prompt[i], r.prompt[i] * (r.prompt[i] + 1) / 2, r.prompt[i], 0, 0)
        extra.append(r.ttft_ms[i] - r.network_ms[i] - prefill)
    # alone, a request waits at most for one decode step in progress and prefills beside it
    assert min(extra) >= -1e-6
    assert statistics.median(extra) < 1.0
    assert sorted(extra)[int(0.9 * len(extra))] < 15.0
    assert all(r.network_ms[i] > 0 for i in served)


def test_overload_grows_queues_and_drops_goodput():
    light = summarize(simulate(chat(20), KIMI, "auto", duration_s=120, seed=1))["overall"]
    heavy = summarize(simulate(chat(200), KIMI, "auto", duration_s=120, seed=1))["overall"]
    assert heavy["queue_ms"]["p90"] > 20 * light["queue_ms"]["p90"]
    assert heavy["ttft_ms"]["p90"] > 2000
    assert heavy["goodput_rps"] < light["goodput_rps"]
    assert heavy["rejected_3040"] > 0  # the admission limit refuses what cannot be served in time
    assert light["slo_attainment"] > 0.99


def test_int4_kv_admits_more_sequences_when_kv_bound():
    rag = msgspec.structs.replace(PROFILES["rag"], arrivals=Arrivals(rate=6.0))
    bf16 = summarize(simulate(rag, KIMI, "bf16", duration_s=200, seed=1))["overall"]
    int4 = summarize(simulate(rag, KIMI, "int4", duration_s=200, seed=1))["overall"]
    assert bf16["kv_occupancy_peak"] > 0.9  # KV-bound
    assert int4["preemptions"] < bf16["preemptions"]
    assert int4["e2e_ms"]["p99"] < bf16["e2e_ms"]["p99"]
    assert int4["goodput_rps"] > bf16["goodput_rps"]


def test_merged_runs_match_step_by_step(monkeypatch):
    """Steady runs (decode stretches, a long prompt's full chunks) advanced as one event give
    exactly what the policy decides step by step."""
    import capacity.replica as replica

    one_pop = TopologySetup(
        Topology.default().with_overrides(gpu_pops={"FRA": {"H200": 8}}), KIMI_NETWORK, {}
    )
    w = Workload(
        name="long",
        arrivals=Arrivals(rate=0.4),
        prompt=Lengths(mean=60000.0, sigma=0.5, min=8192, max=120000),
        output=Lengths(mean=300.0, max=2048),
        clients={"Paris": 1},
    )
    runs = []
    for merged in (True, False):
        monkeypatch.setattr(replica, "MERGE_RUNS", merged)
        runs.append(simulate(w, KIMI, "bf16", duration_s=300, seed=1, setup=one_pop, max_queue_ms=1e12))
    a, b = runs
    assert a.status == b.status and a.preempted == b.preempted and sum(a.preempted) > 0
    assert [x.steps for x in a.replicas] == [x.steps for x in b.replicas]
    assert a.e2e_ms == pytest.approx(b.e2e_ms, rel=1e-9, nan_ok=True)


def test_bad_setups_fail_naming_the_entry():
    no_gpus = TopologySetup(Topology.default().with_overrides(gpu_pops={}), KIMI_NETWORK, {})
    with pytest.raises(SimulationError, match="no GPU PoP"):
        simulate(chat(1), KIMI, duration_s=10, setup=no_gpus)
    with pytest.raises(SimulationError, match="'Atlantis'"):
        simulate(chat(1, clients={"Seoul": 1, "Atlantis": 2}), KIMI, duration_s=10)
    small = TopologySetup(Topology.default().with_overrides(gpu_pops={"LHR": {"L4": 2}}), KIMI_NETWORK, {})
    with pytest.raises(SimulationError, match="LHR: too little memory for kimi-k2"):
        simulate(chat(1), KIMI, duration_s=10, setup=small)
    with pytest.raises(SimulationError, match="'int3'"):
        simulate(chat(1), KIMI, "int3", duration_s=10)


def test_topology_files(tmp_path):
    good = tmp_path / "t.toml"
    good.write_text("[gpu_pops]\nICN = { H200 = 16 }\n[prices]\nH200 = 2.5\n[network]\ninflation = 1.8\n")
    setup = load_topology(str(good))
    assert [p.code for p in setup.topology.gpu_pops()] == ["ICN"]
    assert setup.prices == {"H200": 2.5} and setup.network.inflation == 1.8
    for text, name in [
        ("[gpu_pops]\nXYZ = { H200 = 8 }\n", "XYZ"),
        ("[gpu_pops]\nICN = { B300 = 8 }\n", "B300"),
        ("[prices]\nTPUv9 = 1.0\n", "TPUv9"),
        ("[network]\nbase_ms = 'slow'\n", "network.base_ms"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(SimulationError, match=name):
            load_topology(str(bad))


def test_reports_have_every_metric_per_pop_and_overall():
    r = simulate(chat(30), KIMI, "int4", duration_s=60, seed=2)
    report = build_report([r], chat(30))
    run = report["runs"][0]
    metrics = {
        "ttft_ms", "tpot_ms", "e2e_ms", "throughput_rps", "output_tokens_per_s", "goodput_rps",
        "gpu_busy_fraction", "kv_occupancy_mean", "kv_occupancy_peak", "preemptions",
        "cost_per_request_usd", "cost_per_million_output_tokens_usd", "all_in_cost_per_request_usd",
        "all_in_cost_per_million_output_tokens_usd", "requests", "served", "rejected_3040",
    }  # fmt: skip
    assert set(run["pops"]) == {"ICN", "FRA", "IAD"}
    for group in (run["overall"], *run["pops"].values()):
        assert metrics <= set(group)
        for q in ("p50", "p90", "p99"):
            assert group["ttft_ms"][q] <= group["e2e_ms"][q]
        assert 0 < group["gpu_busy_fraction"] <= 1
        assert 0 < group["kv_occupancy_mean"] <= group["kv_occupancy_peak"] <= 1
        assert group["cost_per_request_usd"] <= group["all_in_cost_per_request_usd"]
    o = run["overall"]
    assert o["served"] == sum(p["served"] for p in run["pops"].values())
    assert o["cost_busy_usd"] == pytest.approx(sum(p["cost_busy_usd"] for p in run["pops"].values()))
    # the busy cost is the GPU price times GPU time
    iad = run["pops"]["IAD"]
    busy_h = sum(x.busy_ms for x in r.replicas if x.pop == "IAD") / 3.6e6
    assert iad["cost_busy_usd"] == pytest.approx(busy_h * 8 * 3.79)
    assert run["skipped_pops"]["NRT"].startswith("too little memory")
    json.dumps(report, allow_nan=False)  # standard JSON: no NaN


def test_rejections_are_counted_not_lost():
    w = chat(2, prompt=Lengths(dist="fixed", mean=200_000.0, max=300_000))  # longer than any context
    r = simulate(w, KIMI, duration_s=20, seed=1)
    assert r.status and all(s != SERVED for s in r.status)
    o = summarize(r)["overall"]
    assert o["too_long_3006"] == len(r.status) and o["served"] == 0
    assert all(math.isnan(x) for x in r.ttft_ms)
    assert REJECTED_CAPACITY == 3040


def test_cli_writes_report_and_plots(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["sim", "--workload", "chat", "--kv", "auto,int4", "--duration", "30", "--seed", "1"]
    assert capacity_cli.main([*argv, "--out", str(out), "--knee", "0.5,1,2", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "KV auto" in text and "KV int4" in text and "TTFT p50/p90/p99" in text
    for name in ("report.json", "latency_cdf.png", "knee.png", "world_map.png"):
        assert (out / name).stat().st_size > 0
    report = json.loads((out / "report.json").read_text())
    assert [run["kv"] for run in report["runs"]] == ["auto", "int4"]
    assert len(report["knee"]["series"]["auto"]) == 3
    assert (out / "latency_cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert (
        capacity_cli.main([*argv, "--out", str(out), "--knee", "none", "--json", "--quiet", "--no-plots"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["runs"][1]["kv"] == "int4"

    bad = tmp_path / "w.toml"
    bad.write_text('[clients]\n"Gotham City" = 1\n')
    assert capacity_cli.main(["sim", "--workload", str(bad), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edge: error:") and "'Gotham City'" in err
    assert capacity_cli.main(["sim", "--kv", "auto,int3", "--out", str(out), "--quiet"]) == 2
    assert "'int3'" in capsys.readouterr().err


def test_profiled_decode_follows_the_measured_batch_curve():
    from capacity.profile import ProfileFit

    common = dict(
        kv="auto", prefill_fixed_ms=4.0, prefill_token_ms=0.1, prefill_pair_ms_per_1m=0.0,
        kv_bytes_per_token=1.0, block_bytes=16, num_blocks=100, staging_blocks=0, max_num_seqs=32,
        max_batched_tokens=512, context_window=4096,
    )  # fmt: skip
    # an MoE's curve: steep while added sequences still wake new experts, then flat
    fit = ProfileFit(
        decode_fixed_ms=3.0,
        decode_seq_ms=0.1,
        decode_kv_ms_per_1k=1.0,
        decode_batch_ms=[(1, 3.0), (4, 6.0), (16, 8.4)],
        **common,
    )
    assert fit.decode_ms(1, 0) == pytest.approx(3.0)
    assert fit.decode_ms(2, 0) == pytest.approx(4.0)  # on the steep segment, not the line's 3.2
    assert fit.decode_ms(10, 2000) == pytest.approx(7.2 + 2.0)
    assert fit.decode_ms(28, 0) == pytest.approx(10.8)  # past the table: the last segment goes on
    # a mixed step: the decode part plus the prefill's own tokens and its larger fixed cost
    assert fit.step_ms(100, 0, 100, 2, 0) == pytest.approx(4.0 + (4.0 - 3.0) + 10.0)
    assert fit.step_ms(100, 0, 100, 0, 0) == pytest.approx(4.0 + 10.0)
    line = msgspec.structs.replace(fit, decode_batch_ms=[])  # an old profile: the fitted line
    assert line.decode_ms(2, 0) == pytest.approx(3.2)


def test_profiled_cost_model_round_trips(tmp_path):
    import torch

    from engine import LLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = LLM(SHIPPED_KIMI, device="cpu", kv_cache_dtype="int4")
        cost = ProfiledCostModel.profile(
            llm,
            batch_sizes=(1, 4),
            contexts=(32, 96),
            prompt_lengths=(32, 96),
            steps_per_point=2,
            compiled=False,  # (compiling its buckets takes minutes on a fresh machine)
        )
    finally:
        torch.set_num_threads(threads)
    fit = cost.fits["int4"]
    assert len(fit.decode_points) == 4 and len(fit.prefill_points) == 2
    assert fit.num_blocks == llm.engine.cache.num_blocks
    assert fit.kv_bytes_per_token == llm.engine.cache.bytes_per_token()
    assert fit.decode_ms(4, 4 * 96) > 0 and fit.step_ms(96, 96 * 48.5, 96, 0, 0) > 0
    assert [b for b, _ in fit.decode_batch_ms] == [1, 4]
    # the table reproduces what was measured (least squares), over all its points: one point's
    # timing may be hit by the host's other work, the fit's total is not moved far by it
    fitted = sum(fit.decode_ms(b, kv) for b, kv, _ in fit.decode_points)
    assert fitted == pytest.approx(sum(ms for _, _, ms in fit.decode_points), rel=0.5)
    path = cost.save(tmp_path / "profile.json")
    again = ProfiledCostModel.load(path)
    assert again.model_name == "kimi-k2-mini" and again.fits == cost.fits
    # the simulator runs on it: one engine per GPU PoP, requests that exceed the window refused
    w = Workload(
        name="tiny",
        arrivals=Arrivals(rate=2.0),
        prompt=Lengths(mean=100.0, max=3000),
        output=Lengths(mean=20.0, max=200),
        clients={"Seoul": 1, "Frankfurt": 1},
    )
    r = simulate(w, again, "int4", duration_s=30, seed=1)
    o = summarize(r)["overall"]
    assert o["served"] == len(r.status) > 20
    assert o["replicas"] == len(Topology.default().gpu_pops())
    with pytest.raises(SimulationError, match="'fp8'"):
        simulate(w, again, "fp8", duration_s=5)
    with pytest.raises(SimulationError, match="not a profile"):
        (tmp_path / "junk.json").write_text("{}")
        ProfiledCostModel.load(tmp_path / "junk.json")
