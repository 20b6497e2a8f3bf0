"""What the scheduling policy (engine.sched.policy) works on: sequence states, its limits, and the block
accounting it asks (the engine's KV block pool and the simulator's BlockCounts both answer it)."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import msgspec

BLOCK_TOKENS = 16  # tokens per KV block (engine.kv.kv_cache.BLOCK_SIZE; checked by a test)
# a sequence preempted for another tenant's fair share is not preempted so again for this many
# steps (engine.sched.policy: the bound that keeps two tenants from trading the same seat back and forth)
PREEMPT_COOLDOWN_STEPS = 32
# while another tenant has work, a tenant running more sequences than it, or more than its share of
# the seats, prefills at most this many prompt tokens a step (engine.sched.policy): every step the others
# wait for stays short
CONTENDED_PREFILL_TOKENS = 128
# a tenant is present for that cap this many policy steps after it last had work (engine.sched.fair_queue)
PRESENCE_STEPS = 256
# how a sequence preempted for another tenant's seat gives it up (engine.sched.policy): "recompute" frees its
# blocks and runs its tokens again when it is readmitted (vLLM v1); "pause" keeps its blocks (and
# staging slot) while it waits and rejoins the decoders where it stopped
PREEMPTION_MODES = ("recompute", "pause")
PREEMPTION_ENV = "EDGE_PREEMPTION"
DEFAULT_PREEMPTION = "pause"


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


RUNNING = SeqStatus.RUNNING  # read in the hot loops


class SchedulerConfig(msgspec.Struct):
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    # tenants by virtual token counters; False: arrival order (engine.sched.fair_queue)
    fair_share: bool = True
    # with fair shares: a new prompt of a tenant under its seat share, while another tenant holds
    # more than its own, is prefilled in a step without the decoders (engine.sched.policy)
    prefill_alone: bool = True
    # a sequence preempted for a seat: "pause" (keep its KV blocks) or "recompute" (PREEMPTION_MODES)
    preemption: str = DEFAULT_PREEMPTION

    def __post_init__(self) -> None:
        if self.preemption not in PREEMPTION_MODES:
            modes = ", ".join(PREEMPTION_MODES)
            raise ValueError(f"preemption must be one of {modes}, got {self.preemption!r}")

    @property
    def seat_limit(self) -> int:
        """Running sequences at most: never more than can all decode in one step."""
        return min(self.max_num_seqs, self.max_num_batched_tokens)

    @property
    def kv_slots(self) -> int:
        """Sequences that may hold KV blocks (and a staging slot) at once: the seats, and as many
        paused beside them when preemption pauses."""
        return self.seat_limit * (2 if self.preemption == "pause" else 1)


def preemption_from_env() -> str:
    """$EDGE_PREEMPTION: "pause" or "recompute" (default DEFAULT_PREEMPTION); anything else is refused."""
    value = os.environ.get(PREEMPTION_ENV, DEFAULT_PREEMPTION).strip().lower()
    if value not in PREEMPTION_MODES:
        raise ValueError(f"${PREEMPTION_ENV} must be one of {', '.join(PREEMPTION_MODES)}, got {value!r}")
    return value


class SeqLike(Protocol):
    """What the policy reads and writes of a sequence."""

    status: SeqStatus
    num_computed: int  # tokens whose KV is in the cache (see SchedulingPolicy on decoders)
    preemptions: int  # times its KV was dropped to be recomputed (a pause keeps it: not counted)
    order: int  # arrival order at this policy (set by `add`)
    decode_base: int | None  # set by the policy while the sequence decodes
    tenant: str  # whose request: fair shares and KV shares are per tenant (engine.sched.fair_queue)
    priority: int  # within its tenant: lower is admitted first (vLLM's convention; default 0)
    kv: Any  # the block accounting's handle for this sequence

    @property
    def remaining(self) -> int:
        """Tokens to run through the model before the next one can be sampled."""
        ...


S = TypeVar("S", bound=SeqLike)  # the sequence type a policy holds (the engine's or the simulator's)


class BlockAccounting(Protocol):
    """Blocks as counts: the engine's KV block pool and `BlockCounts` both answer this."""

    num_blocks: int
    staging_blocks: int

    @property
    def free_blocks(self) -> int: ...

    def blocks_for(self, tokens: int) -> int: ...

    def can_grow(self, handle: Any, tokens: int) -> bool: ...

    def grow(self, handle: Any, tokens: int) -> bool:
        """Room for `tokens` tokens in total; False (and no change) when blocks run out."""
        ...

    def release(self, handle: Any) -> None: ...

    def held(self, handle: Any) -> int:
        """Blocks in the handle's block table."""
        ...

    def blocks_needed(self, handle: Any, tokens: int) -> int:
        """Free blocks `grow(handle, tokens)` would take (staging reservation included); more than
        there are when it cannot succeed at any number of free blocks (no staging slot left)."""
        ...

    def cached_prefix(self, handle: Any) -> int:
        """Tokens at the start of the handle's sequence whose KV blocks the accounting already holds
        (the prefix cache), leaving at least one token to run; `grow` to at least that many attaches
        those blocks instead of new ones. 0 without a prefix cache."""
        ...

    def grow_decoders(self, targets: Callable[[], Iterable[tuple[Any, int]]], blocks: int) -> None:
        """Grow decoding sequences that the policy knows fit, `targets()` giving (handle, tokens)
        each: `blocks` new blocks in all. An accounting may take the total without calling
        `targets` and leave the handles' counts lazy until `settle`."""
        ...

    def settle(self, handle: Any, tokens: int) -> None:
        """The handle of a decoding sequence that holds room for `tokens` tokens is about to be
        grown or released on its own: bring its count up to date after `grow_decoders`."""
        ...
