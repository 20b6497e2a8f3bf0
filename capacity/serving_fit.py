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
MIN_STEPS_PER_BATCH = 8  # a batch size seen fewer times gets no intercept of its own


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


def _charged_ms(steps: list[dict]) -> list[float]:
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


def fit_serving_steps(steps: list[dict], base: ProfiledCostModel, kv: str = "auto") -> ProfiledCostModel:
    """`base` with the step times of its `kv` fit refitted to recorded serving steps.

    step ms = base(B) + k * decode_context / 1e3 + [prefill and B > 0] * mixed_fixed
              + t * prefill_tokens + q * prefill_pairs / 1e6,   base(0) = prefill_fixed
    with base(B) one intercept per batch size seen often enough (ProfileFit interpolates between)."""
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
        ys += _charged_ms(engine_steps)
    counts: dict[int, int] = defaultdict(int)
    for s in rows_steps:
        counts[s["decode_tokens"]] += 1  # decoders: one token each
    batches = sorted(b for b, n in counts.items() if b > 0 and n >= MIN_STEPS_PER_BATCH)
    if not batches:
        raise SimulationError("the step log holds too few decode steps to fit; serve more requests first")
    index = {b: i for i, b in enumerate(batches)}
    rows, used = [], []
    for s, y in zip(rows_steps, ys, strict=True):
        b = s["decode_tokens"]
        if b and b not in index:
            continue
        row = [0.0] * (len(batches) + 1)
        row[index[b] if b else len(batches)] = 1.0
        prefill = s["prefill_tokens"]
        row += [s["decode_context"] / 1e3, float(bool(prefill and b)), prefill, s["prefill_pairs"] / 1e6]
        rows.append(row)
        used.append(y)
    coef = least_squares(rows, used)
    n = len(batches)
    refit = msgspec.structs.replace(
        fit,
        decode_batch_ms=[(b, coef[i]) for i, b in enumerate(batches)],
        decode_kv_ms_per_1k=coef[n + 1],
        prefill_fixed_ms=coef[n] if any(r[n] for r in rows) else fit.prefill_fixed_ms,
        mixed_fixed_ms=coef[n + 2],
        prefill_token_ms=coef[n + 3],
        prefill_pair_ms_per_1m=coef[n + 4],
        serving_steps=len(rows),
    )
    name = f"{base.device}, fitted to {len(rows)} serving steps"
    return ProfiledCostModel(base.model_name, name, {kv: refit}, base.threads, base.prices)
