"""A write to one of the runtime's SQLite files (the state database, the local KV/R2/queue stores)
that failed for a reason outside the request: the file is locked by another process past the busy
timeout, or the disk under it is full. The caller gets a 503 that says which and what to do; the
database is left as it was (SQLite rolls the statement back)."""

from __future__ import annotations

import errno
import sqlite3

BUSY_TIMEOUT_S = 5.0  # how long a write waits for another process's lock before it gives up
_DISK_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


class StorageUnavailable(Exception):
    """The write did not happen; the message names the file's trouble and what to do."""


def storage_failure(exc: BaseException, what: str) -> StorageUnavailable | None:
    """`exc` as a StorageUnavailable about `what` ("the state database"), or None when it is
    something else (a bug, bad SQL) that must surface as it is."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            return StorageUnavailable(
                f"{what} is locked by another process (waited {BUSY_TIMEOUT_S:g} s); nothing was "
                "written: retry once that process has let go of it"
            )
        if "full" in text or "disk i/o" in text:
            return StorageUnavailable(
                f"{what} could not be written ({exc}): its disk is full or failing; nothing was "
                "written: free space there and retry"
            )
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
        return StorageUnavailable(
            f"{what} could not be written ({exc.strerror}): its disk is full; free space there and retry"
        )
    return None
