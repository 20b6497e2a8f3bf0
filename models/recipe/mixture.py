"""What each training row holds: code (the standard library, as the first training), English prose, or
chat conversations packed end to end (whole ones: ChatRows), trained on their assistant
turns only (the prompts' labels are -100). The shares are the recipe's `--chat-share` /
`--prose-share`; the rest is code, so code is not forgotten. The long-context phase is code only."""

from __future__ import annotations

import bisect
import random

import torch

IGNORE = -100  # transformers' label for "no loss here"
PAD = 0  # the input id under a row's padding (its labels are IGNORE; earlier tokens never see it)


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

            self.weights = parse_weights(args.chat_weights)
            for ids, mask in chat_tokens(tokenizer, args.family, args.chat_examples, args.seed, self.weights):
                self.chat.append((torch.tensor(ids), torch.tensor(mask)))
            self.rows = ChatRows(self.chat, self.rng)
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
                x, y = self.rows.row(seq)
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


class ChatRows:
    """Chat rows of whole conversations. A row is filled with conversations drawn at random; where
    the one drawn does not fit in what is left, one that does is drawn among those short enough,
    and what none fills is padding with no loss. A cut conversation loses its end, and the end is
    what is trained: a tool call follows its declaration and the answer the tool's result (a GLM
    tool conversation is about 420 tokens, so rows of 256 cut every call). A conversation longer
    than the row is cut."""

    def __init__(self, conversations: list[tuple[torch.Tensor, torch.Tensor]], rng: random.Random):
        self.conversations, self.rng = conversations, rng
        self.by_length = sorted(range(len(conversations)), key=lambda i: len(conversations[i][0]))
        self.lengths = [len(conversations[i][0]) for i in self.by_length]

    def row(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, labels, used = [], [], 0
        while used < seq:
            x, mask = self.conversations[self.rng.randrange(len(self.conversations))]
            if used and len(x) > seq - used:
                fitting = bisect.bisect_right(self.lengths, seq - used)
                if not fitting:
                    ids.append(torch.full((seq - used,), PAD, dtype=x.dtype))
                    labels.append(torch.full((seq - used,), IGNORE, dtype=x.dtype))
                    break
                x, mask = self.conversations[self.by_length[self.rng.randrange(fitting)]]
            ids.append(x)
            labels.append(torch.where(mask, x, torch.full_like(x, IGNORE)))
            used += len(x)
        return torch.cat(ids)[:seq].long(), torch.cat(labels)[:seq].long()
