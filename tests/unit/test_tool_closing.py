"""Tool calls closed within the token budget (engine.structured.tool_close, GuideState in
engine.structured.guided): cut a
well-formed reply anywhere and the plan closes it into calls that parse and follow their schemas;
a sampler that wanders (random logits under the grammar's mask) ends every trial with whole,
valid calls or with no call at all, never one cut off. Also the schema the arguments are held to
(engine.structured.tool_schema: no keys the schema never named) and its check. No server, no model weights:
llguidance against the miniatures' own tokenizers."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import llguidance.torch as llg_torch
import pytest
import torch

from engine.structured.guided import GuideBatch, GuideCompiler, GuideState
from engine.structured.tool_calls import GLM45, KIMI_K2, arguments_schema, guide_for
from engine.structured.tool_close import CallTracker
from engine.structured.tool_parser import ToolCallParser
from engine.structured.tool_schema import check, closed
from engine.structured.tool_types import ToolFunction
from engine.tokenizer import TextTokenizer

MODELS = Path(__file__).resolve().parents[2] / "models"
MODEL_OF = {KIMI_K2: "kimi-k2-mini", GLM45: "glm-4.5-mini"}

WEATHER = ToolFunction(
    name="get_weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
FORECAST = ToolFunction(
    name="forecast",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},  # (GLM-4.5 writes it as JSON: bounded)
            "note": {"type": "string"},  # (GLM-4.5 writes it raw)
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "opts": {
                "type": "object",
                "properties": {
                    "hourly": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["tags"],
            },
        },
        "required": ["city", "unit", "opts"],
    },
)
NOW = ToolFunction(name="now")
TOOLS = [WEATHER, FORECAST, NOW]
ARGS = {
    "city": 'Se"oul <|tool_call_end|> </arg_value',
    "note": "a <|tool_call_end|> </arg_valu",
    "unit": "celsius",
    "days": 3,
    "opts": {"tags": ["a"]},
}
# a Kimi call's strings may not hold Kimi's own markers (the grammar refuses them: issue 57, item 11),
# only text near them: a marker cut short, and the other family's
KIMI_ARGS = {**ARGS, "city": 'Se"oul <|tool_call_end| </arg_value>', "note": "a </tool_call> <|tool_call_end"}
ARGS_OF = {KIMI_K2: KIMI_ARGS, GLM45: ARGS}
REPLY = {
    KIMI_K2: "<|tool_calls_section_begin|><|tool_call_begin|>functions.forecast:0<|tool_call_argument_begin|>"
    + json.dumps(KIMI_ARGS, separators=(", ", ": "))
    + "<|tool_call_end|><|tool_call_begin|>functions.now:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
    "<|tool_calls_section_end|>",
    GLM45: '<tool_call>forecast\n<arg_key>city</arg_key>\n<arg_value>"Se\\"oul <|tool_call_end|> </arg_value"'
    "</arg_value>\n<arg_key>note</arg_key>\n<arg_value>a <|tool_call_end|> </arg_valu</arg_value>\n"
    "<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n<arg_key>days</arg_key>\n"
    '<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{"tags": ["a"]}</arg_value>\n'
    "</tool_call>\n<tool_call>now\n</tool_call>",
}


@pytest.fixture(scope="module")
def compilers():
    out = {}
    for fmt, name in MODEL_OF.items():
        tok = TextTokenizer(MODELS / name)
        vocab = json.loads((MODELS / name / "config.json").read_text())["vocab_size"]
        # as the engine builds it: the model's own tokenizer canonical for the markers
        out[fmt] = GuideCompiler(tok._tok.to_str(), [tok.eos_token_id], vocab, encode=tok.encode)  # noqa: SLF001
    return out


def valid_calls(fmt: str, text: str, tools=TOOLS, choice="required", parallel=True):
    """(the calls, whether every call begun ended): each call's arguments checked with jsonschema."""
    parser = ToolCallParser(fmt, tools, choice, parallel)
    parser.feed(text)
    parser.flush()
    _, calls = parser.finish()
    by_name = {t.name: t for t in tools}
    for call in calls:
        schema = arguments_schema(by_name[call.name])
        assert jsonschema_rs.validator_for(schema).is_valid(json.loads(call.arguments)), call
    assert parser.rejected == 0, text
    return calls, parser.complete


def state_for(compiler, guide, budget):
    return GuideState(compiler.compile(guide), compiler, budget, guide.calls)


def plan_text(compiler, plan):
    return b"".join(compiler.token_bytes(t) for t in plan if t != compiler.eos).decode()


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
def test_the_whole_reply_is_what_the_parser_returns(compilers, fmt):
    calls, complete = valid_calls(fmt, REPLY[fmt])
    assert complete and [c.name for c in calls] == ["forecast", "now"]
    assert json.loads(calls[0].arguments) == ARGS_OF[fmt]  # marker-like text inside the strings stays text


