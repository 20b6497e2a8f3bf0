"""A PoP whose engine is an OpenAI-compatible server (vLLM, SGLang, llama-server, another edge dev),
behind the same interface as our own nodes (edge_sim.node.PopNodeLike).

What stays ours at the PoP: admission (max_in_flight, the router spills beyond it), per-tenant
fairness before forwarding (edge_sim.upstream_queue: the upstream sees one client, this PoP), the
tenant's prefix-cache isolation upstream (vLLM's `cache_salt`, from the tenant's server-side salt,
when the config says the upstream takes it), the latency account (queue at this PoP; time to the
first token and per output token measured on the stream), what the router ranks by, status,
health checks and failover. Generation goes over one long-lived httpx client with a bounded pool.

The upstream's stream is read back as SeqEvents, so the edge (Delta items, choices, tool calls,
logprobs) is unchanged; an event is one upstream chunk of a choice, not one token (token ids are
not known here: token_id is None), and each choice's last event carries the request's metrics
(token counts from the upstream's usage).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator

import httpx

from edge_sim.errors import EdgeError, PopDown
from edge_sim.load import FinishRate, PopLoad, pop_load
from edge_sim.node import NodeBase
from edge_sim.request import Formats, GenerateRequest
from edge_sim.status import ModelStatus, PopStatus
from edge_sim.topology import PoP
from edge_sim.upstream_queue import FairGate, Ticket
from edge_sim.upstream_wire import (
    CARRIER_FORMAT,
    MAX_ERROR_BYTES,
    MAX_LINE_BYTES,
    ChunkReader,
    Piece,
    parse_error,
    request_body,
    sse_data,
)
from engine import SeqEvent
from engine.kv.prefix_hash import new_salt_key, tenant_salt
from engine.load.verified_load import VerificationRecord
from engine.outputs import RequestMetrics

log = logging.getLogger("edge.upstream")

DEFAULT_PREFILL_MS_PER_TOKEN = 0.05  # until measured: what the router ranks a fresh upstream by
HEALTH_TIMEOUT_S = 5.0


def _now_ms() -> float:
    return time.perf_counter() * 1000.0


class UpstreamPopNode(NodeBase):
    """A GPU PoP forwarding to `pop.upstream`. `transport`: an httpx transport (tests)."""

    def __init__(self, pop: PoP, transport: httpx.AsyncBaseTransport | None = None):
        if pop.upstream is None:
            raise ValueError(f"PoP {pop.code} has no upstream")
        cfg = self.config = pop.upstream
        self.pop = pop
        self.url = cfg.base_url.rstrip("/")
        self.refused: dict[str, str] = {}
        self.max_in_flight = 256  # admission limit (queued here + forwarded); the router spills beyond
        self.reachable = False  # as of the last health check or request
        self.enabled = True  # taken down by the operator (take_down) or not
        key = cfg.api_key()
        self._client = httpx.AsyncClient(
            headers={"authorization": f"Bearer {key}"} if key else {},
            timeout=httpx.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s),
            limits=httpx.Limits(
                max_connections=cfg.max_concurrent + 4, max_keepalive_connections=cfg.max_concurrent
            ),
            transport=transport,
        )
        self._gate = FairGate(cfg.max_concurrent)
        self._salt_key = new_salt_key()  # this node's secret: tenants' salts cannot be guessed upstream
        self._ids = itertools.count()
        self._in_flight = 0
        self._finishes = FinishRate()
        self._prefill_ms_per_token = DEFAULT_PREFILL_MS_PER_TOKEN

    # --- what the router reads ---------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self.reachable and self.enabled

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def models(self) -> list[str]:
        return [m.name for m in self.config.models]

    def has_room(self) -> bool:
        return self.up and self._in_flight < self.max_in_flight

    def route_load(self, model: str) -> PopLoad:
        gate = self._gate
        return pop_load(
            step_ms=0.0, pending_tokens=gate.waiting_tokens(),
            prefill_ms_per_token=self._prefill_ms_per_token, waiting=gate.waiting,
            running=len(gate.active), seat_limit=gate.slots, kv_blocks_free=0, kv_blocks_used=0,
            finish_per_ms=self._finishes.rate,
        )  # fmt: skip

    def formats(self, model: str) -> Formats:
        m = self.config.model(model)
        return Formats(m.weights, m.kv_cache, {}, CARRIER_FORMAT, CARRIER_FORMAT) if m else Formats.unknown()

    def cache_salt(self, tenant: str) -> str | None:
        """What the upstream keys this tenant's prefix cache by (None: it takes no salt)."""
        return tenant_salt(self._salt_key, tenant).hex() if self.config.cache_salt else None

    # --- health and failover -----------------------------------------------------------------------

    async def refresh(self) -> bool:
        """GET the upstream's health path; an upstream that does not answer 200 counts as down."""
        try:
            r = await self._client.get(self.url + self.config.health_path, timeout=HEALTH_TIMEOUT_S)
            ok, why = r.status_code == 200, f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            ok, why = False, f"{type(exc).__name__}: {exc}"
        if ok and not self.reachable:
            log.info("upstream PoP %s at %s is reachable", self.code, self.url)
        if not ok:
            self._mark_down(why)
        self.reachable = ok
        return ok

    def _mark_down(self, why: str) -> None:
        if self.reachable:
            log.warning("upstream PoP %s at %s is down: %s", self.code, self.url, why)
        self.reachable = False
        handed = self._gate.hand_back(lambda: PopDown(self.code))
        if handed:
            log.warning("%s: handed %d queued requests back to be re-routed", self.code, handed)

    async def take_down(self) -> int:
        """Stop taking requests: queued ones are handed back to be re-routed, forwarded ones are
        cut at their next line from the upstream (as PopNode's are)."""
        self.enabled = False
        return self._gate.hand_back(lambda: PopDown(self.code))

    async def bring_up(self) -> None:
        self.enabled = True

    # --- generation --------------------------------------------------------------------------------

    async def stream(self, req: GenerateRequest) -> AsyncIterator[SeqEvent]:
        """The request's events, once this PoP's fair queue lets it go to the upstream."""
        model = self.config.model(req.model)
        if model is None:
            raise EdgeError("model_not_found", f"PoP {self.code} does not serve {req.model!r}")
        path, body = request_body(req, model, self.cache_salt(req.tenant))
        if not self.up:
            raise PopDown(self.code)
        arrival = _now_ms()
        self._in_flight += 1
        ticket = None
        try:
            ticket = await self._gate.enter(req.tenant, req.share, req.estimated_tokens())
            if not self.up:
                raise PopDown(self.code)
            async for event in self._forward(req, path, body, ticket, arrival):
                yield event
        finally:
            self._in_flight -= 1
            if ticket is not None:
                self._gate.leave(ticket)

    async def _forward(
        self, req: GenerateRequest, path: str, body: dict, ticket: Ticket, arrival: float
    ) -> AsyncIterator[SeqEvent]:
        request_id = f"{self.code}-{next(self._ids)}"
        n = req.params.n
        reader, finals, counts = ChunkReader(n), {}, [0] * n
        forwarded, first, started = _now_ms(), None, False
        try:
            async with self._client.stream("POST", self.url + path, json=body) as r:
                if r.status_code != 200:
                    raise await self._refusal(r)
                self.reachable = True
                async for line in _lines(r):
                    if not self.enabled:  # taken down: cut as a failing PoP would (closing the stream)
                        if not started:
                            raise PopDown(self.code)
                        raise EdgeError("no_capacity", f"PoP {self.code} went down mid-answer")
                    data = sse_data(line)
                    if data is None:
                        continue
                    if data == "[DONE]":
                        break
                    for piece in reader.read(data):
                        if first is None and (piece.text or piece.logprobs):
                            first = _now_ms()
                        tokens = len(piece.logprobs) or (1 if piece.text else 0)
                        counts[piece.index] += tokens
                        self._gate.served(ticket, tokens)
                        for event in _events(request_id, piece):
                            started = True
                            yield event
                        if piece.finish_reason is not None:
                            finals[piece.index] = piece.finish_reason
        except httpx.TimeoutException as exc:
            raise EdgeError("timeout", f"upstream PoP {self.code} did not answer in time ({exc})") from None
        except httpx.HTTPError as exc:
            if not started:  # nothing reached the client: the edge re-routes it
                self._mark_down(f"{type(exc).__name__}: {exc}")
                raise PopDown(self.code) from None
            self._mark_down(f"{type(exc).__name__}: {exc}")
            raise EdgeError("no_capacity", f"upstream PoP {self.code} failed mid-answer ({exc})") from None
        if len(finals) < n:
            raise EdgeError("no_capacity", f"upstream PoP {self.code} ended the answer before it finished")
        end = _now_ms()
        first = first if first is not None else end
        usage = reader.usage or {}
        prompt_tokens = _int(usage.get("prompt_tokens"), req.estimated_tokens())
        completion = _per_choice(counts, usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        cached = _int(details.get("cached_tokens"), 0)
        self._prefill_ms_per_token = max(1e-3, (first - forwarded) / max(1, prompt_tokens - cached))
        self._finishes.tick(end)
        for index in range(n):
            metrics = RequestMetrics(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion[index],
                queue_ms=forwarded - arrival,  # waiting in this PoP's fair queue
                prefill_ms=first - forwarded,  # the upstream's own queue, prefill and the network to it
                decode_ms=end - first,
                ttft_ms=first - arrival,
                tpot_ms=(end - first) / max(1, completion[index] - 1),
                finish_reason=finals[index],
                preemptions=0,
                cached_tokens=cached,
            )
            yield SeqEvent(request_id, None, "", finals[index], metrics=metrics, index=index)

    async def _refusal(self, r: httpx.Response) -> EdgeError:
        content = b""
        async for chunk in r.aiter_bytes():
            content += chunk
            if len(content) > MAX_ERROR_BYTES:
                break
        if r.status_code in (401, 403):
            log.warning("upstream PoP %s refused this PoP's API key (HTTP %s)", self.code, r.status_code)
            return EdgeError("no_capacity", f"upstream PoP {self.code} refused this PoP's API key")
        return parse_error(content, r.status_code)

    # --- status ------------------------------------------------------------------------------------

    def status(self) -> PopStatus:
        """What the PoP is doing; each model's formats are the operator's statement of the upstream's."""
        models = {
            m.name: ModelStatus(
                weights=m.weights,
                weights_by_part={},
                kv_cache_dtype=m.kv_cache,
                tool_format=CARRIER_FORMAT,
                reasoning_format=CARRIER_FORMAT,
                verification=VerificationRecord(signed=False, signed_by=None, seconds=0.0),
                kv_bytes_per_token=0.0,
                kv_blocks_total=0,
                kv_blocks_used=0,
                kv_blocks_free=0,
                running=len(self._gate.active),
                waiting=self._gate.waiting,
                preemptions=0,
                generated_tokens=0,
                prefill_ms_per_token=self._prefill_ms_per_token,
                pending_tokens=self._gate.waiting_tokens(),
                seat_limit=self._gate.slots,
                finish_per_s=self._finishes.rate * 1000.0,
                upstream_model=m.upstream_model,
            )
            for m in self.config.models
        }
        return PopStatus(
            code=self.code,
            city=self.pop.city,
            up=self.up,
            gpus=dict(self.pop.gpus),
            in_flight=self._in_flight,
            queue_depth=self._gate.waiting,
            max_in_flight=self.max_in_flight,
            models=models,
            refused=dict(self.refused),
            remote=self.url,
            reachable=self.reachable,
            backend=self.config.backend,
        )

    def close(self) -> None:
        try:
            asyncio.get_running_loop().create_task(self._client.aclose())
        except RuntimeError:
            pass  # no loop left: the process is ending


def _events(request_id: str, piece: Piece) -> list[SeqEvent]:
    """A chunk's text and logprobs as events (the text rides with its first token's logprobs)."""
    if not piece.logprobs:
        return [SeqEvent(request_id, None, piece.text, index=piece.index)] if piece.text else []
    return [
        SeqEvent(request_id, None, piece.text if i == 0 else "", index=piece.index, logprobs=lp)
        for i, lp in enumerate(piece.logprobs)
    ]


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _per_choice(counts: list[int], total: object) -> list[int]:
    """Each choice's completion tokens: the upstream's usage when it gives one (split by the chunks
    each choice streamed, the last taking the rest), else the chunks counted here."""
    if not isinstance(total, int) or total < 0:
        return counts
    if len(counts) == 1:
        return [total]
    head = counts[:-1]
    return [*head, max(counts[-1], total - sum(head))]


async def _lines(r: httpx.Response) -> AsyncIterator[str]:
    """The response's lines, none longer than MAX_LINE_BYTES (an upstream sending more is cut off)."""
    buffer = b""
    async for chunk in r.aiter_bytes():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode(errors="replace")
        if len(buffer) > MAX_LINE_BYTES:
            raise EdgeError("no_capacity", f"the upstream sent an event over {MAX_LINE_BYTES} bytes")
    if buffer:
        yield buffer.decode(errors="replace")
