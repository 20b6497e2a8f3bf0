"""Log-probabilities of sampled tokens and the likeliest alternatives, batched over a step's rows.

They are the model's raw distribution: log_softmax of the logits as the model produced them,
before repetition/frequency/presence penalties, temperature, top-k/top-p/min-p and any grammar
mask (vLLM's default). So a guided or penalised row may be shown a chosen token whose logprob is
lower than a top alternative it was not allowed to pick.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.outputs import Logprobs, SeqEvent, TokenLogprob


class TokenSpeller:
    """A token's text and UTF-8 bytes as OpenAI shows them: the bytes are the piece's own (a
    byte-level piece that is part of a multi-byte character keeps its real bytes), the text those
    bytes decoded with U+FFFD for what is not a whole character."""

    def __init__(self, token_bytes: Callable[[int], bytes]):
        self._token_bytes = token_bytes
        self._known: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int, logprob: float) -> TokenLogprob:
        spelled = self._known.get(token)
        if spelled is None:
            raw = self._token_bytes(token)
            spelled = self._known[token] = (raw.decode("utf-8", errors="replace"), list(raw))
        return TokenLogprob(spelled[0], logprob, spelled[1])


def step_logprobs(raw: torch.Tensor, chosen: list[int], ks: list[int], spell: TokenSpeller) -> list[Logprobs]:
    """`raw`: the asking rows' log_softmax [rows, vocab]; `chosen`: each row's sampled token;
    `ks`: each row's top-k (0-20). One gather and one topk for all the rows."""
    picked = raw.gather(1, torch.tensor(chosen, device=raw.device).unsqueeze(1)).squeeze(1).tolist()
    k = max(ks)
    top_values, top_ids = raw.topk(k, dim=-1) if k else (None, None)
    values = top_values.tolist() if k else [[] for _ in ks]
    ids = top_ids.tolist() if k else [[] for _ in ks]
    return [
        Logprobs(
            spell(token, lp),
            [spell(t, v) for t, v in zip(ids[row][: ks[row]], values[row][: ks[row]], strict=True)],
        )
        for row, (token, lp) in enumerate(zip(chosen, picked, strict=True))
    ]


def attach_logprobs(events: list[SeqEvent], raw: torch.Tensor, ks: list[int], spell: TokenSpeller) -> None:
    """Set `logprobs` on each event that carries a token (row i of `raw` is events[i]'s)."""
    live = [i for i, event in enumerate(events) if event.token_id is not None]
    if not live:
        return
    chosen = [events[i].token_id for i in live]
    for i, lp in zip(live, step_logprobs(raw[live], chosen, [ks[i] for i in live], spell), strict=True):
        events[i].logprobs = lp
