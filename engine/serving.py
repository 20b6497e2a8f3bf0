"""EngineLoop: runs an LLMEngine in its own thread so that callers on other threads (an asyncio
event loop, say) can submit and cancel requests at any time; new requests join the running batch
at the next step (continuous batching).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable

import msgspec
import torch

from engine.engine import LLMEngine
from engine.outputs import SeqEvent
from engine.sampling import SamplingParams
from engine.sched.fair_queue import TenantShare

log = logging.getLogger("edge.engine")

EventCallback = Callable[[SeqEvent], None]

# EDGE_STEP_LOG=path: every engine appends each step's StepStats there, one JSON line with its name
# (what `capacity.profile.fit_serving_steps` fits step times to).
STEP_LOG_ENV = "EDGE_STEP_LOG"


class EngineLoop:
    def __init__(self, engine: LLMEngine, name: str = "engine"):
        self.engine = engine
        self._lock = threading.Condition()
        self._incoming: deque[tuple[str, list[int], SamplingParams, str, EventCallback, float]] = deque()
        self._cancelled: deque[str] = deque()
        self._callbacks: dict[str, EventCallback] = {}
        self._open: dict[str, int] = {}  # by request: its sequences not yet ended (n at the start)
        self._stopped = False
        self._retiring = False  # stop once the requests already running have finished
        self._name = name
        log_path = os.environ.get(STEP_LOG_ENV)
        # unbuffered: one append per step, so nothing is lost when the process is killed
        self._step_log = open(log_path, "ab", buffering=0) if log_path else None  # noqa: SIM115
        self._logged = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        on_event: EventCallback,
        tenant: str = "local",
        share: TenantShare | None = None,
    ) -> None:
        """Queue a request (validate it first with engine.check_request); events go to `on_event`,
        called from the engine thread."""
        with self._lock:
            # its queue time starts now, not when the step in progress ends and it is picked up
            arrival = time.perf_counter()
            self._incoming.append((request_id, prompt_ids, params, tenant, share, on_event, arrival))
            self._lock.notify()

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.append(request_id)
            self._lock.notify()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify()
        self._thread.join(timeout=10)

    def retire(self) -> None:
        """Finish what is running, then stop (a newer engine has taken over new requests)."""
        with self._lock:
            self._retiring = True
            self._lock.notify()

    def _drain(self) -> None:
        with self._lock:
            while (
                not self._stopped
                and not self._incoming
                and not self._cancelled
                and not self.engine.has_unfinished()
            ):
                if self._retiring:
                    self._stopped = True
                    break
                self._lock.wait()
            incoming, self._incoming = list(self._incoming), deque()
            cancelled, self._cancelled = list(self._cancelled), deque()
        for request_id, prompt_ids, params, tenant, share, on_event, arrival in incoming:
            try:
                self.engine.add_request(prompt_ids, params, request_id, tenant, arrival, share)
                self._callbacks[request_id] = on_event
                self._open[request_id] = params.n
            except Exception as exc:  # validated before submit; anything left is reported, not raised
                self._deliver(on_event, SeqEvent(request_id, None, "", "error", error=str(exc)))
        for request_id in cancelled:
            self._dispatch(self.engine.abort_all(request_id))

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            self._drain()
            if self._stopped:
                if self._step_log is not None:
                    self._step_log.close()
                return
            try:
                events = self.engine.step()
                if (
                    self._step_log is not None
                    and self.engine.steps
                    and self.engine.steps[-1] is not self._logged
                ):
                    self._log_step()
            except Exception:  # an engine bug: fail what is running, keep the loop alive
                log.exception("engine step failed")
                events = [e for rid in list(self._callbacks) for e in self.engine.abort_all(rid)]
                for e in events:
                    e.finish_reason, e.error = "error", "internal engine error"
            self._dispatch(events)

    def _dispatch(self, events: list[SeqEvent]) -> None:
        """Deliver events; a request's callback is dropped once each of its n sequences has ended."""
        for event in events:
            callback = self._callbacks.get(event.request_id)
            if event.finish_reason is not None:
                left = self._open.get(event.request_id, 1) - 1
                if left <= 0:
                    self._callbacks.pop(event.request_id, None)
                    self._open.pop(event.request_id, None)
                else:
                    self._open[event.request_id] = left
            if callback is not None:
                self._deliver(callback, event)

    def _log_step(self) -> None:
        self._logged = self.engine.steps[-1]
        step = msgspec.structs.asdict(self._logged)
        self._step_log.write(msgspec.json.encode({"engine": self._name, **step}) + b"\n")

    @staticmethod
    def _deliver(callback: EventCallback, event: SeqEvent) -> None:
        try:
            callback(event)
        except Exception:  # a listener that has gone away must not stop the engine for everyone
            log.exception("dropping an event for %s: its listener failed", event.request_id)
