"""`pyodide.ffi` for the edge runtime: the conversions Cloudflare's Python Workers use between Python
and JavaScript values, with Python objects standing in for the JavaScript ones.

    to_js(dict)  -> JsObject (a dict whose keys are also attributes: a JS object or Map)
    to_js(list)  -> JsArray (a list);  to_js(bytes) -> JsBuffer (bytes, with .buffer/.to_bytes())
    to_py(proxy) -> plain dicts, lists and bytes; any other value is returned as it is

So `Response.json(to_js(data))`, `Response(to_js(image).buffer)` and `env.AI.run(model, to_js(inputs))`
work as on Cloudflare. Proxies of Python callables (`create_proxy`) call straight through, and
`destroy()` only marks them destroyed: there is no JavaScript garbage collector to tell.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

IN_BROWSER = False


class ConversionError(Exception):
    """A value that cannot be converted."""


class JsProxy:
    """Base of the values that stand for JavaScript objects."""

    def to_py(self, *, depth: int = -1, default_converter: Callable | None = None) -> Any:
        return to_py(self, depth=depth, default_converter=default_converter)


class JsObject(JsProxy, dict):
    """A JavaScript object (or Map): keys read by attribute (`obj.name`) or by key (`obj["name"]`)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    def as_object_map(self, *, hereditary: bool = False) -> JsObject:
        return self

    def object_entries(self) -> JsArray:
        return JsArray(JsArray([k, v]) for k, v in self.items())

    def object_keys(self) -> JsArray:
        return JsArray(self.keys())

    def object_values(self) -> JsArray:
        return JsArray(self.values())

    # the Map methods a script may call on to_js(dict) (a Map in Pyodide)
    def has(self, key: Any) -> bool:
        return key in self

    def set(self, key: Any, value: Any) -> JsObject:
        self[key] = value
        return self

    def delete(self, key: Any) -> bool:
        return self.pop(key, _MISSING) is not _MISSING


class JsArray(JsProxy, list):
    """A JavaScript array."""

    @property
    def length(self) -> int:
        return len(self)

    def push(self, *items: Any) -> int:
        self.extend(items)
        return len(self)


class JsBuffer(JsProxy, bytes):
    """A JavaScript typed array or ArrayBuffer: bytes (so a Response or Blob takes it as a body)."""

    @property
    def buffer(self) -> JsBuffer:
        return self

    @property
    def byteLength(self) -> int:  # noqa: N802 - the JavaScript name
        return len(self)

    def to_bytes(self) -> bytes:
        return bytes(self)

    def to_memoryview(self) -> memoryview:
        return memoryview(bytes(self))

    def to_string(self, encoding: str | None = None) -> str:
        return bytes(self).decode(encoding or "utf-8")


JsTypedArray = JsBuffer


class JsException(JsProxy, Exception):
    """A JavaScript error: `name` and `message`."""

    def __init__(self, message: str = "", name: str = "Error"):
        Exception.__init__(self, message)
        self.name, self.message = name, message


class JsPromise(JsProxy):
    """A JavaScript promise (for isinstance checks; awaitables here are Python's)."""


