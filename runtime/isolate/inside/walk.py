"""A request's walk through this repository's files, recorded with sys.setprofile (bench/request_walk.py).

Only Python functions in files of this repository count (the standard library and site-packages
are left out; a call made through them, an event loop resuming a task say, is a call from the
nearest repository frame below, or from nowhere). A hop is a call from a function in one file to a
function in another; each caller-callee pair counts once, so a loop or a poll that repeats a call
adds nothing and the count does not depend on timing. A return is a hop into a file the walk had
already been in. `EDGE_REQUEST_WALK=1` makes an isolate record its side of each request and write
the summary to its stderr as one `EDGE_WALK {...}` line (runtime.isolate.inside.main).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENV = "EDGE_REQUEST_WALK"
MARK = "EDGE_WALK "
_ROOT = str(Path(__file__).resolve().parents[3]) + os.sep
_LEFT_OUT = (
    os.sep + ".venv" + os.sep,
    os.sep + "site-packages" + os.sep,
    os.sep + "tests" + os.sep,
    _ROOT + "bench" + os.sep,
)


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


class Walk:
    """The distinct cross-file calls one thread makes, in the order they first happen."""

    def __init__(self) -> None:
        self.edges: list[tuple[str, str, str, str]] = []  # caller file, function, callee file, function
        self._seen: set[tuple] = set()
        self._me = __file__

    def _ours(self, name: str) -> bool:
        return name.startswith(_ROOT) and name != self._me and not any(p in name for p in _LEFT_OUT)

    def _profile(self, frame, event, arg) -> None:
        if event != "call" or not self._ours(frame.f_code.co_filename):
            return
        caller = frame.f_back
        while caller is not None and not self._ours(caller.f_code.co_filename):
            caller = caller.f_back
        if caller is None or caller.f_code.co_filename == frame.f_code.co_filename:
            return
        edge = (caller.f_code, frame.f_code)
        if edge in self._seen:
            return
        self._seen.add(edge)
        cut = len(_ROOT)
        self.edges.append(
            (
                caller.f_code.co_filename[cut:],
                caller.f_code.co_name,
                frame.f_code.co_filename[cut:],
                frame.f_code.co_name,
            )
        )

    def start(self) -> None:
        sys.setprofile(self._profile)

    def stop(self) -> None:
        sys.setprofile(None)

    def summary(self, callers: tuple[str, ...] = ("",)) -> dict:
        """Hops, returns and files of the calls made from files under `callers` (all by default)."""
        edges = [e for e in self.edges if e[0].startswith(callers)]
        been: set[str] = set()
        returns = 0
        for source, _, target, _ in edges:
            been.add(source)
            if target in been:
                returns += 1
            been.add(target)
        return {
            "hops": len(edges),
            "returns": returns,
            "files": sorted(been),
            "path": [f"{a}:{f} -> {b}:{g}" for a, f, b, g in edges],
        }


def write_summary(walk: Walk) -> None:
    """One line on the process's own stderr (fd 2): the runtime reads it from the isolate's pipe.
    The isolate holds only runtime and workers files, so all its calls are in scope."""
    summary = walk.summary()
    line = MARK + json.dumps(summary, separators=(",", ":")) + "\n"
    if len(line) > 4000:  # the runtime keeps 4 KiB of a line (runtime.isolate.output): the counts fit
        summary.pop("path")
        line = MARK + json.dumps(summary, separators=(",", ":")) + "\n"
    os.write(2, line.encode())
