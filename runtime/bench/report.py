"""The printed result of a benchmark run, laid out as `vllm bench serve` prints its own, and the
result file (`--save-result`) with vLLM's key names where they mean the same thing: date, backend,
model_id, num_prompts, request_rate ("inf" when unbounded), burstiness, max_concurrency, duration,
completed, failed, total_input_tokens, total_output_tokens, request_throughput, request_goodput,
output_throughput, total_token_throughput, {mean,median,std}_{metric}_ms, p{P}_{metric}_ms and,
with --save-detailed, the per-request input_lens, output_lens, ttfts, itls, generated_texts and
errors (seconds, as vLLM's). Ours beside them: failures_by_code, error_codes and e2els (per
request), dataset, tenants, goodput_slo_ms."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from runtime.bench.clients import RequestOutput
from runtime.bench.metrics import BenchmarkMetrics

WIDTH = 50
HEADERS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


def p_word(p: float) -> str:
    """50.0 -> "50", 99.9 -> "99.9" (vLLM's key and label spelling)."""
    return str(int(p)) if float(p).is_integer() else str(p)


def _row(label: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        text = "-"
    elif isinstance(value, float):
        text = f"{value:.2f}"
    else:
        text = str(value)
    return f"{label:<40} {text:<10}".rstrip()


def format_result(
    m: BenchmarkMetrics,
    duration_s: float,
    metrics: list[str],
    request_rate: float,
    max_concurrency: int | None,
) -> str:
    lines = [" Serving Benchmark Result ".center(WIDTH, "=")]
    lines.append(_row("Successful requests:", m.completed))
    lines.append(_row("Failed requests:", m.failed))
    for code, count in m.failures_by_code.items():
        lines.append(_row(f"  failed with {code}:", count))
    if max_concurrency is not None:
        lines.append(_row("Maximum request concurrency:", max_concurrency))
    if not math.isinf(request_rate):
        lines.append(_row("Request rate configured (RPS):", float(request_rate)))
    lines.append(_row("Benchmark duration (s):", float(duration_s)))
    lines.append(_row("Total input tokens:", m.total_input))
    lines.append(_row("Total generated tokens:", m.total_output))
    lines.append(_row("Request throughput (req/s):", m.request_throughput))
    if m.request_goodput is not None:
        lines.append(_row("Request goodput (req/s):", m.request_goodput))
    lines.append(_row("Output token throughput (tok/s):", m.output_throughput))
    lines.append(_row("Total Token throughput (tok/s):", m.total_token_throughput))
    for name in metrics:
        short, title = HEADERS[name]
        s = m.stats[name]
        lines.append(title.center(WIDTH, "-"))
        lines.append(_row(f"Mean {short} (ms):", s.mean))
        lines.append(_row(f"Median {short} (ms):", s.median))
        lines.append(_row(f"Std {short} (ms):", s.std))
        lines += [_row(f"P{p_word(p)} {short} (ms):", v) for p, v in s.percentiles]
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def result_json(
    m: BenchmarkMetrics,
    outputs: list[RequestOutput],
    duration_s: float,
    metrics: list[str],
    setup: dict[str, Any],
    detailed: bool,
) -> dict[str, Any]:
    """The result file's object: `setup` (date, backend, model_id, num_prompts, request_rate, ...)
    first, then the measurements."""
    rate = setup.get("request_rate")
    out: dict[str, Any] = {
        "date": time.strftime("%Y%m%d-%H%M%S"),
        **setup,
        "request_rate": "inf" if isinstance(rate, float) and math.isinf(rate) else rate,
        "duration": duration_s,
        "completed": m.completed,
        "failed": m.failed,
        "failures_by_code": m.failures_by_code,
        "total_input_tokens": m.total_input,
        "total_output_tokens": m.total_output,
        "request_throughput": m.request_throughput,
        "request_goodput": m.request_goodput,
        "output_throughput": m.output_throughput,
        "total_token_throughput": m.total_token_throughput,
    }
    for name in metrics:
        s = m.stats[name]
        out[f"mean_{name}_ms"], out[f"median_{name}_ms"], out[f"std_{name}_ms"] = s.mean, s.median, s.std
        for p, v in s.percentiles:
            out[f"p{p_word(p)}_{name}_ms"] = v
    if detailed:
        out["input_lens"] = [o.prompt_tokens or 0 for o in outputs]
        out["output_lens"] = [o.output_tokens for o in outputs]
        out["ttfts"] = [o.ttft for o in outputs]
        out["itls"] = [o.itl for o in outputs]
        out["e2els"] = [o.latency if o.success else None for o in outputs]
        out["generated_texts"] = [o.generated_text for o in outputs]
        out["errors"] = [o.error for o in outputs]
        out["error_codes"] = [o.code for o in outputs]
    return out


def save_result(path: str | Path, result: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
