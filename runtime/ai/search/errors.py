"""AI Search's errors, one class with a stable code, the HTTP status the REST door answers and a
message that says what to change. The worker binding raises them as Cloudflare's binding does
(an Error whose message names the code)."""

from __future__ import annotations

INVALID = 7001  # the input is wrong: a field, an option, a name
NOT_FOUND = 7002  # no such namespace, instance, item or job in this account
EXISTS = 7003  # a name taken, or a namespace that still holds instances
LIMIT = 7004  # a stated cap reached (instances, items, bytes, chunks)
GENERATION = 7005  # the answer's model failed (chatCompletions, query rewrite)
SOURCE = 7006  # a data source this edge cannot read (a web crawler: no network here)

STATUS = {INVALID: 400, NOT_FOUND: 404, EXISTS: 409, LIMIT: 413, GENERATION: 502, SOURCE: 400}


class AISearchError(Exception):
    def __init__(self, code: int, message: str, status: int | None = None):
        super().__init__(message)
        self.code, self.message = code, message
        self.status = status if status is not None else STATUS.get(code, 400)

    def __str__(self) -> str:
        return f"AI Search error {self.code}: {self.message}"
