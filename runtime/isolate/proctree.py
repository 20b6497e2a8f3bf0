"""What a whole isolate uses, read from the kernel's own accounting in /proc.

An isolate is a tree of processes (the jail's launcher, the worker's interpreter as PID 1 of its
namespace, anything it forks, their threads). Its CPU time is every live process's own time plus
what its reaped children used (cutime/cstime), so a child that forks, spins and exits is still
counted; its memory is the resident anonymous pages of every process together, each page shared
copy-on-write after a fork counted once (proportional set size), so forking alone costs nothing
but what the children then write costs in full.
"""

from __future__ import annotations

import os
from typing import NamedTuple

_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class TreeUsage(NamedTuple):
    cpu_ms: float
    memory_bytes: int
    processes: int


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def tree(root: int) -> list[int]:
    """`root` and every process below it."""
    seen, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        todo.extend(_children(pid))
    return seen


def _anon_bytes(pid: int, shared: bool) -> int:
    """Resident anonymous memory: from statm (cheap) while nothing can share pages with this
    process, else its proportional share from smaps_rollup (a fork shares pages until written)."""
    if shared:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss_Anon:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
    with open(f"/proc/{pid}/statm") as f:
        statm = f.read().split()
    return max(int(statm[1]) - int(statm[2]), 0) * _PAGE  # resident minus file-backed/shared


def usage(root: int) -> TreeUsage | None:
    """CPU and memory of the tree under `root`; None once `root` has gone."""
    pids = tree(root)
    forked = len(pids) > 2  # beyond the jail's launcher and the worker's interpreter
    cpu_ticks, memory, count = 0, 0, 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            memory += _anon_bytes(pid, forked)
        except OSError:
            if pid == root:
                return None
            continue  # it ended between listing and reading: its time is in its parent's now
        # utime, stime, cutime, cstime are fields 14-17 of stat (11-14 after the name)
        cpu_ticks += sum(int(v) for v in fields[11:15])
        count += 1
    return TreeUsage(cpu_ticks * _TICK_MS, memory, count)
