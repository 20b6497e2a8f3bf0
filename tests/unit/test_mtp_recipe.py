"""The recipe's MTP layer (models/recipe/mtp.py): hub names, a lossless round trip, and the forward's
dependencies (row q sees h_0..h_q and x[1..q+1] only). Fresh random weights from tiny configs."""

import pytest
import torch

pytest.importorskip("transformers")

from models.recipe.mtp import MTPLayer, mtp_logits  # noqa: E402
from tests.hf_reference import tiny_deepseek_v3, tiny_glm4_moe  # noqa: E402

FAMILIES = {"kimi": tiny_deepseek_v3, "glm": tiny_glm4_moe}
MTP_ONLY = {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"}
COPIES = {"embed_tokens.weight": "model.embed_tokens.weight", "shared_head.head.weight": "lm_head.weight"}


def hub_layer(state: dict, index: int) -> dict:
    prefix = f"model.layers.{index}."
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}


@pytest.fixture(params=sorted(FAMILIES))
def main_model(request, tmp_path):
    from transformers import AutoModelForCausalLM

    FAMILIES[request.param](tmp_path)
    return AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()


def test_hub_names_are_the_last_layers_names_plus_the_mtp_parts(main_model):
    from safetensors.torch import load_file

    n = main_model.config.num_hidden_layers
    saved = load_file(str(main_model.name_or_path) + "/model.safetensors")
    mtp = MTPLayer.from_main(main_model)
    ours = hub_layer(mtp.hub_state_dict(), n)
    last = hub_layer(saved, n - 1)  # the decoder layer starts as a copy of the last one, in hub names
    assert set(ours) == set(last) | MTP_ONLY | set(COPIES)
    for name, tensor in last.items():
        torch.testing.assert_close(ours[name], tensor.float(), rtol=0, atol=0, msg=name)
    for ours_name, main_name in COPIES.items():
        torch.testing.assert_close(ours[ours_name], saved[main_name].float(), rtol=0, atol=0)


def test_round_trip_through_hub_names_is_exact(main_model):
    torch.manual_seed(1)
    mtp = MTPLayer.from_main(main_model, pass_through=False)
    with torch.no_grad():
        for p in mtp.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    back = MTPLayer(main_model.config)
    back.load_hub_state_dict(mtp.hub_state_dict())
    for (name, a), (_, b) in zip(mtp.state_dict().items(), back.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_row_q_depends_only_on_tokens_up_to_q_plus_1(main_model):
    torch.manual_seed(2)
    mtp = MTPLayer.from_main(main_model, pass_through=False).eval()
    vocab = main_model.config.vocab_size
    x = torch.randint(0, vocab, (1, 24))
    changed = x.clone()
    changed[0, 12:] = torch.randint(0, vocab, (12,))
    with torch.no_grad():
        main, logits = mtp_logits(main_model, mtp, x)
        _, logits_changed = mtp_logits(main_model, mtp, changed)
    assert main.shape == (1, 24, vocab) and logits.shape == (1, 23, vocab)
    # Rows 0..10 read x[0..11] only (hidden states up to q, token q+1); row 11 reads x[12].
    torch.testing.assert_close(logits[0, :11], logits_changed[0, :11], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits[0, 11], logits_changed[0, 11])
