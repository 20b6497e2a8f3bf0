"""Each model's tool-call format: the prompt a tool round trip renders to, the grammar a reply that
may call tools follows (checked with llguidance against the model's own tokenizer), and the
streaming parser that turns a reply back into content and OpenAI tool calls."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest
from tokenizers import Tokenizer

from engine.errors import InvalidRequestError
from engine.structured.choices import Choice
from engine.structured.guided import GuideCompiler, grammar_text
from engine.structured.tool_calls import (
    GLM45,
    KIMI_K2,
    check_tools,
    format_for,
    glm_raw_keys,
    guide_for,
    render_messages,
)
from engine.structured.tool_parser import ToolCallParser
from engine.structured.tool_types import ToolCall, ToolFunction
from engine.tokenizer import TextTokenizer
from runtime.ai.shape_parts import finish_reason

MODELS = Path(__file__).resolve().parents[2] / "models"
MODEL_OF = {KIMI_K2: "kimi-k2-mini", GLM45: "glm-4.5-mini"}

WEATHER = ToolFunction(
    name="get_weather",
    description="Weather in a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
CLOCK = ToolFunction(name="now")
TOOLS = [WEATHER, CLOCK]

KIMI_CALL = (
    "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Paris", "days": 2}<|tool_call_end|>'
)
KIMI_CALLS = f"<|tool_calls_section_begin|>{KIMI_CALL}<|tool_calls_section_end|>"
GLM_CALL = (
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
)
GOOD = {KIMI_K2: KIMI_CALLS, GLM45: GLM_CALL}
TWO = {
    KIMI_K2: KIMI_CALLS.replace(KIMI_CALL, KIMI_CALL + KIMI_CALL.replace(":0", ":1")),
    GLM45: f"{GLM_CALL}\n{GLM_CALL}",
}
# a call whose arguments break the schema (an unknown key; a string where an integer goes)
BAD_ARGS = {KIMI_K2: KIMI_CALLS.replace('"city"', '"town"'), GLM45: GLM_CALL.replace(">2<", ">two<")}
UNKNOWN_TOOL = {
    KIMI_K2: KIMI_CALLS.replace("get_weather", "rm_rf"),
    GLM45: GLM_CALL.replace("get_weather", "rm_rf"),
}


def test_each_model_type_has_its_format():
    assert format_for("kimi_k2") == format_for("deepseek_v3") == KIMI_K2
    assert format_for("glm4_moe") == GLM45
    assert format_for("llama") == ""


# --- prompts ----------------------------------------------------------------------------------------


ROUND_TRIP = [
    {"role": "developer", "content": "Be brief."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_abc",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"},
]


def test_plain_messages_render_as_they_went_in():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for fmt in (KIMI_K2, GLM45, ""):
        assert render_messages(fmt, messages) == messages


def test_kimi_round_trip_renders_its_own_markup():
    out = render_messages(KIMI_K2, ROUND_TRIP, TOOLS)
    assert [m["role"] for m in out] == ["tool_declare", "system", "user", "assistant", "tool"]
    declared = json.loads(out[0]["content"])
    assert [d["function"]["name"] for d in declared] == ["get_weather", "now"]
    assert out[1]["content"] == "Be brief."
    assert out[2]["content"] == "Weather in Paris?"
    assert out[3]["content"] == KIMI_CALLS
    assert out[4]["content"] == "## Return of functions.get_weather:0\nsunny"
    # and the shipped template renders them as Kimi K2's published one: the tools and the result in
    # system turns named tool_declare and tool
    prompt = TextTokenizer(MODELS / "kimi-k2-mini").apply_chat_template(out)
    assert prompt.startswith("<|im_system|>tool_declare<|im_middle|>[{")
    assert "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\nsunny<|im_end|>" in prompt
    assert KIMI_CALLS in prompt and prompt.endswith("<|im_assistant|>assistant<|im_middle|>")


def test_glm_round_trip_renders_its_own_markup():
    out = render_messages(GLM45, ROUND_TRIP, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "observation"]
    assert out[0]["content"].startswith("# Tools\n\nYou may call one or more functions")
    assert '"name": "get_weather"' in out[0]["content"]
    assert out[0]["content"].endswith("\n\nBe brief.")  # the tools and the system prompt: one turn
    assert out[2]["content"] == "\n" + GLM_CALL
    assert out[3]["content"] == "<tool_response>\nsunny\n</tool_response>"
    prompt = TextTokenizer(MODELS / "glm-4.5-mini").apply_chat_template(out)
    assert "<|observation|>\n<tool_response>" in prompt
    # an earlier assistant turn keeps GLM-4.5's empty reasoning block before its call
    assert "<|assistant|>\n<think></think>\n" + GLM_CALL + "<|observation|>" in prompt


def test_glm_results_of_one_round_share_one_observation_turn():
    two = [*ROUND_TRIP, {"role": "tool", "tool_call_id": "call_def", "content": "rain"}]
    out = render_messages(GLM45, two, TOOLS)
    assert out[-1]["content"].count("<tool_response>") == 2 and len(out) == 4


def test_tool_choice_none_declares_nothing():
    assert render_messages(KIMI_K2, [{"role": "user", "content": "hi"}], None) == [
        {"role": "user", "content": "hi"}
    ]
    assert guide_for(KIMI_K2, TOOLS, "none") is None
    assert guide_for(KIMI_K2, None, "auto") is None


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "wizard", "content": "x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}],
        },
        {"role": "user", "content": 3},
    ],
)
def test_malformed_messages_are_refused_naming_where(message):
    with pytest.raises(InvalidRequestError, match=r"messages\[0\]"):
        render_messages(GLM45, [message], TOOLS)


def test_tool_messages_need_a_format():
    with pytest.raises(InvalidRequestError, match="no tool-call format"):
        render_messages("", [{"role": "tool", "tool_call_id": "x", "content": "y"}])


# --- bounds -----------------------------------------------------------------------------------------


def test_tools_are_bounded():
    check_tools(TOOLS, KIMI_K2)
    with pytest.raises(InvalidRequestError, match="at most 128"):
        check_tools([ToolFunction(name=f"f{i}") for i in range(129)], KIMI_K2)
    with pytest.raises(InvalidRequestError, match="must match"):
        check_tools([ToolFunction(name="a.b")], KIMI_K2)
    with pytest.raises(InvalidRequestError, match="unique"):
        check_tools([CLOCK, CLOCK], KIMI_K2)
    with pytest.raises(InvalidRequestError, match="characters"):
        check_tools([ToolFunction(name="f", description="x" * 70_000)], KIMI_K2)
    with pytest.raises(InvalidRequestError, match="object schema"):
        check_tools([ToolFunction(name="f", parameters={"type": "string"})], KIMI_K2)
    with pytest.raises(InvalidRequestError, match="newline"):
        check_tools([ToolFunction(name="f", parameters={"properties": {"a</arg_key>": {}}})], GLM45)
    with pytest.raises(InvalidRequestError, match="no tool-call format"):
        check_tools(TOOLS, "")


def test_a_named_choice_must_be_declared():
    with pytest.raises(InvalidRequestError, match="tool_choice"):
        guide_for(KIMI_K2, TOOLS, "rm_rf")


# --- grammars, with llguidance against the model's tokenizer ------------------------------------------


@pytest.fixture(scope="module")
def tokenizers():
    out = {}
    for fmt, name in MODEL_OF.items():
        path = MODELS / name / "tokenizer.json"
        text = TextTokenizer(MODELS / name)
        vocab = json.loads((MODELS / name / "config.json").read_text())["vocab_size"]
        # llguidance's tokenizer as the engine builds it (the markers spelled as the model spells them)
        guides = GuideCompiler(path.read_text(), [text.eos_token_id], vocab, encode=text.encode)
        out[fmt] = (guides, Tokenizer.from_file(str(path)))
    return out


def accepts(tokenizers, fmt: str, choice: str, text: str, parallel: bool = True) -> bool:
    """Whether the grammar takes the tokens of `text` and may end there."""
    guides, hf = tokenizers[fmt]
    guide = guide_for(fmt, TOOLS, choice, parallel)
    matcher = llguidance.LLMatcher(guides.tokenizer, grammar_text(guide, guides.marker_tokens), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(hf.encode(text, add_special_tokens=False).ids) and matcher.is_accepting()


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
def test_required_takes_calls_and_nothing_else(tokenizers, fmt):
    assert accepts(tokenizers, fmt, "required", GOOD[fmt])
    assert accepts(tokenizers, fmt, "required", TWO[fmt])
    assert not accepts(tokenizers, fmt, "required", TWO[fmt], parallel=False)
    assert not accepts(tokenizers, fmt, "required", "It is sunny.")
    assert not accepts(tokenizers, fmt, "required", BAD_ARGS[fmt])
    assert not accepts(tokenizers, fmt, "required", UNKNOWN_TOOL[fmt])


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
def test_auto_takes_text_or_well_formed_calls(tokenizers, fmt):
    assert accepts(tokenizers, fmt, "auto", "It is sunny.")
    assert accepts(tokenizers, fmt, "auto", GOOD[fmt])
    assert accepts(tokenizers, fmt, "auto", "Let me look. " + GOOD[fmt])
    assert not accepts(tokenizers, fmt, "auto", BAD_ARGS[fmt])
    assert not accepts(tokenizers, fmt, "auto", GOOD[fmt] + " and more text")


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
def test_a_named_function_is_exactly_that_call(tokenizers, fmt):
    assert accepts(tokenizers, fmt, "get_weather", GOOD[fmt])
    assert not accepts(tokenizers, fmt, "now", GOOD[fmt])
    assert not accepts(tokenizers, fmt, "get_weather", TWO[fmt])


# --- the streaming parser -----------------------------------------------------------------------------


def parse(fmt: str, text: str, size: int):
    """Feed `text` in pieces of `size` characters: (content streamed, pieces, content, calls)."""
    parser = ToolCallParser(fmt, TOOLS)
    streamed, pieces = "", []
    for i in range(0, len(text), size):
        content, more = parser.feed(text[i : i + size])
        streamed += content
        pieces += more
    content, more = parser.flush()
    streamed, pieces = streamed + content, pieces + more
    return (streamed, pieces, *parser.finish()), parser


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
@pytest.mark.parametrize("size", [1, 2, 5, 13, 10_000])
def test_the_parser_streams_what_it_finishes_with(fmt, size):
    (streamed, pieces, content, calls), parser = parse(fmt, "Let me look. " + TWO[fmt], size)
    assert streamed == content == "Let me look. "
    assert [c.name for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris", "days": 2}] * 2
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert parser.complete
    firsts = [p for p in pieces if p.name is not None]
    assert [(p.index, p.id) for p in firsts] == [(0, calls[0].id), (1, calls[1].id)]
    for i, call in enumerate(calls):  # the pieces of a call join to its arguments
        assert "".join(p.arguments for p in pieces if p.index == i) == call.arguments


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
def test_markup_never_leaks_into_content(fmt):
    marker = "<|tool_calls_section_begin|>" if fmt == KIMI_K2 else "<tool_call>"
    parser = ToolCallParser(fmt, TOOLS)
    assert parser.feed("Hi " + marker[:5]) == ("Hi ", [])  # held back: it may be a marker
    content, pieces = parser.feed(marker[5:] + GOOD[fmt][len(marker) :])
    assert content == "" and pieces[0].name == "get_weather"
    assert "<" not in parser.finish()[0]


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
def test_a_held_back_lookalike_goes_out_as_text(fmt):
    start = "<|t" if fmt == KIMI_K2 else "<to"
    parser = ToolCallParser(fmt, TOOLS)
    assert parser.feed("a <") == ("a ", [])
    assert parser.feed("b> c") == ("<b> c", [])
    assert parser.feed(" " + start) == (" ", [])
    assert parser.flush() == (start, [])
    assert parser.finish() == ("a <b> c " + start, [])


def test_glm_string_arguments_stay_strings():
    text = GLM_CALL.replace(">Paris<", ">123<")
    (_, _, _, calls), _ = parse(GLM45, text, 3)
    assert json.loads(calls[0].arguments) == {"city": "123", "days": 2}


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
def test_a_call_cut_off_is_dropped_not_streamed_in_part(fmt):
    text = TWO[fmt]
    second = KIMI_CALL if fmt == KIMI_K2 else GLM_CALL
    start = text.rindex(second.replace(":0", ":1") if fmt == KIMI_K2 else second)
    for end in range(start + 1, start + len(second)):  # cut anywhere inside the second call
        (streamed, pieces, _, calls), parser = parse(fmt, text[:end], 3)
        assert len(calls) == 1 and json.loads(calls[0].arguments) == {"city": "Paris", "days": 2}, end
        assert {p.index for p in pieces} == {0} and streamed == ""
        # unfinished: a call had begun (a cut Kimi marker that may yet be the section's end is not one)
        assert parser.complete == (
            fmt == KIMI_K2 and "<|tool_calls_section_end|>".startswith(text[start:end])
        )
    # the end markers cut off after a whole call leave it whole (Kimi K2's section end)
    if fmt == KIMI_K2:
        (_, _, _, calls), parser = parse(fmt, KIMI_CALLS[:-5], 4)
        assert parser.complete and len(calls) == 1
    (_, pieces, _, calls), parser = parse(fmt, GOOD[fmt][:-45], 4)
    assert not parser.complete and calls == [] and pieces == []


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
def test_the_flush_never_pushes_markup_into_arguments(fmt):
    # measured before: `{"city": "},"}<|tool_call` came back as a call's arguments
    text = GOOD[fmt].replace("Paris", "},")
    marker = "<|tool_call_end|>" if fmt == KIMI_K2 else "</arg_value>"
    cut = text.index(marker) + 6
    (_, pieces, content, calls), parser = parse(fmt, text[:cut], 1)
    assert calls == [] and pieces == [] and content == "" and not parser.complete


def test_call_arguments_take_no_free_whitespace(tokenizers):
    # free whitespace let a model at temperature 0 write newlines until max_tokens cut the call
    assert not accepts(tokenizers, KIMI_K2, "required", KIMI_CALLS.replace('{"city": ', '{"city"\n    : '))
    assert not accepts(tokenizers, KIMI_K2, "required", KIMI_CALLS.replace('{"city"', '{ "city"'))


# --- the schema the arguments are held to ---------------------------------------------------------


def accepts_tools(tokenizers, fmt: str, tools: list[ToolFunction], text: str) -> bool:
    guides, hf = tokenizers[fmt]
    guide = guide_for(fmt, tools, "required")
    matcher = llguidance.LLMatcher(guides.tokenizer, grammar_text(guide, guides.marker_tokens), log_level=0)
    return matcher.consume_tokens(hf.encode(text, add_special_tokens=False).ids) and matcher.is_accepting()


OPEN = ToolFunction(
    name="get_weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "additionalProperties": True},
)
NAMED_ONLY = ToolFunction(
    name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}}
)
ONE_KEY = {
    KIMI_K2: KIMI_CALLS.replace(', "days": 2', ""),
    GLM45: GLM_CALL.split("<arg_key>days")[0] + "</tool_call>",
}
EXTRA_KEY = {
    KIMI_K2: KIMI_CALLS.replace('"days": 2', '"other": 0'),
    GLM45: GLM_CALL.replace("<arg_key>days", "<arg_key>other"),
}


@pytest.mark.parametrize("fmt", [KIMI_K2, GLM45])
def test_arguments_take_no_key_the_schema_never_named_unless_it_says_so(tokenizers, fmt):
    # measured before: `{"city": "...}", "-other": 0, ...` (llguidance's default lets any key in)
    assert accepts_tools(tokenizers, fmt, [NAMED_ONLY], ONE_KEY[fmt])
    assert not accepts_tools(tokenizers, fmt, [NAMED_ONLY], EXTRA_KEY[fmt])
    assert accepts_tools(tokenizers, fmt, [OPEN], EXTRA_KEY[fmt])


def test_glm_writes_an_untyped_string_enum_raw_as_the_parser_reads_it():
    tool = ToolFunction(name="f", parameters={"type": "object", "properties": {"u": {"enum": ["c", "f"]}}})
    assert glm_raw_keys(tool) == ["u"]
    text = "<tool_call>f\n<arg_key>u</arg_key>\n<arg_value>c</arg_value>\n</tool_call>"
    parser = ToolCallParser(GLM45, [tool])
    parser.feed(text)
    parser.flush()
    assert json.loads(parser.finish()[1][0].arguments) == {"u": "c"}


def test_only_the_choice_says_tool_calls():
    # a choice cut off by max_tokens says "length" even beside calls it finished before the cut
    call = ToolCall(id="call_1", name="now", arguments="{}")
    assert (
        finish_reason(Choice(text="", finish_reason="length", completion_tokens=1, tool_calls=[call]))
        == "length"
    )
    made = Choice(text="", finish_reason="tool_calls", completion_tokens=1, tool_calls=[call])
    assert finish_reason(made) == "tool_calls"
