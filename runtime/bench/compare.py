"""`edge bench serve --compare kv=auto,int8,int4` (or `weights=bf16,fp8,int8,int4`): the pieces.

One seeded workload is sent to each setting in turn on the same PoPs. The setting is the catalog
entry's `kv_cache_dtype` or `weights` (and its full-size target's, for the modeled times): a
catalog is written with the setting and the running PoPs reload the model from it (POST
/cdn-cgi/edge/models/reload), so no restart is needed, but the runtime's models folder must be one
the command may write: it starts its own `edge dev` on a copy (runtime.cli.bench_compare).

Per setting: KV memory used (peak while the run lasted) and free (at the peak) and the most
sequences running at once, from the PoP view (GET /cdn-cgi/edge/pops, sampled); vLLM's metrics of
the run; cost per request and per million output tokens from the modeled target times: each
request holds the PoP's GPUs for its modeled time shared with the batch it decoded in, priced at
the GPUs' hourly price (edge_sim.topology); and the perplexity change of the setting at the
workload's context lengths (quality.perplexity.evaluate, as `edge models eval`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import msgspec

from edge_sim.roofline import gpu_type
from edge_sim.target import TargetSpec, modeled_times, pop_layout
from edge_sim.topology import Topology
from engine.kv.kv_cache import BLOCK_SIZE
from runtime.ai.catalog import CatalogEntry
from runtime.bench.clients import RequestOutput
from runtime.bench.metrics import BenchmarkMetrics

AXES = {"kv": ("auto", "bf16", "fp8", "int8", "int4"), "weights": ("auto", "bf16", "fp8", "int8", "int4")}


class Setting(msgspec.Struct, frozen=True):
    axis: str  # "kv" or "weights"
    value: str

    @property
    def label(self) -> str:
        return f"{self.axis}={self.value}"


def parse_compare(text: str) -> list[Setting]:
    """`kv=auto,int8,int4` -> its settings; ValueError saying what to write instead."""
    axis, sep, values = text.partition("=")
    names = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or axis not in AXES or len(names) < 2:
        raise ValueError(
            f"--compare {text!r}: give kv=A,B,... or weights=A,B,... (two settings or more), "
            "e.g. --compare kv=auto,int8,int4"
        )
    unknown = [n for n in names if n not in AXES[axis]]
    if unknown:
        raise ValueError(f"--compare {axis}: unknown {', '.join(unknown)}; known: {', '.join(AXES[axis])}")
    return [Setting(axis, n) for n in names]


def apply(entry: CatalogEntry, setting: Setting) -> CatalogEntry:
    """The catalog entry serving `setting` (its full-size target follows, where the roofline knows
    the format: 'auto' weights keep the target's own)."""
    target = entry.target
    if setting.axis == "kv":
        entry = msgspec.structs.replace(entry, kv_cache_dtype=setting.value)
        if target is not None:
            target = msgspec.structs.replace(target, kv=setting.value)
    else:
        entry = msgspec.structs.replace(entry, weights=setting.value)
        if target is not None and setting.value != "auto":
            target = msgspec.structs.replace(target, weights=setting.value)
    return msgspec.structs.replace(entry, target=target)


def write_catalog(models_dir: Path, entry: CatalogEntry, folder: Path) -> Path:
    """A catalog.toml in `models_dir` with this one entry, its checkpoint at `folder` (absolute)."""
    q = json.dumps  # a JSON string is a TOML basic string
    lines = [
        "[[model]]",
        f"name = {q(entry.name)}",
        f"path = {q(str(folder))}",
        f"task = {q(entry.task)}",
        f"schema = {q(entry.schema)}",
        f"weights = {q(entry.weights)}",
        f"kv_cache_dtype = {q(entry.kv_cache_dtype)}",
    ]
    if entry.context_window is not None:
        lines.append(f"context_window = {entry.context_window}")
    if entry.target is not None:
        fields = {k: v for k, v in msgspec.to_builtins(entry.target).items() if v is not None}
        inline = ", ".join(f"{k} = {q(v) if isinstance(v, str) else v}" for k, v in fields.items())
        lines.append(f"target = {{ {inline} }}")
    models_dir.mkdir(parents=True, exist_ok=True)
    path = models_dir / "catalog.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class KVPeak(msgspec.Struct):
    blocks_total: int = 0
    blocks_used: int = 0  # the most in use at once
    blocks_free: int = 0  # free at that moment
    bytes_per_token: float = 0.0
    running: int = 0  # the most sequences running at once (admitted)


def peak_of(pops: list[dict], model: str, peak: KVPeak) -> KVPeak:
    """`peak` updated with one PoP view (the JSON of GET /cdn-cgi/edge/pops), summed over PoPs."""
    views = [p["models"][model] for p in pops if model in p.get("models", {})]
    if not views:
        return peak
    used = sum(v["kv_blocks_used"] for v in views)
    running = sum(v["running"] for v in views)
    total = sum(v["kv_blocks_total"] for v in views)
    if used >= peak.blocks_used or peak.blocks_total == 0:
        peak.blocks_used, peak.blocks_free = used, sum(v["kv_blocks_free"] for v in views)
    peak.blocks_total, peak.running = total, max(peak.running, running)
    peak.bytes_per_token = views[0]["kv_bytes_per_token"]
    return peak


class Sampler:
    """Polls `view()` (the PoP view) on a thread every `interval_s` until stopped; the peak."""

    def __init__(self, view: Callable[[], list[dict]], model: str, interval_s: float = 0.2):
        self.view, self.model, self.interval_s = view, model, interval_s
        self.peak = KVPeak()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            try:
                self.peak = peak_of(self.view(), self.model, self.peak)
            except Exception:  # noqa: BLE001 - a missed sample only loses resolution
                pass
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = peak_of(self.view(), self.model, self.peak)  # one after the run


class Cost(msgspec.Struct):
    per_request_usd: float | None
    per_million_tokens_usd: float | None  # output tokens
    target: str  # what was priced, e.g. "kimi-k2 fp8 weights, int8 KV on 8 x H200"


def cost(outputs: list[RequestOutput], target: TargetSpec | None, topology: Topology) -> Cost:
    """What the completed requests cost on their PoPs' GPUs running the full-size target: each
    holds every GPU of its layout for its modeled time divided by its batch."""
    if target is None:
        return Cost(None, None, "no target in the catalog")
    usd, tokens, served, label = 0.0, 0, 0, ""
    for out in outputs:
        if not out.success or not out.pop:
            continue
        pop = topology.pop(out.pop)
        gpu, gpus = pop_layout(target, pop)
        t = modeled_times(target, pop, out.prompt_tokens or 0, out.output_tokens, out.batch, 0.0)
        label = t.target
        if not t.fits or t.total_ms is None:
            return Cost(None, None, t.target + " (does not fit)")
        usd += gpu_type(gpu).price_per_hour * gpus * t.total_ms / 3.6e6 / max(1, t.batch)
        tokens += out.output_tokens
        served += 1
    if not served:
        return Cost(None, None, label or "nothing completed")
    return Cost(usd / served, usd / tokens * 1e6 if tokens else None, label)


class SettingResult(msgspec.Struct):
    setting: Setting
    metrics: BenchmarkMetrics
    kv: KVPeak
    cost: Cost
    ppl_change_pct: dict[int, float]  # by context length, against the uncompressed baseline


def format_compare(results: list[SettingResult], percentiles: list[float]) -> str:
    """The settings side by side, one column each."""

    def pct(m: BenchmarkMetrics, name: str, p: float) -> str:
        stats = m.stats.get(name)
        value = dict(stats.percentiles).get(p) if stats else None
        return "-" if value is None else f"{value:.1f}"

    def money(x: float | None, digits: int) -> str:
        return "-" if x is None else f"${x:.{digits}f}"

    def mib(blocks: int, kv: KVPeak) -> str:
        return f"{blocks * BLOCK_SIZE * kv.bytes_per_token / 2**20:.2f}"

    rows: list[tuple[str, list[str]]] = [
        ("KV blocks used (peak)", [f"{r.kv.blocks_used}/{r.kv.blocks_total}" for r in results]),
        ("KV MiB used / free", [f"{mib(r.kv.blocks_used, r.kv)} / {mib(r.kv.blocks_free, r.kv)}"
                                for r in results]),
        ("KV bytes per token", [f"{r.kv.bytes_per_token:.0f}" for r in results]),
        ("sequences admitted (peak)", [str(r.kv.running) for r in results]),
        ("completed / failed", [f"{r.metrics.completed} / {r.metrics.failed}" for r in results]),
    ]  # fmt: skip
    for name in ("ttft", "tpot", "e2el"):
        for p in percentiles:
            rows.append((f"P{p:g} {name.upper()} (ms)", [pct(r.metrics, name, p) for r in results]))
    rows += [
        ("requests/s", [f"{r.metrics.request_throughput:.2f}" for r in results]),
        ("output tokens/s", [f"{r.metrics.output_throughput:.1f}" for r in results]),
        ("cost per request", [money(r.cost.per_request_usd, 6) for r in results]),
        ("cost per 1M output tokens", [money(r.cost.per_million_tokens_usd, 3) for r in results]),
    ]
    contexts = sorted({c for r in results for c in r.ppl_change_pct})
    for c in contexts:
        values = [r.ppl_change_pct.get(c) for r in results]
        rows.append((f"perplexity change @ {c}", ["-" if v is None else f"{v:+.2f}%" for v in values]))
    header = ("", [r.setting.label for r in results])
    table = [header, *rows]
    w0 = max(len(label) for label, _ in table)
    widths = [max(len(cells[i]) for _, cells in table) for i in range(len(results))]
    lines = [
        label.ljust(w0) + "  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
        for label, cells in table
    ]
    priced = {r.cost.target for r in results}
    lines.append("(cost: the modeled full-size target: " + "; ".join(sorted(priced)) + ")")
    return "\n".join(lines)


def eval_contexts(prompt_lens: list[int], output_lens: list[int], window: int, text_tokens: int) -> list[int]:
    """The workload's context lengths worth scoring: its median and its longest prompt + output,
    each rounded up to a power of two (at least 64), within the model's window and the held-out
    text."""
    if not prompt_lens:
        return []
    totals = sorted(p + o for p, o in zip(prompt_lens, output_lens, strict=True))
    out = []
    for n in (totals[len(totals) // 2], totals[-1]):
        c = 64
        while c < n:
            c *= 2
        c = min(c, window, text_tokens)
        if c >= 16 and c not in out:
            out.append(c)
    return out
