"""MTP speculative decoding: the engine's MTP layer (engine.models.mtp) computes what transformers'
decoder layer computes for it, prefill and incremental decode alike; drafted by it, the engine's
output is exactly what decoding one token a step gives (greedy, both models, every KV format,
chained drafts, cut by max_tokens, several sequences, seeded sampling, n > 1 over the prefix cache,
the compiled step), and a checkpoint without an MTP layer is refused with a message that says what
to use instead."""

from __future__ import annotations

import json
import shutil

import msgspec
import pytest
import torch

import engine.step.mtp_drafts as mtp_drafts
from engine.errors import ModelLoadError
from engine.kv.batch import SeqSlice, StepBatch
from engine.llm import LLM
from engine.sampling import SamplingParams
from engine.speculation import SpeculativeConfig, parse_speculative
from tests.hf_reference import MTPReference, tiny_deepseek_v3, tiny_glm4_moe
from tests.unit.test_simulator import SHIPPED_KIMI

SHIPPED_GLM = SHIPPED_KIMI.parent / "glm-4.5-mini"
CODE = "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
HELDOUT = (SHIPPED_KIMI.parent / "eval" / "heldout.txt").read_text()[20_000:20_600]
PROMPTS = [CODE, HELDOUT]


def mtp(k: int = 1) -> SpeculativeConfig:
    return SpeculativeConfig(num_tokens=k, method="mtp")


@pytest.fixture(scope="module", params=["kimi", "glm"])
def tiny_with_mtp(request, tmp_path_factory):
    """A tiny random checkpoint with a random MTP layer, and the transformers reference of both."""
    out = tmp_path_factory.mktemp(f"tiny-{request.param}-mtp")
    make = tiny_deepseek_v3 if request.param == "kimi" else tiny_glm4_moe
    model = make(out, seed=3)
    reference = MTPReference(model, seed=4)
    reference.save_into(out)
    return out, reference


def _engine_mtp_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """The engine's MTP logits at every position, one prefill pass of each model over the cache."""
    cache = llm._new_cache(budget=None, max_seqs=1, tokens=len(ids))  # noqa: SLF001
    seq = cache.pool.new_sequence()
    cache.pool.grow(seq, len(ids))
    t = torch.tensor(ids)
    with torch.inference_mode():
        hidden = llm.model.forward(
            t, torch.arange(len(ids)), StepBatch([SeqSlice(seq, 0, len(ids), 0)], llm.device, cache.layers)
        )
        batch = StepBatch([SeqSlice(seq, 0, len(ids) - 1, 0)], llm.device, cache.layers)
        out = llm.model.mtp.forward(hidden[:-1], t[1:], torch.arange(len(ids) - 1), batch)
        return llm.model.mtp.logits(out)


