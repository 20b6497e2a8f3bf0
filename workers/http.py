"""Request, Response and Headers as a worker sees them."""

from __future__ import annotations

import json as _json
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any


def parse_json(data: str | bytes) -> Any:
    """json.loads, with JSON nested too deep for the stack refused as invalid (ValueError, as
    any other bad body) rather than a RecursionError the worker does not expect."""
    try:
        return _json.loads(data)
    except RecursionError:
        raise ValueError("the JSON is nested too deep to parse") from None


class Headers:
    """Case-insensitive HTTP headers that keep repeated values (like the Fetch API's Headers)."""

    def __init__(self, init: Mapping[str, str] | Iterable[tuple[str, str]] | None = None):
        self._items: list[tuple[str, str]] = []
        if init is None:
            return
        pairs = init.items() if isinstance(init, Mapping) else init
        for name, value in pairs:
            self.append(name, value)

    def get(self, name: str, default: str | None = None) -> str | None:
        values = [v for k, v in self._items if k == name.lower()]
        return ", ".join(values) if values else default

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(k == name.lower() for k, _ in self._items)

    def set(self, name: str, value: str) -> None:
        self.delete(name)
        self.append(name, value)

    def __setitem__(self, name: str, value: str) -> None:
        self.set(name, value)

    def append(self, name: str, value: str) -> None:
        self._items.append((name.lower(), str(value)))

    def delete(self, name: str) -> None:
        self._items = [(k, v) for k, v in self._items if k != name.lower()]

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)

    def keys(self) -> list[str]:
        return [k for k, _ in self._items]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


class CfProperties(dict):
    """`request.cf`: read by key (`request.cf["colo"]`) or, as on Cloudflare, by attribute
    (`request.cf.colo`)."""

    def __getattr__(self, name: str) -> Any:
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(f"request.cf has no {name!r}") from None
        return CfProperties(value) if type(value) is dict else value


class Request:
    """An incoming request. Its body is bytes, or (for a large upload) a stream that arrives in
    chunks: `async for chunk in request.body` reads it without holding it whole, while
    `await request.bytes()`, `.text()` and `.json()` read it all."""

    def __init__(
        self,
        url: str,
        method: str = "GET",
        headers: Headers | Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        body: bytes | AsyncIterator[bytes] | None = b"",
        cf: dict[str, Any] | None = None,
    ):
        self.url = url
        self.method = method.upper()
        self.headers = headers if isinstance(headers, Headers) else Headers(headers)
        self.cf = CfProperties(cf or {})
        if body is None or isinstance(body, (bytes, bytearray, memoryview)):
            self._body: bytes | None = bytes(body or b"")
            self._stream: AsyncIterator[bytes] | None = None
        else:
            self._body, self._stream = None, body

    @property
    def body(self) -> AsyncIterator[bytes]:
        """The body as an async iterator of byte chunks (read once)."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            return stream
        return _once(self._body or b"")

    @property
    def bodyUsed(self) -> bool:  # noqa: N802 - the Fetch API's name
        return self._body is None and self._stream is None

    body_used = bodyUsed  # Cloudflare's SDK's name

    @property
    def js_object(self) -> Request:
        """Cloudflare hands back the underlying JS Request; here the Request is its own object."""
        return self

    async def buffer(self) -> bytes:
        """The body (Cloudflare's name; an ArrayBuffer there)."""
        return await self.bytes()

    def clone(self) -> Request:
        """A copy that can be read separately (a body still streaming must be read first)."""
        if self._stream is not None:
            raise TypeError("clone() of a streamed body: read it first with await request.bytes()")
        if self._body is None:
            raise TypeError("Body already used")
        return Request(self.url, self.method, Headers(self.headers.items()), self._body, dict(self.cf))

    async def form_data(self):
        """The body as a workers.FormData (multipart/form-data or urlencoded); TypeError otherwise."""
        from workers.formdata import FormData

        return FormData._parse(await self.bytes(), self.headers.get("content-type"))

    async def blob(self):
        from workers.blob import Blob

        return Blob([await self.bytes()], self.headers.get("content-type"))

    async def bytes(self) -> bytes:
        if self._body is None:
            if self._stream is None:
                raise TypeError("the request body has already been read as a stream")
            stream, self._stream = self._stream, None
            self._body = b"".join([bytes(c) async for c in stream])
        return self._body

    async def text(self) -> str:
        return (await self.bytes()).decode("utf-8", errors="replace")

    async def json(self) -> Any:
        """The body parsed as JSON; raises ValueError on invalid JSON."""
        return parse_json(await self.bytes())

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.url}>"


