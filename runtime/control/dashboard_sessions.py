"""The dashboard's login sessions: the admin token is POSTed once to the login form and traded for a
random session id, sent back as an HttpOnly, SameSite=Strict cookie (so the token never sits in a
URL, a page's script or the browser's history). Sessions live in memory only (a restart logs every
browser out), at most MAX_SESSIONS of them (the oldest goes), each for SESSION_SECONDS."""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

COOKIE = "edge_dashboard"
MAX_SESSIONS = 64
SESSION_SECONDS = 12 * 3600


class DashboardSessions:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._expiry: OrderedDict[str, float] = OrderedDict()

    def open(self) -> str:
        sid = secrets.token_urlsafe(32)
        self._expiry[sid] = self.clock() + SESSION_SECONDS
        while len(self._expiry) > MAX_SESSIONS:
            self._expiry.popitem(last=False)
        return sid

    def valid(self, sid: str | None) -> bool:
        if not sid or len(sid) > 128:
            return False
        now = self.clock()
        for known, expires in list(self._expiry.items()):
            if expires <= now:
                del self._expiry[known]
        # compare against every live id in constant time each, so timing does not reveal a prefix
        return any(hmac.compare_digest(sid.encode(), known.encode()) for known in self._expiry)

    def close(self, sid: str | None) -> None:
        if sid:
            self._expiry.pop(sid, None)