def test_the_mtp_layer_matches_transformers_decoder_layer_on_random_weights(tiny_with_mtp):
    path, reference = tiny_with_mtp
    llm = LLM(path, device="cpu", allow_unsigned=True, speculative=mtp(), compile=False)
    gen = torch.Generator().manual_seed(11)
    for length in (5, 40):
        ids = torch.randint(2, 256, (length,), generator=gen).tolist()
        want = reference.logits(ids)
        got = _engine_mtp_logits(llm, ids)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_drafts_made_step_by_step_are_the_reference_layers_argmax(tiny_with_mtp, monkeypatch):
    """Decoding, the MTP layer runs one or two rows a step against its own cached keys and values;
    each draft must be the argmax the reference gives over the whole sequence at once."""
    path, reference = tiny_with_mtp
    llm = LLM(path, device="cpu", allow_unsigned=True, speculative=mtp(), compile=False)
    drafts: list[tuple[int, int]] = []  # (tokens when drafted, draft)
    store = mtp_drafts.MTPDrafter._store

    def record(self, seq, draft):
        drafts.append((len(seq.tokens), draft[0]))
        store(self, seq, draft)

    monkeypatch.setattr(mtp_drafts.MTPDrafter, "_store", record)
    prompt = torch.randint(2, 256, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    out = llm.engine
    rid = out.add_request(prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    tokens = list(prompt)
    while out.has_unfinished():
        tokens += [e.token_id for e in out.step() if e.request_id == rid and e.token_id is not None]
    best = reference.logits(tokens).argmax(dim=-1).tolist()
    assert len(drafts) >= 8
    assert [d for _, d in drafts] == [best[n - 2] for n, _ in drafts]


@pytest.mark.parametrize(
    ("model", "kv", "k"),
    [(SHIPPED_KIMI, "auto", 1), (SHIPPED_KIMI, "int4", 2), (SHIPPED_GLM, "fp8", 1), (SHIPPED_GLM, "int4", 3)],
)
def test_greedy_output_with_mtp_drafts_is_token_for_token_the_same_and_drafts_are_kept(model, kv, k):
    plain = LLM(model, device="cpu", kv_cache_dtype=kv, speculative=None, compile=False)
    spec = LLM(model, device="cpu", kv_cache_dtype=kv, speculative=mtp(k), compile=False)
    for max_tokens in (32, 11):  # 11: the cut lands inside a step's accepted drafts or not
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        alone = [plain.generate([p], params)[0].token_ids for p in PROMPTS]
        assert [spec.generate([p], params)[0].token_ids for p in PROMPTS] == alone
        assert [g.token_ids for g in spec.generate(PROMPTS, params)] == alone  # both in one step
    stats = spec.engine.stats()
    assert 0 < stats.accepted_tokens <= stats.draft_tokens  # the layer drafted, and was right sometimes


def test_seeded_sampling_n_choices_and_the_prefix_cache_give_the_same_tokens_with_mtp():
    plain = LLM(SHIPPED_KIMI, device="cpu", speculative=None, compile=False)
    spec = LLM(SHIPPED_KIMI, device="cpu", speculative=mtp(2), compile=False)
    params = SamplingParams(temperature=0.7, top_p=0.95, max_tokens=24, n=3, seed=9)
    for _ in range(2):  # the second time the prompt's full blocks come from the prefix cache
        want = plain.generate_choices(PROMPTS, params)
        got = spec.generate_choices(PROMPTS, params)
        assert [[c.token_ids for c in g] for g in got] == [[c.token_ids for c in w] for w in want]
    assert spec.engine.stats().prefix_cache_hits > 0 and spec.engine.stats().draft_tokens > 0


def test_mtp_through_the_compiled_step_drafts_and_decodes_as_the_eager_step():
    """Greedy: the graph that verifies, drafts the next step and decodes in one call makes the
    eager two-pass engine's drafts, so tokens and the counts of drafted and kept tokens are the
    same; sampled: the compiled rows and the separate MTP pass give the eager tokens."""
    eager = LLM(SHIPPED_GLM, device="cpu", speculative=mtp(), compile=False)
    compiled = LLM(SHIPPED_GLM, device="cpu", speculative=mtp(), compile=True)
    compiled.engine.compiled_decode.warm_up([1, 2])  # one sequence: its real token and one draft
    for params in (
        SamplingParams(temperature=0, max_tokens=32),
        SamplingParams(temperature=0.7, seed=5, max_tokens=24),
    ):
        for prompt in PROMPTS:
            want = eager.generate([prompt], params)[0].token_ids
            assert compiled.generate([prompt], params)[0].token_ids == want
    e, c = eager.engine.stats(), compiled.engine.stats()
    assert (c.draft_tokens, c.accepted_tokens) == (e.draft_tokens, e.accepted_tokens)
    assert c.accepted_tokens > 0
    decoder = compiled.engine.compiled_decode
    assert 0 < decoder.greedy_steps < decoder.steps and decoder.mtp_ready == {1, 2}


def test_the_mtp_layer_caches_as_one_more_layer_charged_to_the_kv_budget():
    plain = LLM(SHIPPED_KIMI, device="cpu", speculative=None, compile=False)
    spec = LLM(SHIPPED_KIMI, device="cpu", speculative=mtp(), compile=False)
    layers = plain.config.num_hidden_layers
    assert len(spec.engine.cache.layers) == len(plain.engine.cache.layers) + 1 == layers + 1
    per_layer = plain.engine.cache.bytes_per_token() / layers
    assert spec.engine.cache.bytes_per_token() == pytest.approx(per_layer * (layers + 1))


def test_a_checkpoint_without_an_mtp_layer_is_refused_naming_the_alternatives(tiny_model_dir, tmp_path):
    # transformers' config declares one MTP layer by default, and writes no tensors for it
    with pytest.raises(
        ModelLoadError, match=r"declares 1, but it holds no model.layers.3.\* tensors; use 'ngram'"
    ):
        LLM(tiny_model_dir, device="cpu", allow_unsigned=True, speculative="mtp")
    shutil.copytree(tiny_model_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    with pytest.raises(ModelLoadError, match="num_nextn_predict_layers = 0; use 'ngram' or 'off'"):
        LLM(tmp_path / "m", device="cpu", allow_unsigned=True, speculative="mtp")


def test_the_setting_names_mtp_with_one_draft_token_by_default():
    assert parse_speculative("mtp") == SpeculativeConfig(num_tokens=1, method="mtp")
    assert parse_speculative("mtp:3") == SpeculativeConfig(num_tokens=3, method="mtp")
    assert parse_speculative("ngram") == SpeculativeConfig(num_tokens=5)
    with pytest.raises(ModelLoadError, match="'mtp' or 'mtp:K'"):
        parse_speculative("medusa")
    with pytest.raises(ModelLoadError, match="method must be one of ngram, mtp"):
        SpeculativeConfig(method="eagle")


def test_an_opted_out_request_drafts_nothing():
    spec = LLM(SHIPPED_KIMI, device="cpu", speculative=mtp(), compile=False)
    off = msgspec.structs.replace(SamplingParams(temperature=0, max_tokens=16), speculative=False)
    spec.generate([CODE], off)
    assert spec.engine.stats().draft_tokens == 0
