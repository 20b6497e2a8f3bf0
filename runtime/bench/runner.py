"""Sending a dataset on its schedule: each request at its send time (runtime.bench.load), at most
`max_concurrency` in flight (a request whose time has come waits for a slot, so the achieved rate
can fall below the one asked for when the server cannot keep up, as in vLLM), to tenant i mod N,
with a progress bar (tqdm when installed, else a line on stderr)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Sequence

import httpx
import msgspec

from runtime.bench.clients import RequestOutput, Target, Tenant, send
from runtime.bench.dataset import BenchRequest
from runtime.bench.load import paced
from runtime.bench.tenants import pick

REQUEST_TIMEOUT_S = 6 * 3600.0  # vLLM's: a benchmark waits for slow answers rather than failing them


class RunResult(msgspec.Struct):
    outputs: list[RequestOutput]
    duration_s: float


class Progress:
    """tqdm if installed, else `N/M requests` rewritten on stderr; nothing when disabled."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.bar = total, 0, None
        self.enabled = enabled
        if not enabled:
            return
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, file=sys.stderr, unit="req")
        except ImportError:
            self.bar = None

    def update(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled:
            end = "\n" if self.done == self.total else ""
            print(f"\r{self.done}/{self.total} requests", end=end, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


async def run_requests(
    target: Target,
    tenants: Sequence[Tenant],
    requests: Sequence[BenchRequest],
    times: Sequence[float],
    rates: Sequence[float],
    max_concurrency: int | None = None,
    progress: bool = True,
) -> RunResult:
    """Every request sent and answered (or failed); the duration runs from the first send to the
    last answer."""
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    limit = max_concurrency or max(1, len(requests))
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    bar = Progress(len(requests), progress)
    outputs: list[RequestOutput | None] = [None] * len(requests)

    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:

        async def one(i: int) -> None:
            async with slots:
                outputs[i] = await send(client, target, pick(list(tenants), i), requests[i])
            bar.update()

        started = time.perf_counter()
        tasks = []
        async for sent in paced(times, rates):
            tasks.append(asyncio.create_task(one(sent.index)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - started
    bar.close()
    return RunResult([o if o is not None else RequestOutput() for o in outputs], duration)
