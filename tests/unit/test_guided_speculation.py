"""Speculation under a grammar (engine.structured.guided.GuidedDraft): a guided sequence's drafts are
cut at the
first token its grammar refuses, each verify row is masked as a one-token step would mask it (the
budget's forced closing tokens included), and the output is token for token what decoding without
speculation gives: JSON schema, any-JSON mode cut by small budgets, regex and tool calls, greedy and
seeded sampling, n-gram and MTP drafts, on both miniatures."""

from __future__ import annotations

import json

import pytest

from engine.llm import LLM
from engine.sampling import SamplingParams
from engine.speculation import SpeculativeConfig
from engine.structured.guide import Guide
from engine.structured.guided import GuidedDraft, GuideState
from engine.structured.tool_calls import format_for, guide_for, render_messages
from engine.structured.tool_types import ToolFunction
from tests.unit.test_simulator import SHIPPED_KIMI

SHIPPED_GLM = SHIPPED_KIMI.parent / "glm-4.5-mini"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "color"],
    "additionalProperties": False,
}
ROW = '{"name": "Ada", "age": 36, "color": "red"}'
# the answer's structure repeats the prompt's: n-gram drafts find it
PEOPLE = "People as JSON, one per line:\n" + "\n".join([ROW] * 4) + "\n"
WORDS = "the cat sat on the mat " * 6
WEATHER = ToolFunction(
    name="get_weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def _tool_prompt(llm: LLM) -> tuple[str, Guide]:
    fmt = format_for(llm.config.model_type)
    content = "Weather in Seoul? Then in Seoul again, then Seoul."
    messages = render_messages(fmt, [{"role": "user", "content": content}], [WEATHER])
    return llm.tokenizer.apply_chat_template(messages), guide_for(fmt, [WEATHER], "required")


def _cases(llm: LLM) -> list[tuple[str, SamplingParams]]:
    tool_prompt, tool_guide = _tool_prompt(llm)
    schema = Guide(kind="json_schema", schema=PERSON)
    cases = [(PEOPLE, SamplingParams(temperature=0, max_tokens=40, guide=schema))]
    # any-JSON mode: small budgets, where the closing tokens are forced inside a speculating step
    cases += [
        (PEOPLE, SamplingParams(temperature=0, max_tokens=n, guide=Guide(kind="json"))) for n in (5, 9, 14)
    ]
    cases += [
        (
            WORDS,
            SamplingParams(temperature=0, max_tokens=30, guide=Guide(kind="regex", pattern="[a-z ]{1,40}")),
        )
    ]
    cases += [(tool_prompt, SamplingParams(temperature=0, max_tokens=n, guide=tool_guide)) for n in (30, 80)]
    return cases


def _same(plain: LLM, spec: LLM, prompt: str, params: SamplingParams) -> None:
    want, got = plain.generate([prompt], params)[0], spec.generate([prompt], params)[0]
    assert got.token_ids == want.token_ids, (params, want.text, got.text)
    assert (got.finish_reason, got.text) == (want.finish_reason, want.text)


@pytest.mark.parametrize("model", [SHIPPED_KIMI, SHIPPED_GLM], ids=["kimi", "glm"])
def test_guided_greedy_and_seeded_outputs_are_the_same_with_ngram_drafts(model):
    plain = LLM(model, device="cpu", speculative=None, compile=False)
    spec = LLM(model, device="cpu", speculative=SpeculativeConfig(), compile=False)
    for prompt, params in _cases(plain):
        _same(plain, spec, prompt, params)  # greedy
        for seed in (1, 2):
            sampled = SamplingParams(
                temperature=0.9, top_p=0.95, seed=seed, max_tokens=params.max_tokens, guide=params.guide
            )
            _same(plain, spec, prompt, sampled)
    stats = spec.engine.stats()
    assert 0 < stats.accepted_tokens <= stats.draft_tokens  # guided rows really speculated
    # the schema's answer repeats the prompt's rows: it parses, and drafts were kept on it
    answer = spec.generate(
        [PEOPLE], SamplingParams(temperature=0, max_tokens=40, guide=Guide(kind="json_schema", schema=PERSON))
    )
    assert set(json.loads(answer[0].text)) == set(PERSON["properties"])


def test_guided_outputs_are_the_same_with_mtp_drafts_and_in_one_batch():
    plain = LLM(SHIPPED_KIMI, device="cpu", speculative=None, compile=False)
    spec = LLM(
        SHIPPED_KIMI, device="cpu", speculative=SpeculativeConfig(method="mtp", num_tokens=2), compile=False
    )
    cases = _cases(plain)
    for prompt, params in cases:
        _same(plain, spec, prompt, params)
    # guided and unguided sequences speculating in the same steps
    prompts = [prompt for prompt, _ in cases[:3]]
    for params in (cases[0][1], SamplingParams(temperature=0, max_tokens=24)):
        want = [g.token_ids for g in plain.generate(prompts, params)]
        assert [g.token_ids for g in spec.generate(prompts, params)] == want
    stats = spec.engine.stats()
    assert 0 < stats.accepted_tokens <= stats.draft_tokens


@pytest.fixture(scope="module")
def kimi() -> LLM:
    return LLM(SHIPPED_KIMI, device="cpu", speculative=None, compile=False)


def _state(llm: LLM, guide: Guide, max_tokens: int | None = None) -> GuideState:
    return llm.engine._compile(guide, max_tokens)


def test_a_draft_is_cut_at_the_first_token_its_grammar_refuses(kimi):
    compiler = kimi.engine.guide_compiler()
    guide = _state(kimi, Guide(kind="regex", pattern="[a-c]{2,6}"))
    a, b, z = (compiler.tokenize(text.encode())[0] for text in ("a", "b", "z"))
    checked = GuidedDraft(compiler, guide, [a, b, z, a])
    assert checked.draft == [a, b]  # "z" is refused: nothing after it could be kept
    assert len(checked.states) == 3 and checked.bitmask.shape[0] == 3  # the real token's row, then two
    assert guide.matcher.validate_tokens([z, a]) == 0  # the sequence's own state is untouched
    assert checked.state_after(2).matcher.validate_tokens([z]) == 0
    assert checked.state_after(2).matcher.validate_tokens([a]) == 1
    assert GuidedDraft(compiler, guide, [z, a]).draft == []  # refused at once: no speculation


def test_a_draft_that_completes_the_grammar_ends_there(kimi):
    compiler = kimi.engine.guide_compiler()
    guide = _state(kimi, Guide(kind="regex", pattern="[a-c]{2}"))
    a, b = (compiler.tokenize(text.encode())[0] for text in ("a", "b"))
    checked = GuidedDraft(compiler, guide, [a, b, a, b])
    assert checked.draft == [a, b] and checked.state_after(2).complete


def test_the_budget_closing_token_is_the_only_one_a_late_row_allows(kimi):
    """Any-JSON mode with 4 tokens left: the closing is forced in the row it falls on, as a
    one-token step forces it, and a draft that does not close is cut there."""
    compiler = kimi.engine.guide_compiler()
    guide = _state(kimi, Guide(kind="json"), max_tokens=4)
    opening = compiler.tokenize(b'{"')
    for token in opening:
        assert guide.consume(token) is None
    letter = compiler.tokenize(b"x")[0]
    checked = GuidedDraft(compiler, guide, [letter] * 4)
    allowed = [sum(bin(word & 0xFFFFFFFF).count("1") for word in row.tolist()) for row in checked.bitmask]
    assert 1 in allowed  # a row whose one allowed token is the closing's
    assert len(checked.draft) < 4  # the draft is cut at the first row that forces something else
