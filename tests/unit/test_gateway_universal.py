"""AI Gateway's universal run (runtime.ai.gateway.Gateways.universal, runtime.ai.gateway_universal):
steps in Cloudflare's universal shape tried in turn until one answers, `cf-aig-step` naming it; a
provider this edge cannot reach is that step's failure and the chain goes on; every step failing is
an error listing each; a step's cf-aig-* headers set its options; cf-aig-edge-pop prefers a PoP."""

from __future__ import annotations

import types

import pytest

from edge_sim.topology import Topology
from tests.unit.gateway_fakes import MODEL, POP, call, close_gateways, make_gateways, run
from workers import AIError


@pytest.fixture
def gw(tmp_path):
    gateways = make_gateways(tmp_path)
    yield gateways
    close_gateways(gateways)


def step(prompt="x", model=MODEL, **headers):
    return {"provider": "workers-ai", "endpoint": model, "headers": headers, "query": {"prompt": prompt}}


def test_the_second_step_answers_when_the_first_fails(gw):
    gw.ai.fail = [3040]
    out = run(gw.universal(call(), "gw", [step("first"), step("second")]))
    assert out.step == 1 and ("cf-aig-step", "1") in out.headers and gw.ai.calls == 2
    assert gw.ai.seen[1].inputs == {"prompt": "second"}
    rows = {r["step"]: r for r in run(gw.logs("acct", "gw"))}
    assert rows[0]["success"] is False and rows[1]["success"] is True and rows[1]["id"] == out.log_id


def test_an_unreachable_provider_is_skipped_and_a_single_dict_is_one_step(gw):
    openai = {"provider": "openai", "endpoint": "chat/completions", "headers": {}, "query": {}}
    out = run(gw.universal(call(), "gw", [openai, step()]))
    assert out.step == 1 and gw.ai.calls == 1
    alone = run(gw.universal(call(), "gw", step("alone")))
    assert alone.step == 0 and ("cf-aig-step", "0") in alone.headers


def test_every_step_failing_lists_each_failure(gw):
    openai = {"provider": "openai", "endpoint": "chat/completions", "headers": {}, "query": {}}
    gw.ai.fail = [3040]
    with pytest.raises(AIError) as failed:
        run(gw.universal(call(), "gw", [openai, {"provider": "workers-ai", "endpoint": ""}, step()]))
    text = str(failed.value)
    assert text.startswith("3040: every step of the universal run failed")
    assert "step 0: 3040: provider 'openai' cannot be reached from this edge" in text
    assert "step 1: 5004: endpoint: the model to run" in text and "step 2: 3040: scripted failure" in text


def test_a_steps_headers_set_its_options(gw):
    cached = step(**{"cf-aig-cache-ttl": "60"})
    run(gw.universal(call(), "gw", [cached]))
    assert run(gw.universal(call(), "gw", [cached])).cache_status == "HIT" and gw.ai.calls == 1
    gw.ai.fail = [3040]
    retried = step("r", **{"cf-aig-max-attempts": "2", "cf-aig-retry-delay": "10"})
    assert run(gw.universal(call(), "gw", [retried])).step == 0 and gw.sleep.waited == [0.01]
    with pytest.raises(AIError, match="headers.cf-aig-cache-ttl: 'soon' does not read as cacheTtl"):
        run(gw.universal(call(), "gw", [step(**{"cf-aig-cache-ttl": "soon"})]))


def test_a_step_may_prefer_a_pop_the_edge_has_and_fails_for_one_it_has_not(gw):
    nrt = Topology.default().pop("NRT")
    node = types.SimpleNamespace(code="NRT", pop=nrt, serves=lambda model: model == MODEL)
    gw.ai.edge = types.SimpleNamespace(nodes={"NRT": node})
    gw.ai.resolve = lambda model: model
    out = run(
        gw.universal(call(), "gw", [step(**{"cf-aig-edge-pop": "LAX"}), step(**{"cf-aig-edge-pop": "nrt"})])
    )
    assert out.step == 1 and gw.ai.seen[-1].ingress.code == "NRT"  # the call entered the edge there
    with pytest.raises(AIError, match="PoP NRT does not serve 'other'"):
        run(gw.universal(call(), "gw", [step(model="other", **{"cf-aig-edge-pop": "NRT"})]))
    assert run(gw.universal(call(), "gw", [step()])) and gw.ai.seen[-1].ingress == POP  # none asked


def test_a_bad_gateway_id_or_too_many_steps_is_refused(gw):
    with pytest.raises(AIError, match="^5004: env.AI.gateway"):
        run(gw.universal(call(), "no spaces", [step()]))
    with pytest.raises(AIError, match="give 1 to 8 requests"):
        run(gw.universal(call(), "gw", [step()] * 9))


def test_get_url_names_the_gateways_door_and_refuses_a_provider_it_cannot_reach(gw):
    base = "http://127.0.0.1:8787/cdn-cgi/ai-gateway/v1/acct/gw"
    assert gw.url("acct", "gw", None, "http://127.0.0.1:8787/") == base
    assert gw.url("acct", "gw", "compat", "http://127.0.0.1:8787") == base + "/compat"
    with pytest.raises(AIError, match="^5004: getUrl: provider 'openai' cannot be reached from this edge"):
        gw.url("acct", "gw", "openai", "http://127.0.0.1:8787")
