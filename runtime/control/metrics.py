"""Prometheus metrics of the runtime: requests and outcomes per worker, latency, AI tokens per model,
AI calls refused by rate limits, and per account at the engines: seats and KV blocks held, requests
waiting, preemptions (read at each scrape from the engines' own stats, EngineStats.accounts, the one
source a per-account view reads too) and time to first token.

Two views: the open one (totals by outcome, latency, AI tokens and refusals per model: no worker or
account names) and the admin's, which adds the per-worker and per-account series."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from runtime.control.ai_record import AIRecord

CONTENT_TYPE = CONTENT_TYPE_LATEST

# (pop, model, account, seats held, KV blocks held, waiting, preemptions since start): one account
# at one engine, as its EngineStats.accounts says
AccountRow = tuple[str, str, str, int, int, int, int]


class AccountCollector(Collector):
    """The per-account engine series, read from `source()` at each scrape."""

    def __init__(self, source: Callable[[], Iterable[AccountRow]]):
        self.source = source

    def collect(self) -> Iterator[Metric]:
        labels = ["pop", "model", "account"]
        gauge = GaugeMetricFamily
        seats = gauge("edge_account_seats", "Decode seats (running sequences) held", labels=labels)
        blocks = gauge("edge_account_kv_blocks", "KV blocks held (running and paused)", labels=labels)
        waiting = gauge("edge_account_waiting", "Sequences waiting at the engine", labels=labels)
        preempted = CounterMetricFamily(
            "edge_account_preemptions",
            "Sequences preempted (paused, or recomputed later) since start",
            labels=labels,
        )
        for pop, model, account, n_seats, n_blocks, n_waiting, n_preempted in self.source():
            key = [pop, model, account]
            seats.add_metric(key, n_seats)
            blocks.add_metric(key, n_blocks)
            waiting.add_metric(key, n_waiting)
            preempted.add_metric(key, n_preempted)
        yield from (seats, blocks, waiting, preempted)


class Metrics:
    def __init__(self) -> None:
        self.public = CollectorRegistry()  # what anyone may read
        self.registry = CollectorRegistry()  # per worker: the admin's
        self.hibernations = Counter(
            "edge_durable_object_hibernations",
            "Durable Objects whose isolate was stopped while the runtime held their WebSockets",
            registry=self.public,
        )
        self.total_requests = Counter(
            "edge_requests", "Requests handled by all workers, by outcome", ["outcome"], registry=self.public
        )
        self.total_latency = Histogram(
            "edge_request_seconds",
            "Request latency as the runtime sees it, all workers",
            registry=self.public,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.requests = Counter(
            "edge_worker_requests",
            "Requests handled, by worker and outcome",
            ["worker", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "edge_worker_request_seconds",
            "Request latency as the runtime sees it",
            ["worker"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.tokens = Counter(
            "edge_ai_tokens",
            "AI tokens, by model and kind (prompt or completion)",
            ["model", "kind"],
            registry=self.public,
        )
        self.speculative = Counter(
            "edge_ai_speculative_tokens",
            "Speculative draft tokens verified, by model and kind (drafted, or accepted: kept); "
            "acceptance rate = accepted / drafted",
            ["model", "kind"],
            registry=self.public,
        )
        self.total_limited = Counter(
            "edge_ai_rate_limited",
            "AI calls refused by an account's rate limit (429, 3036), by model and limit (rpm or tpm)",
            ["model", "limit"],
            registry=self.public,
        )
        self.limited = Counter(
            "edge_ai_account_rate_limited",
            "AI calls refused by an account's rate limit, by account, model and limit",
            ["account", "model", "limit"],
            registry=self.registry,
        )

        self.account_ttft = Histogram(
            "edge_account_ttft_seconds",
            "Time to first token at the GPU PoP (queue + prefill), by account",
            ["account"],
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self._accounts: AccountCollector | None = None

        self.rollouts = Counter(
            "edge_model_rollouts",
            "Canary rollouts finished, by model and decision (promoted or rolled_back)",
            ["model", "decision"],
            registry=self.public,
        )

    def request(self, worker: str, outcome: str, seconds: float) -> None:
        self.requests.labels(worker, outcome).inc()
        self.latency.labels(worker).observe(seconds)
        self.total_requests.labels(outcome).inc()
        self.total_latency.observe(seconds)

    def ai_record(self, record: AIRecord) -> None:
        """One AI call, from its record (runtime.control.ai_record): its tokens under the name it
        was called by and, when a generation answered it, its draft tokens and its time to first
        token at its PoP."""
        self.ai_tokens(record.model, record.prompt_tokens, record.completion_tokens)
        timing = record.timing
        if timing is not None:
            self.ai_speculation(record.model, timing.draft_tokens, timing.accepted_tokens)
            self.ai_ttft(record.account, (timing.queue_ms + timing.prefill_ms) / 1000.0)

    def ai_tokens(self, model: str, prompt: int, completion: int) -> None:
        """One AI call's tokens."""
        self.tokens.labels(model, "prompt").inc(prompt)
        self.tokens.labels(model, "completion").inc(completion)

    def ai_speculation(self, model: str, drafted: int, accepted: int) -> None:
        """One AI call's draft tokens and the ones kept (from its latency account)."""
        self.speculative.labels(model, "drafted").inc(drafted)
        self.speculative.labels(model, "accepted").inc(accepted)

    def ai_ttft(self, account: str, seconds: float) -> None:
        """One AI call's time to first token at its PoP (from its latency account)."""
        self.account_ttft.labels(account).observe(seconds)

    def watch_accounts(self, source: Callable[[], Iterable[AccountRow]]) -> None:
        """Per-account engine series (admin view) from `source()`, read at each scrape."""
        if self._accounts is not None:
            self.registry.unregister(self._accounts)
        self._accounts = AccountCollector(source)
        self.registry.register(self._accounts)

    def object_hibernated(self) -> None:
        self.hibernations.inc()

    def ai_rate_limited(self, account: str, model: str, limit: str) -> None:
        self.limited.labels(account, model, limit).inc()
        self.total_limited.labels(model, limit).inc()

    def render(self, detailed: bool = False) -> bytes:
        """The open view, or (detailed, for the admin) with the per-worker series too."""
        out = generate_latest(self.public)
        return out + generate_latest(self.registry) if detailed else out
