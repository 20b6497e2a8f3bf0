"""The live dashboard's stream (runtime.routes.dashboard): what the runtime already measures, kept in
fixed windows, and fanned out to each open browser through a bounded queue of its own.

Bounds, so that a dashboard never costs serving more than a few encodes a second:
- the runtime keeps the last WINDOW_REQUESTS requests, SERIES_BUCKETS buckets of SERIES_SECONDS
  each (10 minutes), the TTFTs of the last minute per account (at most TTFT_SAMPLES each) and at
  most MAX_ACCOUNTS accounts (the least recently seen one goes);
- each browser holds at most CLIENT_EVENTS request events (the oldest are dropped and counted) and
  one snapshot slot (a newer snapshot replaces an unsent one): publishing never waits on a browser,
  whatever it reads or does not read;
- at most MAX_CLIENTS browsers at once; an event is encoded once for all of them."""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from runtime.control.ai_record import AIRecord

WINDOW_REQUESTS = 200
CLIENT_EVENTS = 64
MAX_CLIENTS = 16
MAX_ACCOUNTS = 256
TTFT_SAMPLES = 512
TTFT_WINDOW_S = 60.0
SERIES_SECONDS = 5
SERIES_BUCKETS = 120  # 10 minutes
BUCKET_SAMPLES = 256  # latency samples kept per bucket for its percentiles


def sse(event: str, data: Any) -> bytes:
    """One Server-Sent Event; JSON never holds a bare newline, so one data line is enough."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100.0 * len(ordered)))]


class DashboardClient:
    """One open browser: a bounded queue of request events and one coalescing snapshot slot."""

    def __init__(self, max_events: int = CLIENT_EVENTS):
        self.events: deque[bytes] = deque(maxlen=max_events)
        self.snapshot: bytes | None = None
        self.dropped = 0  # request events it lost by not reading fast enough
        self.closed = False  # the runtime is stopping: its stream ends
        self._wake = asyncio.Event()

    def offer_event(self, data: bytes) -> None:
        if len(self.events) == self.events.maxlen:
            self.dropped += 1
        self.events.append(data)
        self._wake.set()

    def offer_snapshot(self, data: bytes) -> None:
        self.snapshot = data  # an unsent older one is replaced, never queued behind
        self._wake.set()

    def take(self) -> list[bytes]:
        """What is waiting, the snapshot first (without waiting)."""
        out = [self.snapshot] if self.snapshot is not None else []
        out.extend(self.events)
        self.snapshot = None
        self.events.clear()
        self._wake.clear()
        return out

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    async def next(self, timeout: float) -> list[bytes] | None:
        """What is waiting, after at most `timeout` seconds ([] when nothing came: send a keep-alive;
        None once closed: end the stream)."""
        if self.closed:
            return None
        if not self.events and self.snapshot is None:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                return []
        return None if self.closed else self.take()


class Series:
    """Throughput and latency in SERIES_SECONDS buckets over the last SERIES_BUCKETS of them."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.buckets: deque[dict[str, Any]] = deque(maxlen=SERIES_BUCKETS)
        self._done: dict[int, dict[str, Any]] = {}  # the rows of finished buckets, which no longer change

    def _bucket(self) -> dict[str, Any]:
        start = int(self.clock() // SERIES_SECONDS) * SERIES_SECONDS
        if not self.buckets or self.buckets[-1]["t"] != start:
            counts = {"t": start, "requests": 0, "errors": 0, "ai": 0, "tokens": 0}
            self.buckets.append({**counts, "ttft": [], "tpot": [], "e2e": []})
        return self.buckets[-1]

    def request(self, ok: bool) -> None:
        b = self._bucket()
        b["requests"] += 1
        b["errors"] += 0 if ok else 1

    def ai_call(self, completion_tokens: int, ttft_ms: float, tpot_ms: float, total_ms: float) -> None:
        b = self._bucket()
        b["ai"] += 1
        b["tokens"] += completion_tokens
        for key, value in (("ttft", ttft_ms), ("tpot", tpot_ms), ("e2e", total_ms)):
            if len(b[key]) < BUCKET_SAMPLES:
                b[key].append(value)

    def view(self) -> list[dict[str, Any]]:
        """Per bucket: request and output-token throughput, and TTFT / TPOT / E2E percentiles (ms)."""
        out = []
        self._done = (
            {t: row for t, row in self._done.items() if t >= self.buckets[0]["t"]} if self.buckets else {}
        )
        for i, b in enumerate(self.buckets):
            if (row := self._done.get(b["t"])) is not None:
                out.append(row)
                continue
            row = {
                "t": b["t"],
                "req_s": round(b["requests"] / SERIES_SECONDS, 3),
                "err": b["errors"],
                "tok_s": round(b["tokens"] / SERIES_SECONDS, 2),
            }
            for key in ("ttft", "tpot", "e2e"):
                row[f"{key}_p50"] = percentile(b[key], 50)
                row[f"{key}_p99"] = percentile(b[key], 99)
            if i < len(self.buckets) - 1:
                self._done[b["t"]] = row
            out.append(row)
        return out


class AccountFigures:
    """One account as the dashboard counts it: AI calls, tokens, 429s, and its last minute's TTFTs."""

    def __init__(self) -> None:
        self.requests = self.prompt_tokens = self.completion_tokens = self.limited = 0
        self.ttft: deque[tuple[float, float]] = deque(maxlen=TTFT_SAMPLES)  # (when, ms)

    def view(self, now: float) -> dict[str, Any]:
        recent = [ms for at, ms in self.ttft if now - at <= TTFT_WINDOW_S]
        return {
            "requests": self.requests,
            "tokens_in": self.prompt_tokens,
            "tokens_out": self.completion_tokens,
            "rate_limited": self.limited,
            "ttft_p50": percentile(recent, 50),
            "ttft_p99": percentile(recent, 99),
        }


class DashboardFeed:
    """The windows and the browsers. The runtime calls request(), ai_record() and rate_limited() as
    things happen (cheap, never waiting) and publish_snapshot() a few times a second while a browser
    is open."""

    def __init__(self, max_clients: int = MAX_CLIENTS, clock: Callable[[], float] = time.time):
        self.max_clients, self.clock = max_clients, clock
        self.clients: set[DashboardClient] = set()
        self.requests: deque[dict[str, Any]] = deque(maxlen=WINDOW_REQUESTS)
        self.series = Series(clock)
        self.accounts: OrderedDict[str, AccountFigures] = OrderedDict()
        # the last minute's TTFTs per model served (a canary's name apart), for the rollback signal
        self.model_ttft: OrderedDict[str, deque[tuple[float, float]]] = OrderedDict()
        self._next_id = 0
        self.closed = False
        # seconds spent on the browsers' behalf (encoding, fanning out, building snapshots): what an
        # open dashboard costs the event loop that serves, shown in each snapshot
        self.work_s = 0.0

    # --- what the runtime tells it -----------------------------------------------------------------

    def request(self, entry: dict[str, Any]) -> None:
        """A request is over (runtime.host.worker): into the window, and to every open browser."""
        self._next_id += 1
        entry = {"id": self._next_id, **entry}
        self.requests.append(entry)
        self.series.request(entry.get("outcome") == "ok" and int(entry.get("status") or 0) < 500)
        if self.clients:
            started = time.perf_counter()
            data = sse("request", entry)
            for client in self.clients:
                client.offer_event(data)
            self.work_s += time.perf_counter() - started

    def ai_record(self, record: AIRecord) -> None:
        """An AI call a generation answered, from its record (runtime.control.ai_record), under the
        model that served it (a rollout's canary apart from the model)."""
        t = record.timing
        if t is None:
            return
        self.ai_call(
            record.account,
            record.served,
            record.prompt_tokens,
            record.completion_tokens,
            t.ttft_ms,
            t.tpot_ms,
            t.total_ms,
        )

    def ai_call(
        self,
        account: str,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        ttft_ms: float,
        tpot_ms: float,
        total_ms: float,
    ) -> None:
        """An AI call finished: its tokens and latency."""
        figures = self._account(account)
        figures.requests += 1
        figures.prompt_tokens += prompt_tokens
        figures.completion_tokens += completion_tokens
        figures.ttft.append((self.clock(), ttft_ms))
        if model not in self.model_ttft and len(self.model_ttft) >= MAX_ACCOUNTS:
            self.model_ttft.popitem(last=False)
        self.model_ttft.setdefault(model, deque(maxlen=TTFT_SAMPLES)).append((self.clock(), ttft_ms))
        self.series.ai_call(completion_tokens, ttft_ms, tpot_ms, total_ms)

    def rate_limited(self, account: str, model: str, limit: str) -> None:
        """An AI call refused by the account's rate limit (429, 3036)."""
        self._account(account).limited += 1

    def _account(self, account: str) -> AccountFigures:
        figures = self.accounts.get(account)
        if figures is None:
            figures = self.accounts[account] = AccountFigures()
            while len(self.accounts) > MAX_ACCOUNTS:
                self.accounts.popitem(last=False)
        self.accounts.move_to_end(account)
        return figures

    # --- the browsers ------------------------------------------------------------------------------

    def join(self) -> DashboardClient | None:
        """A new browser, its first message the window of recent requests; None when MAX_CLIENTS are
        open or the runtime is stopping."""
        if len(self.clients) >= self.max_clients or self.closed:
            return None
        client = DashboardClient()
        for entry in list(self.requests)[-CLIENT_EVENTS:]:
            client.offer_event(sse("request", entry))
        self.clients.add(client)
        return client

    def leave(self, client: DashboardClient) -> None:
        self.clients.discard(client)

    def close(self) -> None:
        """The runtime is stopping: every open stream ends, and no new one starts."""
        self.closed = True
        for client in self.clients:
            client.close()

    def publish_snapshot(self, snapshot: dict[str, Any]) -> None:
        """The state of now (built by the caller once), encoded once for every open browser."""
        if not self.clients:
            return
        started = time.perf_counter()
        data = sse("snapshot", snapshot)
        for client in self.clients:
            client.offer_snapshot(data)
        self.work_s += time.perf_counter() - started

    def model_p99_ttft(self, model: str) -> float | None:
        now = self.clock()
        return percentile([ms for at, ms in self.model_ttft.get(model, ()) if now - at <= TTFT_WINDOW_S], 99)

    def accounts_view(self) -> dict[str, dict[str, Any]]:
        now = self.clock()
        return {name: figures.view(now) for name, figures in self.accounts.items()}
