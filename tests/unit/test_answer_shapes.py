"""Which shape `env.AI.run` (and `POST .../ai/run/{model}`) answers in depends on the model's name, as
on Cloudflare (issue 57, item 6): each name the shipped catalog serves is held here to the output
schema Cloudflare publishes for it, and the README and every template that calls a model say
which shape its name gives.

The published schemas are written below as small JSON schemas, each with its source:
`@cloudflare/workers-types`' `AiModels` maps a name to a `Base_Ai_...` class whose
`postProcessedOutputs` is the answer's type. Read there: `@cf/moonshotai/kimi-k2.5`
(`Base_Ai_Cf_Moonshotai_Kimi_K2_5`) and `@cf/zai-org/glm-4.7-flash`
(`Base_Ai_Cf_Zai_Org_Glm_4_7_Flash`) answer `ChatCompletionsOutput`;
`@cf/meta/llama-3.3-70b-instruct-fp8-fast` answers `Ai_Cf_Meta_Llama_3_3_70B_Instruct_Fp8_Fast_Output`
(the text-generation shape every other listed name's stand-in answers here). Assumed, not read:
`@cf/moonshotai/kimi-k2.6` (`Base_Ai_Cf_Moonshotai_Kimi_K2_6`) answers `ChatCompletionsOutput` as
K2.5 does (its model page shows the same OpenAI chat completion). The `@edge/...` names are this
project's: the catalog gives Kimi's miniature Workers AI's text-generation shape and GLM's the chat
completion, and they are held to those.
"""

import asyncio
import re
from pathlib import Path

import jsonschema_rs
import pytest

from edge_sim.edge import Edge
from edge_sim.network import NetworkModel
from edge_sim.pop import ModelSpec
from edge_sim.topology import Topology
from runtime.ai.catalog import alias_map, load_catalog
from runtime.ai.service import AIService
from runtime.cli.templates import TEMPLATES

REPO = Path(__file__).resolve().parents[2]
NUMBER = {"type": "number"}
STRING = {"type": "string"}

# @cloudflare/workers-types, `ChatCompletionsOutput` with `ChatCompletionChoice` and
# `ChatCompletionResponseMessage` (required fields only, as typed: `usage` is optional there)
CHAT_COMPLETIONS_OUTPUT = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": STRING,
        "object": STRING,
        "created": NUMBER,
        "model": STRING,
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "message", "finish_reason", "logprobs"],
                "properties": {
                    "index": NUMBER,
                    "message": {
                        "type": "object",
                        "required": ["role", "content", "refusal"],
                        "properties": {
                            "role": {"const": "assistant"},
                            "content": {"type": ["string", "null"]},
                            "refusal": {"type": ["string", "null"]},
                            "tool_calls": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["id", "type", "function"],
                                    "properties": {
                                        "id": STRING,
                                        "type": {"const": "function"},
                                        "function": {
                                            "type": "object",
                                            "required": ["name", "arguments"],
                                            "properties": {"name": STRING, "arguments": STRING},
                                        },
                                    },
                                },
                            },
                        },
                    },
                    "finish_reason": {
                        "enum": ["stop", "length", "tool_calls", "content_filter", "function_call"]
                    },
                    "logprobs": {"type": ["object", "null"]},
                },
            },
        },
        "usage": {
            "type": "object",
            "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
            "properties": {"prompt_tokens": NUMBER, "completion_tokens": NUMBER, "total_tokens": NUMBER},
        },
    },
}
# @cloudflare/workers-types, `Ai_Cf_Meta_Llama_3_3_70B_Instruct_Fp8_Fast_Output` (its object form;
# Workers AI's text-generation answer)
TEXT_GENERATION_OUTPUT = {
    "type": "object",
    "required": ["response"],
    "properties": {
        "response": STRING,
        "usage": {
            "type": "object",
            "properties": {"prompt_tokens": NUMBER, "completion_tokens": NUMBER, "total_tokens": NUMBER},
        },
        "tool_calls": {
            "type": "array",
            "items": {"type": "object", "properties": {"arguments": {"type": "object"}, "name": STRING}},
        },
    },
}
SHAPES = {"chat-completions": CHAT_COMPLETIONS_OUTPUT, "text-generation": TEXT_GENERATION_OUTPUT}
# every name the shipped catalog serves, with the shape it answers in (and a stand-in's example)
KIMI, GLM = "@edge/moonshotai/kimi-k2-mini", "@edge/zai-org/glm-4.5-mini"
STAND_IN = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"
EXPECTED = {
    KIMI: "text-generation",
    GLM: "chat-completions",
    "@cf/moonshotai/kimi-k2.5": "chat-completions",
    "@cf/moonshotai/kimi-k2.6": "chat-completions",
    "@cf/zai-org/glm-4.7-flash": "chat-completions",
    STAND_IN: "text-generation",
}
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def service():
    """The AI service as `edge dev` builds it from the shipped catalog (runtime.app), on one PoP."""
    catalog = load_catalog(REPO / "models")
    aliases = alias_map(catalog, stand_ins_from=[])
    specs = [ModelSpec(name, str(folder)) for name, (_, folder) in catalog.items()]
    edge = Edge.start(Topology.default(), NetworkModel(), ["ICN"], specs, device="cpu")
    yield AIService(
        edge,
        {name: entry.schema for name, (entry, _) in catalog.items()},
        {alias: (target, a.schema) for alias, (target, a) in aliases.items()},
    )
    edge.close()


