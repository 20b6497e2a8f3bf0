"""The scheduling policy's waiting queue: fair shares between tenants by virtual token counters.

The Virtual Token Counter of Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024):
each tenant's counter is the service it has had, counted as prompt tokens run plus OUTPUT_COST per
generated token, divided by its weight. The next sequence admitted is the oldest waiting one of
the tenant with the smallest counter, so a tenant that sends ten times as much does not delay a
light one ten times as long. A tenant whose queue was empty is lifted to the smallest counter of
the tenants still busy when it comes back, so idleness banks no credit; the queue is
work-conserving (whoever waits is admitted when there is room).

Within a tenant, waiting sequences are ordered by their `priority` (vLLM's convention: lower is
served first, default 0), then by arrival; a priority orders a tenant's own requests and never lifts
the tenant above its share. With one tenant and one priority this is the arrival-order queue it
replaces (preempted sequences go back to the front of their tenant's queue: they are older than
anything of theirs still waiting), and nothing is counted until a second tenant appears; the
capacity simulator, which drives the same policy, pays nothing for fairness it does not use.

Shares (what the policy caps and preempts by): a tenant's share of a resource (decode seats, KV
blocks) is the resource times its weight over the weights of the tenants with work (waiting or
running), `share()`.

Decoders are charged on the policy's group clock: a tenant with d decoders gains
d x OUTPUT_COST / weight per step, folded into its counter only when d changes or the counter is
read, so a step still costs nothing per decoder.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from engine.sched.policy_types import PRESENCE_STEPS

OUTPUT_COST = 2.0  # a generated token counts as two prompt tokens (the VTC paper's weights 1 and 2)


class TenantShare(NamedTuple):
    """What an account is owed at a PoP: its fair-share weight, and the share of the KV blocks it
    may hold before its sequences are the first preempted (the runtime sets both per account)."""

    weight: float = 1.0
    kv_share: float = 1.0


class _Tenant:
    __slots__ = ("name", "weight", "kv_share", "queue", "counter", "since", "decoders", "running", "seen")

    def __init__(self, name: str):
        self.name = name
        self.weight = 1.0
        self.kv_share = 1.0  # share of the blocks it may hold before it is the first preempted
        self.queue: deque[Any] = deque()
        self.counter = 0.0  # service at clock `since`, weighted
        self.since = 0
        self.decoders = 0
        self.running = 0
        self.seen = -1  # the policy step at which it last had work (-1: never); see `contended`


class FairQueue:
    """Waiting sequences by tenant (`seq.tenant`), with each tenant's virtual counter.

    Reads like the deque it replaces where the policy and its readers use one: len(), bool(),
    `in`, append (a new arrival), appendleft (a preempted one, back to the front of its tenant's
    queue, within its priority), remove, `head()` (the next to admit) and `pop(seq)`. A sequence's
    `priority` (an int, lower first) orders its tenant's queue."""

    def __init__(self, fair_share: bool = True, running: Callable[[], list[Any]] = list) -> None:
        """`fair_share=False`: one queue in arrival order whoever sends (the baseline fairness is
        measured against: bench/fairness.py). `running()`: the policy's running sequences, counted
        per tenant when a second tenant appears (until then nothing is counted at all)."""
        self._share = fair_share
        self._running = running
        self._tenants: dict[str, _Tenant] = {} if fair_share else _Everyone()
        self._only: _Tenant | None = None  # while there is one tenant: no counting, arrival order
        self._count = 0
        self.fair = False  # a second tenant has been seen: counters are kept from then on
        self.quotas = False  # some tenant has a KV share under 1 (read by the policy every step)

    # --- the deque the policy reads ---------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, seq: Any) -> bool:
        tenant = self._lookup(seq.tenant)
        return tenant is not None and seq in tenant.queue

    def __iter__(self) -> Iterator[Any]:
        """Every waiting sequence, in arrival order."""
        return iter(sorted((s for t in self._tenants.values() for s in t.queue), key=_order))

    def append(self, seq: Any, clock: int) -> None:
        tenant = self._tenant(seq.tenant, clock)
        if self.fair and not tenant.queue and not tenant.running:
            self._lift(tenant, clock)
        queue = tenant.queue
        if not queue or _rank(queue[-1]) <= _rank(seq):  # the common case: in order
            queue.append(seq)
        else:
            _insert(queue, seq)
        self._count += 1

    def appendleft(self, seq: Any) -> None:
        """A preempted sequence: first of its priority in its tenant's queue (older than the rest)."""
        queue = self._tenants[seq.tenant].queue
        if not queue or _rank(seq) <= _rank(queue[0]):
            queue.appendleft(seq)
        else:
            _insert(queue, seq)
        self._count += 1

    def remove(self, seq: Any) -> None:
        self._tenants[seq.tenant].queue.remove(seq)
        self._count -= 1

    def head(self, clock: int, skip: frozenset[str] = frozenset()) -> Any | None:
        """The sequence to admit next: the oldest of the tenant with the least service (ties: the
        older head), among tenants not in `skip`; None when none waits."""
        only = self._only
        if only is not None:
            return only.queue[0] if only.queue and only.name not in skip else None
        best, best_key = None, None
        for tenant in self._tenants.values():
            if tenant.queue and tenant.name not in skip:
                key = (self.counter(tenant, clock), tenant.queue[0].order)
                if best_key is None or key < best_key:
                    best, best_key = tenant.queue[0], key
        return best

    def heads(self) -> Iterator[Any]:
        """The oldest waiting sequence of each tenant (any may be next as the counters move)."""
        return (t.queue[0] for t in self._tenants.values() if t.queue)

    def pop(self, seq: Any) -> None:
        """Take the head `seq` (from head()) out of the queue: it is admitted."""
        self._tenants[seq.tenant].queue.popleft()
        self._count -= 1

    # --- service --------------------------------------------------------------------------------

    def configure(self, name: str, weight: float, kv_share: float, clock: int) -> None:
        tenant = self._tenant(name, clock)
        if self.fair and tenant.weight != weight:  # service so far at the old weight
            tenant.counter, tenant.since = self.counter(tenant, clock), clock
        tenant.weight, tenant.kv_share = weight, kv_share
        self.quotas = any(t.kv_share < 1.0 for t in self._tenants.values())

    def tenant(self, name: str) -> _Tenant | None:
        return self._lookup(name)

    def fair_with(self, name: str) -> bool:
        """Whether a request of tenant `name` is (or will make this queue) fair, not first come."""
        return self.fair or (bool(self._tenants) and self._lookup(name) is None)

    def counter(self, tenant: _Tenant, clock: int) -> float:
        if tenant.decoders:
            return tenant.counter + tenant.decoders * (clock - tenant.since) * OUTPUT_COST / tenant.weight
        return tenant.counter

    def charge_prefill(self, name: str, tokens: int) -> None:
        if self.fair:
            tenant = self._tenants[name]
            tenant.counter += tokens / tenant.weight

    def started(self, name: str) -> None:
        self._tenants[name].running += 1

    def stopped(self, name: str) -> None:
        self._tenants[name].running -= 1

    def decoding(self, name: str, clock: int, delta: int) -> None:
        """A decoder of tenant `name` joined (+1) or left (-1) the group at `clock`."""
        tenant = self._tenants[name]
        if self.fair:
            tenant.counter = self.counter(tenant, clock)
            tenant.since = clock
        tenant.decoders += delta

    def busy_weight(self) -> float:
        """The weights of the tenants with work (waiting or running) summed: shares divide by it."""
        total = 0.0
        for tenant in self._tenants.values():
            if tenant.queue or tenant.running:
                total += tenant.weight
        return total

    def share(self, name: str, amount: int, busy: float) -> float:
        """Tenant `name`'s weighted share of `amount` (seats, blocks), `busy` being busy_weight()."""
        tenant = self._lookup(name)
        if tenant is None or busy <= 0.0:
            return float(amount)
        return amount * tenant.weight / busy

    def over_seats(self, seats: int) -> frozenset[str]:
        """Tenants running more than their share of `seats` (only ever while another has work)."""
        busy = self.busy_weight()
        if busy <= 0.0:
            return frozenset()
        unit = seats / busy
        return frozenset(t.name for t in self._tenants.values() if t.running > unit * t.weight)

    def note(self, step: int) -> None:
        """The policy's step count now (at each schedule): the tenants with work are present."""
        for tenant in self._tenants.values():
            if tenant.queue or tenant.running:
                tenant.seen = step

    def contended(self, seats: int, step: int) -> frozenset[str]:
        """Tenants whose prompts run at most CONTENDED_PREFILL_TOKENS a step (engine.sched.policy), so the
        steps another tenant waits for stay short: while two or more are present (with work, or
        with work within the last PRESENCE_STEPS steps: a light tenant between two requests is
        about to send its next, and the step in flight when it does should be short too), those
        with work running more sequences (by weight) than the present one running fewest; and any
        over its share of `seats`. A tenant alone, or tenants running alike, are never held back."""
        least, present = -1.0, 0
        for tenant in self._tenants.values():
            if tenant.queue or tenant.running or (tenant.seen >= 0 and step - tenant.seen <= PRESENCE_STEPS):
                present += 1
                load = tenant.running / tenant.weight
                if least < 0.0 or load < least:
                    least = load
        if present < 2:
            return frozenset()
        ahead = frozenset(
            t.name for t in self._tenants.values() if (t.queue or t.running) and t.running / t.weight > least
        )
        return ahead | self.over_seats(seats)

    def presence_horizon(self, step: int) -> int:
        """Steps from `step` on over which no tenant without work stops being present (`contended`
        stays as it is while nothing is admitted or finishes); 1 << 30 when none is."""
        horizon = 1 << 30
        for tenant in self._tenants.values():
            if not (tenant.queue or tenant.running) and tenant.seen >= 0:
                left = tenant.seen + PRESENCE_STEPS - step + 1
                if 0 < left < horizon:
                    horizon = left
        return horizon

    def short_of_seats(self, seats: int) -> list[str]:
        """Waiting tenants a neighbour's batch keeps waiting: those that one more running sequence
        leaves within their share of `seats` while another tenant runs more than its own share, and
        those that would still run at most half as many sequences (by weight) as another tenant
        with work (a light tenant beside a heavier one that does not fill the seats)."""
        busy = self.busy_weight()
        if busy <= 0.0:
            return []
        unit = seats / busy
        tenants = [t for t in self._tenants.values() if t.queue or t.running]
        over = any(t.running > unit * t.weight for t in tenants)
        most = max(t.running / t.weight for t in tenants)
        return [
            t.name
            for t in tenants
            if t.queue
            and ((over and t.running + 1 <= unit * t.weight) or 2.0 * (t.running + 1) / t.weight <= most)
        ]

    def others_wait(self, name: str) -> bool:
        """Whether a tenant other than `name` has a sequence waiting."""
        for tenant in self._tenants.values():
            if tenant.queue and tenant.name != name:
                return True
        return False

    def waiting_counts(self) -> dict[str, int]:
        """Waiting sequences by tenant (with fair shares off, all under one name: "")."""
        return {t.name: len(t.queue) for t in list(self._tenants.values()) if t.queue}

    def waiting_tenants(self) -> list[str]:
        return [t.name for t in self._tenants.values() if t.queue]

    def running_of(self, name: str) -> int:
        """Running sequences of tenant `name` (counted once the queue is fair)."""
        tenant = self._lookup(name)
        return tenant.running if tenant is not None else 0

    def over_share(self, held: dict[str, int], num_blocks: int) -> list[str]:
        """Tenants holding more than their share of `num_blocks`, the furthest over first."""
        over = []
        for name, blocks in held.items():
            tenant = self._lookup(name)
            if tenant is not None and tenant.kv_share < 1.0 and blocks > tenant.kv_share * num_blocks:
                over.append((blocks / (tenant.kv_share * num_blocks), name))
        return [name for _, name in sorted(over, reverse=True)]

    # --- internals ------------------------------------------------------------------------------

    def _lookup(self, name: str) -> _Tenant | None:
        try:
            return self._tenants[name]
        except KeyError:
            return None

    def _tenant(self, name: str, clock: int) -> _Tenant:
        if not self._share:
            name = ""
        tenant = self._tenants.get(name)
        if tenant is None:
            tenant = self._tenants[name] = _Tenant(name)
            if len(self._tenants) == 1:
                self._only = tenant
            else:
                self._only = None
                if not self.fair:  # counting starts now, everyone level
                    self.fair = True
                    for other in self._tenants.values():
                        other.counter, other.since = 0.0, clock
                    for seq in self._running():
                        other = self._tenants[seq.tenant]
                        other.running += 1
                        other.decoders += seq.decode_base is not None
        return tenant

    def _lift(self, tenant: _Tenant, clock: int) -> None:
        """A tenant back from idle starts at the least service of those still busy: no banked credit."""
        others = self._tenants.values()
        busy = [self.counter(t, clock) for t in others if t is not tenant and (t.queue or t.running)]
        if busy:
            floor = min(busy)
            if tenant.counter < floor:
                tenant.counter, tenant.since = floor, clock


class _Everyone(dict):
    """The tenants of a queue without fair shares: every name is the one tenant ""."""

    def __missing__(self, key: str) -> _Tenant:
        if key != "" and "" in self:
            return self[""]
        raise KeyError(key)


def _order(seq: Any) -> int:
    return seq.order


def _rank(seq: Any) -> tuple[int, int]:
    """Where a sequence stands in its tenant's queue: priority (lower first), then arrival."""
    return (seq.priority, seq.order)


def _insert(queue: deque[Any], seq: Any) -> None:
    """Put `seq` in `queue` (sorted by _rank) at its place: after every sequence that ranks before it."""
    rank = _rank(seq)
    i = 0
    for other in queue:
        if rank < _rank(other):
            break
        i += 1
    queue.insert(i, seq)
