"""edge bench serve's pure parts: the arrival schedule, vLLM's metrics and goodput, the datasets'
lengths, the answers' shapes (SSE and errors) and the knee."""

import asyncio
import json
import math
import statistics

import httpx
import pytest

from capacity.sampling import sample_requests
from capacity.workload import PROFILES
from edge_sim.topology import Topology
from runtime.bench import clients
from runtime.bench.clients import RequestOutput, Target, Tenant
from runtime.bench.dataset import BenchRequest, clip, load_dataset, words
from runtime.bench.load import Ramp, request_rates, send_times
from runtime.bench.metrics import calculate_metrics, parse_goodput, parse_percentiles, summarise
from runtime.bench.report import format_result, result_json
from runtime.bench.sweep import SweepPoint, find_knee, format_sweep


def gaps(times):
    return [b - a for a, b in zip([0.0, *times], times, strict=False)]


def cv(values):
    return statistics.pstdev(values) / statistics.fmean(values)


# --- arrivals ----------------------------------------------------------------------------------


def test_poisson_arrivals_are_seeded_and_at_the_rate():
    times = send_times(20000, 10.0, seed=3)
    assert times == send_times(20000, 10.0, seed=3) and times != send_times(20000, 10.0, seed=4)
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))
    assert times[-1] == pytest.approx(20000 / 10.0)  # rescaled as vLLM does: the offered rate exactly
    assert statistics.fmean(gaps(times)) == pytest.approx(0.1, rel=1e-6)
    assert cv(gaps(times)) == pytest.approx(1.0, abs=0.05)  # exponential gaps


def test_unrescaled_mean_rate_within_tolerance_over_many_samples():
    # a ramp from r to just above r skips the rescaling: the raw gamma draws' mean rate
    times = send_times(20000, math.inf, seed=5, ramp=Ramp("linear", 10.0, 10.0001))
    assert 20000 / times[-1] == pytest.approx(10.0, rel=0.03)


@pytest.mark.parametrize("burstiness, expected_cv", [(0.25, 2.0), (1.0, 1.0), (4.0, 0.5)])
def test_burstiness_is_the_gamma_shape(burstiness, expected_cv):
    g = gaps(send_times(20000, 5.0, burstiness, seed=1))
    assert cv(g) == pytest.approx(expected_cv, rel=0.08)
    assert statistics.fmean(g) == pytest.approx(0.2, rel=1e-6)


def test_infinite_rate_sends_everything_at_once_and_infinite_burstiness_evenly():
    assert send_times(5, math.inf) == [0.0] * 5
    assert gaps(send_times(4, 2.0, math.inf)) == pytest.approx([0.5] * 4)


def test_ramp_up_strategies_hit_start_and_end_rates():
    linear = request_rates(5, math.inf, Ramp("linear", 2.0, 10.0))
    assert linear == pytest.approx([2.0, 4.0, 6.0, 8.0, 10.0])
    exp = request_rates(3, math.inf, Ramp("exponential", 1.0, 16.0))
    assert exp == pytest.approx([1.0, 4.0, 16.0])
    times = send_times(20000, math.inf, seed=2, ramp=Ramp("linear", 5.0, 50.0))
    g = gaps(times)
    assert 1 / statistics.fmean(g[:500]) == pytest.approx(5.0, rel=0.15)
    assert 1 / statistics.fmean(g[-500:]) == pytest.approx(50.0, rel=0.15)


@pytest.mark.parametrize(
    "rate, burstiness, ramp",
    [(0.0, 1.0, None), (1.0, 0.0, None), (math.inf, 1.0, Ramp("exponential", 0.0, 4.0))],
)
def test_impossible_loads_are_refused_naming_the_flag(rate, burstiness, ramp):
    with pytest.raises(ValueError, match="--"):
        send_times(3, rate, burstiness, ramp=ramp)


# --- metrics -----------------------------------------------------------------------------------


def done(ttft, latency, tokens, itl=()):
    return RequestOutput(
        success=True, ttft=ttft, latency=latency, output_tokens=tokens, prompt_tokens=10, itl=list(itl)
    )


def test_percentiles_mean_median_std_by_hand():
    s = summarise([0.1, 0.2, 0.3, 0.4], [50, 90, 99])
    assert s.mean == pytest.approx(250) and s.median == pytest.approx(250)
    assert s.std == pytest.approx(math.sqrt((150**2 + 50**2 + 50**2 + 150**2) / 4))  # population std
    # linear interpolation: position (n-1)p/100 = 2.7 -> 300 + 0.7 * 100
    assert dict(s.percentiles)[90] == pytest.approx(370)
    assert summarise([], [99]).mean is None


