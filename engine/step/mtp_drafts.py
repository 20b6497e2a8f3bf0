"""MTP drafts: after each step, the checkpoint's MTP layer (engine.models.mtp) runs over the rows
the main model just computed, and its argmax is the next step's draft.

For a row at position q the layer reads the main model's hidden state h_q and the token t_{q+1},
so a row runs once t_{q+1} is known: a prefill chunk's rows at once (their next tokens are the
prompt's), a decoding sequence's last row once its new token is chosen. Running every row keeps
the layer's own keys and values complete (it attends over all earlier positions, as layer N of
the paged cache); rows of a rejected draft are never run, so that cache holds only committed
positions. The last row's logits give the first draft token; more tokens chain the layer on its
own output, one row each, at the positions the next verify step will cover (speculative writes
inside the sequence's last block, never its last slot: rewritten by the next step's rows, and a
staged format's block is never sealed with them).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from engine.kv.batch import SeqSlice, StepBatch
from engine.kv.block_pool import BLOCK_SIZE
from engine.sequence import Sequence
from engine.speculation import MTPDraft

# a sequence's rows this many or fewer run as single-token rows (decode path, compiled graph)
DECODE_ROWS = 16


@dataclass
class MTPRows:
    """A sequence's rows this step that the MTP layer runs: positions past..past+count-1, whose
    main-model hidden states are rows hidden_start.. of the step's output."""

    seq: Sequence
    past: int
    hidden_start: int
    count: int


def draft_room(seq: Sequence, position: int) -> int:
    """Draft tokens a sequence whose next real token sits at `position` may verify: inside that
    token's block, never its last slot, and no more than its remaining max_tokens allow."""
    return min(
        BLOCK_SIZE - 2 - position % BLOCK_SIZE,
        seq.params.max_tokens - len(seq.output_ids) - 1,
    )


class MTPDrafter:
    """Runs one engine's MTP layer after each step and leaves each sequence its draft."""

    def __init__(self, layer, cache, device: torch.device, num_tokens: int, compiled=None):
        """`compiled`: the engine's engine.step.compiled_step.CompiledDecode built with the MTP layer's
        graphs; rows of a step run through them once their bucket is ready."""
        self.layer, self.cache, self.device, self.num_tokens = layer, cache, device, num_tokens
        self.compiled = compiled
        self.rows_run = 0  # MTP rows run since start (its cost, for the benchmarks)

    def run(self, rows: list[MTPRows], hidden: torch.Tensor) -> None:
        if not rows:
            return
        ids: list[int] = []
        positions: list[int] = []
        picks: list[int] = []
        slices: list[SeqSlice] = []
        for r in rows:
            if r.count <= DECODE_ROWS:  # one single-token row each: the batched decode path
                slices.extend(SeqSlice(r.seq.kv, len(ids) + j, 1, r.past + j) for j in range(r.count))
            else:  # a prefill chunk's rows
                slices.append(SeqSlice(r.seq.kv, len(ids), r.count, r.past))
            ids.extend(r.seq.tokens[r.past + 1 : r.past + 1 + r.count])
            positions.extend(range(r.past, r.past + r.count))
            picks.extend(range(r.hidden_start, r.hidden_start + r.count))
        out = self._forward(hidden[picks], ids, positions, slices)
        self.rows_run += len(ids)
        # sequences whose last row read their newest token draft what follows it
        ends = list(itertools.accumulate(r.count for r in rows))  # each sequence's rows end there
        drafting = [
            (ends[i] - 1, r.seq, draft_room(r.seq, r.past + r.count))
            for i, r in enumerate(rows)
            if r.past + r.count == len(r.seq.tokens) - 1
        ]
        drafting = [(i, seq, room) for i, seq, room in drafting if room > 0]
        if not drafting:
            return
        seqs = [seq for _, seq, _ in drafting]
        limits = [min(room, self.num_tokens) for _, _, room in drafting]
        state = out[[last for last, _, _ in drafting]]
        drafts = [[t] for t in self.layer.logits(state).argmax(dim=-1).tolist()]
        active = list(range(len(seqs)))  # the sequences still chaining, aligned with `state`'s rows
        for j in range(1, self.num_tokens):
            # draft j + 1 comes from a row at position P + j - 1 (P: the newest token's position),
            # which must lie in a block the sequence holds
            keep = [
                n
                for n, k in enumerate(active)
                if limits[k] > j and len(seqs[k].tokens) - 2 + j < seqs[k].kv.capacity
            ]
            if not keep:
                break
            active, state = [active[n] for n in keep], state[keep]
            chain = [SeqSlice(seqs[k].kv, n, 1, len(seqs[k].tokens) - 2 + j) for n, k in enumerate(active)]
            state = self._forward(state, [drafts[k][-1] for k in active], [sl.past for sl in chain], chain)
            self.rows_run += len(active)
            for k, t in zip(active, self.layer.logits(state).argmax(dim=-1).tolist(), strict=True):
                drafts[k].append(t)
        for seq, draft in zip(seqs, drafts, strict=True):
            self._store(seq, draft)

    def keep(self, seq: Sequence, draft: list[int]) -> None:
        """A draft made elsewhere (the compiled greedy graph) for the sequence's tokens now."""
        self._store(seq, draft)

    def _store(self, seq: Sequence, draft: list[int]) -> None:
        holder = seq.drafter
        if not isinstance(holder, MTPDraft):
            holder = seq.drafter = MTPDraft()
        holder.made_for, holder.tokens = len(seq.tokens), list(draft)

    def _forward(self, hidden, ids, positions, slices) -> torch.Tensor:
        compiled = self.compiled
        if compiled is not None and len(slices) == len(ids) and compiled.accepts_mtp(len(ids)):
            return compiled.mtp_decode(hidden, ids, slices)
        return self.layer.forward(
            hidden,
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            StepBatch(slices, self.device, self.cache.layers),
        )