def test_the_parser_reads_a_kimi_marker_inside_a_json_string_as_text():
    # what no grammar of ours lets through may still come from an upstream's model: parsed, not cut
    reply = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.forecast:0<|tool_call_argument_begin|>"
        + json.dumps(ARGS, separators=(", ", ": "))
        + "<|tool_call_end|><|tool_calls_section_end|>"
    )
    calls, complete = valid_calls(KIMI_K2, reply)
    assert complete and json.loads(calls[0].arguments) == ARGS


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
@pytest.mark.parametrize("choice", ["required", "auto"])
def test_cut_anywhere_the_plan_closes_into_valid_calls(compilers, fmt, choice):
    compiler = compilers[fmt]
    guide = guide_for(fmt, TOOLS, choice)
    reply = REPLY[fmt] if choice == "required" else "Looking. " + REPLY[fmt]
    tokens = compiler.tokenize(reply.encode())
    for cut in range(len(tokens) + 1):
        state = state_for(compiler, guide, 10_000)
        for token in tokens[:cut]:
            assert state.consume(token) is None
        prefix = b"".join(compiler.token_bytes(t) for t in tokens[:cut]).decode()
        matcher = state.matcher.deep_copy()
        plan = state._plan_from(matcher, state.tracker.copy())  # noqa: SLF001
        assert plan is not None, prefix
        assert matcher.is_stopped() or matcher.is_accepting(), (prefix, plan_text(compiler, plan))
        calls, complete = valid_calls(fmt, prefix + plan_text(compiler, plan), choice=choice)
        assert complete, (prefix, plan_text(compiler, plan))
        if "<|tool_call_begin|>" in prefix or "<tool_call>" in prefix:
            assert calls  # a call begun is closed, not dropped


def wander(compiler, guide, budget: int, seed: int, fmt: str) -> tuple[str, bool]:
    """A sampler with random logits under the guide's mask, as the engine runs one (GuideBatch):
    (the text, whether it ended before the budget ran out)."""
    state = state_for(compiler, guide, budget)
    gen = torch.Generator().manual_seed(seed)
    out = b""
    for _ in range(budget):
        batch = GuideBatch(compiler, [0], [state])
        logits = torch.randn(1, compiler.vocab_size, generator=gen) * 3
        assert batch.apply(logits) == [None]
        token = int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=gen))
        assert state.consume(token) is None
        if token == compiler.eos:
            return out.decode(errors="replace"), True
        out += compiler.token_bytes(token)
        if state.complete:
            return out.decode(errors="replace"), True
    return out.decode(errors="replace"), False


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
@pytest.mark.parametrize(
    ("tools", "choice", "parallel"),
    [
        ([WEATHER], "required", True),
        (TOOLS, "required", True),
        (TOOLS, "forecast", False),
        (TOOLS, "auto", True),
    ],
)
def test_a_wandering_sampler_ends_with_whole_calls_or_none(compilers, fmt, tools, choice, parallel):
    compiler = compilers[fmt]
    guide = guide_for(fmt, tools, choice, parallel)
    for budget in (32, 96, 240):  # (the dearest function's shortest call: about 106 tokens)
        for seed in range(3):
            text, ended = wander(compiler, guide, budget, seed, fmt)
            calls, complete = valid_calls(fmt, text, tools, choice, parallel)  # every call valid
            # never a call begun without room for it, after whole ones (the reserve between calls)
            assert complete or not calls, text
            assert len(calls) <= (8 if parallel else 1)
            if choice != "auto" and budget == 240:  # room for any call: the budget closes it
                assert ended and calls and complete, text
            if not ended:  # cut by max_tokens: no call returned
                assert not calls or complete, text


ONE_CALL = {
    KIMI_K2: "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|>',
    GLM45: "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>",
}


SHORTEST_FORECAST = {
    KIMI_K2: "<|tool_call_begin|>functions.forecast:1<|tool_call_argument_begin|>"
    '{"city": "", "unit": "celsius", "opts": {"tags": []}}<|tool_call_end|><|tool_calls_section_end|>',
    GLM45: '\n<tool_call>forecast\n<arg_key>city</arg_key>\n<arg_value>""</arg_value>\n'
    "<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n"
    '<arg_key>opts</arg_key>\n<arg_value>{"tags": []}</arg_value>\n</tool_call>',
}


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
def test_between_calls_another_starts_only_with_room_for_a_whole_one(compilers, fmt):
    compiler = compilers[fmt]
    guide = guide_for(fmt, TOOLS, "required", True)
    end = compiler.tokenize(b"<|tool_calls_section_end|>") if fmt == KIMI_K2 else [compiler.eos]
    outcomes = {}
    for left in (len(end) + 10, 400):
        state = state_for(compiler, guide, 10_000)
        for token in compiler.tokenize(ONE_CALL[fmt].encode()):
            assert state.consume(token) is None
        assert state.tracker.between
        state.left = left
        outcomes[left] = state.closing_token()
    # short of the dearest call (forecast: ~45 tokens): the reply's end is forced; with room, free
    assert outcomes == {len(end) + 10: end[0], 400: None}
    # the reserve holds the shortest whole forecast call (and the reply's end), priced at most a
    # fifth over it
    shortest = compiler.tokenize(SHORTEST_FORECAST[fmt].encode())
    assert len(shortest) <= state._reserve_here() <= 1.25 * len(shortest)  # noqa: SLF001


