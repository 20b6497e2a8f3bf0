"""The chat corpus of the miniatures' recipe (models/recipe/chat_*.py): conversations rendered as the
engine renders a request, only the assistant's turns trained, the families' markers single tokens,
and held-out entities never in training."""

from __future__ import annotations

import json
import random
from argparse import Namespace

import pytest
import torch

from engine.structured.tool_calls import GLM45, KIMI_K2, render_messages
from engine.tokenizer import TextTokenizer
from models.recipe import chat_corpus as cc
from models.recipe import chat_examples as ex
from models.recipe.mixture import IGNORE, PAD, ChatRows, Mixture
from models.recipe.tokenizer import CHAT_TEMPLATES, MARKER_TOKENS, extend_tokenizer
from tests.conftest import REPO

FOLDERS = {"kimi": "kimi-k2-mini", "glm": "glm-4.5-mini"}


@pytest.fixture(scope="module", params=["kimi", "glm"])
def family_tok(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    tok = extend_tokenizer(REPO / "models" / FOLDERS[request.param], out, request.param)
    return request.param, tok, out


def test_the_markers_are_single_tokens_decoded_as_text(family_tok):
    family, tok, out = family_tok
    for marker in MARKER_TOKENS[family]:
        ids = tok.encode(marker, add_special_tokens=False).ids
        assert len(ids) == 1, marker
        assert TextTokenizer(out).decode(ids) == marker  # not dropped as a special token would be
    assert set(MARKER_TOKENS[family]) <= TextTokenizer(out).vocabulary


def test_a_tool_round_trip_trains_the_calls_and_the_answer_only(family_tok):
    family, tok, _ = family_tok
    rng = random.Random(5)
    example = ex.tool_example(rng, "train")
    pieces = cc.segments(example, family)
    trained = [text for text, on in pieces if on]
    assert len(trained) == 2  # the call, then the answer from the tool's result
    marker = "<|tool_call_begin|>" if family == "kimi" else "<tool_call>"
    assert marker in trained[0] and marker not in trained[1]
    # the prompt pieces are exactly what the engine renders for the same messages
    fmt = {"kimi": KIMI_K2, "glm": GLM45}[family]
    tools = cc._tool_functions(example.tools)
    turns = render_messages(fmt, example.messages[:1], tools)
    rendered = TextTokenizer(REPO / "models" / FOLDERS[family]).apply_chat_template(turns)
    assert pieces[0] == (rendered, False)
    ids, mask = cc.encode(pieces, tok)
    assert len(ids) == len(mask) and any(mask) and not all(mask)
    # the turn's end is trained: Kimi's <|im_end|>, GLM's next role marker
    ends = {"kimi": "<|im_end|>", "glm": "<|observation|>"}[family]
    assert trained[0].endswith(ends)


def test_the_shipped_templates_are_the_recipes(family_tok):
    family, _, _ = family_tok
    shipped = json.loads((REPO / "models" / FOLDERS[family] / "tokenizer_config.json").read_text())
    assert shipped["chat_template"] == CHAT_TEMPLATES[family]


def test_glm_with_thinking_off_renders_the_empty_block_in_the_prompt():
    example = ex.capital_example(random.Random(1), "train")
    on = cc.segments(example, "glm")
    off = cc.segments(example, "glm", thinking=False)
    assert on[1][0].startswith("\n<think></think>\n")  # the model writes the (empty) block itself
    assert off[0][0].endswith("/nothink<|assistant|>\n<think></think>") and off[1][0].startswith("\n")


def test_held_out_entities_never_reach_training():
    train_text = json.dumps([e.messages for e in cc.training_examples("kimi", 3000, 11)])
    held = set(ex.CITIES_HELD)
    assert held and not held & set(ex.CITIES_TRAIN)
    seen = [c for c in held if f'"{c}"' in train_text or f" {c}." in train_text or f" {c}?" in train_text]
    assert not seen, seen[:5]
    lines = cc.eval_lines()
    tools = [x for x in lines if x["kind"] == "tool" and x["split"] == "heldout"]
    assert tools and all(not any(m["role"] == "assistant" for m in x["messages"]) for x in lines)
    assert cc.eval_lines() == lines  # seeded: the same evaluation set on every machine


def test_the_mixture_masks_prompts_and_keeps_code(family_tok):
    family, tok, _ = family_tok
    args = Namespace(
        chat_share=0.5, prose_share=0.0, seed=3, family=family, chat_examples=200, chat_weights=""
    )
    code = torch.arange(5000, dtype=torch.int32) % 4000
    mix = Mixture(tok, args, code)
    x, y = mix.batch(32, 64, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (32, 64)
    masked = (y == IGNORE).any(dim=1)
    assert 0 < int(masked.sum()) < 32  # chat rows carry masked prompts, code rows none
    assert torch.equal(x[~masked], y[~masked])


def test_a_chat_row_holds_whole_conversations_and_pads_what_none_fills():
    # a conversation cut at the row's end loses its end, which is what is trained (the call after a
    # long tool declaration, the answer after the tool's result)
    lengths = [90, 150, 200, 260, 330]  # conversation k: ids from k*1000 + 1000, its first half masked
    chat = [(torch.arange(n) + 1000 * (k + 1), torch.arange(n) >= n // 2) for k, n in enumerate(lengths)]
    rows = ChatRows(chat, random.Random(5))
    for _ in range(64):
        row, labels = (t.tolist() for t in rows.row(512))
        i = 0
        while i < len(row) and row[i] != PAD:
            k = row[i] // 1000 - 1
            n = lengths[k]
            assert row[i : i + n] == list(range(1000 * (k + 1), 1000 * (k + 1) + n))  # whole
            assert labels[i : i + n] == [IGNORE] * (n // 2) + row[i + n // 2 : i + n]
            i += n
        assert set(row[i:]) <= {PAD} and set(labels[i:]) <= {IGNORE}
        assert len(row) - i < min(lengths)  # padded only where no conversation fits


def test_training_coins_names_the_model_can_only_copy():
    rng = random.Random(2)
    coined = [ex.coined(rng, ex.CITIES_HELD_SET, places=True) for _ in range(500)]
    assert len(set(coined)) > 400 and all(c[0].isupper() and c not in ex.CITIES_HELD_SET for c in coined)
    # about half the JSON answers of training name someone the name tables do not hold
    examples = [ex.json_example(rng, "train") for _ in range(400)]
    names = []
    for example in examples:
        answer = json.loads(example.messages[-1]["content"])
        name = answer.get("name", answer.get("who"))
        assert name in example.messages[1]["content"]  # copied from the user's text
        names.append(name)
    made_up = sum(n not in ex.NAMES_TRAIN for n in names) / len(names)
    assert 0.35 < made_up < 0.65


def test_the_shipped_evaluation_set_is_the_generated_one():
    shipped = (REPO / "models" / "eval" / "chat" / "heldout.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in shipped] == cc.eval_lines()


def test_chat_weights_override_the_recipes_and_refuse_an_unknown_kind():
    assert cc.parse_weights("tool=40,json=20") == {"tool": 40.0, "json": 20.0}
    only_tools = cc.training_examples("glm", 50, 1, {k: 0 for k in ex.GENERATORS} | {"tool": 1})
    assert {e.kind for e in only_tools} <= {"tool", "parallel_tool"}
    with pytest.raises(ValueError, match="unknown kind 'tools'"):
        cc.parse_weights("tools=3")
