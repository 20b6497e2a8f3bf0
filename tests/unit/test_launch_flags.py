"""`edge plan --launch`: every printed flag is one the engine's docs list (capacity.launch_flags
cites them), and the command carries the plan's layout numbers."""

from __future__ import annotations

import itertools

import pytest

from capacity.cli import main
from capacity.launch_flags import (
    SGLANG_FLAGS,
    SGLANG_KV_CHOICES,
    VLLM_FLAGS,
    VLLM_KV_CHOICES,
    flags_of,
    launch_command,
)
from capacity.planner import plan
from edge_sim.roofline import SimulationError

CASES = list(
    itertools.product(
        ("kimi-k2", "glm-4.5"), ("fp8", "int4"), ("auto", "fp8", "int4"), ((32768, 32), (65536, 128))
    )
)


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


@pytest.fixture(scope="module")
def plans():
    return {case: plan(case[0], "H200", case[1], case[2], *case[3]) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_vllm_flags_are_documented_and_carry_the_layout(plans, case):
    p = plans[case]
    cmd = launch_command(p, "vllm")
    lay = p.layout
    assert len(cmd.nodes) == max(1, lay.gpus // 8)
    for i, argv in enumerate(cmd.nodes):
        assert argv[:3] == ["vllm", "serve", cmd.checkpoint]
        assert set(flags_of(argv)) <= VLLM_FLAGS
        tp = int(_value(argv, "--tensor-parallel-size"))
        dp = int(_value(argv, "--data-parallel-size")) if "--data-parallel-size" in argv else 1
        assert (tp, dp) == (lay.tensor_parallel_attention, lay.data_parallel_attention)
        assert tp * dp == lay.gpus == lay.expert_parallel  # vLLM's EP size is TP x DP
        assert "--enable-expert-parallel" in argv
        assert int(_value(argv, "--max-model-len")) == p.context
        assert int(_value(argv, "--max-num-seqs")) * dp >= p.concurrency
        assert float(_value(argv, "--gpu-memory-utilization")) == p.usable_fraction
        assert int(_value(argv, "--max-num-batched-tokens")) == p.prefill_chunk
        assert _value(argv, "--kv-cache-dtype") in VLLM_KV_CHOICES
        if len(cmd.nodes) > 1:
            local = int(_value(argv, "--data-parallel-size-local"))
            assert local * len(cmd.nodes) == dp
            assert ("--headless" in argv) == (i > 0)
            if i:
                assert int(_value(argv, "--data-parallel-start-rank")) == i * local


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_sglang_flags_are_documented_and_carry_the_layout(plans, case):
    p = plans[case]
    cmd = launch_command(p, "sglang")
    lay = p.layout
    for i, argv in enumerate(cmd.nodes):
        assert argv[:3] == ["python", "-m", "sglang.launch_server"]
        assert set(flags_of(argv)) <= SGLANG_FLAGS
        assert _value(argv, "--model-path") == cmd.checkpoint
        assert int(_value(argv, "--tp")) == lay.gpus
        assert int(_value(argv, "--ep-size")) == lay.expert_parallel
        dp = int(_value(argv, "--dp")) if "--dp" in argv else 1
        assert dp == lay.data_parallel_attention
        assert ("--enable-dp-attention" in argv) == (dp > 1)
        assert int(_value(argv, "--context-length")) == p.context
        assert int(_value(argv, "--max-running-requests")) == p.concurrency
        assert float(_value(argv, "--mem-fraction-static")) == p.usable_fraction
        assert _value(argv, "--kv-cache-dtype") in SGLANG_KV_CHOICES
        if len(cmd.nodes) > 1:
            assert int(_value(argv, "--nnodes")) == len(cmd.nodes)
            assert int(_value(argv, "--node-rank")) == i


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_kv_formats_the_engine_lacks_are_said_not_invented(plans, engine):
    p = plans[("glm-4.5", "fp8", "int4", (32768, 32))]
    cmd = launch_command(p, engine)
    assert _value(cmd.nodes[0], "--kv-cache-dtype") == "auto"
    assert any("no int4 KV cache" in n for n in cmd.notes)
    fp8 = launch_command(plans[("glm-4.5", "fp8", "fp8", (32768, 32))], engine)
    assert _value(fp8.nodes[0], "--kv-cache-dtype") == "fp8_e4m3"
    assert not any("KV cache" in n for n in fp8.notes)


def test_checkpoints_are_the_published_ones_or_said_missing(plans):
    assert launch_command(plans[("kimi-k2", "fp8", "fp8", (32768, 32))], "vllm").checkpoint == (
        "moonshotai/Kimi-K2-Instruct"
    )
    assert launch_command(plans[("glm-4.5", "fp8", "fp8", (32768, 32))], "sglang").checkpoint == (
        "zai-org/GLM-4.5-FP8"
    )
    cmd = launch_command(plans[("kimi-k2", "int4", "fp8", (32768, 32))], "vllm")
    assert cmd.checkpoint.startswith("/path/to/")
    assert any("no published int4 checkpoint" in n for n in cmd.notes)
    mine = launch_command(plans[("kimi-k2", "int4", "fp8", (32768, 32))], "vllm", checkpoint="/models/k2-w4")
    assert mine.nodes[0][2] == "/models/k2-w4"


def test_unknown_engine_and_bad_port_are_refused(plans):
    p = plans[("glm-4.5", "fp8", "fp8", (32768, 32))]
    with pytest.raises(SimulationError, match="--launch"):
        launch_command(p, "tgi")
    with pytest.raises(SimulationError, match="--port"):
        launch_command(p, "vllm", port=0)


def test_edge_plan_launch_prints_the_plan_then_the_command(capsys):
    rc = main(["plan", "--model", "glm-4.5", "--kv", "fp8", "--context", "32768", "--concurrency", "32",
               "--launch", "vllm", "--served-model-name", "glm"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert out.index("GPUs needed: 8 x H200") < out.index("vllm serve zai-org/GLM-4.5-FP8")
    assert "--tensor-parallel-size 8" in out and "--served-model-name glm" in out
