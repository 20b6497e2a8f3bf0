"""Test hosts as Linux network namespaces: each host is a namespace with `lo` up and a veth pair to
the root namespace on a /30 of its own (10.213.<k>.0/30: root side .1, host side .2), so a process
started in it is reached from the root namespace only over that link, which a test can cut.

Names are unique per test run (`ew-<pid>-<i>`); `Hosts.close` deletes what it made even when a test
failed, and a new `Hosts` first removes what a dead run left (its pid no longer alive).
Needs root and a kernel with network namespaces and veth; `problem()` says why not, for a skip.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

SUBNET = "10.213"
LOCK = "/tmp/edge-workers-test-hosts.lock"
_OURS = re.compile(r"^ew-(\d+)-\d+")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def problem() -> str | None:
    """Why test hosts cannot be made here (for pytest.skip), or None when they can."""
    if os.geteuid() != 0:
        return "test hosts are network namespaces: creating them needs root (CI runs these as root)"
    if shutil.which("ip") is None:
        return "test hosts need iproute2's `ip` command, which is not installed"
    probe = f"ew-{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def sweep_stale() -> None:
    """Remove namespaces and links a test run that died left behind (its pid is gone)."""
    names = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]
    for name in names:
        if (m := _OURS.match(name)) and not _pid_alive(int(m[1])):
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        link = line.split(":")[1].strip().split("@")[0]
        if (m := _OURS.match(link)) and not _pid_alive(int(m[1])):
            _ip("link", "del", link, check=False)


def _free_octets(count: int) -> list[int]:
    """Third octets of 10.213.<k>.0/30 subnets no address in the root namespace uses yet."""
    used = set(re.findall(rf"inet {re.escape(SUBNET)}\.(\d+)\.", _ip("-o", "addr", "show").stdout))
    free = [k for k in range(1, 255) if str(k) not in used]
    if len(free) < count:
        raise RuntimeError(f"no free {SUBNET}.<k>.0/30 subnets left for {count} test hosts")
    return free[:count]


@dataclass
class Host:
    """One test host: its namespace, the veth ends, and its address as the root namespace sees it."""

    name: str
    octet: int
    link_up: bool = True

    @property
    def root_link(self) -> str:
        return self.name + "r"

    @property
    def host_link(self) -> str:
        return self.name + "h"

    @property
    def address(self) -> str:
        return f"{SUBNET}.{self.octet}.2"

    @property
    def root_address(self) -> str:
        return f"{SUBNET}.{self.octet}.1"

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        """Take the root side of the link down: the host is unreachable, its processes keep running."""
        _ip("link", "set", self.root_link, "down")
        self.link_up = False

    def restore(self) -> None:
        _ip("link", "set", self.root_link, "up")
        self.link_up = True

    def netem_delay(self, ms: int) -> str | None:
        """Delay every packet leaving the root side by `ms` (tc netem); None, or why it failed."""
        added = subprocess.run(
            ["tc", "qdisc", "add", "dev", self.root_link, "root", "netem", "delay", f"{ms}ms"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return None if added.returncode == 0 else (added.stderr.strip() or f"tc exited {added.returncode}")


@dataclass
class Hosts:
    """`count` test hosts, made at once; `close()` (always call it) kills their processes and deletes them."""

    count: int
    hosts: list[Host] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        # one test process at a time picks free subnets and takes them (pytest-xdist runs several)
        with open(LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            sweep_stale()
            try:
                for i, octet in enumerate(_free_octets(self.count)):
                    host = Host(f"ew-{os.getpid()}-{i}", octet)
                    self.hosts.append(host)  # before it exists: close() removes a half-made one too
                    self._make(host)
            except BaseException:
                self.close()
                raise

    @staticmethod
    def _make(host: Host) -> None:
        _ip("netns", "add", host.name)
        _ip("link", "add", host.root_link, "type", "veth", "peer", "name", host.host_link)
        _ip("link", "set", host.host_link, "netns", host.name)
        _ip("addr", "add", f"{host.root_address}/30", "dev", host.root_link)
        _ip("link", "set", host.root_link, "up")
        _ip("-n", host.name, "addr", "add", f"{host.address}/30", "dev", host.host_link)
        _ip("-n", host.name, "link", "set", host.host_link, "up")
        _ip("-n", host.name, "link", "set", "lo", "up")

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def popen(self, host: Host, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start `argv` in `host` (`ip netns exec` execs it, so the pid is its own); close() kills it."""
        proc = subprocess.Popen(host.command(argv), **kwargs)
        self.processes.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for host in self.hosts:
            _ip("link", "del", host.root_link, check=False)  # deletes its peer too
            _ip("netns", "del", host.name, check=False)
