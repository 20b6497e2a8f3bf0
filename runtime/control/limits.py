"""A worker's limits: the one place that knows each limit's range and default.

Both ways a limit arrives, `[limits]` in wrangler-like.toml and the deploy API's `config`, go
through `validate`, so both accept and refuse the same values; the isolate is only ever built
from its result. The ranges are Workers' own (CPU time up to 5 minutes per request, 128 MB of
memory by default), and nothing means "unlimited".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import msgspec


class IsolateLimits(msgspec.Struct):
    """Per isolate, enforced by the OS and the runtime's watchdog over the whole process tree."""

    cpu_ms: int = 30_000  # CPU time per request, its streamed body and waitUntil work included
    memory_mb: int = 128  # memory of the whole tree on top of the loaded worker
    sandbox: bool = True  # jail (or, insecure, Landlock only); False only in the runtime's own tests
    processes: int = 16  # tasks (processes and threads) in the isolate's namespace
    file_bytes: int = 16 * 1024 * 1024  # largest file it may write, and the size of its /tmp


class Bound(NamedTuple):
    low: int
    high: int
    default: int


BOUNDS: dict[str, Bound] = {
    "cpu_ms": Bound(1, 300_000, 30_000),  # CPU time per request; 300000 is Workers' maximum
    "memory_mb": Bound(16, 1024, 128),  # per isolate; 128 as on Workers, 0 is not "unlimited"
    "subrequests": Bound(1, 1000, 50),  # fetch() calls per request
}
DEFAULTS: dict[str, int] = {key: b.default for key, b in BOUNDS.items()}


class LimitError(ValueError):
    """A limit is out of range or not an integer; the message names the key path and the range."""


class Limits(msgspec.Struct, frozen=True):
    cpu_ms: int = DEFAULTS["cpu_ms"]
    memory_mb: int = DEFAULTS["memory_mb"]
    subrequests: int = DEFAULTS["subrequests"]

    def isolate(self, sandbox: bool = True) -> IsolateLimits:
        """What the isolate enforces itself (subrequests are counted by the worker host)."""
        return IsolateLimits(cpu_ms=self.cpu_ms, memory_mb=self.memory_mb, sandbox=sandbox)


def check(key: str, value: Any, where: str = "limits") -> int:
    """`value` as the limit `key`, or LimitError naming `where.key` and the allowed range."""
    bound = BOUNDS[key]
    # bool is an int subclass in Python, but `cpu_ms = true` is a mistake, not 1 ms.
    if type(value) is not int or not bound.low <= value <= bound.high:
        raise LimitError(
            f"{where}.{key}: must be an integer between {bound.low} and {bound.high}, got {value!r}"
        )
    return value


def validate(values: Mapping[str, Any], where: str = "limits") -> Limits:
    """The limits in `values` (other keys are the caller's business), each checked; a key that is
    absent gets its default. `where` is the key path to name in errors ("limits", "config")."""
    return Limits(**{key: check(key, values[key], where) for key in BOUNDS if key in values})
