"""`edge models eval --chat`: the scorers on hand-made answers, the prompts as the edge's requests,
and one run of the whole evaluation on the tiny random model (its structure, not its scores)."""

from __future__ import annotations

import json

import pytest

from engine import SamplingParams
from quality import chat_score as score
from quality.chat_eval import Budget, Perplexity, evaluate_chat, format_table
from quality.chat_prompts import guide_of, load_prompts, request_for
from runtime.cli import main as edge
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "chat_eval"
THREE = FIXTURES / "three.jsonl"
WEATHER = {"name": "get_weather", "arguments": {"city": "Paris"}}


# --- tool calls -------------------------------------------------------------------------------------


def test_a_tool_reply_is_right_only_with_exactly_the_expected_calls():
    assert score.right("tool", {"calls": [WEATHER]}, "", [("get_weather", {"city": "Paris"})])
    assert not score.right("tool", {"calls": [WEATHER]}, "", [("get_weather", {"city": "paris"})])
    assert not score.right("tool", {"calls": [WEATHER]}, "", [("get_time", {"city": "Paris"})])
    assert not score.right("tool", {"calls": [WEATHER]}, "It is sunny in Paris.", [])
    extra = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    assert not score.right("tool", {"calls": [WEATHER]}, "", extra)
    more_args = [("get_weather", {"city": "Paris", "unit": "C"})]
    assert not score.right("tool", {"calls": [WEATHER]}, "", more_args)
    assert not score.right("tool", {"calls": [WEATHER]}, "", [("get_weather", None)])  # not an object


def test_parallel_calls_are_right_in_any_order_and_exact_in_value():
    want = {"calls": [WEATHER, {"name": "get_weather", "arguments": {"city": "Rome"}}]}
    rome_first = [("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Paris"})]
    assert score.right("parallel_tool", want, "", rome_first)
    assert not score.right("parallel_tool", want, "", rome_first[:1])
    assert not score.right("parallel_tool", want, "", [*rome_first, ("get_weather", {"city": "Rome"})])
    people = {"calls": [{"name": "book", "arguments": {"people": 2}}]}
    assert score.right("tool", people, "", [("book", {"people": 2})])
    assert not score.right("tool", people, "", [("book", {"people": 2.0})])
    assert not score.right("tool", people, "", [("book", {"people": "2"})])


def test_call_arguments_are_read_as_a_json_object():
    assert score.parse_arguments('{"city": "Paris"}') == {"city": "Paris"}
    assert score.parse_arguments('["Paris"]') is None
    assert score.parse_arguments('{"city": ') is None


# --- JSON -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "right"),
    [
        ('{"name": "Hannah", "age": 29}', True),
        ('  {"age": 29, "name": "Hannah"}\n', True),
        ('Here it is: {"name": "Hannah", "age": 29} as asked.', True),
        ('{oops} then {"name": "Hannah", "age": 29}', True),  # the first { ... } that parses
        ('{"name": "Hannah", "age": 30}', False),
        ('{"name": "Hannah", "age": "29"}', False),
        ('{"name": "Hannah", "age": 29, "city": "Oslo"}', False),
        ('{"name": "Hannah"}', False),
        ('{"name": "Hannah", "age": 29', False),  # cut off
        ("Hannah, 29", False),
    ],
)
def test_a_json_answer_must_equal_the_object(answer, right):
    assert score.right("json", {"object": {"name": "Hannah", "age": 29}}, answer, []) is right


# --- facts ------------------------------------------------------------------------------------------


def test_facts_are_answered_unless_it_does_not_know_and_correct_when_named():
    expect = {"any": ["Paris"]}
    assert score.right("fact_phrasing", expect, "The capital of France is paris.", [])
    assert not score.right("fact_seen", expect, "It is Lyon.", [])
    assert score.answered("It is Lyon.")
    assert not score.answered("I don't know.")
    assert not score.answered("I DO NOT KNOW that.")
    assert not score.answered("I don\u2019t know.")  # a typographic apostrophe
    assert not score.answered("   ")
    assert score.right("rag", {"any": ["6 am", "6:00"]}, "It opens at 6:00.", [])


def test_an_unknown_fact_is_right_when_it_says_it_does_not_know():
    assert score.right("fact_unknown", {"unknown": True}, "Sorry, I don't know your dog's name.", [])
    assert not score.right("fact_unknown", {"unknown": True}, "Your dog is called Rex.", [])


def test_a_docstring_needs_enough_whole_words():
    expect = {"words": ["join", "path", "components"], "min": 2}
    assert score.right("docstring", expect, "It joins one or more PATH components.", [])
    assert not score.right("docstring", expect, "It joins paths.", [])  # neither whole word
    assert score.words_found("close-on-exec flag", ["close-on-exec", "flag", "exe"]) == 2


# --- prose and English ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "def greet(name):",
        "class Greeter:",
        "import os",
        "from os import path",
        "return x",
        "@property",
        ">>> greet()",
        "```python",
        "if x > 1:",
        "else:",
        "    print(name)",
        "\tpass",
        "result = compute(x)",
        "x = self.value",
        "a == b",
        "int x = 1;",
    ],
)
def test_code_lines(line):
    assert score.looks_like_code(line)


@pytest.mark.parametrize(
    "line",
    [
        "Hello! I am a small language model.",
        "Return the item to the store if it is broken.",  # English, capitalised
        "For example:",
        "Here is what I would do: ask politely.",
        "x = 1 is a simple fact.",  # ' = ' alone, no call or self.
        "",
    ],
)
def test_prose_lines(line):
    assert not score.looks_like_code(line)


