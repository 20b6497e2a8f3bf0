"""What the KV, D1, R2 and queue bindings share: the transport that carries a call to the
runtime, the errors a failed call raises, result objects readable by attribute or by key (as a
JsProxy reads), and Cloudflare's options-dict-or-keywords arguments."""

from __future__ import annotations

import difflib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

Transport = Callable[[str, list, dict], Awaitable[Any]]

STREAM_CHUNK = 64 * 1024


class BindingError(Exception):
    """A KV, D1 or R2 call the runtime refused or that failed; `type` is e.g. "D1_ERROR"."""

    def __init__(self, type: str, message: str):  # noqa: A002 - the name Cloudflare's errors carry
        super().__init__(message)
        self.type = type


def binding_error(error_type: str, message: str) -> Exception:
    """The exception a failed call raises in the worker (TypeError / ValueError for bad arguments)."""
    if error_type == "TypeError":
        return TypeError(message)
    if error_type == "RangeError":
        return ValueError(message)
    return BindingError(error_type, message)


def close_name(name: str, names: Iterable[str]) -> str | None:
    """The one of `names` that `name` most likely misspells, or None: the same name in another case
    (`ai` for `AI`), the same letters in another order (`ia` for `ai`: difflib's ratio for two
    swapped letters of a short name is too low to find it), else difflib's closest."""
    by_lower = {n.lower(): n for n in names}
    lower = name.lower()
    if lower in by_lower:
        return by_lower[lower]
    swapped = [n for low, n in by_lower.items() if sorted(low) == sorted(lower)]
    if swapped:
        return swapped[0]
    found = difflib.get_close_matches(lower, list(by_lower), n=1)
    return by_lower[found[0]] if found else None


def no_such_binding(name: str, bindings: Mapping[str, str], declare_in: str = "the worker's config") -> str:
    """What `env.NAME` (in the isolate) and `worker.binding(NAME)` (the pytest plugin) say when the
    worker has no such binding: the bindings it has, each with its kind, and the closest name, so a
    misspelling is seen where it is made rather than guessed at from a bare AttributeError."""
    listed = ", ".join(f"{n} ({kind})" for n, kind in sorted(bindings.items())) or "none"
    message = f"the worker has no binding named {name!r} (its bindings: {listed})"
    close = close_name(name, bindings)
    return message + (f"; did you mean {close!r}?" if close else "") + f"; declare it in {declare_in}"


class JsObject(dict):
    """A result object: a dict whose keys are also attributes, as a JsProxy reads."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_py(self) -> dict:
        return to_py_value(self)


def to_py_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: to_py_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_py_value(v) for v in value]
    if callable(getattr(value, "to_py", None)):  # an R2Object
        return value.to_py()
    return value


def wrap_result(value: Any) -> Any:
    if isinstance(value, dict):
        return JsObject({k: wrap_result(v) for k, v in value.items()})
    if isinstance(value, list):
        return [wrap_result(v) for v in value]
    return value


def merge_options(options: Any, kwargs: dict[str, Any], what: str) -> dict[str, Any]:
    """Cloudflare's options dict merged with keyword arguments (keywords win)."""
    if options is None:
        merged = {}
    elif isinstance(options, dict):
        merged = dict(options)
    else:
        raise TypeError(f"{what}: options must be a dict, got {type(options).__name__}")
    merged.update({k: v for k, v in kwargs.items() if v is not None})
    return merged


async def as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if hasattr(value, "__aiter__"):  # a stream (e.g. request.body): read whole, it crosses in one frame
        return b"".join([c.encode() if isinstance(c, str) else bytes(c) async for c in value])
    raise TypeError(f"{what}: the value must be str, bytes or a stream of bytes, got {type(value).__name__}")


async def byte_stream(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), STREAM_CHUNK):
        yield data[start : start + STREAM_CHUNK]
