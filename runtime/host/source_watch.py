"""`edge dev --reload`: notice when the dev worker's Python sources change."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path


def source_stamp(root: Path) -> tuple:
    """Every .py under `root` (not .edge/ nor __pycache__) with its modification time."""
    return tuple(
        sorted(
            (str(p), p.stat().st_mtime_ns)
            for p in root.rglob("*.py")
            if ".edge" not in p.parts and "__pycache__" not in p.parts
        )
    )


async def watch_source(root: Path, on_change: Callable[[], Awaitable[None]], interval: float = 0.5) -> None:
    """Poll `root` every `interval` seconds; await `on_change()` after each change (runs until cancelled)."""
    stamp = source_stamp(root)
    while True:
        await asyncio.sleep(interval)
        now = source_stamp(root)
        if now != stamp:
            stamp = now
            await on_change()