def test_the_tracker_hints_the_markup_that_closes():
    kimi = CallTracker(KIMI_K2, ["get_weather"], opened=True)
    assert kimi.hint() == b"<|tool_calls_section_begin|><|tool_call_begin|>"
    kimi.feed(b"<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0")
    assert kimi.hint() == b"<|tool_call_argument_begin|>"
    kimi.feed(b'<|tool_call_argument_begin|>{"city": "Se')
    assert kimi.hint() == b'"}<|tool_call_end|><|tool_calls_section_end|>'
    kimi.feed(b'oul"}<|tool_call_end|>')
    assert kimi.between and kimi.hint() == b"<|tool_calls_section_end|>"
    glm = CallTracker(GLM45, ["get_weather"], {"get_weather": ["city", "n"]}, {"get_weather": ["city"]})
    glm.feed(b"<tool_call>get_weather\n<arg_key>n</arg_key>\n<arg_value>[1, ")
    assert glm.hint() == b"0]</arg_value>\n</tool_call>"
    glm.feed(b"2]</arg_value>\n<arg_key>city</arg_key>\n<arg_value>Seoul</arg_")
    assert glm.hint() == b"value>\n</tool_call>"
    glm.feed(b"value>\n</tool_call>")
    assert glm.between and glm.hint() == b""
    glm.feed(b"\nx")
    assert glm.lost  # not the format: it closes nothing


def test_objects_take_no_keys_their_schema_never_named():
    schema = closed(FORECAST.parameters)
    assert (
        schema["additionalProperties"] is False
        and schema["properties"]["opts"]["additionalProperties"] is False
    )
    assert closed({"type": "object", "properties": {}, "additionalProperties": True})["additionalProperties"]
    assert "additionalProperties" not in closed({"type": "object"})  # free-form: it names none
    assert check({"city": "x", "unit": "celsius", "opts": {"tags": []}}, schema) is None
    for bad in (
        {"city": "x", "unit": "celsius", "opts": {"tags": []}, "other": 0},  # a key never named
        {"city": "x", "unit": "kelvin", "opts": {"tags": []}},
        {"city": "x" * 41, "unit": "celsius", "opts": {"tags": []}},
        {"city": "x", "unit": "celsius", "days": 0, "opts": {"tags": []}},
        {"city": "x", "unit": "celsius", "days": 2.5, "opts": {"tags": []}},
        {"city": "x", "unit": "celsius", "opts": {"tags": [1]}},
        {"city": "x", "unit": "celsius"},
    ):
        assert check(bad, schema) is not None, bad
        assert not jsonschema_rs.validator_for(schema).is_valid(bad)  # (the check agrees with jsonschema)


OPTIONAL = ToolFunction(  # after `city`, the next key or the call's end
    name="f",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "day": {"type": "string"}},
        "required": ["city"],
    },
)
# where two markers may come next: after a whole Kimi call; after a GLM value, one optional key left
AFTER = {
    KIMI_K2: (ONE_CALL[KIMI_K2], ["<|tool_call_begin|>", "<|tool_calls_section_end|>"]),
    GLM45: (
        "<tool_call>f\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n",
        ["<arg_key>", "</tool_call>"],
    ),
}


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
def test_where_markers_share_a_start_the_model_may_write_them_as_its_own_tokens(compilers, fmt):
    # the grammar names each marker's token: a literal there would have llguidance force the shared
    # start ("<|tool_call", "<") in its own tokenization, letter by letter, which the model never saw
    compiler = compilers[fmt]
    written, markers = AFTER[fmt]
    state = state_for(compiler, guide_for(fmt, [*TOOLS, OPTIONAL], "required", True), 10_000)
    for token in compiler.tokenize(written.encode()):
        assert state.consume(token) is None
    mask = llg_torch.allocate_token_bitmask(1, compiler.vocab_size)
    llg_torch.fill_next_token_bitmask(state.matcher, mask, 0)
    allowed = {t for t in range(compiler.vocab_size) if (int(mask[0][t // 32]) >> (t % 32)) & 1}
    tokens = [compiler.tokenize(m.encode()) for m in markers]
    assert all(len(t) == 1 for t in tokens)  # (the markers are tokens of their own)
    assert allowed == {t[0] for t in tokens}  # and nothing spells them
