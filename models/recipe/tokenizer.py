"""Train the miniatures' byte-level BPE tokenizer on the training corpus (seeded, deterministic).

    python -m models.recipe.tokenizer OUT_DIR --vocab 4096 --family kimi

Writes tokenizer.json and tokenizer_config.json (with the family's chat template).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from models.recipe.corpus import read_corpus

# Special tokens follow each family's published tokenizer, so their chat templates look the same.
SPECIAL_TOKENS = {
    "kimi": [
        "<|endoftext|>",
        "<|im_system|>",
        "<|im_user|>",
        "<|im_assistant|>",
        "<|im_middle|>",
        "<|im_end|>",
    ],
    "glm": [
        "<|endoftext|>",
        "[gMASK]",
        "<sop>",
        "<|system|>",
        "<|user|>",
        "<|assistant|>",
        "<|observation|>",
    ],
}

# The families' chat, tool and reasoning markers that the published tokenizers hold as single tokens
# (Kimi K2's tool-call section; GLM-4.5's tool call, argument, tool-response and think tags). They are
# added tokens that decode as text ("special": false), so a reply's text carries them to the tool and
# reasoning parsers (vLLM decodes Kimi's with skip_special_tokens=False for the same reason), and a
# one-argument call is a handful of tokens rather than its markup spelled out byte by byte.
MARKER_TOKENS = {
    "kimi": [
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    ],
    "glm": [
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "/nothink",
    ],
}
VOCAB_MULTIPLE = 32  # the embedding is padded to a multiple of this beyond the tokenizer's tokens

CHAT_TEMPLATES = {
    # Kimi K2's layout: role markers, <|im_middle|> between role and content, <|im_end|> after each
    # turn; the tools declared in a `tool_declare` system turn and a result in a `tool` one
    # (engine.structured.tool_calls.render_messages writes both, and the calls into an assistant's content).
    "kimi": (
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
        "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
        "{%- elif message['role'] in ('tool', 'tool_declare') -%}"
        "<|im_system|>{{ message['role'] }}<|im_middle|>"
        "{%- else -%}<|im_system|>system<|im_middle|>{%- endif -%}"
        "{{ message['content'] }}<|im_end|>"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    ),
    # GLM-4.5's layout: [gMASK]<sop> once, then <|role|> and a newline before each turn's content; an
    # earlier assistant turn keeps an empty <think></think> (its reasoning is not carried), tool
    # results come in an observation turn; thinking off (enable_thinking false) appends /nothink to
    # user turns and writes the empty block after the generation prompt itself, as the published
    # template does.
    "glm": (
        "[gMASK]<sop>"
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'assistant' -%}<|assistant|>{{ '\\n<think></think>' }}"
        "{%- if message['content'].strip() -%}{{ '\\n' + message['content'].strip() }}{%- endif -%}"
        "{%- elif message['role'] == 'user' -%}<|user|>{{ '\\n' + message['content'] }}"
        "{{- '/nothink' if (enable_thinking is defined and not enable_thinking"
        " and not message['content'].endswith('/nothink')) else '' -}}"
        "{%- else -%}<|{{ message['role'] }}|>{{ '\\n' + message['content'] }}{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|assistant|>"
        "{{- '\\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' -}}"
        "{%- endif -%}"
    ),
}
EOS_TOKENS = {"kimi": "<|im_end|>", "glm": "<|endoftext|>"}


def train_tokenizer(vocab_size: int, family: str) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS[family],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = read_corpus()
    chunk = 1 << 16
    tokenizer.train_from_iterator(
        (corpus[i : i + chunk] for i in range(0, len(corpus), chunk)), trainer=trainer
    )
    return tokenizer


def write_tokenizer(out: Path, vocab_size: int, family: str) -> Tokenizer:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size, family)
    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKER_TOKENS[family]])
    tokenizer.save(str(out / "tokenizer.json"))
    _write_config(out, family)
    return tokenizer


def extend_tokenizer(src: Path, out: Path, family: str) -> Tokenizer:
    """The tokenizer of the checkpoint in `src` with the family's marker tokens added (ids after its
    own, decoded as text), and the family's chat template, written to `out`."""
    tokenizer = Tokenizer.from_file(str(src / "tokenizer.json"))
    have = tokenizer.get_vocab(with_added_tokens=True)
    new = [m for m in MARKER_TOKENS[family] if m not in have]
    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in new])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    _write_config(out, family)
    return tokenizer


def _write_config(out: Path, family: str) -> None:
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKENS[family],
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATES[family],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--family", choices=sorted(SPECIAL_TOKENS), default="kimi")
    args = parser.parse_args()
    tok = write_tokenizer(args.out, args.vocab, args.family)
    print(f"wrote {args.out}/tokenizer.json with {tok.get_vocab_size()} tokens")


if __name__ == "__main__":
    main()
