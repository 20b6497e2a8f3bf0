"""OS-enforced limits for an isolate process: Linux Landlock for the file system, the network,
signals and abstract Unix sockets, RLIMIT_AS for memory. (The namespaces, seccomp and process
limits around it are runtime.isolate.jail's.)

After `restrict(paths)` the process can read (and execute) only beneath the given paths, write
nothing, and open no TCP connection; the kernel enforces it, whatever the script does. Outbound
HTTP goes through the runtime (workers.fetch). Where Landlock is missing, `restrict` reports it
and the isolate runs with process separation only.
"""

from __future__ import annotations

import ctypes
import os
import resource
import struct
from pathlib import Path

_SYS_create_ruleset, _SYS_add_rule, _SYS_restrict_self = 444, 445, 446  # x86_64 and aarch64
_PR_SET_NO_NEW_PRIVS = 38
_RULE_PATH_BENEATH = 1
# file-system access rights (Landlock ABI 1-3)
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ALL_FS_V1 = (1 << 13) - 1
_REMOVE_DIR, _REMOVE_FILE, _MAKE_DIR, _MAKE_REG = 1 << 4, 1 << 5, 1 << 7, 1 << 8
_REFER, _TRUNCATE = 1 << 13, 1 << 14
_TCP_BIND, _TCP_CONNECT = 1 << 0, 1 << 1
# ABI 6 (Linux 6.12): no abstract Unix socket or signal may reach a process outside the domain
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 where it is unavailable."""
    try:
        version = _libc().syscall(_SYS_create_ruleset, None, 0, 1)
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def restrict(
    read_paths: list[str | Path], writable: list[str | Path] = (), scratch: list[str | Path] = ()
) -> int:
    """Confine this process; returns the Landlock ABI used (0: not confined). `writable` files
    may be written; in `scratch` folders files and folders may also be made and removed."""
    abi = landlock_abi()
    if abi == 0:
        return 0
    libc = _libc()
    fs = _ALL_FS_V1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    net = (_TCP_BIND | _TCP_CONNECT) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    buf = ctypes.create_string_buffer(attr)
    ruleset = libc.syscall(_SYS_create_ruleset, buf, size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:

        def allow(path: str | Path, access: int) -> None:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return  # a path that does not exist needs no rule
            try:
                if not os.path.isdir(path):
                    access &= _EXECUTE | _WRITE_FILE | _READ_FILE | (_TRUNCATE if abi >= 3 else 0)
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd))
                if libc.syscall(_SYS_add_rule, ruleset, _RULE_PATH_BENEATH, rule, 0) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(fd)

        for path in read_paths:
            allow(path, _EXECUTE | _READ_FILE | _READ_DIR)
        truncate = _TRUNCATE if abi >= 3 else 0
        for path in writable:
            allow(path, _READ_FILE | _WRITE_FILE | truncate)
        for path in scratch:
            make = _REMOVE_DIR | _REMOVE_FILE | _MAKE_DIR | _MAKE_REG
            allow(path, _READ_FILE | _READ_DIR | _WRITE_FILE | truncate | make)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_restrict_self, ruleset, 0) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


def limit_memory(extra_mb: int) -> int:
    """Cap the address space at what is mapped now plus `extra_mb` (the worker's own budget)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    limit = pages * os.sysconf("SC_PAGE_SIZE") + extra_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit
