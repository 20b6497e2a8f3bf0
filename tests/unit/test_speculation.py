"""N-gram speculative decoding: the drafter's lookups, and the engine's output with drafts verified
in the decode step is exactly what decoding one token a step gives (greedy, both models, a quantized
KV cache that stages its partial block, a max_tokens cut, several sequences at once), while drafts
are really accepted; sampled sequences speculate with rejection sampling: a seed gives the tokens
it gives without speculation, and 2,000 samples' distribution is the same by a chi-square test.
Guided sequences: tests/unit/test_guided_speculation.py."""

from __future__ import annotations

import math
from collections import Counter

import msgspec
import pytest

import engine.engine as engine_module
from engine.errors import ModelLoadError
from engine.kv.kv_cache import BLOCK_SIZE
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
    with pytest.raises(ModelLoadError, match="'off', 'ngram', 'ngram:K', 'mtp' or 'mtp:K'"):
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


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.02, max_tokens=32),
        SamplingParams(temperature=0.6, repetition_penalty=1.2, frequency_penalty=0.3, max_tokens=32),
        SamplingParams(temperature=0, presence_penalty=0.5, logit_bias={7: 3.0}, logprobs=3, max_tokens=32),
    ],
    ids=["filters", "penalties", "greedy-penalty-bias-logprobs"],
)
def test_a_seeded_sampled_request_gives_the_same_tokens_with_speculation(params):
    """Sampler.verify draws from the sequence's generator once per emitted token, in order, so a
    seed's tokens (and their logprobs) are those of decoding one token a step."""
    plain = LLM(SHIPPED_KIMI, device="cpu", speculative=None)
    spec = LLM(SHIPPED_KIMI, device="cpu", speculative=SpeculativeConfig())
    for seed in (1, 2, 3, 4):  # (enough draws that some drafts are accepted under the filters)
        seeded = msgspec.structs.replace(params, seed=seed)
        want, got = plain.generate(PROMPTS, seeded), spec.generate(PROMPTS, seeded)
        assert [g.token_ids for g in got] == [g.token_ids for g in want]
        if params.logprobs is not None:
            for g, w in zip(got, want, strict=True):
                assert [lp.chosen.token for lp in g.logprobs] == [lp.chosen.token for lp in w.logprobs]
                assert [lp.chosen.logprob for lp in g.logprobs] == pytest.approx(
                    [lp.chosen.logprob for lp in w.logprobs], abs=1e-4
                )
    stats = spec.engine.stats()
    assert 0 < stats.accepted_tokens < stats.draft_tokens  # drafts were judged both ways


class GreedyPathDrafter(NgramDrafter):
    """Proposes on every step: the greedy continuation of the prompt at these positions (`path`,
    set by the test). A deterministic guess, so a point mass the rejection rule must hold for,
    right often enough to be accepted and rejected alike."""

    path: list[int] = []
    prompt_len = 0

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        at = len(tokens) - self.prompt_len
        return self.path[at : at + min(limit, self.config.num_tokens)]


STAT_PROMPT = "def parse(text):\n    "
STAT_PARAMS = SamplingParams(temperature=0.5, top_p=0.95, max_tokens=4, ignore_eos=True)


def _sampled_tokens(spec: SpeculativeConfig | None, seeds: range) -> tuple[list, LLM]:
    """The first output tokens of one sampled request per seed, up to 128 at once."""
    llm = LLM(SHIPPED_KIMI, device="cpu", speculative=spec, max_num_seqs=128, max_num_batched_tokens=4096)
    ids = llm.encode(STAT_PROMPT)
    for seed in seeds:
        llm.engine.add_request(ids, msgspec.structs.replace(STAT_PARAMS, seed=seed), request_id=str(seed))
    out: dict[str, list[int]] = {}
    while llm.engine.has_unfinished():
        for event in llm.engine.step():
            if event.token_id is not None:
                out.setdefault(event.request_id, []).append(event.token_id)
    return [out[str(seed)] for seed in seeds], llm


