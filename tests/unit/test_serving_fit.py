"""Step times fitted to what the engine did while serving (EDGE_STEP_LOG): the log is written, the
fit recovers the step-time formula and each step's pause before the next one, and a simulator run
on it charges those times."""

from __future__ import annotations

import json
import random
import threading

import msgspec
import pytest

from capacity import cli as capacity_cli
from capacity.profile import ProfiledCostModel, ProfileFit
from capacity.serving_fit import fit_serving_steps, load_step_log
from engine import LLM, SamplingParams
from engine.serving import STEP_LOG_ENV, EngineLoop

FIXED = {1: 3.0, 2: 3.5, 4: 4.4, 8: 6.0}  # decode step ms with nothing cached, per batch size
PAUSE_MS = 0.7  # the serving loop's share of every step
KV_MS_PER_1K, MIXED_FIXED, TOKEN_MS, PAIR_MS_PER_1M, PREFILL_FIXED = 0.2, 1.5, 0.03, 2.0, 2.5


def true_ms(b: int, context: int, prefill: int, pairs: float) -> float:
    base = FIXED[b] if b else PREFILL_FIXED
    mixed = MIXED_FIXED if b and prefill else 0.0
    return base + KV_MS_PER_1K * context / 1e3 + mixed + TOKEN_MS * prefill + PAIR_MS_PER_1M * pairs / 1e6


def base_profile() -> ProfiledCostModel:
    fit = ProfileFit(
        kv="auto", decode_fixed_ms=1.0, decode_seq_ms=0.1, decode_kv_ms_per_1k=0.0, prefill_fixed_ms=1.0,
        prefill_token_ms=0.01, prefill_pair_ms_per_1m=0.0, kv_bytes_per_token=100.0, block_bytes=1600,
        num_blocks=1000, staging_blocks=0, max_num_seqs=8, max_batched_tokens=512, context_window=4096,
    )  # fmt: skip
    return ProfiledCostModel("tiny", "cpu", {"auto": fit})


def synthetic_steps(seed: int = 5) -> list[dict]:
    rng = random.Random(seed)
    steps, t = [], 100.0
    pause_ms = PAUSE_MS
    for i in range(600):
        b = rng.choice([0, 1, 2, 4, 8]) if i % 7 else 0
        prefill = rng.choice([0, 0, 64, 200]) if b else rng.choice([64, 300])
        context = b * rng.randrange(50, 900)
        pairs = prefill * (rng.randrange(0, 400) + (prefill + 1) / 2) if prefill else 0.0
        ms = true_ms(b, context, prefill, pairs)
        steps.append(
            {"engine": "e", "batch_size": b + bool(prefill), "prefill_tokens": prefill, "decode_tokens": b,
             "duration_ms": ms - pause_ms, "started": t, "prefill_pairs": pairs, "decode_context": context}
        )  # fmt: skip
        idle = 50.0 if i % 40 == 39 else 0.0  # now and then the engine waits for requests
        t += (ms + idle) / 1000.0
    return steps


def test_the_fit_recovers_step_times_and_charges_the_pause_before_the_next_step():
    fitted = fit_serving_steps(synthetic_steps(), base_profile()).fits["auto"]
    for b in (1, 2, 4, 8):
        assert fitted.decode_ms(b, 3000) == pytest.approx(FIXED[b] + KV_MS_PER_1K * 3, rel=0.02)
    assert fitted.step_ms(200, 60000.0, 0, 4, 1000) == pytest.approx(true_ms(4, 1000, 200, 60000.0), rel=0.02)
    assert fitted.step_ms(300, 90000.0, 0, 0, 0) == pytest.approx(true_ms(0, 0, 300, 90000.0), rel=0.02)
    assert fitted.num_blocks == 1000 and fitted.serving_steps == 600  # the cache is the base profile's


def test_an_engine_loop_logs_every_step_when_asked(tiny_model_dir, tmp_path, monkeypatch):
    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv(STEP_LOG_ENV, str(log))
    llm = LLM(tiny_model_dir, device="cpu", allow_unsigned=True)
    loop = EngineLoop(llm.engine, name="tiny")
    done = threading.Event()
    loop.submit(
        "r1", list(range(10, 50)), SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
        lambda e: done.set() if e.finish_reason else None,
    )  # fmt: skip
    assert done.wait(60)
    loop.stop()
    steps = load_step_log(log)
    assert [s["engine"] for s in steps] == ["tiny"] * len(steps)
    assert [s["prefill_tokens"] for s in steps] == [40] + [0] * 5  # one prefill, then 5 decodes
    assert steps[0]["prefill_pairs"] == pytest.approx(40 * 41 / 2)
    assert [s["decode_context"] for s in steps[1:]] == [41, 42, 43, 44, 45]
    assert all(msgspec.json.decode(msgspec.json.encode(s)) == s for s in steps)


def test_edge_sim_fits_a_profile_to_serving_steps(tmp_path, capsys):
    profile = base_profile().save(tmp_path / "profile.json")
    log = tmp_path / "steps.jsonl"
    log.write_bytes(b"".join(msgspec.json.encode(s) + b"\n" for s in synthetic_steps()))
    argv = ["sim", "--cost", "profiled", "--model", "tiny", "--profile", str(profile), "--duration", "20"]
    argv += ["--knee", "none", "--json", "--quiet", "--no-plots", "--out", str(tmp_path / "out")]
    assert capacity_cli.main([*argv, "--serving-steps", str(log)]) == 0
    fitted = json.loads(capsys.readouterr().out)
    assert capacity_cli.main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "fitted to 600 serving steps" in fitted["meta"]["cost_model"]
    # the serving fit's steps are the longer ones (the base profile's are made up and short)
    tpot = [r["runs"][0]["overall"]["tpot_ms"]["p50"] for r in (fitted, plain)]
    assert tpot[0] > tpot[1]
    argv[argv.index("profiled")] = "roofline"
    assert capacity_cli.main([*argv, "--serving-steps", str(log)]) == 2
    assert "add --cost profiled" in capsys.readouterr().err


def test_a_bad_step_log_is_refused_naming_the_line(tmp_path, capsys):
    from edge_sim.roofline import SimulationError

    log = tmp_path / "steps.jsonl"
    good = b"".join(msgspec.json.encode(s) + b"\n" for s in synthetic_steps()[:3])
    log.write_bytes(good + b'{"engine": "e", "start')  # the server was killed mid-line
    assert len(load_step_log(log)) == 3
    log.write_bytes(b'{"engine": "e"}\n' + good)
    with pytest.raises(SimulationError, match=r"steps.jsonl:1: a step record needs started"):
        load_step_log(log)
    log.write_bytes(b"not json\n" + good)
    with pytest.raises(SimulationError, match=r"steps.jsonl:1: not a JSON step record"):
        load_step_log(log)
    with pytest.raises(SimulationError, match="cannot read the step log"):
        load_step_log(tmp_path / "missing.jsonl")
    argv = [
        "sim",
        "--cost",
        "profiled",
        "--model",
        "tiny",
        "--profile",
        str(base_profile().save(tmp_path / "p.json")),
    ]
    argv += ["--serving-steps", str(tmp_path / "missing.jsonl"), "--quiet", "--out", str(tmp_path / "o")]
    assert capacity_cli.main(argv) == 2
    assert "cannot read the step log" in capsys.readouterr().err
