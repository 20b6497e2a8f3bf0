"""Errors the edge reports for a request; the runtime maps each kind to its API's error code."""

from __future__ import annotations

from typing import Literal

from engine import InvalidRequestError, RequestTooLargeError

# busy: a call that asked not to wait (rejectIfBusy) found every PoP serving its model full
ErrorKind = Literal["model_not_found", "invalid_input", "too_large", "no_capacity", "timeout", "busy"]


class EdgeError(Exception):
    def __init__(self, kind: ErrorKind, message: str, param: str | None = None):
        """`param`: the request parameter at fault, when the engine named one."""
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param


def from_engine(exc: InvalidRequestError) -> EdgeError:
    """The edge's error for a request the engine rejected, chosen by the exception's type (never
    by its message): one that does not fit is too_large, any other is invalid_input."""
    kind: ErrorKind = "too_large" if isinstance(exc, RequestTooLargeError) else "invalid_input"
    return EdgeError(kind, str(exc), exc.param)


class PopDown(Exception):
    """The PoP went down before this request started; the caller re-routes it."""

    def __init__(self, code: str):
        super().__init__(f"PoP {code} is down")
        self.code = code