def chi2_sf_even(x: float, df: int) -> float:
    """P(chi-square with an even `df` > x), in closed form: exp(-x/2) * sum_{j < df/2} (x/2)^j / j!."""
    assert df % 2 == 0
    term = total = math.exp(-x / 2)
    for j in range(1, df // 2):
        term *= x / 2 / j
        total += term
    return min(total, 1.0)


def chi2_sf(x: float, df: int) -> float:
    """P(chi-square with `df` degrees > x), in closed form for either parity: an odd df adds the
    normal tail, erfc(sqrt(x/2)) + sqrt(2/pi) exp(-x/2) sum_{r <= (df-1)/2} x^(r-1/2) / (1*3*...*(2r-1))."""
    if df % 2 == 0:
        return chi2_sf_even(x, df)
    total, term, acc = math.erfc(math.sqrt(x / 2)), math.sqrt(x), 0.0
    for r in range(1, (df - 1) // 2 + 1):
        if r > 1:
            term *= x / (2 * r - 1)
        acc += term
    return min(total + math.sqrt(2 / math.pi) * math.exp(-x / 2) * acc, 1.0)


def test_the_closed_form_chi_square_survival_matches_known_values():
    # tables: chi-square critical values at p = 0.05 and 0.001, even and odd degrees of freedom
    table = [(2, 5.991, 0.05), (10, 18.307, 0.05), (20, 31.410, 0.05), (20, 45.315, 0.001)]
    table += [(1, 3.841, 0.05), (3, 7.815, 0.05), (19, 30.144, 0.05), (19, 43.820, 0.001)]
    for df, x, p in table:
        assert chi2_sf(x, df) == pytest.approx(p, rel=2e-3)
    assert chi2_sf(0.0, 20) == 1.0 and chi2_sf(0.0, 19) == 1.0


def homogeneity_p_value(a: list[int], b: list[int], bins: int = 20) -> float:
    """Chi-square test that samples `a` and `b` come from one distribution: the `bins` likeliest
    tokens (by pooled count) each a bin, the rest one more."""
    top = [t for t, _ in Counter(a + b).most_common(bins)]
    index = {t: i for i, t in enumerate(top)}
    counts = [[0] * (len(top) + 1) for _ in range(2)]
    for row, sample in enumerate((a, b)):
        for t in sample:
            counts[row][index.get(t, len(top))] += 1
    columns = [c for c in zip(*counts, strict=True) if sum(c) > 0]
    n = len(a) + len(b)
    stat = sum(
        (observed - expected) ** 2 / expected
        for column in columns
        for observed, size in zip(column, (len(a), len(b)), strict=True)
        if (expected := sum(column) * size / n) > 0
    )
    return chi2_sf(stat, len(columns) - 1)


def test_speculative_sampling_leaves_the_token_distribution_unchanged(monkeypatch):
    """2,000 sampled requests after one prompt with and without speculation (other seeds, so the
    two samples are independent): each token that a speculating step chooses (judging a draft, or
    after drafts were accepted) has the same distribution, by a chi-square test over the 20
    likeliest tokens plus the rest (p > 0.001)."""
    plain_llm = LLM(SHIPPED_KIMI, device="cpu", speculative=None)
    greedy = msgspec.structs.replace(STAT_PARAMS, temperature=0, max_tokens=8)
    ids = plain_llm.encode(STAT_PROMPT)
    assert len(ids) % BLOCK_SIZE < BLOCK_SIZE - 4  # the first decode step has room for 3 drafts
    monkeypatch.setattr(GreedyPathDrafter, "path", plain_llm.generate([STAT_PROMPT], greedy)[0].token_ids)
    monkeypatch.setattr(GreedyPathDrafter, "prompt_len", len(ids))
    monkeypatch.setattr(engine_module, "NgramDrafter", GreedyPathDrafter)
    always = SpeculativeConfig(num_tokens=3, max_decoders=128)
    plain, _ = _sampled_tokens(None, range(2000))
    spec, llm = _sampled_tokens(always, range(10_000, 12_000))
    stats = llm.engine.stats()
    assert 50 < stats.accepted_tokens < stats.draft_tokens - 50  # drafts were judged both ways
    for position in range(1, STAT_PARAMS.max_tokens):  # the prefill chose the first
        p = homogeneity_p_value([t[position] for t in plain], [t[position] for t in spec])
        assert p > 0.001, f"output token {position}: chi-square p = {p:.2g}"
