"""JSON with a strict schema closes within max_tokens (issue 57, item 10): a guided answer that ends by
`length` still parses and follows its schema, on both shipped models, and a schema's integers stay
within what every JSON parser keeps exact unless the schema bounds them itself."""

import json
from pathlib import Path

import jsonschema_rs
import pytest

from engine.llm import LLM
from engine.sampling import SamplingParams
from engine.structured.guide import MAX_EXACT_INTEGER, Guide, bounded_integers

REPO = Path(__file__).resolve().parents[2]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["kimi-k2-mini", "glm-4.5-mini"])
def llm(request) -> LLM:
    return LLM(REPO / "models" / request.param, device="cpu")


def test_a_strict_schema_answer_parses_and_validates_at_every_seed(llm):
    # measured before the fix: seed 6 (kimi) ran a name on, seed 2 (glm) a city, both cut at 64
    # tokens as unparsable text; the issue saw integers of 60+ digits cut the same way
    prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": "Give me a person as JSON"}])
    validator = jsonschema_rs.validator_for(PERSON)
    for seed in range(8):
        params = SamplingParams(
            max_tokens=64, temperature=1.0, seed=seed, guide=Guide(kind="json_schema", schema=PERSON)
        )
        (gen,) = llm.generate([prompt], params)
        assert len(gen.token_ids) <= 64 and gen.finish_reason in ("stop", "length"), gen.text
        answer = json.loads(gen.text)  # parses, ended by the model or closed by the budget
        assert validator.is_valid(answer), (seed, gen.text)
        assert abs(answer["age"]) <= MAX_EXACT_INTEGER, (seed, gen.text)


def test_a_budget_too_small_to_write_freely_still_closes_into_the_schema(llm):
    # 20 tokens hold the closing ({"name": "", "age": 0, "city": ""} is about 14) but little more
    prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": "Give me a person as JSON"}])
    validator = jsonschema_rs.validator_for(PERSON)
    for seed in range(4):
        params = SamplingParams(
            max_tokens=20, temperature=1.0, seed=seed, guide=Guide(kind="json_schema", schema=PERSON)
        )
        (gen,) = llm.generate([prompt], params)
        assert len(gen.token_ids) <= 20 and validator.is_valid(json.loads(gen.text)), (seed, gen.text)


def test_integers_are_bounded_to_what_json_parsers_keep_exact_unless_the_schema_says():
    assert MAX_EXACT_INTEGER == 10**15 - 1 and MAX_EXACT_INTEGER < 2**53  # 15 digits, exact in a double
    out = bounded_integers(PERSON)
    assert out["properties"]["age"] == {
        "type": "integer",
        "minimum": -MAX_EXACT_INTEGER,
        "maximum": MAX_EXACT_INTEGER,
    }
    assert PERSON["properties"]["age"] == {"type": "integer"}  # the client's schema is not changed
    own = {"type": "integer", "minimum": 0, "exclusiveMaximum": 10**18}
    assert bounded_integers(own) == own  # the schema's own bounds win
    nested = {
        "type": "array",
        "items": {"anyOf": [{"type": ["integer", "null"]}, {"$ref": "#/$defs/n"}]},
        "$defs": {"n": {"type": "integer", "maximum": 5}},
    }
    out = bounded_integers(nested)
    assert out["items"]["anyOf"][0]["maximum"] == MAX_EXACT_INTEGER
    assert out["$defs"]["n"] == {"type": "integer", "maximum": 5, "minimum": -MAX_EXACT_INTEGER}


def test_the_grammar_refuses_an_integer_past_15_digits(llm):
    compiler = llm.engine.guide_compiler()

    def takes(schema, text):
        matcher = compiler.compile(Guide(kind="json_schema", schema=schema))
        tokens = compiler.tokenize(text.encode())
        return matcher.validate_tokens(tokens) == len(tokens)

    assert takes(PERSON, '{"name": "A", "age": 999999999999999, ')
    assert not takes(PERSON, '{"name": "A", "age": 1000000000000000')
    wide = {**PERSON, "properties": {**PERSON["properties"], "age": {"type": "integer", "maximum": 10**18}}}
    assert takes(wide, '{"name": "A", "age": 1000000000000000, ')  # its own bound: 19 digits allowed
