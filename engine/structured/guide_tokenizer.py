"""The llguidance tokenizer of a model whose tokenizer holds markers that decode as text.

The families' tool and think markers (`<tool_call>`, `<|tool_call_begin|>`, `<think>`, ...) are added
tokens of the miniatures' tokenizers with "special": false, as in the published ones: one token each,
decoded as text. llguidance reads every added token of a tokenizer.json as special (its bytes marked
apart from text), so a grammar's "<tool_call>" would match only the marker spelled out byte by byte.
And where a grammar forces bytes, llguidance allows only its own (canonical) tokenization of them, so
a marker forced after a key would be spelled out too, a context the model never saw in training.

So for such a tokenizer llguidance gets a TokenizerWrapper: each token's bytes (a marker's are its
text), the truly special ids apart, and the model's own tokenizer as the canonical one; every other
tokenizer goes to llguidance as its tokenizer.json, as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import llguidance


def _text_markers(data: dict) -> list[dict]:
    """Added tokens that decode as text, printable ASCII without spaces (a byte-level or metaspace
    vocabulary spells such text as itself)."""
    return [
        t
        for t in data.get("added_tokens") or []
        if not t.get("special") and t["content"] and all("!" <= c <= "~" for c in t["content"])
    ]


def marker_tokens(tokenizer_json: str) -> dict[str, int]:
    """Each text marker's own token id, by its text (what a tool grammar's markers resolve to:
    engine.structured.tool_calls.resolve_markers)."""
    return {t["content"]: t["id"] for t in _text_markers(json.loads(tokenizer_json))}


def markers_as_text(tokenizer_json: str) -> tuple[str, bool]:
    """The tokenizer.json with each text marker moved into the model's vocabulary under its own id
    (so llguidance reads its bytes as text); True when one was moved."""
    data = json.loads(tokenizer_json)
    vocab = (data.get("model") or {}).get("vocab")
    markers = _text_markers(data)
    if not markers or not isinstance(vocab, dict):
        return tokenizer_json, False
    for token in markers:
        vocab[token["content"]] = token["id"]
    moved = {t["id"] for t in markers}
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] not in moved]
    return json.dumps(data), True


class _Spelled:
    """What llguidance.TokenizerWrapper reads: the tokens' bytes, the special ids, and encode."""

    bos_token_id = None

    def __init__(self, plain: llguidance.LLTokenizer, data: dict, vocab_size: int, eos: int, encode):
        special = {t["id"]: t["content"].encode() for t in data.get("added_tokens") or [] if t.get("special")}
        known = plain.vocab_size
        self.tokens = [
            special[i] if i in special else plain.decode_bytes([i]) if i < known else b""
            for i in range(vocab_size)
        ]
        self.special_token_ids = sorted(special)
        self.eos_token_id = eos
        self._encode = encode

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("text, not bytes")  # tells the wrapper to hand over str
        return self._encode(text)


def guide_tokenizer(
    tokenizer_json: str, eos_ids: list[int], vocab_size: int, encode: Callable[[str], list[int]] | None
) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for the model (see the module's docstring)."""
    moved_json, moved = markers_as_text(tokenizer_json)
    if not moved or encode is None:
        return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_ids)
    plain = llguidance.LLTokenizer(moved_json, n_vocab=vocab_size, eos_token=eos_ids)
    eos = eos_ids[0] if eos_ids else 0
    spelled = _Spelled(plain, json.loads(tokenizer_json), vocab_size, eos, encode)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(spelled), n_vocab=vocab_size, eos_token=eos_ids)
