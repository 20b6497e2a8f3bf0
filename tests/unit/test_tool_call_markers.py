"""A tool call's argument never spells its family's own markup (issue 57, item 11): a GLM-4.5
calculator call once came back with `</tool_call>\\n<tool_call>calculator\\n<arg_key>...` inside
its expression. The grammar (engine.structured.tool_calls) refuses every marker's text inside a
value, whether the model writes the marker's own token or spells it byte by byte."""

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.llm import LLM
from engine.sampling import SamplingParams
from engine.structured.tool_calls import GLM45, KIMI_K2, MARKERS, format_for, guide_for, render_messages
from engine.structured.tool_parser import ToolCallParser
from engine.structured.tool_schema import excluding_pattern, without_markers
from engine.structured.tool_types import ToolFunction

REPO = Path(__file__).resolve().parents[2]
CALCULATOR = ToolFunction(
    name="calculator",
    description="Evaluate an arithmetic expression",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
)
WEATHER = ToolFunction(
    name="get_weather",
    description="Weather in a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
# a JSON-valued argument (GLM writes it as JSON, not raw) with a string inside and an untyped value
NOTE = ToolFunction(
    name="note",
    parameters={
        "type": "object",
        "properties": {"body": {"type": "object", "properties": {"text": {"type": "string"}}}, "extra": {}},
        "required": ["body", "extra"],
    },
)


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
@settings(max_examples=300, deadline=None)
@given(text=st.data())
def test_the_pattern_matches_exactly_the_strings_without_a_marker(fmt, text):
    markers = MARKERS[fmt]
    alphabet = sorted(set("".join(markers)) | set("x \n"))
    pieces = st.one_of(st.sampled_from(markers), st.text(alphabet=alphabet, max_size=4))
    value = "".join(text.draw(st.lists(pieces, max_size=6)))
    matched = re.fullmatch(excluding_pattern(markers)[1:-1], value, re.S) is not None
    assert matched == (not any(m in value for m in markers)), value


def test_every_string_the_schema_lets_the_model_write_gets_the_pattern_and_the_clients_own_stay():
    pattern = excluding_pattern(MARKERS[GLM45])
    schema = {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "own": {"type": "string", "pattern": "^[a-z]+$"},
            "either": {"type": ["string", "null"]},
            "pick": {"enum": ["<tool_call>"]},  # the client's own value: left alone
            "any": {},
        },
    }
    out = without_markers(schema, MARKERS[GLM45])
    props = out["properties"]
    assert props["s"] == {"type": "string", "pattern": pattern}
    assert props["own"] == {"allOf": [schema["properties"]["own"], {"type": "string", "pattern": pattern}]}
    assert {"type": "string", "pattern": pattern} in props["either"]["anyOf"]
    assert props["pick"] == {"enum": ["<tool_call>"]} and props["any"]["$ref"].startswith("#/$defs/")
    assert schema["properties"]["s"] == {"type": "string"}  # the client's schema is not changed


@pytest.fixture(scope="module", params=["kimi-k2-mini", "glm-4.5-mini"])
def llm(request) -> LLM:
    return LLM(REPO / "models" / request.param, device="cpu")


def _call(fmt: str, tool: str, arguments: dict, glm_raw: str | None = None) -> tuple[str, str]:
    """A whole call's text split where the value under test begins: (before, after) around it."""
    if fmt == KIMI_K2:
        head = (
            f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{tool}:0<|tool_call_argument_begin|>"
        )
        text = json.dumps(arguments)
        cut = text.index("VALUE")
        return head + text[:cut], text[cut + 5 :] + "<|tool_call_end|><|tool_calls_section_end|>"
    if glm_raw is not None:
        head = f"<tool_call>{tool}\n<arg_key>{glm_raw}</arg_key>\n<arg_value>"
        return head, "</arg_value>\n</tool_call>"
    (key, value) = next(iter(arguments.items()))
    text = json.dumps(value)
    cut = text.index("VALUE")
    head = f"<tool_call>{tool}\n<arg_key>{key}</arg_key>\n<arg_value>{text[:cut]}"
    return head, text[cut + 5 :] + "</arg_value>\n</tool_call>"


def _takes(compiler, guide, before: str, value_tokens: list[int], after: str) -> bool:
    matcher = compiler.compile(guide)
    tokens = compiler.tokenize(before.encode()) + value_tokens + compiler.tokenize(after.encode())
    return matcher.validate_tokens(tokens) == len(tokens)


def test_the_grammar_refuses_each_marker_inside_a_value_however_it_is_spelled(llm):
    compiler = llm.engine.guide_compiler()
    fmt = format_for(llm.config.model_type)
    cases = [  # (tool, the call's text around the value)
        (CALCULATOR, _call(fmt, "calculator", {"expression": "VALUE"}, glm_raw="expression")),
        (NOTE, _call(fmt, "note", {"body": {"text": "VALUE"}})),  # a string inside JSON
    ]
    for tool, (before, after) in cases:
        if tool is NOTE:
            after = after.replace(
                "</tool_call>", "<arg_key>extra</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"
            )
            after = after.replace("}<|tool_call_end|>", ', "extra": 1}<|tool_call_end|>')
        guide = guide_for(fmt, [tool], "required")
        for plain in ("29 * 157", "a < b, c > d", "<tool", "tool_call"):
            assert _takes(compiler, guide, before, compiler.tokenize(plain.encode()), after), (
                tool.name,
                plain,
            )
        for marker in MARKERS[fmt]:
            value = f"29 {marker} 157"
            as_tokens = compiler.tokenize(value.encode())  # the marker as its own token
            by_bytes = [t for ch in value for t in compiler.tokenize(ch.encode())]  # spelled out
            assert not _takes(compiler, guide, before, as_tokens, after), (tool.name, marker)
            assert not _takes(compiler, guide, before, by_bytes, after), (tool.name, marker, "spelled")


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


QUESTIONS = [
    "What is 29 * 157?",
    "Compute 12 + 30 - 7.",
    "What's the weather in Paris?",
    "Weather in Tomsk and in Lima?",
]


def test_sampled_calls_at_temperature_1_never_carry_a_marker_in_an_argument(llm):
    # measured before the fix, these 48 seeded trials a model: one GLM call whose city held
    # "<tool_call>get_weather\n<arg_key>calculator ...", one Kimi call whose expression held
    # "get_weather:1<|tool_call_argument_begin|>{"
    fmt = format_for(llm.config.model_type)
    tools = [CALCULATOR, WEATHER]
    calls_seen = 0
    for asked in QUESTIONS:
        prompt = llm.tokenizer.apply_chat_template(
            render_messages(fmt, [{"role": "user", "content": asked}], tools)
        )
        for seed in range(12):
            params = SamplingParams(
                max_tokens=96, temperature=1.0, seed=seed, guide=guide_for(fmt, tools, "required")
            )
            (gen,) = llm.generate([prompt], params)
            parser = ToolCallParser(fmt, tools)
            parser.feed(gen.text)
            parser.flush()
            _, calls = parser.finish()
            for call in calls:
                calls_seen += 1
                for text in _strings(json.loads(call.arguments)):
                    assert not any(m in text for m in MARKERS[fmt]), (asked, seed, text)
    assert calls_seen >= 40  # the trials did call (48 trials, about one call each)
