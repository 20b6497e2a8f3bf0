"""Grammar-constrained decoding (engine.structured.guided) on the shipped miniatures: outputs follow their
guide, the mask is exact, and a guide that cannot go on ends its own sequence only."""

import json
import re
from pathlib import Path

import jsonschema_rs
import llguidance
import llguidance.torch as llg_torch
import pytest
import torch

from engine.errors import InvalidRequestError
from engine.llm import LLM
from engine.sampling import SamplingParams
from engine.structured.guide import Guide
from engine.structured.guided import DEAD_GRAMMAR
from engine.structured.tool_calls import arguments_schema, format_for, guide_for, render_messages
from engine.structured.tool_parser import ToolCallParser
from engine.structured.tool_types import ToolFunction

REPO = Path(__file__).resolve().parents[2]
MODELS = ["kimi-k2-mini", "glm-4.5-mini"]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}
PATTERN = r"[a-z]{3}-\d{2,4}"


@pytest.fixture(scope="module", params=MODELS)
def llm(request) -> LLM:
    return LLM(REPO / "models" / request.param, device="cpu")


def run(llm: LLM, prompts: list[str], params: SamplingParams):
    return llm.generate(prompts, params)


def test_json_schema_outputs_validate_in_20_of_20_sampled_trials(llm):
    params = SamplingParams(max_tokens=160, temperature=1.0, guide=Guide(kind="json_schema", schema=PERSON))
    gens = run(llm, ["Describe a person as JSON:"] * 20, params)  # unseeded: fresh randomness
    validator = jsonschema_rs.validator_for(PERSON)
    for gen in gens:
        assert gen.finish_reason == "stop", gen.text
        assert validator.is_valid(json.loads(gen.text)), gen.text
    assert len({g.text for g in gens}) > 1  # sampled, not one greedy answer


def test_json_schema_greedy_validates(llm):
    params = SamplingParams(max_tokens=160, temperature=0, guide=Guide(kind="json_schema", schema=PERSON))
    (gen,) = run(llm, ["A person:"], params)
    assert gen.finish_reason == "stop"
    assert jsonschema_rs.validator_for(PERSON).is_valid(json.loads(gen.text))


def test_json_mode_gives_an_object(llm):
    params = SamplingParams(max_tokens=400, temperature=0, guide=Guide(kind="json"))
    for said in ("Ana is 31.", "Tom lives in Oslo and is 40."):  # chat requests, as a user sends them
        ask = [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": said}]
        prompt = llm.tokenizer.apply_chat_template(ask)
        (gen,) = run(llm, [prompt], params)
        assert gen.finish_reason == "stop", gen.text
        assert isinstance(json.loads(gen.text), dict)


def test_json_mode_answers_are_whole_objects_at_any_budget(llm):
    # a sampled any-JSON answer can wander (in a key, down nested brackets) past any budget: once
    # only the closing tokens fit, they are forced, and the answer ends "length" but parses
    budgets = [1, 2, 3, 5, 8, 13, 30, 60]
    prompts = ["Answer in JSON:", "{", "What is the weather in Paris? Answer in JSON."]
    for max_tokens in budgets:
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, guide=Guide(kind="json"))
        for gen in run(llm, prompts * 4, params):  # unseeded: fresh randomness
            assert isinstance(json.loads(gen.text), dict), (max_tokens, gen.text)
            assert len(gen.token_ids) <= max_tokens
            assert gen.finish_reason in ("stop", "length")


def test_json_mode_says_length_when_the_budget_closed_the_object(llm):
    gens = [  # eight seeded trials (one seed shared by eight prompts would be one trial eight times)
        gen
        for seed in range(8)
        for gen in run(
            llm,
            ["Answer in JSON:"],
            SamplingParams(max_tokens=6, temperature=1.0, guide=Guide(kind="json"), seed=seed),
        )
    ]
    closed_by_budget = [g for g in gens if g.finish_reason == "length"]
    assert closed_by_budget  # measured: 6 (kimi) and 8 (glm) of these 8 are closed by the budget
    for gen in closed_by_budget:
        assert isinstance(json.loads(gen.text), dict), gen.text
        assert len(gen.token_ids) <= 6


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regex_outputs_fullmatch(llm, temperature):
    params = SamplingParams(
        max_tokens=40, temperature=temperature, guide=Guide(kind="regex", pattern=PATTERN)
    )
    for gen in run(llm, ["Code:"] * 8, params):
        assert gen.finish_reason == "stop"
        assert re.fullmatch(PATTERN, gen.text), gen.text


