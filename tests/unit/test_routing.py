"""Routing by expected time to first token, spill-over, PoPs going down with their queue re-routed,
the network emulation mode, and topology overrides."""

import asyncio
import textwrap
import threading
import time

import pytest

from edge_sim.edge import Edge
from edge_sim.errors import EdgeError
from edge_sim.network import NetworkModel
from edge_sim.pop import ModelSpec
from edge_sim.request import Formats, GenerateRequest, GenerateResult
from edge_sim.topology import Topology
from engine import SamplingParams
from runtime.cli import load_topology
from runtime.control.config import ConfigError, parse_config

MODEL = "@edge/test/tiny"


@pytest.fixture
def edge(tiny_model_dir):
    e = Edge.start(
        Topology.default(),
        NetworkModel(),
        ["ICN", "NRT", "FRA"],
        [ModelSpec(MODEL, str(tiny_model_dir), allow_unsigned=True)],
        device="cpu",
    )
    yield e
    e.close()


def req(tokens=2):
    return GenerateRequest(
        model=MODEL, prompt="def f(x):", params=SamplingParams(max_tokens=tokens, temperature=0)
    )


def seoul(edge):
    return edge.ingress(edge.locate("Seoul"))


def test_the_nearest_pop_wins_until_its_queue_outweighs_the_distance(edge):
    ingress, _ = seoul(edge)
    assert edge.router.choose(MODEL, ingress, 10)[0].code == "ICN"
    # 100k prompt tokens queued at Seoul take longer than the ~30 ms hop to Tokyo
    edge.nodes["ICN"]._pending["busy"] = (MODEL, 100_000, None)
    node, rtt = edge.router.choose(MODEL, ingress, 10)
    assert node.code == "NRT" and rtt > 0


def test_full_pops_spill_and_none_left_is_3040(edge):
    ingress, _ = seoul(edge)
    edge.nodes["ICN"].max_in_flight = 0
    assert edge.router.choose(MODEL, ingress)[0].code == "NRT"
    for node in edge.nodes.values():
        node.max_in_flight = 0
    with pytest.raises(EdgeError) as err:
        edge.router.choose(MODEL, ingress)
    assert err.value.kind == "no_capacity" and "ICN full" in err.value.message


def test_a_pop_taken_down_hands_its_queue_to_the_next_best(edge):
    ingress, rtt = seoul(edge)
    icn = edge.nodes["ICN"]
    gate = threading.Event()
    real_step = icn.engines[MODEL].engine.step

    def held_step():  # ICN's engine stalls, so requests queue there
        gate.wait(timeout=30)
        return real_step()

    icn.engines[MODEL].engine.step = held_step

    async def scenario():
        tasks = [asyncio.create_task(edge.run(req(), ingress, rtt)) for _ in range(3)]
        for _ in range(200):
            if len(icn._pending) == 3:
                break
            await asyncio.sleep(0.01)
        assert len(icn._pending) == 3
        assert await icn.take_down() == 3
        return await asyncio.gather(*tasks)

    try:
        results = asyncio.run(scenario())
    finally:
        gate.set()
    assert [r.timing.pop for r in results] == ["NRT"] * 3  # re-routed, none dropped
    assert all(r.completion_tokens == 2 for r in results)
    assert not icn.up and edge.router.choose(MODEL, ingress)[0].code == "NRT"
    asyncio.run(icn.bring_up())
    assert edge.router.choose(MODEL, ingress)[0].code == "ICN"


def test_account_parts_and_network_emulation(edge):
    ingress, _ = edge.ingress(edge.locate("Berlin"))  # not a GPU PoP: the call crosses the backbone
    account = asyncio.run(edge.run(req(4), ingress, 20.0)).timing
    assert account.backbone_rtt_ms > 5
    assert account.ttft_ms == pytest.approx(
        account.client_rtt_ms + account.backbone_rtt_ms + account.queue_ms + account.prefill_ms, abs=1e-3
    )
    assert account.tpot_ms == pytest.approx(account.decode_ms / 3, abs=1e-3)
    assert account.total_ms == pytest.approx(account.ttft_ms + account.decode_ms, abs=1e-3)
    edge.emulate = True
    started = time.perf_counter()
    account = asyncio.run(edge.run(req(1), ingress, 20.0)).timing
    assert (time.perf_counter() - started) * 1000 >= account.backbone_rtt_ms * 0.95  # really waited


