"""Tokenizer (tokenizers' tokenizer.json), chat template (jinja2) and streaming detokenization."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from engine.errors import InvalidRequestError, ModelLoadError


class TextTokenizer:
    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{model_dir}: no tokenizer.json")
        self._tok = Tokenizer.from_file(str(path))
        cfg_path = model_dir / "tokenizer_config.json"
        cfg: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.chat_template: str | None = cfg.get("chat_template")
        eos = cfg.get("eos_token")
        self.eos_token_id = self._tok.token_to_id(eos) if isinstance(eos, str) else None
        self._template = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for (a byte-level token's length is its bytes,
        at least the characters it decodes to): text longer than this times a window cannot fit."""
        return max((len(piece) for piece in self._tok.get_vocab(with_added_tokens=True)), default=1)

    @functools.cached_property
    def vocabulary(self) -> frozenset[str]:
        """The tokens that decode as text (special tokens are dropped from decoded text): where a
        family's markers, say `<think>`, are among them, a reply's text carries them."""
        special = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        return frozenset(self._tok.get_vocab(with_added_tokens=True).keys() - special)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True, thinking: bool | None = None
    ) -> str:
        """The prompt as the model's own template writes it; `thinking` (None: the template's
        default) is given under both families' names: GLM-4.5's `enable_thinking`, Kimi's `thinking`."""
        if self.chat_template is None:
            raise InvalidRequestError("messages", "this model has no chat template; send a prompt instead")
        if self._template is None:
            self._template = ImmutableSandboxedEnvironment().from_string(self.chat_template)
        switch = {} if thinking is None else {"enable_thinking": thinking, "thinking": thinking}
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **switch)


class IncrementalDetokenizer:
    """Turns a token stream into text deltas that never end inside a multi-byte character.

    Decodes a short window (from the last emitted boundary) rather than the whole sequence, so the
    cost per token stays flat as the output grows.
    """

    def __init__(self, tokenizer: TextTokenizer):
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # tokens whose text has been emitted

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        done = self._tok.decode(self._ids[self._prefix : self._read])
        text = self._tok.decode(self._ids[self._prefix :])
        if len(text) <= len(done) or (text.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(done) :]
