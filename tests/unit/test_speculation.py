"""N-gram speculative decoding: the drafter's lookups, and the engine's output with drafts verified
in the decode step is exactly what decoding one token a step gives (greedy, both models, a quantized
KV cache that stages its partial block, a max_tokens cut, several sequences at once), while drafts
are really accepted; sequences that sample, or ask for logprobs, decode one token a step."""

from __future__ import annotations

import pytest

from engine.errors import ModelLoadError
from engine.llm import LLM
from engine.sampling import SamplingParams
from engine.speculation import NgramDrafter, SpeculativeConfig, accepted_prefix, speculative_from_env
from tests.unit.test_simulator import SHIPPED_KIMI

SHIPPED_GLM = SHIPPED_KIMI.parent / "glm-4.5-mini"
REPEATS = "def parse(text):\n    " + "value = text.strip().split(',')\n    " * 6
STACK = "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
PROMPTS = [REPEATS, STACK]


def test_the_drafter_continues_the_latest_earlier_occurrence_longest_ngram_first():
    drafter = NgramDrafter(SpeculativeConfig(num_tokens=3, min_n=1, max_n=3))
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert drafter.propose(tokens, 5) == [7, 8, 5]  # "2 3" last ended at index 6: then 7 8 5
    assert drafter.propose([*tokens, 7], 2) == [8, 5]  # the index grew with the sequence
    tokens2 = [4, 5, 6, 4, 5]
    assert NgramDrafter(SpeculativeConfig(num_tokens=4, min_n=2, max_n=2)).propose(tokens2, 9) == [6, 4, 5]
    assert NgramDrafter(SpeculativeConfig(min_n=2)).propose([1, 2, 3, 4], 5) == []  # nothing repeats
    assert drafter.propose(tokens, 0) == []
    assert accepted_prefix([5, 6, 7], [5, 6, 1, 2]) == 2 and accepted_prefix([5], [4, 0]) == 0


def test_the_environment_names_the_method_and_bad_values_say_what_to_write(monkeypatch):
    monkeypatch.setenv("EDGE_SPECULATIVE", "ngram:3")
    assert speculative_from_env() == SpeculativeConfig(num_tokens=3)
    monkeypatch.setenv("EDGE_SPECULATIVE", "off")
    assert speculative_from_env() is None
    monkeypatch.setenv("EDGE_SPECULATIVE", "eagle")
    with pytest.raises(ModelLoadError, match="'off', 'ngram' or 'ngram:K'"):
        speculative_from_env()
    with pytest.raises(ModelLoadError, match="1-14"):
        SpeculativeConfig(num_tokens=20)


def _outputs(llm: LLM, prompts: list[str], params: SamplingParams) -> list[list[int]]:
    return [g.token_ids for g in llm.generate(prompts, params)]


@pytest.mark.parametrize(
    ("model", "kv"),
    [(SHIPPED_KIMI, "auto"), (SHIPPED_KIMI, "int8"), (SHIPPED_GLM, "auto"), (SHIPPED_GLM, "int4")],
)
def test_greedy_output_is_the_same_token_for_token_and_drafts_are_accepted(model, kv):
    plain = LLM(model, device="cpu", kv_cache_dtype=kv, speculative=None)
    spec = LLM(model, device="cpu", kv_cache_dtype=kv, speculative=SpeculativeConfig())
    for max_tokens in (48, 21):  # 21: the cut lands inside a step's accepted drafts or not, never past
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        alone = [_outputs(plain, [p], params)[0] for p in PROMPTS]
        assert [_outputs(spec, [p], params)[0] for p in PROMPTS] == alone
        assert _outputs(spec, PROMPTS, params) == alone  # two sequences verified in one step
        assert all(len(out) <= max_tokens for out in alone)
    stats = spec.engine.stats()
    assert 0 < stats.accepted_tokens <= stats.draft_tokens  # guesses ran, and some were right
    assert stats.generated_tokens == 2 * plain.engine.stats().generated_tokens  # each prompt alone, then both


def test_sampled_and_logprob_requests_decode_one_token_a_step():
    spec = LLM(SHIPPED_KIMI, device="cpu", speculative=SpeculativeConfig())
    spec.generate([REPEATS], SamplingParams(temperature=0.8, seed=3, max_tokens=24))
    spec.generate([REPEATS], SamplingParams(temperature=0, logprobs=2, max_tokens=24))
    spec.generate([REPEATS], SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=24))
    assert spec.engine.stats().draft_tokens == 0