def test_metrics_and_goodput_by_hand():
    reqs = [BenchRequest("x", 8, 4)] * 5
    outs = [
        done(0.1, 0.4, 4, [0.1, 0.1, 0.1]),  # TPOT (0.4 - 0.1) / 3 = 100 ms
        done(0.2, 0.3, 2, [0.1]),  # TPOT 100 ms
        done(0.05, 0.05, 1),  # one token: no TPOT (0 for goodput)
        done(0.5, 1.1, 4, [0.2, 0.2, 0.2]),  # TPOT 200 ms
        RequestOutput(success=False, code="3036 (HTTP 429)"),
    ]
    m = calculate_metrics(reqs, outs, 2.0, [50], parse_goodput(["ttft:200", "tpot:150"]))
    assert (m.completed, m.failed, m.failures_by_code) == (4, 1, {"3036 (HTTP 429)": 1})
    assert (m.total_input, m.total_output) == (40, 11)
    assert m.request_throughput == 2.0 and m.output_throughput == 5.5 and m.total_token_throughput == 25.5
    assert m.request_goodput == 1.5  # the first three meet TTFT <= 200 and TPOT <= 150: 3 / 2 s
    assert m.stats["tpot"].mean == pytest.approx((100 + 100 + 200) / 3)
    assert m.stats["ttft"].median == pytest.approx(150)
    assert m.stats["itl"].mean == pytest.approx((0.1 * 4 + 0.2 * 3) / 7 * 1000)
    assert m.stats["e2el"].mean == pytest.approx((400 + 300 + 50 + 1100) / 4)
    assert calculate_metrics(reqs, outs, 2.0, [50], {}).request_goodput is None


def test_goodput_and_percentile_flags_refuse_what_they_cannot_read():
    assert parse_goodput(["e2el:1000"]) == {"e2el": 1000.0}
    for bad in (["ttft"], ["itl:5"], ["ttft:-1"], ["ttft:abc"]):
        with pytest.raises(ValueError, match="METRIC:MS"):
            parse_goodput(bad)
    assert parse_percentiles("50,90,99.9") == [50.0, 90.0, 99.9]
    with pytest.raises(ValueError):
        parse_percentiles("50,101")


def test_the_report_and_result_file_use_vllms_names():
    reqs = [BenchRequest("x", 8, 4)] * 2
    outs = [done(0.1, 0.4, 4, [0.1] * 3), RequestOutput(success=False, code="5007 (HTTP 400)")]
    m = calculate_metrics(reqs, outs, 1.0, [50, 99.9], {})
    text = format_result(m, 1.0, ["ttft", "e2el"], math.inf, 4)
    labels = ("Successful requests:", "Failed requests:", "failed with 5007 (HTTP 400):", "Mean TTFT (ms):")
    labels += ("P99.9 E2EL (ms):", "Total Token throughput (tok/s):", "Maximum request concurrency:")
    for label in labels:
        assert label in text
    result = result_json(
        m, outs, 1.0, ["ttft", "e2el"], {"backend": "openai-chat", "request_rate": math.inf}, True
    )
    assert result["request_rate"] == "inf" and result["completed"] == 1 and result["failed"] == 1
    for key in ("p50_ttft_ms", "p99.9_e2el_ms", "mean_e2el_ms", "std_ttft_ms", "ttfts", "itls", "errors"):
        assert key in result
    json.dumps(result, allow_nan=False)  # valid JSON: missing values are null


# --- datasets ----------------------------------------------------------------------------------


def test_a_profile_draws_the_simulators_lengths():
    ds = load_dataset("chat", 400, 7, max_context=0, client_location="Seoul")
    w = ds.workload
    sample = sample_requests(w, Topology.default(), 2 * 400 / w.arrivals.rate + 10, 7)
    assert [r.prompt_len for r in ds.requests] == sample.prompts[:400]
    assert [r.output_len for r in ds.requests] == sample.outputs[:400]
    assert statistics.fmean(r.prompt_len for r in ds.requests) == pytest.approx(
        PROFILES["chat"].prompt.mean, rel=0.15
    )
    assert all(len(r.prompt.split()) == r.prompt_len for r in ds.requests)  # one word a token


def test_clipping_keeps_prompt_and_output_in_the_window():
    assert clip(5000, 300, 4096) == (4096 - 32 - 1, 1)
    assert clip(100, 300, 4096) == (100, 300)
    assert clip(5000, 300, 0) == (5000, 300)
    ds = load_dataset("rag", 20, 1, max_context=4096, client_location="Seoul")
    assert all(r.prompt_len + r.output_len <= 4096 - 32 for r in ds.requests)


