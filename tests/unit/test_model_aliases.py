"""Cloudflare's model names (`@cf/moonshotai/kimi-k2.6`) are served by the local miniatures, and
every answer says which miniature stood in."""

import asyncio
import json
import textwrap
from pathlib import Path

import pytest

from edge_sim.edge import Edge
from edge_sim.network import NetworkModel
from edge_sim.pop import ModelSpec
from edge_sim.topology import Topology
from runtime.ai.call import AICall
from runtime.ai.catalog import alias_map, load_catalog, search_models
from runtime.ai.service import AIService
from runtime.control.config import ConfigError
from workers import AIError

REPO = Path(__file__).resolve().parents[2]
MODEL = "@edge/test/tiny"
ALIAS = "@cf/moonshotai/kimi-k2.6"


def test_the_shipped_catalog_maps_cloudflares_kimi_and_glm_names_to_the_miniatures():
    aliases = alias_map(load_catalog(REPO / "models"))
    kimi, glm = "@edge/moonshotai/kimi-k2-mini", "@edge/zai-org/glm-4.5-mini"
    assert {a: t for a, (t, _) in aliases.items()} == {
        "@cf/moonshotai/kimi-k2.5": kimi,
        "@cf/moonshotai/kimi-k2.6": kimi,
        "@cf/zai-org/glm-4.7-flash": glm,
    }
    for _, entry in aliases.values():  # Cloudflare answers these in the OpenAI ChatCompletion shape
        assert entry.schema == "chat-completions" and entry.source.startswith("https://")
        assert entry.description


def _catalog(tmp_path, body: str) -> Path:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "catalog.toml").write_text(textwrap.dedent(body))
    return tmp_path


def test_an_alias_may_name_only_one_model(tmp_path):
    folder = _catalog(
        tmp_path,
        """
        [[model]]
        name = "@edge/a"
        path = "m"
        [[model.aliases]]
        name = "@edge/a"
        """,
    )
    with pytest.raises(ConfigError, match="alias"):
        load_catalog(folder)


def test_an_alias_with_an_unknown_key_fails_with_its_path(tmp_path):
    folder = _catalog(
        tmp_path,
        """
        [[model]]
        name = "@edge/a"
        path = "m"
        [[model.aliases]]
        name = "@cf/x/y"
        schemas = "chat-completions"
        """,
    )
    with pytest.raises(ConfigError, match="schemas"):
        load_catalog(folder)


@pytest.fixture(scope="module")
def service(tiny_model_dir):
    edge = Edge.start(
        Topology.default(),
        NetworkModel(),
        ["ICN"],
        [ModelSpec(MODEL, str(tiny_model_dir), allow_unsigned=True)],
        device="cpu",
    )
    yield AIService(edge, {MODEL: "text-generation"}, {ALIAS: (MODEL, "chat-completions")})
    edge.close()


def call(service, model, inputs):
    ingress, rtt = service.edge.ingress(service.edge.locate("Seoul"))
    return asyncio.run(service.run(model, inputs, ingress=ingress, client_rtt_ms=rtt))


def test_a_call_under_the_alias_is_served_by_the_stand_in_and_says_so(service):
    body, _ = call(
        service, ALIAS, {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}
    )
    assert body["model"] == ALIAS and body["object"] == "chat.completion"  # Cloudflare's shape for it
    assert body["served_by"] == {"model": MODEL, "stand_in": True, "weights": "bf16", "kv_cache": "auto"}
    assert body["usage"]["completion_tokens"] <= 3  # max_completion_tokens, as Cloudflare's schema names it
    own, _ = call(service, MODEL, {"prompt": "def f():", "max_tokens": 2})
    assert "response" in own and own["served_by"]["model"] == MODEL and own["served_by"]["stand_in"] is False


def test_unknown_names_list_the_aliases(service):
    with pytest.raises(AIError) as err:
        call(service, "@cf/moonshotai/kimi-k9", {"prompt": "x"})
    assert err.value.code == 5007 and ALIAS in str(err.value) and MODEL in str(err.value)


def test_an_alias_whose_stand_in_is_not_served_says_which():
    edge = Edge.start(Topology.default(), NetworkModel(), ["ICN"], [], device="cpu")
    try:
        lonely = AIService(edge, {}, {"@cf/x/y": ("@edge/missing", None)})
        with pytest.raises(AIError, match=r"'@cf/x/y' \(served here by '@edge/missing'\)") as err:
            lonely.prepare("@cf/x/y", {"prompt": "x"}, "local")
        assert err.value.code == 5007
    finally:
        edge.close()


