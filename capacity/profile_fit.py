"""The step-time formulas of a profiled engine (ProfileFit), its file (ProfileFile) and the fit."""

from __future__ import annotations

import msgspec


class ProfileFit(msgspec.Struct, kw_only=True):
    """Step-time fit for one KV dtype on one machine, with the cache and scheduler it ran with.

    decode step ms = base(B) + decode_kv_ms_per_1k * B * (C - context_per_seq) / 1000, with C the
    cached tokens per sequence (context_per_seq is 0 in a profile, whose base(B) has nothing
    cached), where base(B) interpolates `decode_batch_ms` (measured per batch size, extrapolated
    as _base says). A linear
    base, decode_fixed_ms + decode_seq_ms * B, is also fitted but underestimates small batches of
    an MoE: each added sequence there also wakes experts nobody else needed, so the cost per
    sequence falls as the batch grows (a profile without the table falls back to the line).
    prefill step ms = prefill_fixed_ms + prefill_token_ms * P + prefill_pair_ms_per_1m * pairs / 1e6
    (pairs: query-key pairs the step's attention covers). A mixed step pays the larger fixed cost
    once and both variable parts.
    """

    kv: str
    decode_fixed_ms: float
    decode_seq_ms: float
    decode_kv_ms_per_1k: float
    prefill_fixed_ms: float
    prefill_token_ms: float
    prefill_pair_ms_per_1m: float
    kv_bytes_per_token: float
    block_bytes: int
    num_blocks: int
    staging_blocks: int
    max_num_seqs: int
    max_batched_tokens: int
    context_window: int
    decode_batch_ms: list[tuple[int, float]] = []  # (batch size, step ms with nothing cached)
    decode_points: list[tuple[int, int, float]] = []  # (batch, total cached tokens, median ms)
    prefill_points: list[tuple[int, float, float]] = []  # (tokens, pairs, median ms)
    seconds: float = 0.0  # how long profiling took
    # fitted to serving steps (capacity.serving_fit): a mixed step's fixed cost beyond the decode's
    mixed_fixed_ms: float | None = None
    serving_steps: int = 0  # how many recorded steps the fit used (0: a standalone profile)
    serving_error: float = 0.0  # the serving fit's median relative error on the steps it was fitted to
    serving_pause_ms: float = 0.0  # the mean pause before the next step it charged to each step
    serving_drift: float = 0.0  # how far its total misses either half of those steps (capacity.serving_fit)
    # the cached tokens per decoder that decode_batch_ms already includes (a serving fit's typical
    # context, so that the context slope only prices the difference; 0: nothing cached, a profile)
    context_per_seq: float = 0.0
    serving_notes: list[str] = []  # what the serving fit could not fit from its steps, and used instead

    def step_ms(self, prefill_tokens, prefill_pairs, prefill_kv, decode_seqs, decode_kv) -> float:
        prefill = self.prefill_token_ms * prefill_tokens + self.prefill_pair_ms_per_1m * prefill_pairs / 1e6
        if not decode_seqs:
            return (self.prefill_fixed_ms if prefill_tokens else 0.0) + prefill
        # a mixed step pays the larger fixed cost once and both variable parts
        if not prefill_tokens:
            extra_fixed = 0.0
        elif self.mixed_fixed_ms is not None:
            extra_fixed = self.mixed_fixed_ms
        else:
            extra_fixed = max(0.0, self.prefill_fixed_ms - self._base(1))
        return self.decode_ms(decode_seqs, decode_kv) + extra_fixed + prefill

    def decode_ms(self, decode_seqs, decode_kv) -> float:
        extra = decode_kv - self.context_per_seq * decode_seqs
        return max(0.0, self._base(decode_seqs) + self.decode_kv_ms_per_1k * extra / 1e3)

    def _base(self, b: float) -> float:
        """Decode step time of `b` sequences with nothing cached. Past the largest batch measured
        it grows along the chord over the table's upper half (from the batch nearest half the
        largest to the largest): one noisy last segment must not set the slope of every batch
        beyond it, and the chord over the whole table would understate a step whose cost per
        sequence rises at the top."""
        table = self.decode_batch_ms
        if len(table) < 2:
            return self.decode_fixed_ms + self.decode_seq_ms * b
        (bl, tl) = table[-1]
        if b > bl:
            (bh, th) = min(table[:-1], key=lambda p: abs(p[0] - bl / 2))
            slope = max(0.0, (tl - th) / (bl - bh))
            return tl + slope * (b - bl)
        i = 1
        while i < len(table) - 1 and b > table[i][0]:
            i += 1
        (b0, t0), (b1, t1) = table[i - 1], table[i]
        return max(0.0, t0 + (t1 - t0) * (b - b0) / (b1 - b0))


class ProfileFile(msgspec.Struct, kw_only=True):
    model: str
    device: str
    threads: int
    fits: dict[str, ProfileFit]


def least_squares(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares with non-negative coefficients (a negative one is dropped and the rest refit)."""
    import numpy as np

    cols = list(range(len(rows[0])))
    coef = [0.0] * len(cols)
    while cols:
        a = np.array([[r[c] for c in cols] for r in rows], dtype=float)
        sol, *_ = np.linalg.lstsq(a, np.array(ys, dtype=float), rcond=None)
        negative = [c for c, v in zip(cols, sol, strict=True) if v < 0]
        if not negative:
            for c, v in zip(cols, sol, strict=True):
                coef[c] = float(v)
            break
        cols = [c for c in cols if c not in negative]
    return coef