def allowed_set(matcher: llguidance.LLMatcher, vocab: int) -> torch.Tensor:
    """The reference: the matcher's bitmask unpacked with plain torch into a bool per token."""
    bits = llg_torch.allocate_token_bitmask(1, vocab)
    llg_torch.fill_next_token_bitmask(matcher, bits)
    unpacked = (bits[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
    return unpacked.flatten()[:vocab].bool()


def test_mask_is_exact_and_unguided_neighbours_are_unchanged(llm):
    eng = llm.engine
    plain = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = run(llm, ["The neighbour says"], plain)[0].token_ids
    guide = Guide(kind="json_schema", schema=PERSON)
    guided_params = SamplingParams(max_tokens=160, temperature=1.0, guide=guide)
    prompt = llm.encode("Describe a person as JSON:")
    rid = eng.add_request(prompt, guided_params)
    other = eng.add_request(llm.encode("The neighbour says"), plain)
    tokens = {rid: [], other: []}
    while eng.has_unfinished():
        for event in eng.step():
            if event.token_id is not None:
                tokens[event.request_id].append(event.token_id)
    assert tokens[other] == alone  # the guided row's mask touched its row only
    reference = eng.guide_compiler().compile(guide)  # a fresh matcher, replayed token by token
    for token in tokens[rid]:
        assert allowed_set(reference, llm.config.vocab_size)[token], f"token {token} was not allowed"
        assert reference.consume_token(token)
    assert reference.is_stopped()


def test_a_dead_grammar_ends_its_sequence_alone(llm):
    eng = llm.engine
    guide = Guide(kind="regex", pattern=PATTERN)
    doomed = eng.add_request(llm.encode("Code:"), SamplingParams(max_tokens=40, temperature=1.0, guide=guide))
    fine = eng.add_request(llm.encode("Code:"), SamplingParams(max_tokens=40, temperature=1.0, guide=guide))
    eng.step()  # both prefill and sample their first token
    matcher = eng.sequences(doomed)[0].guide.matcher
    vocab = llm.config.vocab_size
    matcher.consume_token(next(t for t in range(vocab) if not allowed_set(matcher, vocab)[t]))
    assert matcher.is_error()  # a matcher that cannot go on (as a grammar past its limits would be)
    ends = {}
    while eng.has_unfinished():
        for event in eng.step():
            if event.finish_reason is not None:
                ends[event.request_id] = event
    assert ends[doomed].finish_reason == "error"
    assert ends[doomed].error.startswith(DEAD_GRAMMAR + ": ")
    assert ends[fine].finish_reason == "stop" and ends[fine].error is None
    assert eng.cache.used_blocks == 0


@pytest.mark.parametrize(
    "guide",
    [
        Guide(kind="regex", pattern="((("),
        Guide(kind="json_schema", schema={"type": "objectx"}),
        Guide(kind="lark", grammar="start: undefined_rule"),
    ],
)
def test_a_guide_that_does_not_compile_is_refused_before_queueing(llm, guide):
    with pytest.raises(InvalidRequestError) as info:
        llm.engine.check_request([1, 2, 3], SamplingParams(guide=guide))
    assert info.value.param == "response_format"
    assert "does not compile" in str(info.value)
    assert not llm.engine.has_unfinished()


def test_compiled_grammars_are_cached_and_bounded(llm, monkeypatch):
    import engine.structured.guided as guided

    monkeypatch.setattr(guided, "MAX_COMPILED", 3)
    compiler = llm.engine.guide_compiler()
    for i in range(6):
        compiler.compile(Guide(kind="regex", pattern=f"a{{{i + 1}}}"))
    assert len(compiler._compiled) == 3


def test_masks_overlap_the_forward_pass_only_where_a_core_is_free(monkeypatch):
    from engine.structured.guided import overlap_masks

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert not overlap_masks(torch.device("cpu"))  # torch takes both cores: fill after the pass
    assert overlap_masks(torch.device("cuda"))  # the pass runs on the GPU: the CPU is free
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert overlap_masks(torch.device("cpu"))


def test_tool_calls_close_within_the_budget_or_end_length_with_no_call(llm):
    # the engine's own tool-call guide (engine.structured.tool_calls) on the model's rendered prompt: each of
    # 16 sampled trials at temperature 1 is a whole call whose arguments validate, or (a budget no
    # call fits in) finish_reason "length" and no call; with room, a call every time
    weather = ToolFunction(
        name="get_weather",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    )
    fmt = format_for(llm.config.model_type)
    messages = render_messages(fmt, [{"role": "user", "content": "Weather in Seoul?"}], [weather])
    prompt = llm.tokenizer.apply_chat_template(messages)
    validator = jsonschema_rs.validator_for(arguments_schema(weather))
    for budget, trials in ((6, 4), (160, 12)):
        params = SamplingParams(
            max_tokens=budget, temperature=1.0, guide=guide_for(fmt, [weather], "required")
        )
        for gen in run(llm, [prompt] * trials, params):
            parser = ToolCallParser(fmt, [weather])
            parser.feed(gen.text)
            parser.flush()
            _, calls = parser.finish()
            assert gen.completion_tokens <= budget
            if budget == 6:  # no call fits in 6 tokens of either format's markup (GLM's: 12 at least)
                assert (gen.finish_reason, calls) == ("length", []), gen.text
                continue
            assert calls and parser.complete, gen.text
            assert all(validator.is_valid(json.loads(c.arguments)) for c in calls), gen.text
