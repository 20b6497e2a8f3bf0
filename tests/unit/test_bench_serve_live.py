"""edge bench serve end to end against a real `edge dev` (bench/dev_project.py's project: one PoP
serving the shipped miniature), as a user runs it: 4-token answers keep it fast."""

import json
import os
import subprocess
import sys

import pytest

from bench.dev_project import start_dev, write_project

pytestmark = pytest.mark.slow

TINY_WORKLOAD = """
name = "tiny"
[prompt]
dist = "fixed"
mean = 24
[output]
dist = "fixed"
mean = 4
"""
KEYS = (
    "date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "request_goodput", "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms",
    "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms",
    "failures_by_code", "ttfts", "itls", "e2els", "errors",
)  # fmt: skip


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench-serve")
    write_project(d, "bench")
    (d / "tiny.toml").write_text(TINY_WORKLOAD)
    proc, url = start_dev(d, {"OMP_NUM_THREADS": "1"})
    try:
        yield d, url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def bench(dev, *args):
    folder, url = dev
    env = {k: v for k, v in os.environ.items() if k != "EDGE_API_TOKEN"}  # the project's token
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", "bench", "serve", "--base-url", url, "--disable-tqdm"]
        + ["--dataset", "tiny.toml", *args],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("backend", ["openai-chat", "workers-ai"])
def test_eight_streamed_requests_all_complete(dev, backend):
    out = dev[0] / f"{backend}.json"
    r = bench(
        dev, "--backend", backend, "--num-prompts", "8", "--request-rate", "inf", "--max-concurrency", "4",
        "--goodput", "e2el:60000", "--save-result", str(out), "--save-detailed",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Serving Benchmark Result" in r.stdout and "Mean TTFT (ms):" in r.stdout
    result = json.loads(out.read_text())
    assert all(key in result for key in KEYS), [k for k in KEYS if k not in result]
    assert (result["completed"], result["failed"], result["backend"]) == (8, 0, backend)
    assert result["total_output_tokens"] == 8 * 4 and result["total_input_tokens"] >= 8 * 24
    assert all(0 < t <= e for t, e in zip(result["ttfts"], result["e2els"], strict=True))
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])


def test_failures_are_counted_by_code_and_still_reported(dev):
    admin = (dev[0] / ".edge" / "admin-token").read_text().strip()
    out = dev[0] / "limited.json"
    r = bench(
        dev, "--backend", "workers-ai", "--num-prompts", "8", "--tenants", "2", "--admin-token", admin,
        "--tenant-rpm", "2", "--save-result", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    # two accounts of 2 requests a minute each: 4 served, 4 refused by the rate limit
    assert (result["completed"], result["failed"]) == (4, 4)
    assert result["failures_by_code"] == {"3036 (HTTP 429)": 4}
    assert len(set(result["tenants"])) == 2 and "failed with 3036 (HTTP 429):" in r.stdout
    bad = bench(dev, "--backend", "openai-chat", "--num-prompts", "3", "--model", "@edge/none")
    assert bad.returncode == 0 and "Failed requests:                         3" in bad.stdout
    assert "failed with 5007 (HTTP 400):" in bad.stdout


def test_a_worker_route_a_sweep_and_the_simulator_beside_it(dev):
    r = bench(dev, "--backend", "worker", "--num-prompts", "10", "--request-rate", "50")
    assert r.returncode == 0 and "Successful requests:                     10" in r.stdout, r.stderr[-2000:]
    assert "End-to-end Latency" in r.stdout and "Time to First Token" not in r.stdout
    plot = dev[0] / "sweep.png"
    r = bench(
        dev, "--backend", "openai-chat", "--num-prompts", "4", "--sweep", "--sweep-start-rate", "8",
        "--sweep-max-rate", "16", "--plot", str(plot),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "P99 E2EL" in r.stdout and "knee:" in r.stdout and plot.stat().st_size > 0
    r = bench(dev, "--backend", "workers-ai", "--num-prompts", "4", "--request-rate", "20", "--compare-sim")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "live vs simulated" in r.stdout and "PoPs ICN" in r.stdout