async def _once(data: bytes) -> AsyncIterator[bytes]:
    if data:
        yield data


Body = str | bytes | AsyncIterator[bytes] | None


class _class_or_instance:
    """A method that receives the class when called on it, the instance when called on one."""

    def __init__(self, fn):
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj, owner):
        target = obj if obj is not None else owner
        return lambda *args, **kwargs: self.fn(target, *args, **kwargs)


class Response:
    """A response. The body is str, bytes, an async iterator of bytes, or a workers.FormData /
    Blob / File (sent with its content type). `status_text` is kept on the object, not sent:
    the HTTP server writes the standard reason phrase. Cloudflare's positional order
    `Response(body, status, status_text, headers)` is accepted too (a str in third place)."""

    def __init__(
        self,
        body: Body = None,
        status: int | None = 200,
        headers: Headers | Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        status_text: str = "",
        web_socket: Any = None,
    ):
        if isinstance(headers, str):  # Cloudflare's order: (body, status, status_text, headers)
            headers, status_text = (status_text or None), headers
        status = 200 if status is None else status
        if web_socket is not None and (int(status) != 101 or type(web_socket).__name__ != "WebSocket"):
            raise TypeError("web_socket: pass the client end of a WebSocketPair, with status=101")
        if int(status) == 101 and web_socket is None:
            raise TypeError("status 101: pass web_socket=client (the client end of a WebSocketPair)")
        self.web_socket = web_socket
        if not 100 <= int(status) <= 599:
            raise ValueError(f"Response status must be between 100 and 599, got {status}")
        self.status = int(status)
        self.status_text = str(status_text or "")
        self.headers = headers if isinstance(headers, Headers) else Headers(headers)
        if hasattr(body, "_body_and_type"):  # workers.FormData, Blob, File
            body, content_type = body._body_and_type()
            if content_type and "content-type" not in self.headers:
                self.headers.set("content-type", content_type)
        self.body = body
        if isinstance(body, str) and "content-type" not in self.headers:
            self.headers.set("content-type", "text/plain;charset=UTF-8")

    @_class_or_instance
    def json(cls_or_self, data: Any = None, status: int = 200, headers: Mapping[str, str] | None = None):
        """Response.json(data): a JSON response. response.json(): its body parsed (awaitable),
        as the Fetch API has both."""
        if isinstance(cls_or_self, Response):
            return cls_or_self._read_json()
        out = cls_or_self(_json.dumps(data, ensure_ascii=False), status=status, headers=headers)
        out.headers.set("content-type", "application/json")
        return out

    @classmethod
    def from_json(cls, data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
        return cls.json(data, status=status, headers=headers)  # the name Cloudflare's SDK also accepts

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    async def bytes(self) -> bytes:
        body = self.body
        if body is None:
            return b""
        if isinstance(body, str):
            return body.encode("utf-8")
        if isinstance(body, (bytes, bytearray)):
            return bytes(body)
        return b"".join([c.encode() if isinstance(c, str) else bytes(c) async for c in body])

    async def text(self) -> str:
        return (await self.bytes()).decode("utf-8", errors="replace")

    async def _read_json(self) -> Any:
        return parse_json(await self.bytes())

    async def form_data(self):
        """The body as a workers.FormData (multipart/form-data or urlencoded); TypeError otherwise."""
        from workers.formdata import FormData

        return FormData._parse(await self.bytes(), self.headers.get("content-type"))

    formData = form_data  # noqa: N815 - the name Cloudflare's SDK also accepts

    @property
    def js_object(self) -> Response:
        """Cloudflare hands back the underlying JS Response; here the Response is its own object."""
        return self

    def replace_body(self, body: Body) -> Response:
        """A new Response with this one's status and headers and another body."""
        headers = Headers(self.headers.items())
        if hasattr(body, "_body_and_type"):
            headers.delete("content-type")  # the new body brings its own
        return Response(body, self.status, headers, status_text=self.status_text)

    async def blob(self):
        from workers.blob import Blob

        return Blob([await self.bytes()], self.headers.get("content-type"))

    @classmethod
    def redirect(cls, url: str, status: int = 302) -> Response:
        if status not in (301, 302, 303, 307, 308):
            raise ValueError(f"redirect status must be 301, 302, 303, 307 or 308, got {status}")
        return cls(None, status=status, headers={"location": url})

    def __repr__(self) -> str:
        return f"<Response {self.status}>"
