"""Per-tenant fairness at a PoP whose engine is an upstream server: the upstream sees one client
(this PoP), so tenants are scheduled here, before forwarding. A request waits for one of the PoP's
forwarding slots; when one frees, the oldest request of the tenant with the least service goes,
by engine.sched.fair_queue's virtual token counters (prompt tokens when it is forwarded, OUTPUT_COST per
generated token as they stream back), so one tenant's burst cannot starve another."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from engine.sched.fair_queue import OUTPUT_COST, FairQueue, TenantShare

CLOCK = 0  # no decode clock here: service is charged as tokens are forwarded and streamed back


class Ticket:
    """One request's place: waiting in the queue, then holding a forwarding slot."""

    __slots__ = ("tenant", "order", "priority", "tokens", "decode_base", "admitted")

    def __init__(self, tenant: str, order: int, tokens: int):
        self.tenant = tenant
        self.order = order  # arrival order (fair_queue breaks ties by it)
        self.priority = 0  # fair_queue orders a tenant's queue by it, then by arrival
        self.tokens = tokens  # the prompt's estimated tokens, charged when it is forwarded
        self.decode_base = None  # fair_queue counts decoders by this; service here is charged directly
        self.admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class FairGate:
    """`slots` requests forwarded at once; the rest wait in fair order."""

    def __init__(self, slots: int):
        self.slots = slots
        self.active: list[Ticket] = []
        self._queue = FairQueue(True, lambda: self.active)
        self._orders = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def waiting_tokens(self) -> int:
        return sum(t.tokens for t in self._queue)

    async def enter(self, tenant: str, share: TenantShare, tokens: int) -> Ticket:
        """Wait for a slot; raises what hand_back set (the PoP went down) if it comes first."""
        ticket = Ticket(tenant, next(self._orders), tokens)
        self._queue.configure(tenant, share.weight, share.kv_share, CLOCK)
        self._queue.append(ticket, CLOCK)
        self._admit()
        try:
            await ticket.admitted
        except asyncio.CancelledError:  # the client left while it waited, or just as it was admitted
            if ticket in self._queue:
                self._queue.remove(ticket)
            elif ticket in self.active:
                self.leave(ticket)
            raise
        return ticket

    def served(self, ticket: Ticket, tokens: int) -> None:
        """Charge `tokens` generated for `ticket`'s tenant."""
        if self._queue.fair and tokens:
            # an int: the compiled fair queue (engine.native) holds its counters' inputs to their types
            self._queue.charge_prefill(ticket.tenant, round(OUTPUT_COST * tokens))

    def leave(self, ticket: Ticket) -> None:
        """The request is done with its slot: the next one goes."""
        if ticket in self.active:
            self.active.remove(ticket)
            if self._queue.fair:
                self._queue.stopped(ticket.tenant)
        self._admit()

    def hand_back(self, error: Callable[[], BaseException]) -> int:
        """Fail every waiting request with error() (the PoP went down: the edge re-routes them)."""
        handed = 0
        while (ticket := self._queue.head(CLOCK)) is not None:
            self._queue.pop(ticket)
            if not ticket.admitted.done():
                ticket.admitted.set_exception(error())
                handed += 1
        return handed

    def _admit(self) -> None:
        queue = self._queue
        while len(self.active) < self.slots and (ticket := queue.head(CLOCK)) is not None:
            queue.pop(ticket)
            if ticket.admitted.done():  # cancelled while queued
                continue
            self.active.append(ticket)
            if queue.fair:
                queue.started(ticket.tenant)
                queue.charge_prefill(ticket.tenant, ticket.tokens)
            ticket.admitted.set_result(None)
