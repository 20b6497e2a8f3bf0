"""Is the port `edge dev` (or `edge pop serve`) is told to listen on free? Asked before any model
loads: a second `edge dev` on a busy port used to load its models for seconds and only then fail in
uvicorn's bind, ending with the engines' threads torn down under it (exit 134). The process that
holds the port is named when /proc says which it is (best effort: Linux, and a process we may read)."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

LISTEN = "0A"  # a socket's state in /proc/net/tcp: TCP_LISTEN
NEXT_FREE_TRIES = 20  # ports after the busy one tried for the --port suggestion


def _bind(host: str, port: int) -> OSError | None:
    """Bind (and release) `host`:`port` as uvicorn binds it; the error, or None when it is free."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        return OSError(errno.EADDRNOTAVAIL, exc.strerror)
    with socket.socket(family, kind, proto) as sock:
        # as uvicorn does: a port whose last connections linger in TIME_WAIT is free to listen on
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc
    return None


def port_problem(host: str, port: int, busy_only: bool = False) -> str | None:
    """Why `edge dev --host host --port port` cannot listen there (what holds it, what to do), or
    None when it can. `busy_only`: only a port another process holds is a problem (the check made
    before anything else, which must not stand in for the config's own errors: a port the user may
    not bind is left to the bind itself, as before)."""
    error = _bind(host, port)
    if error is None or (busy_only and error.errno != errno.EADDRINUSE):
        return None
    if error.errno == errno.EADDRINUSE:
        holder = port_holder(port)
        by = f" by {holder}" if holder else ""
        free = next((p for p in range(port + 1, port + 1 + NEXT_FREE_TRIES) if _bind(host, p) is None), None)
        other = f"--port {free}" if free is not None else "--port with another port"
        return f"{host}:{port} is already in use{by}: stop that, or run edge dev with {other}"
    if error.errno == errno.EACCES:
        return f"{host}:{port}: permission denied (ports below 1024 need privileges): pick one with --port"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"--host {host}: not an address of this machine ({error.strerror})"
    return f"cannot listen on {host}:{port}: {error.strerror or error}"


def port_holder(port: int) -> str | None:
    """'pid N (its command line)' of a process listening on TCP `port`, as /proc shows it, or None."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    command = " ".join(command.split())  # one line, whatever its arguments hold
                    shown = command if len(command) <= 120 else command[:117] + "..."
                    return f"pid {proc.name} ({shown})" if shown else f"pid {proc.name}"
        except OSError:  # gone meanwhile, or another user's: not ours to read
            continue
    return None
