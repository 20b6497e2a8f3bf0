"""The Responses request's translation into the chat inputs AIService.prepare takes, and every
refusal naming its parameter."""

import pytest

from runtime.ai.inputs import TextGenerationInputs
from runtime.ai.responses_inputs import MAX_ITEMS, ResponsesInputError, chat_inputs, decode_request


def translate(body: dict) -> dict:
    return chat_inputs(decode_request(body))


def refused(body: dict) -> ResponsesInputError:
    with pytest.raises(ResponsesInputError) as info:
        translate(body)
    assert info.value.code == 5004
    return info.value


def test_text_input_with_instructions_and_sampling():
    inputs = translate(
        {"input": "hi", "instructions": "be brief", "max_output_tokens": 9, "temperature": 0, "top_p": 0.5}
    )
    assert inputs == {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 9,
        "temperature": 0,
        "top_p": 0.5,
    }


def test_items_become_chat_messages():
    items = [
        {"role": "developer", "content": "rules"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "let me look"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"x":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": "2"},
        {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
    ]
    messages = translate({"input": items})["messages"]
    assert messages[0] == {"role": "system", "content": "rules"}
    assert messages[1] == {"role": "user", "content": "a\nb"}
    # the text and the two calls after it are one assistant turn, as chat completions carry them
    assert messages[2]["role"] == "assistant" and messages[2]["content"] == "let me look"
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[2]["tool_calls"][1] == {
        "id": "c2",
        "type": "function",
        "function": {"name": "g", "arguments": '{"x":1}'},
    }
    assert messages[3:5] == [
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "tool_call_id": "c2", "content": "2"},
    ]
    assert messages[5] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c3", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }


def _supported(key: str) -> bool:
    return key in TextGenerationInputs.__struct_fields__


def test_tools_choice_and_format_translate_or_are_refused_until_served():
    body = {
        "input": "x",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
        "tool_choice": {"type": "function", "name": "f"},
        "parallel_tool_calls": False,
        "text": {
            "format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}
        },
    }
    if not _supported("tools"):  # the chat inputs cannot carry tools yet: refused, never dropped
        assert refused(body).param == "tools"
        return
    inputs = translate(body)
    assert inputs["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}
    ]
    assert inputs["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert inputs["parallel_tool_calls"] is False
    assert inputs["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
    }


def test_plain_text_format_and_auto_or_none_choice_add_nothing():
    assert translate({"input": "x", "text": {"format": {"type": "text"}}, "tool_choice": "none"}) == {
        "messages": [{"role": "user", "content": "x"}]
    }


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "no response is stored"),
        ({"input": "x", "store": True}, "store", "no response is stored"),
        ({"input": "x", "background": True}, "background", "batch API"),
        (
            {"input": "x", "reasoning": {"effort": "high", "summary": "auto"}},
            "reasoning.summary",
            "never summarised",
        ),
        ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort", "must be one of"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type", "built-in"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice", "no tools"),
        ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice", "built-in"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type", "json_schema"),
        ({"input": "x", "frobnicate": 1}, "frobnicate", "remove it"),
        ({"instructions": "x"}, "input", "is required"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input.0.content.0",
            "text only",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type", "not served"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role", "user, system"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input.0.call_id", "call_id"),
        ({"input": []}, "input", "empty"),
        ({"input": ["x"] * (MAX_ITEMS + 1)}, "input", f"at most {MAX_ITEMS}"),
        ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "metadata", "at most 16"),
        ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens", "int"),
        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include.0", "only"),
    ],
)
def test_refusals_name_the_parameter_and_say_why(body, param, words):
    exc = refused(body)
    assert exc.param == param and words in exc.detail, exc.detail


def test_reasoning_effort_none_and_store_false_are_accepted():
    assert translate(
        {"input": "x", "reasoning": {"effort": "none"}, "store": False, "metadata": {"k": "v"}, "user": "u"}
    )


def test_a_reasoning_effort_switches_thinking_in_the_chat_inputs():
    assert translate({"input": "x", "reasoning": {"effort": "high"}})["reasoning_effort"] == "high"
    assert "reasoning_effort" not in translate({"input": "x"})


def test_logprobs_are_asked_for_by_include_or_by_top_logprobs():
    assert "logprobs" not in translate({"input": "x"})
    included = translate({"input": "x", "include": ["message.output_text.logprobs"]})
    assert included["logprobs"] is True and included["top_logprobs"] == 0
    alternatives = translate({"input": "x", "top_logprobs": 3})
    assert alternatives["logprobs"] is True and alternatives["top_logprobs"] == 3
