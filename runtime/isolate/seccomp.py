"""The isolate's seccomp filter (runtime.isolate.jail installs it last, just before the exec): syscalls a
worker never needs answer EPERM, no clone() makes a namespace, no socket but a Unix one.
Standard library only, as the jail is."""

from __future__ import annotations

import ctypes
import errno

# What a worker never needs; each answers EPERM (clone3: ENOSYS, so libc falls back to clone,
# whose namespace flags are checked below).
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "chroot",
    "unshare", "setns", "kexec_load", "kexec_file_load", "bpf", "keyctl", "add_key", "request_key",
    "perf_event_open", "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff",
    "open_by_handle_at", "name_to_handle_at", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "acct", "quotactl", "sethostname", "setdomainname", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm", "fsopen", "fsconfig", "fsmount",
    "fspick", "move_mount", "open_tree", "mount_setattr", "syslog", "vhangup", "personality",
    "kcmp", "pidfd_getfd", "lookup_dcookie", "nfsservctl", "uselib",
)  # fmt: skip
AF_UNIX = 1
_SCMP_ACT_ALLOW, _SCMP_CMP_NE, _SCMP_CMP_MASKED_EQ = 0x7FFF0000, 1, 7
_SCMP_FLTATR_CTL_OPTIMIZE = 8


class SeccompError(OSError):
    """libseccomp is missing or refused the filter (the jail reports it as it reports an OSError)."""


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


def load_seccomp_library():
    """libseccomp, opened before the old root goes away."""
    for name in ("libseccomp.so.2", "libseccomp.so"):
        try:
            return ctypes.CDLL(name, use_errno=True)
        except OSError:
            continue
    raise SeccompError("libseccomp is not installed (Debian/Ubuntu: apt-get install libseccomp2)")


def install_seccomp(lib, namespaces: int) -> None:
    """The filter: DENIED_SYSCALLS answer EPERM, clone() may not make any of `namespaces`, and
    sockets are Unix sockets only."""
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp),
    ]  # fmt: skip
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompError("seccomp_init failed")
    # a binary tree of syscall numbers (libseccomp 2.5+): an allowed call passes a handful of
    # comparisons, not every denied one in turn; older libraries keep the linear filter
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_attr_set(ctypes.c_void_p(ctx), _SCMP_FLTATR_CTL_OPTIMIZE, 2)

    def rule(action: int, name: str, *cmps: _ArgCmp) -> None:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return  # not on this architecture
        arr = (_ArgCmp * len(cmps))(*cmps) if cmps else None
        if lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr) < 0:
            raise SeccompError(f"seccomp rule for {name} failed")

    eperm = 0x00050000 | errno.EPERM
    for name in DENIED_SYSCALLS:
        rule(eperm, name)
    rule(0x00050000 | errno.ENOSYS, "clone3")
    ns_flags = namespaces | 0x80  # and CLONE_NEWTIME
    for flag in (1 << b for b in range(32) if ns_flags & (1 << b)):
        rule(eperm, "clone", _ArgCmp(0, _SCMP_CMP_MASKED_EQ, flag, flag))
    # only Unix sockets (the IPC channel, asyncio's self-pipe): no packet, raw, UDP or TCP socket
    eaf = 0x00050000 | errno.EAFNOSUPPORT
    rule(eaf, "socket", _ArgCmp(0, _SCMP_CMP_NE, AF_UNIX, 0))
    rule(eaf, "socketpair", _ArgCmp(0, _SCMP_CMP_NE, AF_UNIX, 0))
    try:
        if lib.seccomp_load(ctypes.c_void_p(ctx)) < 0:
            raise SeccompError("seccomp_load failed")
    finally:
        lib.seccomp_release(ctypes.c_void_p(ctx))