def run(service, model, inputs):
    ingress, rtt = service.edge.ingress(service.edge.locate("Seoul"))
    return asyncio.run(service.run(model, inputs, ingress=ingress, client_rtt_ms=rtt))[0]


def test_the_catalog_gives_each_name_the_shape_cloudflare_publishes():
    catalog = load_catalog(REPO / "models")
    aliases = alias_map(catalog, stand_ins_from=[])
    shapes = {name: entry.schema for name, (entry, _) in catalog.items()}
    shapes |= {alias: a.schema or catalog[target][0].schema for alias, (target, a) in aliases.items()}
    named = set(catalog) | {a.name for entry, _ in catalog.values() for a in entry.aliases}
    assert named <= set(EXPECTED)  # a new catalog name needs its published shape here
    for name, shape in EXPECTED.items():
        assert shapes[name] == shape, name


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_names_answer_follows_its_published_schema(service, name):
    validator = jsonschema_rs.validator_for(SHAPES[EXPECTED[name]])
    plain = run(service, name, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert validator.is_valid(plain), (name, list(validator.iter_errors(plain))[:3], plain)
    ask = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 48, "temperature": 0}
    called = run(service, name, {**ask, "tools": [WEATHER], "tool_choice": "required"})
    assert validator.is_valid(called), (name, list(validator.iter_errors(called))[:3], called)
    calls = called.get("tool_calls") or called.get("choices", [{}])[0]["message"].get("tool_calls")
    assert calls, called  # a call was made, in the shape's own place


def _readme_shape_rows() -> dict[str, str]:
    """The README's table of answer shapes: each name it lists -> the shape its row names."""
    rows = {}
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("| `@") and ("chat.completion" in line or '{"response"' in line):
            shape = "chat-completions" if "chat.completion" in line.split("|")[2] else "text-generation"
            for name in re.findall(r"`(@[^`]+)`", line.split("|")[1]):
                rows[name] = shape
    return rows


def test_the_readme_says_which_shape_each_name_gives():
    rows = _readme_shape_rows()
    for name, shape in EXPECTED.items():
        if name != STAND_IN:
            assert rows.get(name) == shape, (name, rows)


def test_every_template_that_calls_a_model_says_which_shape_its_name_gives():
    for name, template in TEMPLATES.items():
        worker = template.worker
        if "env.AI.run" not in worker:
            continue
        models = set(re.findall(r'"(@edge/[^"]+)"', worker)) & set(EXPECTED)
        assert models, name
        for model in models:
            said = '{"response"' if EXPECTED[model] == "text-generation" else "chat.completion"
            assert said in worker, (name, model, said)