def test_a_streamed_answer_under_the_alias_ends_with_served_by(service):
    async def collect():
        ingress, rtt = service.edge.ingress(service.edge.locate("Seoul"))
        inputs = {"prompt": "def f():", "max_tokens": 2, "stream": True}
        answer = await service.answer(AICall(ALIAS, inputs, "local", None, ingress, rtt))
        return [e async for e in answer.stream]

    events = asyncio.run(collect())
    final = json.loads(events[-2].decode().removeprefix("data: "))
    assert final["model"] == ALIAS and final["object"] == "chat.completion.chunk"
    assert final["served_by"]["model"] == MODEL and final["served_by"]["stand_in"] is True


def test_model_search_filters_as_cloudflares():
    models = [
        {
            "name": "@edge/moonshotai/kimi-k2-mini",
            "description": "Kimi K2 in miniature",
            "task": {"name": "Text Generation"},
        },
        {"name": "@cf/moonshotai/kimi-k2.6", "description": "Kimi K2.6", "task": {"name": "Text Generation"}},
        {"name": "@cf/zai-org/glm-4.7-flash", "description": "GLM", "task": {"name": "Text Generation"}},
    ]
    assert [m["name"] for m in search_models(models, "KIMI", None, None)] == [
        models[0]["name"],
        models[1]["name"],
    ]
    assert search_models(models, "miniature", None, None) == [models[0]]  # the description counts too
    assert len(search_models(models, None, "text-generation", None)) == 3
    assert search_models(models, None, "Text Classification", None) == []
    assert search_models(models, None, None, "zai-org") == [models[2]]


def test_every_cloudflare_text_generation_name_has_a_stand_in_of_its_family():
    from runtime.ai.cloudflare_names import EXAMPLE_NAMES, NAMES

    catalog = load_catalog(REPO / "models")
    kimi, glm = "@edge/moonshotai/kimi-k2-mini", "@edge/zai-org/glm-4.5-mini"
    aliases = {a: t for a, (t, _) in alias_map(catalog, stand_ins_from=[]).items()}
    assert set(aliases) == set(NAMES) | set(EXAMPLE_NAMES)  # each listed name, once
    assert aliases["@cf/deepseek-ai/deepseek-v4-pro-0813"] == kimi  # MLA
    assert aliases["@cf/moonshotai/kimi-k2.7-code"] == kimi
    assert aliases["@cf/openai/gpt-oss-120b"] == glm  # GQA
    assert aliases["@cf/meta/llama-3.3-70b-instruct-fp8-fast"] == glm
    assert aliases["@cf/deepseek-ai/deepseek-r1-distill-qwen-32b"] == glm  # a Qwen underneath
    # the catalog's own aliases keep their entries (schema, source); serving one model, it stands in
    own = alias_map(catalog)
    assert all(alias_map(catalog, stand_ins_from=[])[a] == own[a] for a in own)
    only_kimi = {a: t for a, (t, _) in alias_map(catalog, stand_ins_from=[kimi]).items()}
    assert only_kimi["@cf/openai/gpt-oss-120b"] == kimi


def test_a_stand_in_name_is_served_warned_once_and_a_typo_gets_the_nearest_names(caplog):
    import logging

    catalog = load_catalog(REPO / "models")
    kimi = "@edge/moonshotai/kimi-k2-mini"
    aliases = alias_map(catalog, stand_ins_from=[kimi])

    class OneModel:  # the AI service asks the edge only which models it serves
        nodes = {"ICN": None}

        def models(self):
            return [kimi]

        def refusal(self, model):
            return None

    service = AIService(
        OneModel(), {kimi: "chat-completions"}, {a: (t, e.schema) for a, (t, e) in aliases.items()}
    )
    service.stand_ins = frozenset(aliases) - set(alias_map(catalog))
    with caplog.at_level(logging.WARNING, logger="edge.ai"):
        for _ in range(2):
            req, _ = service.prepare("@cf/openai/gpt-oss-120b", {"prompt": "a"}, "acct")
            assert req.model == kimi
    assert caplog.text.count("gpt-oss-120b is not shipped here") == 1
    with pytest.raises(AIError, match=r"^5007: no such model '@cf/openai/gpt-oss-12b'; nearest: .*gpt-oss"):
        service.prepare("@cf/openai/gpt-oss-12b", {"prompt": "a"}, "acct")
    strict = AIService(
        OneModel(), {kimi: "chat-completions"}, {a: (t, e.schema) for a, (t, e) in alias_map(catalog).items()}
    )
    with pytest.raises(AIError, match="^5007: no such model '@cf/openai/gpt-oss-120b'"):
        strict.prepare("@cf/openai/gpt-oss-120b", {"prompt": "a"}, "acct")
