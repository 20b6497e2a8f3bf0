"""Errors the edge reports for a request; the runtime maps each kind to its API's error code."""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal["model_not_found", "invalid_input", "too_large", "no_capacity", "timeout"]


class EdgeError(Exception):
    def __init__(self, kind: ErrorKind, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message
