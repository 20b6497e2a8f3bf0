"""What may cross to a Durable Object: an RPC argument or result, and a WebSocket's attachment,
are JSON-like values (`check_rpc_value`).

A module of its own because both workers.durable_objects (a stub's calls) and workers.websocket
(serializeAttachment, which keeps a value through the object's hibernation) check values, and
workers.durable_objects imports workers.websocket for the object's hibernatable sockets: kept in
either, the other would import it back.

This package runs inside the isolate and imports nothing of the runtime's.
"""

from __future__ import annotations

from typing import Any

RPC_DEPTH = 32  # nesting of lists and dicts in an argument or a result


def check_rpc_value(value: Any, what: str, depth: int = 0) -> None:
    """An RPC argument or result must be JSON-like: None, bool, int, float, str, bytes, lists
    and dicts with string keys (tuples pass as lists); TypeError names what is not."""
    if depth > RPC_DEPTH:
        raise TypeError(f"{what}: nested more than {RPC_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
            raise TypeError(f"{what}: the integer {value} does not fit 64 bits")
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            check_rpc_value(item, what, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{what}: dict keys must be strings, got {type(key).__name__}")
            check_rpc_value(item, what, depth + 1)
        return
    raise TypeError(
        f"{what}: {type(value).__name__} cannot cross to a Durable Object; use None, bool, int, "
        "float, str, bytes, lists and dicts with string keys"
    )
