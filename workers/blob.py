"""`Blob` and `File`: immutable bytes with a content type (and, for a File, a name), in the shape of
Cloudflare's `workers.Blob` / `workers.File`. Usable as a `Response` or `fetch` body."""

from __future__ import annotations

import time
from collections.abc import Iterable
from enum import StrEnum

BlobValue = "str | bytes | bytearray | memoryview | Blob | File"


class BlobEnding(StrEnum):
    TRANSPARENT = "transparent"
    NATIVE = "native"


def _is_parts(value: object) -> bool:
    if isinstance(value, (str, bytes, bytearray, memoryview, Blob)):
        return False
    try:
        iter(value)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True


def _part_bytes(part: object, endings: str) -> bytes:
    if isinstance(part, str):
        if endings == BlobEnding.NATIVE:  # native line endings on the runtime's platform (POSIX: \n)
            part = part.replace("\r\n", "\n").replace("\r", "\n")
        return part.encode("utf-8")
    if isinstance(part, Blob):
        return part._data
    if hasattr(part, "to_bytes") and not isinstance(part, int):  # a pyodide.ffi JsBuffer
        return bytes(part.to_bytes())
    try:
        return bytes(memoryview(part))  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"Don't know how to handle {type(part).__name__} for Blob()") from None


class Blob:
    def __init__(
        self,
        blob_parts: Iterable[BlobValue] | BlobValue,
        content_type: str | None = None,
        endings: BlobEnding | str | None = None,
    ):
        if not _is_parts(blob_parts):
            if not content_type and isinstance(blob_parts, Blob):
                content_type = blob_parts.content_type  # a single Blob passes its type on
            blob_parts = [blob_parts]
        ending = str(endings or BlobEnding.TRANSPARENT)
        if ending not in (BlobEnding.TRANSPARENT, BlobEnding.NATIVE):
            raise TypeError(f"endings must be 'transparent' or 'native', got {endings!r}")
        self._data = b"".join(_part_bytes(p, ending) for p in blob_parts)  # type: ignore[union-attr]
        self._type = (content_type or "").lower()

    @property
    def size(self) -> int:
        return len(self._data)

    @property
    def content_type(self) -> str:
        return self._type

    type = content_type  # the Web API's name

    @property
    def js_object(self) -> Blob:
        """Cloudflare hands back the underlying JS Blob; here the Blob is its own object."""
        return self

    async def text(self) -> str:
        return self._data.decode("utf-8", errors="replace")

    async def bytes(self) -> bytes:
        return self._data

    async def arrayBuffer(self) -> bytes:  # noqa: N802 - the Web API's name
        return self._data

    def slice(
        self, start: int | None = None, end: int | None = None, content_type: str | None = None
    ) -> Blob:
        return Blob([self._data[slice(start, end)]], content_type)

    def _body_and_type(self) -> tuple[bytes, str | None]:
        """What a Response or fetch sends for this body: its bytes and content type."""
        return self._data, self._type or None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} size={self.size} type={self._type!r}>"


class File(Blob):
    def __init__(
        self,
        blob_parts: Iterable[BlobValue] | BlobValue,
        filename: str,
        content_type: str | None = None,
        endings: BlobEnding | str | None = None,
        last_modified: int | None = None,
    ):
        if not last_modified and isinstance(blob_parts, File):
            last_modified = blob_parts.last_modified
        super().__init__(blob_parts, content_type, endings)
        self._name = str(filename)
        self._last_modified = int(last_modified if last_modified else time.time() * 1000)

    @property
    def name(self) -> str:
        return self._name

    @property
    def last_modified(self) -> int:
        """Milliseconds since the epoch, as the Web API's lastModified."""
        return self._last_modified

    lastModified = last_modified  # noqa: N815 - the Web API's name

    def __repr__(self) -> str:
        return f"<File {self._name!r} size={self.size} type={self._type!r}>"
