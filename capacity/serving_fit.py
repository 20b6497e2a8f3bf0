"""Step times fitted to what an engine did while it served, not to a standalone profile.

A profile measures the engine alone; serving adds the process around it (the event loop that
delivers tokens, HTTP, new requests joining between steps), and on a small machine that is a
sizeable part of every step. `edge dev` with EDGE_STEP_LOG=path records each engine step (its
batch, prefill tokens and attention pairs, decoders' context, start and duration); this module fits
the profile's formulas to those records, charging each step the time until the next one started
when the engine went straight on (its share of the serving overhead), so the simulator's
steps are as long as the live engine's cadence.

    base = ProfiledCostModel.load("profile.json")        # cache and scheduler limits, fallback
    cost = fit_serving_steps(load_step_log("steps.jsonl"), base)
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import msgspec

from capacity.profile import ProfiledCostModel
from capacity.profile_fit import least_squares
from edge_sim.roofline import SimulationError

BUSY_GAP_MS = 10.0  # a shorter pause before the next step is overhead, a longer one is idle time
DRIFT_NOTE = 0.10  # a fit whose log's halves differ more than this says so
MIN_STEPS_PER_KNOT = 8  # steps at least on each segment of the fitted base(B)


STEP_FIELDS = ("started", "duration_ms", "batch_size", "prefill_tokens", "decode_tokens")
STEP_FIELDS += ("prefill_pairs", "decode_context")


def load_step_log(path: str | Path) -> list[dict]:
    """The steps in an EDGE_STEP_LOG file, in the order they were written. A last line cut short
    (the server was killed mid-write) is skipped; any other bad line fails, naming it."""
    try:
        lines = [line for line in Path(path).read_bytes().splitlines() if line.strip()]
    except OSError as exc:
        raise SimulationError(f"{path}: cannot read the step log: {exc.strerror}") from None
    steps = []
    for n, line in enumerate(lines, 1):
        try:
            step = msgspec.json.decode(line, type=dict)
        except msgspec.DecodeError:
            if n == len(lines):
                break
            raise SimulationError(f"{path}:{n}: not a JSON step record") from None
        missing = [f for f in STEP_FIELDS if not isinstance(step.get(f), int | float)]
        if missing:
            raise SimulationError(
                f"{path}:{n}: a step record needs {', '.join(missing)}; record it with EDGE_STEP_LOG"
            )
        steps.append(step)
    return steps


def charged_ms(steps: list[dict]) -> list[float]:
    """Each step's duration plus its pause before the next step, when the engine went straight on;
    a step followed by idle time (or the last one) gets the typical pause instead."""
    gaps = [
        (nxt["started"] - this["started"]) * 1000.0 - this["duration_ms"]
        for this, nxt in zip(steps, steps[1:], strict=False)
    ]
    busy = [g if 0.0 <= g < BUSY_GAP_MS else None for g in gaps] + [None]
    pauses = [g for g in busy if g is not None]
    typical = statistics.median(pauses) if pauses else 0.0
    return [s["duration_ms"] + (typical if g is None else g) for s, g in zip(steps, busy, strict=True)]


def _knots(counts: dict[int, int]) -> list[int]:
    """Batch sizes to fit base(B) at: the smallest and the largest seen, and between them one
    wherever at least MIN_STEPS_PER_KNOT steps have accumulated since the last, so that every
    segment of the piecewise-linear base rests on enough steps (a sparse batch size shares its
    neighbours' segment instead of getting an intercept of its own, or none)."""
    sizes = sorted(b for b in counts if b > 0)
    knots, since = [sizes[0]], 0
    for b in sizes[1:]:
        since += counts[b]
        if since >= MIN_STEPS_PER_KNOT:
            knots.append(b)
            since = 0
    if knots[-1] != sizes[-1]:  # the tail's few steps join the last segment
        if len(knots) > 1:
            knots.pop()
        knots.append(sizes[-1])
    return knots


def _hat(knots: list[int], b: int) -> list[float]:
    """Weights of `b` on each knot: linear interpolation between the two around it."""
    row = [0.0] * len(knots)
    if len(knots) == 1:
        row[0] = 1.0
        return row
    i = 1
    while i < len(knots) - 1 and b > knots[i]:
        i += 1
    lo, hi = knots[i - 1], knots[i]
    w = (hi - b) / (hi - lo)
    row[i - 1], row[i] = w, 1.0 - w
    return row


def _monotone(values: list[float], weights: list[float]) -> list[float]:
    """The closest non-decreasing sequence (weighted pool-adjacent-violators): a step with one more
    sequence in its batch does not take less time, whatever the noise of a few steps says."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, max(w, 1e-9), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [v for v, _, n in blocks for _ in range(int(n))]


def _drift(steps: list[dict], predicted: list[float], ys: list[float]) -> float:
    """How far the fit's total time for the log's first half (in time) and for its second half each
    miss the recorded totals, the larger: one formula for both halves cannot be closer than the
    host's own change of speed between them (another process, a thermal limit)."""
    middle = statistics.median(s["started"] for s in steps)
    worst = 0.0
    for half in (True, False):
        idx = [i for i, s in enumerate(steps) if (s["started"] < middle) == half]
        actual = sum(ys[i] for i in idx)
        if actual > 0:
            worst = max(worst, abs(sum(predicted[i] for i in idx) / actual - 1.0))
    return worst


_COLUMNS = ("prefill fixed", "context slope", "mixed fixed", "prefill per token", "prefill per pair")


def _solve(rows: list[list[float]], ys: list[float], fixed: dict[int, float]) -> list[float]:
    """Non-negative least squares with the columns in `fixed` held at their values."""
    free = [j for j in range(len(rows[0])) if j not in fixed]
    rest = [y - sum(v * r[j] for j, v in fixed.items()) for r, y in zip(rows, ys, strict=True)]
    sol = least_squares([[r[j] for j in free] for r in rows], rest)
    coef = [0.0] * len(rows[0])
    for j, v in fixed.items():
        coef[j] = v
    for j, v in zip(free, sol, strict=True):
        coef[j] = v
    return coef


def fit_serving_steps(steps: list[dict], base: ProfiledCostModel, kv: str = "auto") -> ProfiledCostModel:
    """`base` with the step times of its `kv` fit refitted to recorded serving steps.

    step ms = base(B) + k * (decode_context - B * c) / 1e3 + [prefill and B > 0] * mixed_fixed
              + t * prefill_tokens + q * prefill_pairs / 1e6,   base(0) = prefill_fixed
    with c the log's cached tokens per decoder, base(B) piecewise linear between knots (`_knots`),
    non-decreasing, and every coefficient non-negative. Refuses (SimulationError, saying what is
    missing) when the steps cannot support the fit: too few decode steps, one batch size only,
    or a fitted term larger than the longest step recorded (the data cannot tell it apart)."""
    fit = base.fits.get(kv)
    if fit is None:
        raise SimulationError(f"the base profile has no KV dtype {kv!r}; profile it first")
    by_engine: dict[str, list[dict]] = defaultdict(list)
    for step in steps:
        by_engine[step.get("engine", "")].append(step)
    rows_steps, ys = [], []
    for engine_steps in by_engine.values():
        engine_steps.sort(key=lambda s: s["started"])
        rows_steps += engine_steps
        ys += charged_ms(engine_steps)
    pause = statistics.mean(y - s["duration_ms"] for s, y in zip(rows_steps, ys, strict=True)) if ys else 0.0
    counts: dict[int, int] = defaultdict(int)
    for s in rows_steps:
        counts[s["decode_tokens"]] += 1  # decoders: one token each
    decode_steps = sum(n for b, n in counts.items() if b > 0)
    if decode_steps < 2 * MIN_STEPS_PER_KNOT:
        raise SimulationError(
            f"the step log holds {decode_steps} decode steps; a fit needs at least "
            f"{2 * MIN_STEPS_PER_KNOT}: serve more requests first"
        )
    knots = _knots(counts)
    if len(knots) < 2:
        raise SimulationError(
            f"the step log's decode steps are all at batch {knots[0]}: the batch term cannot be fitted; "
            f"serve a load that varies the batch (more requests at once)"
        )
    n = len(knots)
    # Serving's contexts grow with its batches (each decoder brings its few hundred tokens), so
    # the data cannot split a step between base(B) and the cache read: base(B) is the step at the
    # log's typical context per decoder, and the slope prices only the difference from it (left
    # free, the split is noise, and a non-negative fit may put the whole step into either term).
    per_seq = sum(s["decode_context"] for s in rows_steps) / sum(s["decode_tokens"] for s in rows_steps)
    rows = []
    for s in rows_steps:
        b, prefill = s["decode_tokens"], s["prefill_tokens"]
        row = _hat(knots, b) if b else [0.0] * n
        row += [0.0 if b else 1.0]
        extra = (s["decode_context"] - per_seq * b) / 1e3
        row += [extra, float(bool(prefill and b)), prefill, s["prefill_pairs"] / 1e6]
        rows.append(row)
    # a term the log has too few steps of keeps the profile's value (its steps are fitted around it)
    fallback = {
        n: ("prefill-only steps", fit.prefill_fixed_ms),
        n + 2: ("mixed steps", max(0.0, fit.prefill_fixed_ms - fit._base(1))),
        n + 3: ("prefill steps", fit.prefill_token_ms),
        n + 4: ("prefill steps", fit.prefill_pair_ms_per_1m),
    }
    fixed, notes = {}, []
    for j, (what, value) in fallback.items():
        seen = sum(1 for r in rows if r[j])
        if seen < MIN_STEPS_PER_KNOT:
            fixed[j] = value
            notes.append(f"{seen} {what}: column {_COLUMNS[j - n]} kept from the profile")
    coef = _solve(rows, ys, fixed)
    # The cache read of a token beyond the typical context costs no more than a step at that
    # context costs per cached token (it is part of that step): above that bound, the slope is the
    # log's noise, and the profile's (measured by varying the context alone) is used, within it.
    support = [sum(r[j] for r in rows) for j in range(n)]
    table = _monotone(coef[:n], support)
    per_token = [ms / (b * per_seq) * 1e3 for b, ms in zip(knots, table, strict=True) if ms > 0]
    bound = min(per_token) if per_seq > 0 and per_token else 0.0
    if coef[n + 1] > bound:
        fixed[n + 1] = min(fit.decode_kv_ms_per_1k, bound)
        notes.append(
            f"context slope {coef[n + 1]:.2f} ms/1k over the plausible {bound:.2f}: the profile's, within it"
        )
        coef = _solve(rows, ys, fixed)
        table = _monotone(coef[:n], support)
    longest = max(ys)
    most = {key: max(s[key] for s in rows_steps) for key in ("prefill_tokens", "prefill_pairs")}
    terms = {f"decode step at batch {b}": ms for b, ms in zip(knots, table, strict=True)} | {
        "context slope at the most cached tokens": coef[n + 1] * max(r[n + 1] for r in rows),
        "mixed step's fixed cost": coef[n + 2],
        "prefill per token at the longest chunk": coef[n + 3] * most["prefill_tokens"],
        "attention pairs at the most pairs": coef[n + 4] * most["prefill_pairs"] / 1e6,
        "prefill step's fixed cost": coef[n],
    }
    for name, ms in terms.items():
        if ms > longest:
            raise SimulationError(
                f"the step log cannot support a fit: its {name} comes out at {ms:.1f} ms, longer than the "
                f"longest step recorded ({longest:.1f} ms), so the steps do not tell that term from the "
                f"others; record more varied serving (batch sizes, prompt lengths) or use the profile"
            )
    predicted = [sum(c * x for c, x in zip(coef, r, strict=True)) for r in rows]
    errors = sorted(abs(p - y) / y for p, y in zip(predicted, ys, strict=True) if y > 0)
    drift = _drift(rows_steps, predicted, ys)
    if drift > DRIFT_NOTE:
        notes.append(
            f"the host's speed moved by {drift:.0%} between the log's halves: no replay is closer than that"
        )
    refit = msgspec.structs.replace(
        fit,
        decode_batch_ms=list(zip(knots, table, strict=True)),
        decode_kv_ms_per_1k=coef[n + 1],
        prefill_fixed_ms=coef[n],
        mixed_fixed_ms=coef[n + 2],
        prefill_token_ms=coef[n + 3],
        prefill_pair_ms_per_1m=coef[n + 4],
        serving_steps=len(rows),
        serving_error=statistics.median(errors) if errors else 0.0,
        serving_drift=drift,
        serving_pause_ms=pause,
        context_per_seq=per_seq,
        serving_notes=notes,
    )
    name = f"{base.device}, fitted to {len(rows)} serving steps"
    return ProfiledCostModel(base.model_name, name, {kv: refit}, base.threads, base.prices)


def describe_fit(fit) -> str:
    """A fit's terms in one line: decode step ms per batch size, context and prefill slopes."""
    table = ", ".join(f"{b}: {ms:.1f}" for b, ms in fit.decode_batch_ms)
    at = f" beyond {fit.context_per_seq:.0f} per decoder" if fit.context_per_seq else ""
    mixed = f", mixed step +{fit.mixed_fixed_ms:.2f} ms" if fit.mixed_fixed_ms is not None else ""
    return (
        f"decode ms by batch {{{table}}} + {fit.decode_kv_ms_per_1k:.3f} ms/1k cached tokens{at}{mixed}; "
        f"prefill {fit.prefill_fixed_ms:.2f} ms + {fit.prefill_token_ms:.4f} ms/token "
        f"+ {fit.prefill_pair_ms_per_1m:.2f} ms/1M pairs"
        + (
            f"; pause before the next step {fit.serving_pause_ms:.2f} ms on average, in every step's time; "
            f"median |error| on its steps {fit.serving_error:.0%}"
            if fit.serving_steps
            else ""
        )
        + "".join(f"; {note}" for note in fit.serving_notes)
    )