def test_agent_turns_share_their_tenant_and_session_text():
    ds = load_dataset("agent", 60, 3, max_context=0, client_location="Seoul")
    s = ds.sample
    by_session = {}
    for i, req in enumerate(ds.requests):
        by_session.setdefault(s.sessions[i], []).append(req.prompt)
    multi = [p for p in by_session.values() if len(p) > 1]
    assert multi and all(
        later.startswith(earlier) for p in multi for earlier, later in zip(p, p[1:], strict=False)
    )
    system = PROFILES["agent"].sessions.system_prompt
    heads = {}
    for i, req in enumerate(ds.requests):
        heads.setdefault(s.tenants[i], set()).add(" ".join(req.prompt.split()[:system]))
    assert all(len(h) == 1 for h in heads.values())
    assert words("a", 3) == words("a", 5).rsplit(" ", 2)[0]


def test_a_jsonl_dataset_is_read_literally(tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"prompt": "def f(x):", "max_tokens": 3}\n\n{"prompt": "import os", "max_tokens": 2}\n')
    ds = load_dataset(str(f), 3, 0, 4096, "Seoul")
    assert [(r.prompt, r.output_len) for r in ds.requests] == [
        ("def f(x):", 3),
        ("import os", 2),
        ("def f(x):", 3),
    ]
    f.write_text('{"prompt": 1}\n')
    with pytest.raises(ValueError, match="prompts.jsonl:1"):
        load_dataset(str(f), 1, 0, 4096, "Seoul")


# --- answers -----------------------------------------------------------------------------------


def sse(*events):
    return "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)


def run_one(backend, status, body, stream=True):
    async def go():
        transport = httpx.MockTransport(lambda request: httpx.Response(status, text=body))
        async with httpx.AsyncClient(transport=transport) as client:
            target = Target(backend=backend, base_url="http://x", model="m", stream=stream)
            return await clients.send(client, target, Tenant("acme", "t"), BenchRequest("hi", 1, 4))

    return asyncio.run(go())


def test_a_workers_ai_stream_gives_ttft_itl_and_usage():
    usage = {"prompt_tokens": 7, "completion_tokens": 3}
    out = run_one("workers-ai", 200, sse({"response": "a"}, {"response": "b"}, {"response": "c"},
                                         {"response": "", "usage": usage}, "[DONE]"))  # fmt: skip
    assert out.success and out.generated_text == "abc" and len(out.itl) == 2
    assert (out.prompt_tokens, out.output_tokens) == (7, 3) and 0 <= out.ttft <= out.latency


def test_an_openai_stream_and_its_error_event():
    chunk = {"choices": [{"delta": {"content": "x"}}]}
    final = {"choices": [{"delta": {}}], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}
    role = {"choices": [{"delta": {"role": "assistant", "content": ""}}]}
    out = run_one("openai-chat", 200, sse(role, chunk, final, "[DONE]"))
    assert out.success and out.output_tokens == 1 and out.itl == [] and out.ttft is not None
    bad = run_one("openai-chat", 200, sse(chunk, {"error": {"message": "PoP down", "code": 3040}}, "[DONE]"))
    assert not bad.success and bad.code == "3040 (HTTP 200)"


@pytest.mark.parametrize(
    "backend, status, body, code",
    [
        ("workers-ai", 400, {"errors": [{"code": 5007, "message": "no"}]}, "5007 (HTTP 400)"),
        ("openai-chat", 429, {"error": {"message": "slow down", "code": "rate_limit_exceeded"}},
         "rate_limit_exceeded (HTTP 429)"),
        ("workers-ai", 502, "bad gateway", "HTTP 502"),
        ("worker", 500, "boom", "HTTP 500"),
    ],
)  # fmt: skip
def test_failures_keep_their_error_code(backend, status, body, code):
    text = body if isinstance(body, str) else json.dumps(body)
    for stream in (True, False):
        out = run_one(backend, status, text, stream)
        assert not out.success and out.code == code and out.status == status


# --- the knee ----------------------------------------------------------------------------------


def point(rate, throughput, p99_e2el_ms):
    out = [done(0.01, p99_e2el_ms / 1000, 2)]
    m = calculate_metrics([BenchRequest("x", 1, 2)], out, 1.0, [50, 99], {})
    m.request_throughput = throughput
    return SweepPoint(rate, m, 1.0)


def test_the_knee_is_where_latency_doubles_and_throughput_stalls():
    pts = [
        point(1, 1.0, 100),
        point(2, 2.0, 150),
        point(4, 3.9, 210),
        point(8, 4.1, 900),
        point(16, 4.0, 2000),
    ]
    assert find_knee(pts) == 3  # at 4: latency doubled but throughput still rose; at 8 it stalled
    assert find_knee(pts[:3]) is None
    assert "knee: 8 req/s" in format_sweep(pts, 3) and "8 <- knee" in format_sweep(pts, 3)
