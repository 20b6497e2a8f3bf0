"""What each training row holds: code (the standard library, as the first training), English prose, or
chat conversations packed end to end, trained on their assistant turns only (the prompts' labels are
-100). The shares are the recipe's `--chat-share` / `--prose-share`; the rest is code, so code is
not forgotten. The long-context phase is code only."""

from __future__ import annotations

import random

import torch

IGNORE = -100  # transformers' label for "no loss here"


class Mixture:
    def __init__(self, tokenizer, args, code: torch.Tensor):
        self.code = code
        self.chat_share, self.prose_share = args.chat_share, args.prose_share
        self.rng = random.Random(args.seed + 7)
        self.chat: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.prose = torch.zeros(0, dtype=torch.int32)
        self.weights: dict[str, float] = {}  # --chat-weights: kinds' weights over the recipe's own
        if self.chat_share:
            from models.recipe.chat_corpus import chat_tokens, parse_weights

            self.weights = parse_weights(getattr(args, "chat_weights", "") or "")
            for ids, mask in chat_tokens(tokenizer, args.family, args.chat_examples, args.seed, self.weights):
                self.chat.append((torch.tensor(ids), torch.tensor(mask)))
            tokens = sum(len(ids) for ids, _ in self.chat)
            print(f"chat conversations {len(self.chat):,}, {tokens:,} tokens", flush=True)
        if self.prose_share:
            from models.recipe.chat_corpus import prose_tokens

            self.prose = prose_tokens(tokenizer)
            print(f"prose tokens {len(self.prose):,}", flush=True)

    def describe(self) -> dict:
        return {
            "chat_share": self.chat_share,
            "prose_share": self.prose_share,
            "chat_conversations": len(self.chat),
            **({"chat_weights": self.weights} if self.weights else {}),
            "prose_text": "Python's pydoc_data/topics.py" if self.prose_share else None,
        }

    def batch(self, rows: int, seq: int, gen: torch.Generator, long: bool = False):
        """(inputs, labels) of shape rows x seq."""
        xs, ys = [], []
        for _ in range(rows):
            draw = self.rng.random()
            if not long and draw < self.chat_share:
                x, y = self._chat_row(seq)
            elif not long and draw < self.chat_share + self.prose_share:
                x = self._window(self.prose, seq, gen)
                y = x.clone()
            else:
                x = self._window(self.code, seq, gen)
                y = x.clone()
            xs.append(x)
            ys.append(y)
        return torch.stack(xs), torch.stack(ys)

    @staticmethod
    def _window(tokens: torch.Tensor, seq: int, gen: torch.Generator) -> torch.Tensor:
        start = int(torch.randint(0, len(tokens) - seq - 1, (1,), generator=gen))
        return tokens[start : start + seq].long()

    def _chat_row(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole conversations end to end until the row is full (the last one cut)."""
        ids, labels, used = [], [], 0
        while used < seq:
            x, mask = self.chat[self.rng.randrange(len(self.chat))]
            ids.append(x)
            labels.append(torch.where(mask, x, torch.full_like(x, IGNORE)))
            used += len(x)
        return torch.cat(ids)[:seq].long(), torch.cat(labels)[:seq].long()
