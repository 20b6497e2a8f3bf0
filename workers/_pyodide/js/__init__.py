"""`js` for the edge runtime: the JavaScript globals that Cloudflare's Python Workers import
(`from js import Response, Headers, fetch, Object, JSON, console, URL`), as Python stand-ins
built on the `workers` SDK. `X.new(...)` constructs, as with Pyodide's JsProxy of a class;
options objects may be dicts, to_js(...) results, or keyword arguments.

No JavaScript runs here: globals that need it (HTMLRewriter, ...) are not
simulated, and importing one says so.
"""

from __future__ import annotations

import json as _json
import logging as _logging
import sys as _sys
import time as _time
import urllib.parse as _urlparse
import uuid as _uuid
from typing import Any as _Any

import workers as _workers
from pyodide.ffi import JsArray as _JsArray
from pyodide.ffi import JsBuffer as _JsBuffer
from pyodide.ffi import JsObject as _JsObject
from pyodide.ffi import JsProxy as _JsProxy
from pyodide.ffi import to_js as _to_js
from pyodide.ffi import to_py as _to_py


def _options(init: _Any, kwargs: dict[str, _Any]) -> dict[str, _Any]:
    """A JavaScript options object (dict, JsObject, None) merged with keyword arguments."""
    out = dict(_to_py(init) or {}) if init is not None else {}
    out.update(kwargs)
    return out


def _headers(value: _Any) -> _workers.Headers | None:
    if value is None or isinstance(value, _workers.Headers):
        return value
    value = _to_py(value)
    if isinstance(value, dict):
        return _workers.Headers(value)
    return _workers.Headers([(str(k), str(v)) for k, v in value])


class Object:
    """`Object.fromEntries(entries)` (the usual to_js dict_converter), keys, values, entries, assign."""

    @staticmethod
    def new(*_args: _Any) -> _JsObject:
        return _JsObject()

    @staticmethod
    def fromEntries(entries: _Any) -> _JsObject:  # noqa: N802 - the JavaScript name
        return _JsObject((k, v) for k, v in entries)

    @staticmethod
    def keys(obj: _Any) -> _JsArray:
        return _JsArray(dict(obj).keys())

    @staticmethod
    def values(obj: _Any) -> _JsArray:
        return _JsArray(dict(obj).values())

    @staticmethod
    def entries(obj: _Any) -> _JsArray:
        return _JsArray(_JsArray([k, v]) for k, v in dict(obj).items())

    @staticmethod
    def assign(target: _Any, *sources: _Any) -> _Any:
        for source in sources:
            target.update(dict(source))
        return target


def _default(value: _Any) -> _Any:
    if isinstance(value, bytes):  # a JsBuffer serializes as JSON.stringify does a Uint8Array
        return {str(i): b for i, b in enumerate(value)}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class JSON:
    @staticmethod
    def stringify(value: _Any, replacer: _Any = None, space: int | str | None = None) -> str:
        separators = (",", ":") if space is None else None
        return _json.dumps(
            _to_py(value), default=_default, ensure_ascii=False, indent=space, separators=separators
        )

    @staticmethod
    def parse(text: str | bytes) -> _Any:
        return _to_js(_json.loads(text), dict_converter=Object.fromEntries)


class _Console:
    """`console.log` and friends reach `edge tail` as the worker's log lines."""

    def log(self, *args: _Any) -> None:
        print(*(_show(a) for a in args))

    def info(self, *args: _Any) -> None:
        _logging.getLogger("console").info(" ".join(_show(a) for a in args))

    def debug(self, *args: _Any) -> None:
        _logging.getLogger("console").debug(" ".join(_show(a) for a in args))

    def warn(self, *args: _Any) -> None:
        _logging.getLogger("console").warning(" ".join(_show(a) for a in args))

    def error(self, *args: _Any) -> None:
        print(*(_show(a) for a in args), file=_sys.stderr)


def _show(value: _Any) -> str:
    if isinstance(value, (dict, list)):
        try:
            return JSON.stringify(value)
        except TypeError:
            pass
    return str(value)


console = _Console()


class Headers:
    @staticmethod
    def new(init: _Any = None) -> _workers.Headers:
        return _headers(init) or _workers.Headers()


def _body(value: _Any) -> _Any:
    return _to_py(value) if isinstance(value, _JsProxy) and not isinstance(value, _JsBuffer) else value


class Response:
    """`Response.new(body, {status, statusText, headers, webSocket})`, `Response.json(data, init)`,
    `Response.redirect(url, status)`: each a workers.Response."""

    @staticmethod
    def new(body: _Any = None, init: _Any = None, **kwargs: _Any) -> _workers.Response:
        opts = _options(init, kwargs)
        return _workers.Response(
            _body(body),
            status=opts.get("status", 200),
            headers=_headers(opts.get("headers")),
            status_text=opts.get("statusText", ""),
            web_socket=opts.get("webSocket"),  # Response.new(None, status=101, webSocket=client)
        )

    @staticmethod
    def json(data: _Any, init: _Any = None, **kwargs: _Any) -> _workers.Response:
        opts = _options(init, kwargs)
        response = Response.new(JSON.stringify(data), opts)
        if "content-type" not in (opts.get("headers") or {}):
            response.headers.set("content-type", "application/json")
        return response

    @staticmethod
    def redirect(url: str, status: int = 302) -> _workers.Response:
        return _workers.Response.redirect(url, status)


