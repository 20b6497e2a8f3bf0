"""Messages between the runtime and an isolate process: msgspec structs, msgpack, length-prefixed.

The runtime sends Init and Invoke; the isolate answers Ready/LoadFailed and InvokeResult/InvokeError,
and calls back into the runtime with AICall (answered by AIReply) because the runtime owns the
AI service. Frames are a 4-byte big-endian length followed by the msgpack body.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec

MAX_FRAME = 256 * 1024 * 1024  # larger than the largest body the runtime accepts


class Init(msgspec.Struct, tag=True):
    script: str  # absolute path of the worker's main module
    vars: dict[str, Any]
    ai_binding: str | None


class Ready(msgspec.Struct, tag=True):
    entry: str  # "Default.fetch" or "on_fetch"


class LoadFailed(msgspec.Struct, tag=True):
    message: str
    traceback: str


class Invoke(msgspec.Struct, tag=True):
    id: int
    method: str
    url: str
    headers: list[tuple[str, str]]
    body: bytes
    cf: dict[str, Any]


class InvokeResult(msgspec.Struct, tag=True):
    id: int
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class InvokeError(msgspec.Struct, tag=True):
    id: int
    message: str  # "ExceptionType: message"
    traceback: str


class AICall(msgspec.Struct, tag=True):
    call: int
    request: int  # the Invoke this call belongs to
    model: str
    inputs: Any
    options: Any = None


class AIReply(msgspec.Struct, tag=True):
    call: int
    result: Any = None
    error_code: int | None = None
    error_message: str | None = None


Message = Init | Ready | LoadFailed | Invoke | InvokeResult | InvokeError | AICall | AIReply

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
_HEADER = struct.Struct(">I")


def encode(msg: Message) -> bytes:
    body = _encoder.encode(msg)
    return _HEADER.pack(len(body)) + body


async def read_message(reader: asyncio.StreamReader) -> Message:
    """The next message; raises asyncio.IncompleteReadError when the peer has gone."""
    (length,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if length > MAX_FRAME:
        raise ValueError(f"IPC frame of {length} bytes exceeds {MAX_FRAME}")
    return _decoder.decode(await reader.readexactly(length))
