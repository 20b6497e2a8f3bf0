"""The families' markers as tokens of their own (models/recipe/tokenizer.py MARKER_TOKENS) under
grammar-guided decoding: a tool-call grammar's "<tool_call>" is matched by the one token the model
writes, and what a closer forces is spelled as the model spells it."""

from __future__ import annotations

import json

import llguidance
import pytest

from engine.structured.guide_tokenizer import markers_as_text
from engine.structured.guided import GuideCompiler
from engine.tokenizer import TextTokenizer
from models.recipe.tokenizer import extend_tokenizer
from tests.conftest import REPO


@pytest.fixture(scope="module")
def glm_tok(tmp_path_factory):
    out = tmp_path_factory.mktemp("glm")
    extend_tokenizer(REPO / "models" / "glm-4.5-mini", out, "glm")
    return TextTokenizer(out)


def test_a_grammar_literal_takes_the_markers_one_token(glm_tok):
    marker = glm_tok.encode("<tool_call>")
    assert len(marker) == 1
    compiler = GuideCompiler(glm_tok._tok.to_str(), [0], 4128, encode=glm_tok.encode)
    matcher = llguidance.LLMatcher(
        compiler.tokenizer, llguidance.LLMatcher.grammar_from_lark('start: "<tool_call>" /[a-z]+/')
    )
    assert matcher.consume_token(marker[0]) and not matcher.is_error()
    # bytes a grammar forces are allowed only as the model spells them: the marker in one token
    grammar = llguidance.LLMatcher.grammar_from_lark('start: ("a" | "b") "\\n<arg_key>" /[a-z]+/')
    forced = llguidance.LLMatcher(compiler.tokenizer, grammar)
    assert forced.consume_tokens(glm_tok.encode("a"))
    assert forced.compute_ff_tokens() == glm_tok.encode("\n<arg_key>")
    # what a closer forces: the marker in one token, as the model writes it
    assert compiler.tokenize(b"</arg_value>\n</tool_call>") == glm_tok.encode("</arg_value>\n</tool_call>")
    assert len(compiler.tokenize(b"</tool_call>")) == 1


def test_without_marker_tokens_the_tokenizer_goes_to_llguidance_unchanged():
    # the shipped tokenizer less any text markers: a Python-only tokenizer, as before this change
    data = json.loads(TextTokenizer(REPO / "models" / "kimi-k2-mini")._tok.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["special"]]
    bare = json.dumps(data)
    compiler = GuideCompiler(bare, [5], 4096, encode=lambda text: [0])  # not consulted here
    own = llguidance.LLTokenizer(bare, n_vocab=4096, eos_token=[5])
    assert compiler.tokenize(b"<|tool_call_begin|>x") == own.tokenize_bytes(b"<|tool_call_begin|>x")
    plain = '{"added_tokens": [{"id": 0, "content": "<|im_end|>", "special": true}], "model": {"vocab": {}}}'
    assert markers_as_text(plain) == (plain, False)
    moved, changed = markers_as_text(
        '{"added_tokens": [{"id": 0, "content": "<|im_end|>", "special": true},'
        ' {"id": 1, "content": "<think>", "special": false}], "model": {"vocab": {"a": 2}}}'
    )
    assert changed and '"<think>": 1' in moved and '"content": "<think>"' not in moved
