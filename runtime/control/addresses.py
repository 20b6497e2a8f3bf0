"""A HOST:PORT entry as an operator writes one (`[edge] fetch_allow`), read strictly."""

from __future__ import annotations

import ipaddress


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