def test_topology_file_extends_or_replaces_the_world(tmp_path):
    (tmp_path / "worker.py").write_text("")
    (tmp_path / "topo.toml").write_text(
        textwrap.dedent("""
        [[pop]]
        code = "XLB"
        city = "Lab"
        country = "KR"
        continent = "AS"
        lat = 36.0
        lon = 127.5
        timezone = "Asia/Seoul"
        gpus = { H200 = 2 }
    """)
    )
    base = (
        'name = "w"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n[edge]\ntopology = "topo.toml"\n'
    )
    topo = load_topology(parse_config(base, base_dir=tmp_path))
    assert topo.pop("XLB").gpus == {"H200": 2} and "ICN" in topo.pops
    (tmp_path / "topo.toml").write_text((tmp_path / "topo.toml").read_text().replace("H200 = 2", "B300 = 2"))
    with pytest.raises(ConfigError, match="B300"):
        load_topology(parse_config(base, base_dir=tmp_path))
    (tmp_path / "topo.toml").write_text(
        "replace = true\n" + (tmp_path / "topo.toml").read_text().replace("B300", "H200")
    )
    assert list(load_topology(parse_config(base, base_dir=tmp_path)).pops) == ["XLB"]


def test_routing_estimates_the_prompt_length_from_its_characters():
    prompt = GenerateRequest(model=MODEL, prompt="x" * 41, params=SamplingParams())
    assert prompt.estimated_tokens() == 11
    chat = GenerateRequest(
        model=MODEL, messages=[{"role": "user", "content": "x" * 8}], params=SamplingParams()
    )
    assert chat.estimated_tokens() == 2 + 4  # content plus the template's markers around a message


def test_the_edge_answers_in_one_typed_result_with_its_formats_and_timing(edge):
    ingress, rtt = seoul(edge)
    result = asyncio.run(edge.run(req(2), ingress, rtt))
    assert isinstance(result, GenerateResult) and result.pop == "ICN" == result.timing.pop
    assert result.formats == edge.nodes["ICN"].formats(MODEL) and isinstance(result.formats, Formats)
    assert result.total_tokens == result.prompt_tokens + result.completion_tokens


def test_a_session_goes_back_to_the_pop_that_served_it_until_that_pop_is_full(edge):
    ingress, rtt = seoul(edge)

    def session_req(tenant, key):
        return GenerateRequest(
            model=MODEL, prompt="def f(x):", params=SamplingParams(max_tokens=2, temperature=0),
            tenant=tenant, session=key,
        )  # fmt: skip

    # the first call of a session lands where the queue pushed it (Tokyo: Seoul looks busy)
    edge.nodes["ICN"]._pending["busy"] = (MODEL, 100_000, None)
    first = asyncio.run(edge.run(session_req("a", "conv-1"), ingress, rtt))
    assert first.pop == "NRT"
    del edge.nodes["ICN"]._pending["busy"]
    # Seoul is the better choice now, but the session's cache is in Tokyo
    assert asyncio.run(edge.run(session_req("a", "conv-1"), ingress, rtt)).pop == "NRT"
    # another account's session with the same key is its own: normal routing
    assert asyncio.run(edge.run(session_req("b", "conv-1"), ingress, rtt)).pop == "ICN"
    # the session's PoP is full: normal routing, and the session follows to where it was served
    edge.nodes["NRT"].max_in_flight = 0
    assert asyncio.run(edge.run(session_req("a", "conv-1"), ingress, rtt)).pop == "ICN"
    edge.nodes["NRT"].max_in_flight = 64
    assert asyncio.run(edge.run(session_req("a", "conv-1"), ingress, rtt)).pop == "ICN"


def test_the_session_table_is_bounded():
    from edge_sim.affinity import SessionAffinity, check_key

    table = SessionAffinity(capacity=3)
    for i in range(10):
        table.served("a", MODEL, f"k{i}", "ICN")
    assert len(table) == 3 and table.preferred("a", MODEL, "k0") is None
    assert table.preferred("a", MODEL, "k9") == "ICN"
    assert check_key("") is None and check_key("conv-1") == "conv-1"
    with pytest.raises(ValueError, match="at most 256 printable"):
        check_key("x" * 257)
    with pytest.raises(ValueError, match="printable"):
        check_key("a\nb")
