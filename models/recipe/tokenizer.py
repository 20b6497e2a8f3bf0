"""Train the miniatures' byte-level BPE tokenizer on the training corpus (seeded, deterministic).

    python -m models.recipe.tokenizer OUT_DIR --vocab 4096 --family kimi

Writes tokenizer.json and tokenizer_config.json (with the family's chat template).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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

CHAT_TEMPLATES = {
    # Kimi K2's layout: role markers, <|im_middle|> between role and content, <|im_end|> after each turn.
    "kimi": (
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
        "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
        "{%- else -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
        "{{ message['content'] }}<|im_end|>"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    ),
    # GLM-4.5's layout: [gMASK]<sop> once, then <|role|> and a newline before each turn's content.
    "glm": (
        "[gMASK]<sop>"
        "{%- for message in messages -%}"
        "<|{{ message['role'] }}|>\n{{ message['content'] }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|assistant|>\n{%- endif -%}"
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
    tokenizer.save(str(out / "tokenizer.json"))
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
    return tokenizer


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
