"""The simulator's prefix cache on the `agent` workload: sessions of turns over tenants' shared
system prompts, hit rates counted per request and reported per PoP and overall."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from capacity.costmodel import RooflineCostModel
from capacity.report import format_table, summarize
from capacity.sampling import sample_requests
from capacity.simulator import SERVED, simulate
from capacity.workload import PROFILES, TopologySetup, load_topology, load_workload
from edge_sim.roofline import SimulationError
from edge_sim.topology import Topology

KIMI = RooflineCostModel("kimi-k2", "fp8")
ONE_POP = TopologySetup(
    Topology.default().with_overrides(gpu_pops={"FRA": {"H200": 8}}), load_topology(None).network, {}
)


def agent(turns: float = 4, system: int = 3000, rate: float = 8.0, window: int = 4096):
    w = PROFILES["agent"]
    sessions = msgspec.structs.replace(
        w.sessions, system_prompt=system, window=window,
        turns=msgspec.structs.replace(w.sessions.turns, mean=turns),
    )  # fmt: skip
    return msgspec.structs.replace(
        w, sessions=sessions, arrivals=msgspec.structs.replace(w.arrivals, rate=rate), clients={"Paris": 1}
    )


def hit_rate(r) -> float:
    served = [i for i, s in enumerate(r.status) if s == SERVED]
    return sum(r.cached[i] for i in served) / sum(r.prompt[i] for i in served)


def test_a_session_is_its_conversation_so_far():
    w = agent()
    s = sample_requests(w, Topology.default(), 120, seed=3)
    assert s.times == sorted(s.times) and len(s.times) > 100
    by_session: dict[int, list[int]] = {}
    for i, sid in enumerate(s.sessions):
        by_session.setdefault(sid, []).append(i)
    assert any(len(turns) > 1 for turns in by_session.values())
    for turns in by_session.values():
        first = turns[0]
        assert s.turns[first] == 0 and s.prompts[first] > w.sessions.system_prompt
        for k, (a, b) in enumerate(itertools.pairwise(turns), start=1):
            assert s.turns[b] == k and s.tenants[b] == s.tenants[a] and s.clients[b] == s.clients[a]
            assert s.prompts[b] > s.prompts[a] + s.outputs[a]  # earlier turns, their reply, a new message
            assert s.block_ids[b] == s.block_ids[a]
        assert s.prompts[turns[-1]] + s.outputs[turns[-1]] <= w.sessions.window
    ids = s.block_ids[0]
    assert len(ids.ids) == w.sessions.system_prompt // 16 and ids.ids[0] == (s.tenants[0], "system", 0)
    assert ids.at(len(ids.ids)) == ((s.tenants[0], s.sessions[0]), len(ids.ids))
    other = next(i for i, t in enumerate(s.tenants) if t != s.tenants[0])
    assert not set(s.block_ids[other].ids) & set(ids.ids)  # never another tenant's blocks


def test_the_hit_rate_is_counted_and_rises_with_more_turns():
    rates = {}
    for turns in (1, 4):
        r = simulate(agent(turns, system=1000), KIMI, "auto", duration_s=120, seed=1, setup=ONE_POP)
        assert r.prefix_cache and all(c <= p for c, p in zip(r.cached, r.prompt, strict=True))
        rates[turns] = hit_rate(r)
    assert 0 < rates[1] < rates[4] < 1


def test_merged_runs_match_step_by_step_with_the_cache(monkeypatch):
    """Committing a steady run's blocks at its end gives the hits of committing after each step."""
    import capacity.replica as replica

    w = agent(rate=40.0)
    runs = []
    for merged in (True, False):
        monkeypatch.setattr(replica, "MERGE_RUNS", merged)
        runs.append(simulate(w, KIMI, "bf16", duration_s=40, seed=2, setup=ONE_POP, max_queue_ms=1e12))
    a, b = runs
    assert a.status == b.status and a.preempted == b.preempted and a.cached == b.cached
    assert sum(a.cached) > 0
    assert [x.steps for x in a.replicas] == [x.steps for x in b.replicas]
    assert a.e2e_ms == pytest.approx(b.e2e_ms, rel=1e-9, nan_ok=True)


def test_the_report_shows_the_hit_rate_for_sessions_only(tmp_path):
    toml = tmp_path / "agents.toml"
    toml.write_text('profile = "agent"\n[sessions]\ntenants = 2\nturns = { dist = "fixed", mean = 2 }\n')
    w = load_workload(str(toml))
    assert w.name == "agent" and w.sessions.tenants == 2 and w.sessions.system_prompt == 3000
    r = simulate(w, KIMI, "auto", duration_s=30, seed=1)
    s = summarize(r)
    assert 0 < s["overall"]["prefix_cache_hit_rate"] < 1
    assert all("prefix_cache_hit_rate" in g for g in s["pops"].values())
    chat = summarize(simulate(PROFILES["chat"], KIMI, "auto", duration_s=5, seed=1))
    assert "prefix_cache_hit_rate" not in chat["overall"] and not chat["pops"]["FRA"].get(
        "cached_prompt_tokens"
    )
    report = {
        "runs": [s], "meta": {
            "workload_description": w.describe(), "duration_s": 30, "seed": 1, "cost_model": "x",
            "slo": {"ttft_ms": 1, "tpot_ms": 1}, "pops": [], "skipped": [],
        },
    }  # fmt: skip
    table = format_table(report)
    assert "prefix cache hit rate" in table and "cache hit" in table.splitlines()[-len(s["pops"]) - 2]


@pytest.mark.parametrize(
    "body, key",
    [
        ("[sessions]\ntenants = 0\n", "sessions.tenants"),
        ("[sessions]\nsystem_prompt = 5000\n", "sessions.system_prompt"),
        ("[sessions]\nthink_s = -1.0\n", "sessions.think_s"),
    ],
)
def test_bad_sessions_name_the_key(tmp_path, body, key):
    toml = tmp_path / "bad.toml"
    toml.write_text('profile = "agent"\n' + body)
    with pytest.raises(SimulationError, match=key):
        load_workload(str(toml))
