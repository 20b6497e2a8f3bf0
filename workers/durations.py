"""Cloudflare Workflows' durations: a number of milliseconds, or a string such as "10 seconds",
"1 minute" or "2.5 hours" (a number, a space, a unit, singular or plural)."""

from __future__ import annotations

import math
import re

UNIT_MS = {
    "millisecond": 1,
    "second": 1_000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 7 * 86_400_000,
    "month": 30 * 86_400_000,
    "year": 365 * 86_400_000,
}
MAX_MS = 365 * 86_400_000  # Cloudflare's longest sleep, wait or timeout: a year
_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+?)s?\s*$")


def duration_ms(value: object, what: str = "duration") -> int:
    """`value` (ms, or "<number> <unit>") as whole milliseconds, 0 to MAX_MS; ValueError or
    TypeError saying what to write otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(
            f'{what}: give milliseconds or a string such as "10 seconds", got {type(value).__name__}'
        )
    if isinstance(value, str):
        found = _TEXT.match(value.lower())
        if found is None or found.group(2) not in UNIT_MS:
            units = ", ".join(UNIT_MS)
            raise ValueError(
                f'{what}: {value!r} is not a duration; write "<number> <unit>" with a unit of {units}'
            )
        ms = float(found.group(1)) * UNIT_MS[found.group(2)]
    else:
        ms = float(value)
    if not math.isfinite(ms) or not 0 <= ms <= MAX_MS:
        raise ValueError(f"{what}: {value!r} is out of range; at most 365 days, never negative")
    return round(ms)
