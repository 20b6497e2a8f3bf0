"""`FormData`: form fields and files, in the shape of Cloudflare's `workers.FormData` (a mapping
that keeps repeated keys). A Response or fetch body of FormData is sent as multipart/form-data;
`await request.form_data()` reads multipart/form-data and application/x-www-form-urlencoded."""

from __future__ import annotations

import email.parser
import email.policy
import secrets
from collections.abc import Iterator, Mapping, MutableMapping
from urllib.parse import parse_qsl

from workers.blob import Blob, File

FormDataValue = "str | Blob | File"


def _entry(value: object, filename: str | None = None) -> str | File:
    """As the Web API stores it: a string, or a File (a Blob becomes a File named 'blob')."""
    if isinstance(value, Blob):
        if filename is not None or not isinstance(value, File):
            return File(value, filename or "blob", value.content_type)
        return value
    if filename is not None:
        raise TypeError("a filename can only be given with a Blob or File value")
    return str(value)


class FormData(MutableMapping):
    """Key/value pairs of a form. `form[key]` is the first value (None when absent, as Cloudflare's);
    `get_all(key)` every value; `append` adds one, `form[key] = v` replaces them all."""

    def __init__(self, form_data: FormData | Mapping[str, FormDataValue] | None = None):
        self._items: list[tuple[str, str | File]] = []
        if not form_data:
            return
        if isinstance(form_data, FormData):
            self._items = list(form_data._items)
        elif isinstance(form_data, Mapping):
            for key, value in form_data.items():
                self.append(key, value)
        else:
            raise TypeError("Expected form_data to be a dict or an instance of FormData")

    def __getitem__(self, key: str) -> str | File | None:  # type: ignore[override]
        return next((v for k, v in self._items if k == key), None)

    def __setitem__(self, key: str, value: FormDataValue) -> None:
        if isinstance(value, list):
            raise TypeError("Expected single item in arguments to FormData.__setitem__")
        entry = _entry(value)
        out, placed = [], False
        for k, v in self._items:
            if k != key:
                out.append((k, v))
            elif not placed:
                out.append((k, entry))
                placed = True
        if not placed:
            out.append((key, entry))
        self._items = out

    def append(self, key: str, value: FormDataValue, filename: str | None = None) -> None:
        self._items.append((str(key), _entry(value, filename)))

    def delete(self, key: str) -> None:
        self._items = [(k, v) for k, v in self._items if k != key]

    def __delitem__(self, key: str) -> None:
        self.delete(key)

    def __contains__(self, key: object) -> bool:
        return any(k == key for k, _ in self._items)

    def keys(self) -> Iterator[str]:  # type: ignore[override]
        return iter([k for k, _ in self._items])

    def values(self) -> Iterator[str | File]:  # type: ignore[override]
        return iter([v for _, v in self._items])

    def items(self) -> Iterator[tuple[str, str | File]]:  # type: ignore[override]
        return iter(list(self._items))

    def __iter__(self) -> Iterator[str]:
        return self.keys()

    def __len__(self) -> int:
        return len(self._items)

    def get_all(self, key: str) -> list[str | File]:
        return [v for k, v in self._items if k == key]

    getAll = get_all  # noqa: N815 - the Web API's name

    def has(self, key: str) -> bool:
        return key in self

    @property
    def js_object(self) -> FormData:
        """Cloudflare hands back the underlying JS FormData; here the FormData is its own object."""
        return self

    def _body_and_type(self) -> tuple[bytes, str]:
        """The multipart/form-data encoding a Response or fetch sends, and its content type."""
        boundary = f"----edgeFormBoundary{secrets.token_hex(12)}"
        out = bytearray()
        for key, value in self._items:
            name = _quote(key)
            out += f"--{boundary}\r\n".encode()
            if isinstance(value, File):
                disposition = f'form-data; name="{name}"; filename="{_quote(value.name)}"'
                out += f"Content-Disposition: {disposition}\r\n".encode()
                out += f"Content-Type: {value.content_type or 'application/octet-stream'}\r\n\r\n".encode()
                out += value._data
            else:
                out += f'Content-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
                out += value.encode("utf-8")
            out += b"\r\n"
        out += f"--{boundary}--\r\n".encode()
        return bytes(out), f"multipart/form-data; boundary={boundary}"

    @classmethod
    def _parse(cls, body: bytes, content_type: str | None) -> FormData:
        """A request or response body read as a form; raises TypeError as the Fetch API does."""
        mime = (content_type or "").split(";", 1)[0].strip().lower()
        form = cls()
        if mime == "application/x-www-form-urlencoded":
            for key, value in parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True):
                form.append(key, value)
            return form
        if mime != "multipart/form-data":
            raise TypeError(f"the body is not a form (content-type {content_type!r})")
        header = email.parser.HeaderParser(policy=email.policy.HTTP).parsestr(
            f"Content-Type: {content_type}\r\n\r\n"
        )
        boundary = header.get_param("boundary")
        if not boundary:
            raise TypeError("multipart/form-data without a boundary")
        delimiter = b"--" + str(boundary).encode("latin-1")
        for part in body.split(delimiter)[1:]:
            if part.startswith(b"--"):
                break
            head, sep, data = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
            if not sep:
                raise TypeError("a multipart/form-data part has no header end")
            msg = email.parser.BytesHeaderParser(policy=email.policy.HTTP).parsebytes(head + b"\r\n\r\n")
            name = msg.get_param("name", header="content-disposition")
            if name is None:
                raise TypeError("a multipart/form-data part has no name")
            data = data.removesuffix(b"\r\n")
            filename = msg.get_filename()
            if filename is None:
                form.append(str(name), data.decode("utf-8", errors="replace"))
            else:
                kind = msg.get_content_type() if msg.get("content-type") else "application/octet-stream"
                form.append(str(name), File([data], filename, kind))
        return form

    def __repr__(self) -> str:
        return f"FormData({self._items!r})"


def _quote(text: str) -> str:
    """A name or filename inside a quoted Content-Disposition parameter, escaped as the HTML
    standard says (CR, LF and the quote percent-encoded)."""
    return text.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
