"""Speculative decoding in the roofline: what a draft-and-verify step costs and what it yields.

One model, used by the planner's tables (`edge sim --speculative`) and by the capacity simulator's
replica steps (capacity.costmodel wraps a plan's step times with it), so both predict the same.

Inputs: the method (`ngram`: drafts looked up in the sequence's own context, no weights; `mtp`: a
multi-token-prediction layer), k draft tokens per step, the acceptance and the target's roofline.

* Acceptance: a_i is the chance that draft token i is accepted given that tokens 1..i-1 were
  (chained drafts decay: one rate a gives a_i = a, so position i survives with a^i). Expected
  tokens per sequence per step = 1 + sum_i prod_{j<=i} a_j (the verify always yields one token).
* Verify: the target's step over k+1 positions per decoding sequence. Weights and cached KV are
  read once per step; FLOPs (linear layers, LM head rows, attention over the context) scale with
  the k+1 positions; the k extra positions' KV is written whether or not they are kept (the
  rejected ones are rolled back afterwards). So a memory-bound step verifies for about a decode
  step's cost, and a compute-bound large one pays (k+1)x. With routed experts (both targets), each
  position routes on its own: a small batch's verify reads up to k+1 times the experts a decode
  step reads, so speculation pays least at small-to-middle batches and again once the verify
  reads nearly every expert (SpeculativeStepTimes.pays_again_from).
* Draft: `mtp` runs one more decoder layer of the target's own shape (MLA/GQA attention, the MoE
  with its routed and shared experts, the DeepSeek-V3 layout) plus the shared LM head for each draft
  token, chained k times, with its own one-layer KV; `ngram` costs ~0 (a host-side lookup).
* Speculation runs only while the batch has at most `max_decoders` decoding sequences (the
  engine's SpeculativeConfig.max_decoders); beyond that a step is a plain decode step.

Defaults: DeepSeek-V3's technical report (arXiv 2412.19437, section 5.4.3) measures 85-90%
acceptance of the second token predicted by its one MTP layer, giving 1.8x decode TPS; 0.85 is
the default MTP acceptance here. N-gram acceptance depends on how much the text repeats its
context; 0.5 per position is the default here (an assumption for code/RAG-like text, not a
published figure: pass --acceptance).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from edge_sim.roofline import RooflineModel, SimulationError

__all__ = [
    "DEFAULT_ACCEPTANCE",
    "SpeculationSpec",
    "SpeculativeStepTimes",
    "expected_tokens",
    "parse_acceptance",
    "parse_speculative",
]

METHODS = ("ngram", "mtp")
# mtp: DeepSeek-V3 report, 85-90% acceptance of the 2nd token (the low end); ngram: an assumption
DEFAULT_ACCEPTANCE = {"mtp": 0.85, "ngram": 0.5}
DEFAULT_TOKENS = {"mtp": 1, "ngram": 5}  # DeepSeek-V3 ships one MTP layer; vLLM's ngram default is 5
MAX_TOKENS = 14  # engine.speculation: a KV block's room
# MTP layers the published checkpoints ship (config.json's num_nextn_predict_layers)
SHIPPED_MTP_LAYERS = {"kimi-k2": 0, "glm-4.5": 1, "deepseek-v3": 1}


def mtp_note(model_name: str) -> str:
    """What "with MTP" means for a target: its own shipped layer, or one assumed on its shape."""
    shipped = SHIPPED_MTP_LAYERS.get(model_name.lower())
    if shipped == 0:
        return (
            f"{model_name}'s release ships no MTP layer (num_nextn_predict_layers = 0): this is a "
            f"DeepSeek-V3-layout MTP layer on {model_name}'s shape, assumed"
        )
    if shipped:
        return f"{model_name} ships {shipped} MTP layer (num_nextn_predict_layers = {shipped})"
    return f"{model_name}: an MTP layer of its shape, assumed"


class SpeculationSpec(msgspec.Struct, frozen=True):
    """`acceptance`: per draft position, the chance it is accepted given the ones before it were;
    `max_decoders`: speculate only while at most this many sequences decode (None: decide from the
    roofline, the largest batch at which speculation still pays; see SpeculativeStepTimes)."""

    method: Literal["ngram", "mtp"]
    num_tokens: int
    acceptance: tuple[float, ...]
    max_decoders: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            methods = ", ".join(METHODS)
            raise SimulationError(f"speculative method must be one of {methods}, got {self.method!r}")
        if not 1 <= self.num_tokens <= MAX_TOKENS:
            raise SimulationError(f"speculative draft tokens must be 1-{MAX_TOKENS}, got {self.num_tokens}")
        if len(self.acceptance) != self.num_tokens:
            raise SimulationError(
                f"acceptance: {len(self.acceptance)} rates for {self.num_tokens} draft tokens; give one rate "
                f"or one per draft position"
            )
        for a in self.acceptance:
            if not 0.0 <= a <= 1.0:
                raise SimulationError(f"acceptance rates must be in [0, 1], got {a!r}")
        if self.max_decoders is not None and self.max_decoders < 0:
            raise SimulationError(f"speculative max_decoders must be >= 0, got {self.max_decoders}")

    @property
    def expected_tokens(self) -> float:
        return expected_tokens(self.acceptance)

    def describe(self) -> str:
        same = len(set(self.acceptance)) == 1
        rates = f"{self.acceptance[0]:g}" if same else ",".join(f"{a:g}" for a in self.acceptance)
        return f"{self.method}:{self.num_tokens} at acceptance {rates}"


def expected_tokens(acceptance: tuple[float, ...] | list[float]) -> float:
    """Tokens one sequence gains per verify step: 1 + sum_i prod_{j<=i} a_j."""
    total, survive = 1.0, 1.0
    for a in acceptance:
        survive *= a
        total += survive
    return total


def parse_acceptance(text: str | None, num_tokens: int, method: str) -> tuple[float, ...]:
    """'0.85' (one rate: every position's conditional rate) or '0.9,0.7' (one per position)."""
    if text is None or not text.strip():
        return (DEFAULT_ACCEPTANCE[method],) * num_tokens
    try:
        rates = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise SimulationError(
            f"--acceptance {text!r}: give a rate in [0, 1] (e.g. 0.85) or one per draft position (0.9,0.7)"
        ) from None
    if len(rates) == 1:
        rates = rates * num_tokens
    return rates


def parse_speculative(
    text: str, acceptance: str | None = None, max_decoders: int | None = None
) -> SpeculationSpec | None:
    """'off', 'mtp', 'mtp:K', 'ngram' or 'ngram:K' (K draft tokens per step) into a spec."""
    value = text.strip().lower()
    if value in ("", "off", "none", "0"):
        return None
    method, _, k = value.partition(":")
    if method not in METHODS or (k and not k.isdigit()):
        raise SimulationError(
            f"--speculative {text!r}: use off, mtp, mtp:K, ngram or ngram:K (K draft tokens per step, "
            f"1-{MAX_TOKENS}), e.g. --speculative mtp:1"
        )
    n = int(k) if k else DEFAULT_TOKENS[method]
    return SpeculationSpec(method, n, parse_acceptance(acceptance, n, method), max_decoders)  # type: ignore[arg-type]


def mtp_layer_model(target: RooflineModel) -> RooflineModel:
    """The MTP module's roofline: one MoE decoder layer of the target's shape plus the shared LM
    head, on the same GPUs and formats (the DeepSeek-V3 layout; its eh_proj, 2h x h, is small
    beside the layer and not counted)."""
    m = target.model
    layer = msgspec.structs.replace(m, name=f"{m.name} MTP layer", num_layers=1, first_dense_layers=0)
    return RooflineModel(layer, target.gpu, target.gpus, target.weights, target.kv, target.eff)


class SpeculativeStepTimes:
    """A target layout's decode step with speculation: verify, draft, and the expected yield.

    `decode_ms` / `step_ms` have the plain RooflineStepTimes signatures and return the time per
    *token step* (a verify step's cost over its expected tokens) while speculation runs, so the
    simulator's policy, which advances decoders one token per step, sees the speculative TPOT."""

    def __init__(self, target: RooflineModel, spec: SpeculationSpec, context: float = 2048.0):
        self.target, self.spec = target, spec
        self.plain = target.times
        self.k = spec.num_tokens
        self.expected = spec.expected_tokens
        self.draft_model = mtp_layer_model(target) if spec.method == "mtp" else None
        self.draft_weight_bytes_per_gpu = 0.0  # what the draft adds to the target's weights
        if self.draft_model is not None:  # the embeddings and LM head are the target's, shared
            b = self.draft_model.weight_bytes.bytes
            shared = (b["embeddings"] + b["lm_head"]) / target.gpus
            self.draft_weight_bytes_per_gpu = self.draft_model.weight_bytes_per_gpu - shared
        self.crossover = self.crossover_batch(context)
        self.pays_again = self.pays_again_from(context)
        self.paying = self.paying_ranges(context)
        if spec.max_decoders is not None:
            self.max_decoders = spec.max_decoders
        else:  # the back-off a tuned engine would set: speculate while it pays at this context
            self.max_decoders = (self.crossover - 1) if self.crossover is not None else 1 << 30

    def verify_ms(self, batch: float, kv_tokens: float) -> float:
        """The target's step over k+1 positions for each of `batch` sequences (KV read once)."""
        if batch <= 0:
            return 0.0
        t, q = self.plain, self.k + 1
        rows = batch * q
        compute = (t.c0 + t.c1) * rows + t.c3 * kv_tokens * q
        # KV read once; the k extra positions' KV written (kept or rolled back) at the same bytes per token
        memory = t.c4 + t.c5 * (1.0 - t.c6**rows) + t.c7 * (kv_tokens + batch * self.k)
        return max(compute, memory) + t.c8 + t.c9 * rows

    def draft_ms(self, batch: float, kv_tokens: float) -> float:
        """k chained MTP steps (one layer + LM head each) for `batch` sequences; n-gram: 0."""
        if self.draft_model is None or batch <= 0:
            return 0.0
        return self.k * self.draft_model.times.decode_ms(batch, kv_tokens)

    def speculative_step_ms(self, batch: float, kv_tokens: float) -> float:
        return self.verify_ms(batch, kv_tokens) + self.draft_ms(batch, kv_tokens)

    def speculates(self, batch: float) -> bool:
        return 0 < batch <= self.max_decoders

    def gain(self, batch: float, context: float) -> float:
        """Tokens per ms with speculation over without, at `batch` sequences of `context` tokens."""
        plain = self.plain.decode_ms(batch, batch * context)
        return self.expected * plain / self.speculative_step_ms(batch, batch * context)

    def crossover_batch(self, context: float, limit: int = 4096) -> int | None:
        """The smallest batch at which the expected tokens no longer cover the verify+draft step
        (gain <= 1), or None when speculation pays up to `limit` sequences. Scanned, not bisected:
        an MoE target's gain is not monotonic (see pays_again_from)."""
        for b in range(1, limit + 1):
            if self.gain(b, context) <= 1.0:
                return b
        return None

    def pays_again_from(self, context: float, limit: int = 4096) -> int | None:
        """The smallest batch past the crossover at which speculation pays again, or None. With
        routed experts a small batch's verify reads k+1 times the experts a decode step reads;
        the extra reads level off as the verify reads them all, and the extra positions are
        cheap again until the step turns compute-bound."""
        c = self.crossover_batch(context, limit)
        if c is None:
            return None
        for b in range(c + 1, limit + 1):
            if self.gain(b, context) > 1.0:
                return b
        return None

    def paying_ranges(self, context: float, limit: int = 4096) -> list[tuple[int, int]]:
        """The batch ranges (first, last, inclusive) in 1..`limit` at which speculation pays."""
        ranges: list[tuple[int, int]] = []
        start = None
        for b in range(1, limit + 1):
            pays = self.gain(b, context) > 1.0
            if pays and start is None:
                start = b
            elif not pays and start is not None:
                ranges.append((start, b - 1))
                start = None
        if start is not None:
            ranges.append((start, limit))
        return ranges

    # --- the plain RooflineStepTimes interface, per token step -----------------------------------

    def decode_ms(self, batch: float, kv_tokens: float) -> float:
        if not self.speculates(batch):
            return self.plain.decode_ms(batch, kv_tokens)
        return self.speculative_step_ms(batch, kv_tokens) / self.expected

    def step_ms(
        self,
        prefill_tokens: float,
        prefill_pairs: float,
        prefill_kv: float,
        decode_seqs: float,
        decode_kv: float,
    ) -> float:
        # A step that carries a prefill chunk is modelled without speculation (its decoders gain
        # one token): the policy advances the chunk and the decoders together.
        if prefill_tokens > 0:
            return self.plain.step_ms(prefill_tokens, prefill_pairs, prefill_kv, decode_seqs, decode_kv)
        return self.decode_ms(decode_seqs, decode_kv)