class Request:
    @staticmethod
    def new(resource: _Any, init: _Any = None, **kwargs: _Any) -> _workers.Request:
        opts = _options(init, kwargs)
        if isinstance(resource, _workers.Request):
            url, method = resource.url, opts.get("method", resource.method)
            headers = _headers(opts.get("headers")) or resource.headers
            body = opts.get("body", resource._body or b"")
        else:
            url, method = str(resource), opts.get("method", "GET")
            headers, body = _headers(opts.get("headers")), opts.get("body", b"")
        if hasattr(body, "_body_and_type"):
            body, content_type = body._body_and_type()
            headers = headers or _workers.Headers()
            if content_type and "content-type" not in headers:
                headers.set("content-type", content_type)
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body or b"")
        return _workers.Request(url, str(method), headers, data)


async def fetch(resource: _Any, init: _Any = None, **kwargs: _Any) -> _workers.Response:
    """`await fetch(url, {method, headers, body})`: workers.fetch through the runtime."""
    opts = _options(init, kwargs)
    unused = {k: opts.pop(k) for k in ("redirect", "cf") if k in opts}
    return await _workers.fetch(
        resource,
        method=opts.pop("method", None),
        headers=_headers(opts.pop("headers", None)),
        body=_body(opts.pop("body", None)),
        **unused,
    )


class Blob:
    @staticmethod
    def new(parts: _Any = (), options: _Any = None, **kwargs: _Any) -> _workers.Blob:
        opts = _options(options, kwargs)
        return _workers.Blob(list(parts), opts.get("type"), opts.get("endings"))


class File:
    @staticmethod
    def new(parts: _Any, name: str, options: _Any = None, **kwargs: _Any) -> _workers.File:
        opts = _options(options, kwargs)
        return _workers.File(
            list(parts), name, opts.get("type"), opts.get("endings"), opts.get("lastModified")
        )


class FormData:
    @staticmethod
    def new(*_args: _Any) -> _workers.FormData:
        return _workers.FormData()


class Uint8Array:
    @staticmethod
    def new(value: _Any = b"") -> _JsBuffer:
        return _JsBuffer(bytes(value))  # a length (zeros) or the bytes


class URLSearchParams:
    def __init__(self, query: str = ""):
        self._pairs = _urlparse.parse_qsl(query.removeprefix("?"), keep_blank_values=True)

    @staticmethod
    def new(init: _Any = "") -> URLSearchParams:
        if isinstance(init, str):
            return URLSearchParams(init)
        pairs = _to_py(init).items() if isinstance(init, dict) else init
        return URLSearchParams(_urlparse.urlencode(list(pairs)))

    def get(self, name: str) -> str | None:
        return next((v for k, v in self._pairs if k == name), None)

    def getAll(self, name: str) -> list[str]:  # noqa: N802 - the JavaScript name
        return [v for k, v in self._pairs if k == name]

    def has(self, name: str) -> bool:
        return any(k == name for k, _ in self._pairs)

    def toString(self) -> str:  # noqa: N802 - the JavaScript name
        return _urlparse.urlencode(self._pairs)

    __str__ = toString


class URL:
    """`URL.new(url, base)`: href, protocol, host, hostname, port, pathname, search, hash, origin,
    searchParams."""

    def __init__(self, url: str, base: str | None = None):
        self.href = _urlparse.urljoin(base, url) if base else url
        parts = _urlparse.urlsplit(self.href)
        if not parts.scheme:
            raise TypeError(f"Invalid URL: {url!r}")
        self.protocol = f"{parts.scheme}:"
        self.host = parts.netloc.rpartition("@")[2]
        self.hostname = parts.hostname or ""
        self.port = str(parts.port) if parts.port else ""
        self.pathname = parts.path or "/"
        self.search = f"?{parts.query}" if parts.query else ""
        self.hash = f"#{parts.fragment}" if parts.fragment else ""
        self.origin = f"{parts.scheme}://{self.host}"
        self.searchParams = URLSearchParams(parts.query)  # noqa: N815 - the JavaScript name

    @staticmethod
    def new(url: str, base: str | None = None) -> URL:
        return URL(str(url), base)

    def toString(self) -> str:  # noqa: N802 - the JavaScript name
        return self.href

    __str__ = toString


class Date:
    @staticmethod
    def now() -> int:
        """Milliseconds since the epoch."""
        return int(_time.time() * 1000)


class _Crypto:
    @staticmethod
    def randomUUID() -> str:  # noqa: N802 - the JavaScript name
        return str(_uuid.uuid4())


crypto = _Crypto()

# `from js import AbortController`: a signal for env.AI.run's options (and anything else that takes one)
from workers.abort import AbortController as AbortController  # noqa: E402
from workers.abort import AbortSignal as AbortSignal  # noqa: E402


def __getattr__(name: str) -> _Any:
    if name in ("WebSocketPair", "WebSocket"):  # the SDK's, carried by the runtime
        import workers.websocket

        return getattr(workers.websocket, name)
    if name.startswith("__"):
        raise AttributeError(name)
    # an ImportError, so that `from js import HTMLRewriter` reports this message, not a bare one
    raise ImportError(
        f"js.{name} is not simulated by the edge runtime (no JavaScript runs here); "
        "use the workers SDK's Python API"
    )