class JsDoubleProxy(JsProxy):
    """What create_proxy returns: a handle on a Python object that calls and reads straight through."""

    def __init__(self, obj: Any, once: bool = False):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_once", once)
        object.__setattr__(self, "_destroyed", False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._destroyed:
            raise RuntimeError("This borrowed proxy was automatically destroyed")
        if self._once:
            object.__setattr__(self, "_destroyed", True)
        return self._obj(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._obj, name)

    def unwrap(self) -> Any:
        return self._obj

    def destroy(self) -> None:
        object.__setattr__(self, "_destroyed", True)


JsCallable = JsDoubleProxy


class _JsNull:
    """JavaScript's null (Python's None stands for undefined)."""

    _instance: _JsNull | None = None

    def __new__(cls) -> _JsNull:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "jsnull"


jsnull = _JsNull()
_MISSING = object()


def to_js(
    obj: Any,
    /,
    *,
    depth: int = -1,
    pyproxies: Any = None,
    create_pyproxies: bool = True,
    dict_converter: Callable[[Iterable[JsArray]], Any] | None = None,
    default_converter: Callable[[Any, Callable, dict], Any] | None = None,
    eager_converter: Callable[[Any, Callable, dict], Any] | None = None,
) -> Any:
    """A Python value as the JavaScript value Pyodide would make: dicts become JsObjects (or what
    `dict_converter` makes of their entries, e.g. Object.fromEntries), lists and tuples JsArrays,
    bytes JsBuffers; strings, numbers, None and proxies stay as they are; any other object stays
    itself (in Pyodide, a proxy of it) unless a converter says otherwise."""
    cache: dict[int, Any] = {}

    def convert(value: Any, level: int = depth) -> Any:
        if level == 0 or value is None or isinstance(value, (str, int, float, JsProxy, _JsNull)):
            return value
        if id(value) in cache:
            return cache[id(value)]
        if eager_converter is not None:
            out = eager_converter(value, lambda v: convert(v, level - 1), cache)
            if out is not None:
                return out
        if isinstance(value, (bytes, bytearray, memoryview)):
            return JsBuffer(bytes(value))
        if isinstance(value, Mapping) and not isinstance(value, JsProxy):
            entries = JsArray(JsArray([k, convert(v, level - 1)]) for k, v in value.items())
            out = dict_converter(entries) if dict_converter is not None else JsObject(entries)
            cache[id(value)] = out
            return out
        if isinstance(value, (list, tuple, set, frozenset)):
            out = JsArray(convert(v, level - 1) for v in value)
            cache[id(value)] = out
            return out
        if default_converter is not None:
            return default_converter(value, lambda v: convert(v, level - 1), cache)
        return value

    return convert(obj)


def to_py(obj: Any, *, depth: int = -1, default_converter: Callable | None = None) -> Any:
    """Plain Python data from a JavaScript value: JsObjects become dicts, JsArrays lists, JsBuffers
    bytes, jsnull None; anything that is not a proxy is returned as it is."""
    if isinstance(obj, _JsNull):
        return None
    if not isinstance(obj, JsProxy):
        to_py_method = getattr(obj, "to_py", None)  # e.g. a binding's result object
        return to_py_method() if callable(to_py_method) and not isinstance(obj, type) else obj
    if depth == 0:
        return obj
    if isinstance(obj, JsObject):
        return {k: _inner(v, depth - 1) for k, v in dict.items(obj)}
    if isinstance(obj, JsArray):
        return [_inner(v, depth - 1) for v in obj]
    if isinstance(obj, JsBuffer):
        return bytes(obj)
    if isinstance(obj, JsDoubleProxy):
        return obj.unwrap()
    if default_converter is not None:
        return default_converter(obj, lambda v: to_py(v, depth=depth - 1), {})
    return obj


def _inner(value: Any, depth: int) -> Any:
    return to_py(value, depth=depth) if isinstance(value, (JsProxy, _JsNull)) else value


def create_proxy(obj: Any, /, *, capture_this: bool = False, roundtrip: bool = True) -> JsDoubleProxy:
    return JsDoubleProxy(obj)


def create_once_callable(obj: Callable, /, *, _may_syncify: bool = False) -> JsDoubleProxy:
    return JsDoubleProxy(obj, once=True)


def destroy_proxies(pyproxies: Iterable[Any], /) -> None:
    for proxy in pyproxies:
        if hasattr(proxy, "destroy"):
            proxy.destroy()


def run_sync(awaitable: Any) -> Any:
    """Pyodide blocks on a promise through JSPI; here only outside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(awaitable) if asyncio.iscoroutine(awaitable) else asyncio.run(_wait(awaitable))
    raise RuntimeError("No suspender: run_sync cannot block inside the worker's event loop; use await")


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def register_js_module(name: str, jsproxy: Any) -> None:
    """Make `jsproxy` importable as `name` (`import name`), as Pyodide does."""
    sys.modules[name] = jsproxy


def unregister_js_module(name: str) -> None:
    sys.modules.pop(name, None)


__all__ = [
    "IN_BROWSER",
    "ConversionError",
    "JsArray",
    "JsBuffer",
    "JsCallable",
    "JsDoubleProxy",
    "JsException",
    "JsObject",
    "JsPromise",
    "JsProxy",
    "JsTypedArray",
    "create_once_callable",
    "create_proxy",
    "destroy_proxies",
    "jsnull",
    "register_js_module",
    "run_sync",
    "to_js",
    "to_py",
    "unregister_js_module",
]
