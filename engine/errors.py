"""Errors the engine raises for input a user controls; each message says what to change."""


class EngineError(Exception):
    """Base class for engine errors a caller can act on."""


class ModelLoadError(EngineError):
    """A checkpoint or its config cannot be served as it is (names the file, tensor or field)."""


class InvalidRequestError(EngineError, ValueError):
    """A generation request is invalid (names the parameter and the accepted values)."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


class RequestTooLargeError(InvalidRequestError):
    """The request does not fit: its prompt (plus max_tokens) exceeds the context window or the KV
    cache. A distinct type so callers tell "too large" from "malformed" without reading the message."""


class GenerationError(EngineError):
    """A request's generation failed as a whole (every one of its choices ended in error, or the
    events do not belong to it); the message names the first failure."""
