"""Engine API behaviour: requests rejected before work, sampling, streaming text, load errors."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, EngineStats, InvalidRequestError, ModelLoadError, RequestTooLargeError, SamplingParams
from engine.tokenizer import IncrementalDetokenizer, TextTokenizer


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, device="cpu", allow_unsigned=True)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
    ],
)
def test_bad_sampling_params_name_the_parameter(llm, kwargs, param):
    with pytest.raises(InvalidRequestError) as err:
        llm.generate("def f():", SamplingParams(**kwargs))
    assert err.value.param == param and param in str(err.value)


def test_prompt_limits(llm):
    with pytest.raises(InvalidRequestError, match="prompt: must not be empty"):
        llm.generate("")
    window = llm.context_window
    with pytest.raises(InvalidRequestError, match=f"context window is {window}"):
        llm.check_request([7] * window, SamplingParams())
    with pytest.raises(InvalidRequestError, match="ask for at most 2"):
        llm.check_request([7] * (window - 2), SamplingParams(max_tokens=3))


def test_a_request_that_does_not_fit_has_its_own_type(llm):
    window = llm.context_window
    for ids, params in (([7] * window, SamplingParams()), ([7] * (window - 2), SamplingParams(max_tokens=3))):
        with pytest.raises(RequestTooLargeError):
            llm.check_request(ids, params)
    with pytest.raises(InvalidRequestError) as err:  # malformed, not too large
        llm.check_request([], SamplingParams())
    assert not isinstance(err.value, RequestTooLargeError)


def test_stats_report_the_queue_and_the_cache(llm):
    llm.generate("def f():", SamplingParams(max_tokens=2, temperature=0))
    stats = llm.stats()
    assert isinstance(stats, EngineStats) and stats.running == stats.waiting == 0
    assert (
        stats.kv_blocks_total > 0 and stats.kv_blocks_used == 0
    )  # the finished request gave its blocks back
    assert stats.kv_blocks_free == stats.kv_blocks_total and stats.kv_bytes_per_token > 0
    assert stats.generated_tokens >= 2 and stats.prompt_tokens > 0
    assert llm.recent_steps(1) and len(llm.recent_steps(3)) <= 3 and llm.recent_steps(0) == []


def test_seeded_sampling_repeats_and_greedy_equivalents(llm):
    sp = SamplingParams(max_tokens=12, temperature=1.0, seed=42, ignore_eos=True)
    a, b = llm.generate("import os", sp)[0], llm.generate("import os", sp)[0]
    assert a.token_ids == b.token_ids and len(a.token_ids) == 12
    other = llm.generate(
        "import os", SamplingParams(max_tokens=12, temperature=1.0, seed=43, ignore_eos=True)
    )[0]
    assert other.token_ids != a.token_ids
    greedy = llm.generate("import os", SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    top1 = llm.generate(
        "import os", SamplingParams(max_tokens=8, temperature=0.8, top_k=1, seed=1, ignore_eos=True)
    )[0]
    nucleus = llm.generate(
        "import os", SamplingParams(max_tokens=8, temperature=0.8, top_p=1e-6, seed=1, ignore_eos=True)
    )[0]
    assert greedy.token_ids == top1.token_ids == nucleus.token_ids


def test_generation_text_is_the_decoded_tokens(llm):
    out = llm.generate(
        ["def f():", "class A:"], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    )
    assert len(out) == 2
    for g in out:
        assert g.finish_reason == "length" and g.completion_tokens == 10
        assert g.text == llm.tokenizer.decode(g.token_ids)
        assert g.prefill_ms > 0 and g.decode_ms > 0


def test_eos_stops_generation(tiny_model_dir):
    llm = LLM(tiny_model_dir, device="cpu", allow_unsigned=True)
    first = llm.generate("x = 1", SamplingParams(max_tokens=1, temperature=0))[0].token_ids[0]
    llm.eos_token_ids = frozenset({first})  # make the model's first choice the end of sequence
    out = llm.generate("x = 1", SamplingParams(max_tokens=5, temperature=0))[0]
    assert out.finish_reason == "stop" and out.token_ids == []


def test_logits_cover_every_position(llm):
    ids = torch.randint(10, 4000, (20,)).tolist()
    logits = llm.logits(ids)
    assert logits.shape == (20, llm.config.vocab_size) and logits.dtype == torch.float32
    # the last row equals what a separate prefill of the same prompt produces
    assert torch.allclose(logits[5], llm.logits(ids[:6])[-1], atol=1e-5)


def test_streamed_deltas_never_split_a_character(tiny_model_dir):
    tok = TextTokenizer(tiny_model_dir)
    text = "서울 → 東京 🚀 naïve café ∑"
    ids = tok.encode(text)
    assert len(ids) > len(text) // 2  # multi-byte characters span several byte-level tokens
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_tensor_is_named(tiny_model_dir, tmp_path):
    d = _copy(tiny_model_dir, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"lacks .*model\.layers\.1\.mlp\.experts\.3\.up_proj\.weight"):
        LLM(d, device="cpu", allow_unsigned=True)


def test_wrong_shape_and_dtype_are_named(tiny_model_dir, tmp_path):
    d = _copy(tiny_model_dir, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(65)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(
        ModelLoadError, match=r"model\.norm\.weight has shape \[65\]; the config expects \[64\]"
    ):
        LLM(d, device="cpu", allow_unsigned=True)
    tensors["model.norm.weight"] = torch.ones(64, dtype=torch.int32)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight has dtype torch\.int32"):
        LLM(d, device="cpu", allow_unsigned=True)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"model_type": "llama"}, "model_type 'llama' is not supported"),
        ({"n_group": 3}, "n_group = 3; expected a divisor"),
        ({"hidden_size": "big"}, "hidden_size"),
    ],
)
def test_bad_config_fails_naming_the_field(tiny_model_dir, tmp_path, edit, message):
    d = _copy(tiny_model_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(edit)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=message):
        LLM(d, device="cpu", allow_unsigned=True)


def test_unsupported_formats_are_refused(tiny_model_dir):
    with pytest.raises(ModelLoadError, match="weights='int3' is not supported"):
        LLM(tiny_model_dir, weights="int3", device="cpu", allow_unsigned=True)
    with pytest.raises(ModelLoadError, match="weight part 'heads' is unknown"):
        LLM(tiny_model_dir, weights="int4", weight_parts="experts,heads", device="cpu", allow_unsigned=True)


def test_chat_uses_the_models_template(llm):
    out = llm.chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        SamplingParams(max_tokens=3, temperature=0, ignore_eos=True),
    )
    tok = llm.tokenizer
    prompt = out.prompt_token_ids
    # Kimi's layout: role markers and <|im_middle|> are single special tokens, and the prompt ends
    # by opening the assistant's turn
    for marker in ("<|im_system|>", "<|im_user|>", "<|im_middle|>", "<|im_end|>"):
        assert tok._tok.token_to_id(marker) in prompt
    ids = tok._tok.token_to_id
    assert prompt[-1] == ids("<|im_middle|>") and ids("<|im_assistant|>") in prompt[-6:]
    assert out.completion_tokens == 3