def test_prose_and_english_answers():
    prose = "Hi! I am a small model.\nI can help you with questions."
    assert score.right("chat", {"prose": True}, prose, [])
    assert score.right("greeting", {"prose": True}, prose, [])
    assert not score.right("chat", {"prose": True}, "Sure:\ndef f():\n    return 1", [])
    assert not score.right("chat", {"prose": True}, "  ", [])
    # prose, but not English: too few ASCII letters, or no two common words
    assert score.right("chat", {"prose": True}, "Привет, я модель.", [])
    assert not score.right("identity", {"prose": True}, "Привет, я модель.", [])
    assert not score.right("identity", {"prose": True}, "Bonjour tout le monde.", [])
    assert score.is_english("Hello, I am the model.")
    assert not score.is_english("hello hello hello")  # one common word, however often


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="poetry"):
        score.right("poetry", {}, "", [])


# --- prompts and requests ---------------------------------------------------------------------------


def test_prompts_load_per_kind_and_bad_files_are_named(tmp_path):
    prompts = load_prompts([THREE])
    assert [p.kind for p in prompts] == ["tool", "json", "greeting"]
    assert [p.id for p in load_prompts([THREE, THREE], per_kind=1)] == ["t-tool", "t-json", "t-greeting"]
    with pytest.raises(ValueError, match=r"bad_kind.jsonl:2: unknown kind 'poetry'"):
        load_prompts([FIXTURES / "bad_kind.jsonl"])
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_prompts([tmp_path / "missing.jsonl"])


def test_a_prompt_becomes_the_request_a_users_call_would():
    tool, as_json, greeting = load_prompts([THREE])
    req = request_for(tool, "m", SamplingParams(max_tokens=96, temperature=0))
    assert [t.name for t in req.tools] == ["get_weather"] and req.tool_choice == "auto"
    assert req.tools[0].parameters["required"] == ["city"] and req.params.guide is None
    guided = request_for(as_json, "m", SamplingParams()).params.guide
    assert guided.kind == "json_schema" and guided.schema["required"] == ["name", "age"]
    assert request_for(greeting, "m", SamplingParams()).thinking is False
    assert guide_of({"type": "json_object"}).kind == "json"
    assert guide_of({"type": "text"}) is None
    assert guide_of({"type": "json_schema", "json_schema": {"type": "object"}}).schema == {"type": "object"}


# --- the whole evaluation ---------------------------------------------------------------------------


def test_the_evaluation_runs_the_prompts_through_a_pop(tiny_model_dir, tmp_path):
    text = tmp_path / "heldout.txt"
    text.write_text((REPO / "models" / "eval" / "heldout.txt").read_text()[:4000])
    rows = evaluate_chat(
        tiny_model_dir,
        load_prompts([THREE]),
        kv_dtypes=["auto", "int8"],
        seeds=2,
        budget=Budget(tool=12, other=8),
        perplexity=Perplexity(context=64, windows=2, text=text),
        device="cpu",
        allow_unsigned=True,
    )
    assert [r.kv_cache_dtype for r in rows][1] == "int8" and len(rows) == 2
    for row in rows:
        assert row.counts == {"tool": 1, "json": 1, "greeting": 1}
        assert row.sampled == 2 and row.errors == 0  # the tool prompt, once per seed
        assert row.tool_greedy in (0.0, 1.0) and row.json in (0.0, 1.0) and row.english in (0.0, 1.0)
        assert row.tool_sampled in (0.0, 0.5, 1.0)
        assert row.parallel is None and row.fact_seen is None and row.prose is not None
        assert row.perplexity > 1 and row.perplexity_context == 64
    table = format_table(rows).splitlines()
    assert table[0].split()[:3] == ["weights", "kv", "tool"] and len(table) == 5
    assert table[3] == "prompts: tool 1, json 1, greeting 1; temperature-1 replies: 2"


def test_the_cli_fails_clearly_without_its_prompts(tiny_model_dir, capsys):
    assert edge(["models", "eval", str(tiny_model_dir), "--chat", "--allow-unsigned"]) == 1
    err = capsys.readouterr().err
    assert str(tiny_model_dir.parent / "eval" / "chat" / "heldout.jsonl") in err and "--prompts" in err
    bad = FIXTURES / "bad_kind.jsonl"
    assert edge(["models", "eval", str(tiny_model_dir), "--chat", "--prompts", str(bad)]) == 2
    assert "poetry" in capsys.readouterr().err


def test_the_cli_prints_and_records_json(tiny_model_dir, tmp_path, capsys):
    model = tmp_path / "tiny"
    model.symlink_to(tiny_model_dir, target_is_directory=True)  # its record lands in tmp_path/quality
    text = tmp_path / "heldout.txt"
    text.write_text((REPO / "models" / "eval" / "heldout.txt").read_text()[:4000])
    args = ["models", "eval", str(model), "--chat", "--prompts", str(THREE), "--allow-unsigned"]
    args += ["--seeds", "1", "--max-tokens", "4", "--tool-max-tokens", "8", "--contexts", "64"]
    assert edge([*args, "--text", str(text), "--max-windows", "1", "--json", "--record"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert len(rows) == 1 and rows[0]["counts"] == {"tool": 1, "json": 1, "greeting": 1}
    record = tmp_path / "quality" / "tiny.chat.json"
    assert json.loads(record.read_text()) == rows and str(record) in out.err
