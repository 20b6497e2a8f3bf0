"""Addresses as an operator writes them, read strictly: a HOST:PORT entry (`[edge] fetch_allow`), the
runtime's own origin (`[edge] public_url`, else the address `edge dev` listens on). URLs the runtime
hands a worker (an AI Gateway's getUrl) start with that origin, never with a request's Host header,
which the client writes."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def parse_host_port(entry: str) -> tuple[str, int]:
    """'127.0.0.1:8123', '[::1]:8123' or 'devbox.lan:8123' -> (host, port); ValueError says what is wrong."""
    host, sep, port = entry.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{entry!r}: {host!r} in brackets is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"{entry!r}: write an IPv6 address in brackets, e.g. '[::1]:8123'")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{entry!r}: expected HOST:PORT with a port from 1 to 65535, e.g. '127.0.0.1:8123'")
    return host.lower(), int(port)


DEFAULT_ORIGIN = "http://127.0.0.1:8787"  # edge dev's address unless --host / --port say otherwise


def parse_origin(url: str) -> str:
    """'https://edge.example.com' or 'http://127.0.0.1:8787' (`[edge] public_url`) -> its origin,
    scheme://host[:port] with no path; ValueError says what is wrong."""
    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r}: the port is not a number from 1 to 65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r}: expected http:// or https:// and a host, e.g. 'https://edge.example.com'")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{url!r}: give the origin only (scheme, host and port), no path or query")
    if port == 0:
        raise ValueError(f"{url!r}: the port is not a number from 1 to 65535")
    host = parts.hostname
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def listen_origin(host: str, port: int) -> str:
    """The origin of a server listening on host:port (`edge dev --host --port`); one listening on
    every address (0.0.0.0, ::) is named by the loopback one, which reaches it from this machine."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"
