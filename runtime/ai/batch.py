"""Workers AI's asynchronous batch API: `env.AI.run(model, {"requests": [...]}, {"queueRequest":
True})` or POST /ai/run/MODEL?queueRequest=true answers `{"status": "queued", "request_id", "model"}`
at once; polling with `{"request_id": ID}` answers `{"status": "queued" | "running", ...}` until every
request has run, then Cloudflare's `{"responses": [{"id", "result", "success", "external_reference"}],
"usage"}`.

Every request is validated through AIService.prepare when the batch is submitted (a bad one
refuses the whole batch, naming its index), so nothing accepted fails later for its inputs. The
batch and each request's result live in the runtime's state database (tables ai_batches and
ai_batch_items): a batch queued or half run when the runtime stops runs on when it starts again
(a request cut off mid-run runs again from its start), and results outlive restarts until they
expire. A batch belongs to the account that queued it: another account's poll gets the same
refusal as an unknown id. The batch is low priority: one background task runs its requests a
few at a time through AIService, oldest batch first.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from edge_sim.topology import PoP
from runtime.control.rate_limit import AccountLimited
from workers import AIError

if TYPE_CHECKING:
    from runtime.ai.service import AIService
    from runtime.control.state import State

log = logging.getLogger("edge.batch")

MAX_REQUESTS = 100  # per batch (Workers AI's batch limit for its batched models)
MAX_PAYLOAD_BYTES = 10 * 1024 * 1024  # the requests' JSON (Cloudflare: "under 10 MB")
MAX_QUEUED_PER_ACCOUNT = 10  # batches not yet done, per account
MAX_REFERENCE_CHARS = 256  # an external_reference
RESULT_TTL_S = 24 * 3600  # a done batch's results are kept this long after it finished
CONCURRENCY = 2  # requests of batches run at once (the rest wait: batches are low priority)
TRANSIENT = {3040, 3007}  # out of capacity, timeout: tried again, up to ATTEMPTS times
ATTEMPTS, RETRY_S = 3, 2.0
IDLE_POLL_S = 5.0  # the runner looks for work this often when nothing woke it

TABLES = (
    """CREATE TABLE IF NOT EXISTS ai_batches (
        id TEXT PRIMARY KEY, account_id TEXT NOT NULL, model TEXT NOT NULL, created REAL NOT NULL,
        ingress TEXT NOT NULL, client_rtt_ms REAL NOT NULL, finished REAL)""",
    """CREATE TABLE IF NOT EXISTS ai_batch_items (
        batch_id TEXT NOT NULL REFERENCES ai_batches(id), idx INTEGER NOT NULL, inputs TEXT NOT NULL,
        external_reference TEXT, result TEXT, success INTEGER, PRIMARY KEY (batch_id, idx))""",
)


class BatchNotFound(AIError):
    """No batch of this account has this id (or it expired): the same for another account's."""

    def __init__(self, request_id: str):
        super().__init__(
            5004,
            f"no batch request {request_id!r} for this account (results expire after "
            f"{RESULT_TTL_S // 3600} hours)",
        )


def _unlimited(service: AIService) -> AIService:
    """The service without rate limits, to validate a batch's requests at submit: they count
    against the account when they run, not twice."""
    view = copy.copy(service)
    view.rate_limits = None
    return view


