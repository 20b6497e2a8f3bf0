"""The model runner: a step's plan in, the forward's outputs back (as nano-vllm's model_runner and
vLLM v1's GPUModelRunner).

The engine asks the scheduling policy what to run and hands the plan here; the runner owns what
the model sees of it: the flat token batch with its positions, each sequence's slice of it, the
rows the forward runs (a speculating decoder's real token and drafts as one row each), the choice
of forward (the eager model, which stays the reference; a compiled decode bucket; the compiled
greedy graph that also drafts the next step) and the float32 logits of the rows that sample. The
engine keeps the policy's bookkeeping, sampling and events.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv.batch import SeqSlice, StepBatch
from engine.sequence import Sequence
from engine.step.compiled_step import CompiledDecode

# which forward ran a step (StepStats.forward_path)
EAGER, COMPILED, GREEDY_GRAPH = "eager", "compiled", "greedy-graph"


@dataclass
class StepInputs:
    """What one step runs: `plan` (sequence, tokens computed this step) decoders first."""

    plan: list[tuple[Sequence, int]]
    chunks: int  # how many of the plan's entries are prefill chunks (the last ones)
    ids: list[int]  # the flat token batch: each entry's tokens, then its drafts
    positions: list[int]
    slices: list[SeqSlice]  # one per plan entry
    rows: list[SeqSlice]  # as the forward runs them (decode_rows)
    samplers: list[tuple[Sequence, SeqSlice]]  # entries whose last row samples a token
    speculated: list[tuple[Sequence, SeqSlice]]  # entries whose rows verify a draft


@dataclass
class StepOutput:
    hidden: torch.Tensor  # final hidden states, one row per token of the batch
    logits: torch.Tensor | None  # the greedy graph's float32 logits of every row (else computed on demand)
    next_drafts: torch.Tensor | None  # the greedy graph's MTP draft after each row
    path: str  # EAGER, COMPILED or GREEDY_GRAPH


class ModelRunner:
    def __init__(self, model, cache, compiled: CompiledDecode | None, mtp_draft_tokens: int = 0):
        """`mtp_draft_tokens`: MTP drafts per step (0 without MTP); one a step lets a greedy batch
        run the greedy graph."""
        self.model = model
        self.cache = cache
        self.device = cache.device
        self.compiled = compiled
        self.mtp_draft_tokens = mtp_draft_tokens

    def prepare(
        self, plan: list[tuple[Sequence, int]], chunks: int, drafts: dict[int, list[int]]
    ) -> StepInputs:
        """The step's inputs; `drafts`: speculative draft tokens by sequence order, verified after
        the decoder's real token."""
        ids: list[int] = []
        positions: list[int] = []
        slices: list[SeqSlice] = []
        for seq, n in plan:
            tokens = seq.tokens[seq.num_computed : seq.num_computed + n]
            draft = drafts.get(seq.order)
            if draft:  # the real token, then the guesses: verified together, causally
                tokens = tokens + draft
            slices.append(SeqSlice(seq.kv, len(ids), len(tokens), seq.num_computed))
            ids.extend(tokens)
            positions.extend(range(seq.num_computed, seq.num_computed + len(tokens)))
        samplers = [
            (seq, sl)
            for (seq, n), sl in zip(plan, slices, strict=True)
            if seq.num_computed + n == len(seq.tokens) and seq.order not in drafts
        ]
        speculated = [(seq, sl) for (seq, _), sl in zip(plan, slices, strict=True) if seq.order in drafts]
        rows = decode_rows(slices, len(plan) - chunks)
        return StepInputs(plan, chunks, ids, positions, slices, rows, samplers, speculated)

    def run(self, inputs: StepInputs) -> StepOutput:
        """The forward pass: the greedy graph when the whole batch may take it, a compiled bucket
        for other decode-only steps whose bucket is ready, else the eager model."""
        compiled, ids = self.compiled, inputs.ids
        if compiled is not None and not inputs.chunks and self._greedy_graph(inputs.plan, len(ids)):
            hidden, logits, _, next_drafts = compiled.greedy_decode(ids, inputs.rows)
            return StepOutput(hidden, logits, next_drafts, GREEDY_GRAPH)
        if compiled is not None and not inputs.chunks and compiled.accepts(len(ids)):
            return StepOutput(compiled.decode(ids, inputs.rows), None, None, COMPILED)  # one token a row
        hidden = self.model.forward(
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(inputs.positions, dtype=torch.long, device=self.device),
            StepBatch(inputs.rows, self.device, self.cache.layers),
        )
        return StepOutput(hidden, None, None, EAGER)

    def logits(self, out: StepOutput, rows: list[int]) -> torch.Tensor:
        """Float32 logits of these rows (a copy: biases and masks apply to it in place), from the
        greedy graph's when it computed them."""
        return out.logits[rows] if out.logits is not None else self.model.logits(out.hidden[rows])

    def _greedy_graph(self, plan, rows: int) -> bool:
        """Whether this decode-only step runs the compiled greedy graph, which drafts the next step
        inside it (engine.step.compiled_step.CompiledDecode.greedy_decode): one MTP draft token a step,
        and every sequence greedy with no penalties, biases, grammar or logprobs, so the argmax
        the graph feeds the MTP layer is the token each row emits."""
        compiled = self.compiled
        if self.mtp_draft_tokens != 1 or compiled is None or not compiled.accepts_mtp(rows):
            return False
        return all(
            p.greedy and not p.penalised and not p.logit_bias and p.logprobs is None and seq.guide is None
            for seq, _ in plan
            for p in (seq.params,)
        )


def decode_rows(slices: list[SeqSlice], decoders: int) -> list[SeqSlice]:
    """The step's slices as the forward pass runs them: a speculating decoder's real token and
    drafts become one single-token row each, at consecutive positions of its one block table, so
    they take the batched decode path (and the compiled graph) instead of a per-sequence prefill.
    Each layer writes every row's keys and values before any row reads, and each row reads
    only up to its own position, so a row sees exactly the real token and drafts before it, as a
    causal pass over them would; the rows stay inside the block being filled, never its last slot
    (engine.step.mtp_drafts.draft_room), so a staged format seals no block with a draft.
    `slices[:decoders]` are the decoders' (the policy's plan lists them first)."""
    if all(sl.length == 1 for sl in slices[:decoders]):
        return slices
    rows = []
    for i, sl in enumerate(slices):
        if i < decoders and sl.length > 1:
            rows.extend(SeqSlice(sl.blocks, sl.start + j, 1, sl.past + j) for j in range(sl.length))
        else:
            rows.append(sl)
    return rows
