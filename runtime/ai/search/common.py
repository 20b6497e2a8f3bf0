"""What the parts of AI Search share: the default namespace, paging and time shapes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

from runtime.ai.search.errors import INVALID, AISearchError

DEFAULT_NAMESPACE = "default"
PER_PAGE = 50  # items, instances or jobs in one page
# (model, Workers AI text-generation inputs) -> the answer {response | choices, usage}, or (inputs'
# `stream`) its event stream: made by the caller (worker host, REST door, plugin) so that a
# generation is routed, recorded and rate limited as that caller's other AI calls are
Generate = Callable[[str, dict], Awaitable[Any]]


def iso(ts: float | None) -> str | None:
    return None if ts is None else dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def page_of(rows: list, page: Any, per_page: Any) -> tuple[list, int]:
    page = int_arg(page, "page", 1, 1_000_000)
    per_page = int_arg(per_page, "per_page", 1, PER_PAGE)
    return rows[(page - 1) * per_page : page * per_page], len(rows)


def int_arg(value: Any, what: str, lo: int, hi: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise AISearchError(INVALID, f"{what}: an integer from {lo} to {hi}") from None
    if isinstance(value, bool) or not lo <= number <= hi or (isinstance(value, float) and value != number):
        raise AISearchError(INVALID, f"{what}: an integer from {lo} to {hi}")
    return number