class BatchQueue:
    """The batches in the state database and the task that runs them. `locate(code)`: the PoP
    a batch entered at, by its code (its requests run from there, as a direct call would)."""

    def __init__(self, state: State, service: AIService, locate: Callable[[str], PoP]):
        self.state, self.service, self.locate = state, service, locate
        for sql in TABLES:
            state.query(sql)
        self._wake = asyncio.Event()
        self._running: set[tuple[str, int]] = set()

    # --- submit and poll -----------------------------------------------------------------------

    def submit(
        self, model: str, inputs: Any, account: str, ingress: PoP, client_rtt_ms: float
    ) -> dict[str, Any]:
        """Queue `inputs["requests"]`, each validated now; AIError (5004 naming the index) if any
        is refused, 3036 when the account has too many batches not yet done."""
        requests = inputs.get("requests") if isinstance(inputs, dict) else None
        if not isinstance(requests, list) or set(inputs) != {"requests"}:
            raise AIError(5004, "a queued batch is {'requests': [inputs, ...]} and nothing else")
        if not 1 <= len(requests) <= MAX_REQUESTS:
            raise AIError(5004, f"requests: give 1 to {MAX_REQUESTS} requests, got {len(requests)}")
        encoded = [msgspec.json.encode(item) for item in requests]
        if sum(map(len, encoded)) > MAX_PAYLOAD_BYTES:
            raise AIError(3006, f"requests: the batch must be under {MAX_PAYLOAD_BYTES // 2**20} MB of JSON")
        references = [self._validate(model, item, i, account) for i, item in enumerate(requests)]
        self._purge()
        waiting = self.state.query(
            "SELECT COUNT(*) FROM ai_batches WHERE account_id = ? AND finished IS NULL", (account,)
        )[0][0]
        if waiting >= MAX_QUEUED_PER_ACCOUNT:
            raise AIError(
                3036,
                f"this account has {waiting} batches not yet done; at most "
                f"{MAX_QUEUED_PER_ACCOUNT} may wait: poll them until they are, then queue more",
            )
        ident = str(uuid.uuid4())
        self.state.query(
            "INSERT INTO ai_batches (id, account_id, model, created, ingress, client_rtt_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (ident, account, model, time.time(), ingress.code, client_rtt_ms),
        )
        for i, (item, reference) in enumerate(zip(encoded, references, strict=True)):
            self.state.query(
                "INSERT INTO ai_batch_items (batch_id, idx, inputs, external_reference) VALUES (?, ?, ?, ?)",
                (ident, i, item.decode(), reference),
            )
        self._wake.set()
        return {"status": "queued", "request_id": ident, "model": model}

    def _validate(self, model: str, item: Any, i: int, account: str) -> str | None:
        """The request's external_reference, once its inputs pass prepare (the first counts the
        batch's submission against the account's requests per minute, the rest do not)."""
        where = f"requests.{i}"
        if not isinstance(item, dict):
            raise AIError(5004, f"{where}: must be an inputs object, got {type(item).__name__}")
        item = dict(item)
        reference = item.pop("external_reference", None)
        if reference is not None and (not isinstance(reference, str) or len(reference) > MAX_REFERENCE_CHARS):
            raise AIError(
                5004,
                f"{where}.external_reference: must be a string of at most {MAX_REFERENCE_CHARS} characters",
            )
        if item.get("stream") is True:
            raise AIError(
                5004, f"{where}.stream: a queued request's result is kept, not streamed; leave it out"
            )
        service = self.service if i == 0 else _unlimited(self.service)
        try:
            service.prepare(model, item, account)  # a Responses-shaped one checked as the Responses API
        except AccountLimited:
            raise
        except AIError as exc:
            raise AIError(exc.code, f"{where}: {exc.detail}") from None
        return reference

    def poll(self, model: str, inputs: dict[str, Any], account: str) -> dict[str, Any]:
        """The batch's status, or (once every request has run) its responses; BatchNotFound."""
        ident = inputs.get("request_id")
        if set(inputs) != {"request_id"} or not isinstance(ident, str):
            raise AIError(5004, "a poll is {'request_id': ID} and nothing else")
        self._purge()
        rows = self.state.query(
            "SELECT model, finished FROM ai_batches WHERE id = ? AND account_id = ?", (ident, account)
        )
        if not rows:
            raise BatchNotFound(ident)
        batch_model, finished = rows[0]
        items = self.state.query(
            "SELECT idx, external_reference, result, success FROM ai_batch_items "
            "WHERE batch_id = ? ORDER BY idx",
            (ident,),
        )
        if finished is None:
            started = any(r[2] is not None for r in items) or any(key[0] == ident for key in self._running)
            return {"status": "running" if started else "queued", "request_id": ident, "model": batch_model}
        responses, usage = [], {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for idx, reference, result, success in items:
            body = msgspec.json.decode(result)
            entry = {"id": idx, "success": bool(success), "external_reference": reference}
            if success:
                entry["result"] = body
                _add_usage(usage, body.get("usage") or {})
            else:
                entry["result"], entry["error"] = None, body
            responses.append(entry)
        return {"responses": responses, "usage": usage}

    def _purge(self) -> None:
        """Forget batches whose results expired."""
        old = [
            r[0]
            for r in self.state.query(
                "SELECT id FROM ai_batches WHERE finished IS NOT NULL AND finished < ?",
                (time.time() - RESULT_TTL_S,),
            )
        ]
        for ident in old:
            self.state.query("DELETE FROM ai_batch_items WHERE batch_id = ?", (ident,))
            self.state.query("DELETE FROM ai_batches WHERE id = ?", (ident,))

    # --- the runner ------------------------------------------------------------------------------

    def _next(self, limit: int) -> list[tuple[str, int, str, str, str, float, str]]:
        """Requests not yet run and not running, oldest batch first."""
        rows = self.state.query(
            "SELECT b.id, i.idx, b.account_id, b.model, b.ingress, b.client_rtt_ms, i.inputs "
            "FROM ai_batch_items i JOIN ai_batches b ON b.id = i.batch_id "
            "WHERE i.result IS NULL ORDER BY b.created, i.idx LIMIT ?",
            (limit + len(self._running),),
        )
        return [r for r in rows if (r[0], r[1]) not in self._running][:limit]

    async def run_forever(self) -> None:
        """Run queued requests, CONCURRENCY at a time, until cancelled (a restart runs the rest)."""
        tasks: set[asyncio.Task] = set()
        try:
            while True:
                for row in self._next(CONCURRENCY - len(tasks)):
                    self._running.add((row[0], row[1]))
                    task = asyncio.create_task(self._run_one(*row))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    task.add_done_callback(lambda _t, key=(row[0], row[1]): self._done(key))
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), IDLE_POLL_S)
                except TimeoutError:
                    pass
        finally:
            for task in tasks:
                task.cancel()

    def _done(self, key: tuple[str, int]) -> None:
        self._running.discard(key)
        self._wake.set()

    async def _run_one(
        self, batch: str, idx: int, account: str, model: str, ingress: str, rtt: float, inputs: str
    ) -> None:
        item = msgspec.json.decode(inputs)
        item.pop("external_reference", None)
        where = self.locate(ingress)
        attempt = 0
        while True:
            try:
                result = await self._generate(model, item, account, where, rtt)
            except AccountLimited as exc:  # the account's limit: wait, as any caller would
                await asyncio.sleep(exc.retry_after)
                continue
            except AIError as exc:
                attempt += 1
                if exc.code in TRANSIENT and attempt < ATTEMPTS:
                    await asyncio.sleep(RETRY_S)
                    continue
                self._store(batch, idx, {"code": exc.code, "message": exc.detail}, success=False)
                return
            except Exception as exc:  # an engine bug fails this request alone
                log.exception("batch %s request %d failed", batch, idx)
                self._store(
                    batch, idx, {"code": 3007, "message": f"internal error: {type(exc).__name__}"}, False
                )
                return
            self._store(batch, idx, result, success=True)
            return

    async def _generate(
        self, model: str, item: dict, account: str, ingress: PoP, rtt: float
    ) -> dict[str, Any]:
        shaped, _ = await self.service.run(model, item, ingress=ingress, client_rtt_ms=rtt, account=account)
        return shaped

    def _store(self, batch: str, idx: int, body: dict[str, Any], success: bool) -> None:
        self.state.query(
            "UPDATE ai_batch_items SET result = ?, success = ? WHERE batch_id = ? AND idx = ?",
            (msgspec.json.encode(body).decode(), int(success), batch, idx),
        )
        left = self.state.query(
            "SELECT COUNT(*) FROM ai_batch_items WHERE batch_id = ? AND result IS NULL", (batch,)
        )[0][0]
        if not left:
            self.state.query("UPDATE ai_batches SET finished = ? WHERE id = ?", (time.time(), batch))


def _add_usage(total: dict[str, int], usage: dict[str, Any]) -> None:
    """Add a result's usage to the batch's: Workers AI's names, or the Responses API's."""
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
    total["prompt_tokens"] += prompt
    total["completion_tokens"] += completion
    total["total_tokens"] += prompt + completion
