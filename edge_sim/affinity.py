"""Session affinity: a conversation's calls go back to the PoP that holds its prefix cache.

A client names a session (`x-session-affinity: KEY`, Cloudflare's prompt-caching header, or the
binding's option); the edge remembers which PoP served that session's last call and puts that PoP
first next time, if it is up and has room, else routes as usual. Keys are per account and model,
so one account can neither steer nor probe another's sessions; the table is bounded (least
recently used sessions are forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict

MAX_KEY_CHARS = 256
MAX_SESSIONS = 100_000


class SessionAffinity:
    def __init__(self, capacity: int = MAX_SESSIONS):
        self.capacity = capacity
        self._pop_of: OrderedDict[tuple[str, str, str], str] = OrderedDict()

    def preferred(self, tenant: str, model: str, key: str | None) -> str | None:
        """The PoP that served this session last, if it is remembered."""
        if not key:
            return None
        return self._pop_of.get((tenant, model, key))

    def served(self, tenant: str, model: str, key: str | None, pop: str) -> None:
        if not key:
            return
        entry = (tenant, model, key)
        self._pop_of[entry] = pop
        self._pop_of.move_to_end(entry)
        while len(self._pop_of) > self.capacity:
            self._pop_of.popitem(last=False)

    def __len__(self) -> int:
        return len(self._pop_of)


def check_key(key: str | None) -> str | None:
    """A session key as a client sent it: None when absent; ValueError saying what to change."""
    if key is None or key == "":
        return None
    if len(key) > MAX_KEY_CHARS or not key.isprintable():
        raise ValueError(f"x-session-affinity: give at most {MAX_KEY_CHARS} printable characters")
    return key
