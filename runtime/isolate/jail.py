"""The isolate's jail: Linux namespaces, a minimal read-only file view, no capabilities, seccomp.

Run by the runtime as `python -S -B -m runtime.isolate.jail SPEC_JSON`; it builds the sandbox, then
execs the isolate's own interpreter inside it. Standard library only (its seccomp filter is
runtime.isolate.seccomp), and nothing else runs before the exec, so the runtime's threads never
meet a fork.

    launcher (outside)  --unshare(user, mount, pid, net, ipc, uts, cgroup)-->  fork
       |  waits, exits with the child's status               child: PID 1 of the new PID namespace
       |                                                         mounts the view, pivots into it,
       |  (as root: a helper forked first writes the             becomes uid 1000 (outside: an
       |   uid/gid maps, since a process cannot map              unprivileged uid), drops every
       |   another uid for itself)                               capability, seccomp, execs Python

The view holds the interpreter's own prefix, the SDK files, msgspec, a copy of the worker's
bundle, a fresh /proc of its own PID namespace, a few /dev nodes and a size-capped private /tmp.
The network namespace has only a down loopback, so no socket reaches anything; when PID 1 ends,
the kernel kills every process the worker forked.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import signal
import stat
import sys

from runtime.isolate.seccomp import install_seccomp, load_seccomp_library

INSIDE_ID = 1000  # the uid and gid a worker sees
SETUP_FAILED = 111  # exit status: the jail could not be built (the message is on stderr)
NO_USER_NAMESPACES = 112  # exit status: the kernel refuses user namespaces

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x10000000, 0x20000000, 0x40000000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
NAMESPACES |= CLONE_NEWCGROUP

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
# statvfs flags that a bind remount inside a user namespace must keep (the kernel locks them)
_KEEP = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC}
_KEEP |= {os.ST_NOATIME: MS_NOATIME, os.ST_NODIRATIME: MS_NODIRATIME, os.ST_RELATIME: MS_RELATIME}

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4

_SYSCALLS = {"x86_64": {"pivot_root": 155, "capset": 126}, "aarch64": {"pivot_root": 41, "capset": 91}}


class JailError(Exception):
    pass


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise JailError(f"{what}: {os.strerror(err)} (errno {err})")
    return result


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# --- the file view -------------------------------------------------------------------------------


def _mount(libc, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None):
    _check(
        libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {source or fstype} on {target}",
    )


def _make_mountpoint(path: str, is_dir: bool) -> None:
    os.makedirs(path if is_dir else os.path.dirname(path), mode=0o755, exist_ok=True)
    if not is_dir and not os.path.exists(path):
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


class _Sources:
    """Everything the view takes from the host, opened while the jail still has the runtime's own
    identity: as root, the isolate's uid could not even traverse /root (mode 700), and files in the
    new tmpfs can be created only once the process has a uid that the namespace maps."""

    def __init__(self, spec: dict):
        self.binds: list[tuple[int, bool, str]] = []  # (O_PATH fd, is a folder, target)
        self.links: list[tuple[str, str]] = []  # (link text, target): /lib -> usr/lib
        self.files: list[tuple[bytes, str]] = []  # (content, target)
        for source, target in [*spec["binds"], *((f"/dev/{n}", f"/dev/{n}") for n in _DEV_NODES)]:
            if os.path.islink(source):
                self.links.append((os.readlink(source), target))
            elif os.path.exists(source):
                fd = os.open(source, os.O_PATH | os.O_CLOEXEC)
                self.binds.append((fd, stat.S_ISDIR(os.fstat(fd).st_mode), target))
        for source, target in spec.get("copies", []):
            if os.path.isfile(source):
                self.files.append((_read(source, 64 * 1024 * 1024), target))
        bundle = spec["bundle"]
        self.bundle = bundle["target"]
        self.files += _read_tree(
            bundle["source"],
            bundle["target"],
            set(bundle.get("skip", [])),
            bundle.get("max_files", 2000),
            bundle.get("max_bytes", 64 * 1024 * 1024),
        )


_DEV_NODES = ("null", "zero", "full", "random", "urandom")


def _read(path: str, limit: int) -> bytes:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise JailError(f"{path} is larger than {limit} bytes")
    return data


def _read_tree(source: str, target: str, skip: set[str], max_files: int, max_bytes: int):
    """The worker's bundle, read (regular files only) so that a copy the isolate's uid can read
    lands in the view whatever the folder's own modes; hidden files and folders (the runtime's
    .edge state among them, .git, .venv) stay out."""
    out, total = [], 0
    for root, dirs, names in os.walk(source):
        dirs[:] = sorted(
            d
            for d in dirs
            if os.path.join(root, d) not in skip
            and not d.startswith(".")
            and d not in ("__pycache__", "node_modules")
        )
        rel = os.path.relpath(root, source)
        for name in sorted(names):
            path = os.path.join(root, name)
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or path in skip or name.startswith("."):
                continue  # hidden files stay out too (.dev.vars holds local secrets)
            total += st.st_size
            if len(out) >= max_files or total > max_bytes:
                raise JailError(
                    f"the worker's folder {source} holds more than {max_files} files or "
                    f"{max_bytes // (1024 * 1024)} MB; give `main` a folder of its own"
                )
            out.append((_read(path, max_bytes), os.path.normpath(os.path.join(target, rel, name))))
    return out


def _bind_readonly(libc, fd: int, is_dir: bool, target: str) -> None:
    """The opened source at `target`, read-only, keeping the flags the kernel locks."""
    _make_mountpoint(target, is_dir)
    _mount(libc, f"/oldroot/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    have = os.statvfs(target).f_flag
    keep = sum(ms for st, ms in _KEEP.items() if have & st)
    _mount(libc, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)
    os.close(fd)


def _build_view(libc, sources: _Sources, spec: dict) -> None:
    """Mount a fresh tmpfs root, fill it from the sources, pivot into it, drop the old root."""
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    new_root = "/tmp"  # any directory does; it is covered only in this mount namespace
    _mount(libc, "tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=131072k")
    old = "/oldroot"
    os.mkdir(new_root + old, 0o700)
    _check(libc.syscall(_syscall("pivot_root"), new_root.encode(), (new_root + old).encode()), "pivot_root")
    os.chdir("/")
    os.makedirs("/dev", mode=0o755)
    for fd, is_dir, target in sources.binds:
        _bind_readonly(libc, fd, is_dir, target)
    for link, target in sources.links:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(link, target)
    os.makedirs(sources.bundle, mode=0o755, exist_ok=True)
    for data, target in sources.files:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
        os.chmod(target, 0o644)
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "fd/0"), ("stdout", "fd/1"), ("stderr", "fd/2")):
        os.symlink(link, f"/dev/{name}")
    os.makedirs("/tmp", mode=0o1777)
    tmp_kb = max(int(spec.get("tmp_bytes", 16 * 1024 * 1024)) // 1024, 4)
    _mount(libc, "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={tmp_kb}k")
    os.makedirs("/proc", mode=0o555)
    # a /proc of this PID namespace only: the worker sees its own processes and nothing else
    _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _check(libc.umount2(old.encode(), MNT_DETACH), "umount the old root")
    os.rmdir(old)
    _mount(libc, None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(sources.bundle)


def _syscall(name: str) -> int:
    try:
        return _SYSCALLS[platform.machine()][name]
    except KeyError:
        raise JailError(f"the jail does not know {name} on {platform.machine()}") from None


# --- identity and capabilities (the seccomp filter: runtime.isolate.seccomp) ------------------------


def _become_worker() -> None:
    """uid and gid 1000 inside (outside: the unprivileged uid the maps name); the capabilities
    this namespace gave us stay until _drop_privileges, since we were never its root."""
    os.setresgid(INSIDE_ID, INSIDE_ID, INSIDE_ID)
    os.setresuid(INSIDE_ID, INSIDE_ID, INSIDE_ID)


def _drop_privileges(libc) -> None:
    last_cap = 63
    while last_cap >= 0 and libc.prctl(PR_CAPBSET_DROP, last_cap, 0, 0, 0) < 0:
        last_cap -= 1  # find the kernel's highest capability: dropping beyond it fails
    for cap in range(last_cap + 1):
        _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty
    _check(libc.syscall(_syscall("capset"), header, data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no core dumps, no /proc/self/mem from a sibling


def _set_limits(spec: dict) -> None:
    limits = spec.get("rlimits", {})
    for name, value in limits.items():
        which = getattr(resource, f"RLIMIT_{name.upper()}")
        resource.setrlimit(which, (value, value))


# --- the processes -------------------------------------------------------------------------------


def _map_ids_as_root(pid: int, outside: int, ready_r: int, done_w: int) -> None:
    """The helper (still root outside): once the launcher has unshared, map its ids."""
    try:
        os.read(ready_r, 1)
        _write(f"/proc/{pid}/setgroups", "deny")
        _write(f"/proc/{pid}/uid_map", f"{INSIDE_ID} {outside} 1\n")
        _write(f"/proc/{pid}/gid_map", f"{INSIDE_ID} {outside} 1\n")
        os.write(done_w, b"1")
    finally:
        os._exit(0)


def _unshare(libc) -> None:
    if libc.unshare(NAMESPACES) < 0:
        err = ctypes.get_errno()
        sys.stderr.write(
            f"edge: the kernel refused to create user namespaces for an isolate ({os.strerror(err)}). "
            "Isolates need them: check `sysctl user.max_user_namespaces` (must be > 0), and where present "
            "`kernel.unprivileged_userns_clone=1` and `kernel.apparmor_restrict_unprivileged_userns=0`; "
            "or run `edge dev --insecure-isolation` (process separation and Landlock only).\n"
        )
        os._exit(NO_USER_NAMESPACES)


def run(spec: dict) -> None:
    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the runtime went: so do we
    seccomp_lib = load_seccomp_library() if spec.get("seccomp", True) else None
    outside_uid = spec.get("outside_uid") if os.geteuid() == 0 else None
    if outside_uid is not None:
        os.setgroups([])
        ready_r, ready_w = os.pipe()
        done_r, done_w = os.pipe()
        me = os.getpid()
        if os.fork() == 0:
            _map_ids_as_root(me, outside_uid, ready_r, done_w)
        _unshare(libc)
        os.write(ready_w, b"1")
        mapped = os.read(done_r, 1)
        os.wait()
        if mapped != b"1":
            raise JailError("mapping the isolate's uid failed")
    else:
        uid, gid = os.getuid(), os.getgid()
        _unshare(libc)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{INSIDE_ID} {uid} 1\n")
        _write("/proc/self/gid_map", f"{INSIDE_ID} {gid} 1\n")

    alive_r, alive_w = os.pipe()
    child = os.fork()
    if child:  # the launcher: stays outside the PID namespace until its child ends
        os.close(alive_r)
        _, status = os.waitpid(child, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    os.close(alive_w)
    os.set_blocking(alive_r, False)
    _die_with_launcher(libc, alive_r)
    sources = _Sources(spec)
    _become_worker()
    _build_view(libc, sources, spec)
    _drop_privileges(libc)
    _set_limits(spec)
    # a change of uid cleared PDEATHSIG: without it again, a launcher killed (SIGKILL from outside)
    # would leave this PID 1, and the request it runs, alive with no one to answer
    _die_with_launcher(libc, alive_r)
    os.close(alive_r)
    if seccomp_lib is not None:
        install_seccomp(seccomp_lib, NAMESPACES)
    argv = spec["argv"]
    os.execve(argv[0], argv, spec["env"])


def _die_with_launcher(libc, alive_r: int) -> None:
    """Be killed when the launcher dies; exit now if it already has (its end of the pipe closed)."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        if os.read(alive_r, 1) == b"":
            os._exit(SETUP_FAILED)
    except BlockingIOError:
        pass


def probe() -> None:
    """Exit 0 when this kernel lets the runtime build jails (a throwaway set of namespaces)."""
    libc = _libc()
    load_seccomp_library()
    _unshare(libc)
    os._exit(0)


def main() -> None:
    try:
        if sys.argv[1] == "--probe":
            probe()
        run(json.loads(sys.argv[1]))
    except (JailError, OSError) as exc:
        sys.stderr.write(f"edge: could not build the isolate's sandbox: {exc}\n")
        os._exit(SETUP_FAILED)


if __name__ == "__main__":
    main()
