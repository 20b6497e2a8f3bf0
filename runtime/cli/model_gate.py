"""The quality gate `edge models promote` and `edge models rollout` share: NEW verified against
the trusted keys, then compared with the baseline on held-out text at each context length
(quality.perplexity.compare), failing past a perplexity increase or under a greedy agreement."""

from __future__ import annotations

from pathlib import Path


class QualityGate:
    """A candidate verified and compared with a baseline on held-out text: rows and failures."""

    def __init__(self, rows, failures, signed_by, verification_s, evaluation_s):
        self.rows, self.failures, self.signed_by = rows, failures, signed_by
        self.verification_s, self.evaluation_s = verification_s, evaluation_s


def quality_gate(
    new: Path,
    old: Path,
    contexts: list[int],
    limit_pct: float,
    min_agreement: float,
    keys: list[str] | None,
    allow_unsigned_baseline: bool,
    text: str | None,
    max_windows: int | None,
) -> QualityGate:
    """Verify NEW (EngineError when it fails) and compare it with OLD at each context length."""
    import time

    from engine import LLM
    from quality.perplexity import compare, heldout_text_path

    started = time.perf_counter()
    candidate = LLM(new, device="cpu", trusted_keys=keys)  # refuses anything that fails verification
    verification_s = time.perf_counter() - started
    baseline = LLM(old, device="cpu", trusted_keys=keys, allow_unsigned=allow_unsigned_baseline)
    text_path = Path(text) if text else heldout_text_path(old)
    started = time.perf_counter()
    rows = compare(candidate, baseline, contexts, text_path, max_windows)
    evaluation_s = time.perf_counter() - started
    failures = [
        f"perplexity +{r.ppl_change_pct:.2f}% at {r.context} tokens exceeds +{limit_pct}%"
        for r in rows
        if r.ppl_change_pct > limit_pct
    ]
    failures += [
        f"greedy agreement {r.greedy_agreement:.1%} at {r.context} tokens is under {min_agreement:.0%}"
        for r in rows
        if r.greedy_agreement < min_agreement
    ]
    return QualityGate(rows, failures, candidate.verification.signed_by, verification_s, evaluation_s)


def print_quality(gate: QualityGate) -> None:
    for r in gate.rows:
        print(
            f"context {r.context:5d}: perplexity {r.baseline_perplexity:.3f} -> {r.candidate_perplexity:.3f} "
            f"({r.ppl_change_pct:+.2f}%), greedy agreement {r.greedy_agreement:.1%}"
        )
    print(
        f"verification {gate.verification_s:.2f} s (signed by {gate.signed_by[:16]}), "
        f"evaluation {gate.evaluation_s:.2f} s"
    )
