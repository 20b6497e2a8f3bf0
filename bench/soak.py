"""A soak: N minutes of steady load on `edge dev`, sampling what the runtime holds (not in CI).

    python bench/soak.py [--minutes 30] [--rate R | --sweep] [--interval 10] [--plot soak.png]
        [--url URL --pid PID]

The load is `--rate` req/s, or 70% of the knee that a short `--sweep` finds first (the rate where
latency grows non-linearly with load, runtime.bench.sweep.find_knee; 70% of the highest swept rate
when no knee shows), sent with runtime.bench over the Workers AI REST API in rounds of
`--round-prompts` requests. Every `--interval` seconds it samples the resident memory (RSS), open
files and threads of the runtime and every process under it (its isolates and PoP engine
processes), with psutil when installed, else from /proc. It prints one row per sample and a
summary: per role, the first and last values and the least-squares slope per hour, and the
requests that failed; with --plot, the lines (matplotlib). The goal is flat lines and no error.

Without --url it starts its own `edge dev` (runtime.bench.devserver: one PoP, the miniature), its
account's rate limit raised to `--rpm` (the default 300 rpm is far under a soak's load; with --url,
give the account room first, `edge accounts` / [edge.accounts.NAME] rpm). The 30-minute default is
for a quiet machine; a few minutes show whether anything climbs fast."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def children(pid: int) -> list[int]:
    """Every process under `pid` (from /proc: each task's children file)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def role(pid: int) -> str:
    """What a process is, from its command line: runtime, isolate, pop or other."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if "isolate" in cmd:
        return "isolate"
    if " pop " in cmd or "pop serve" in cmd or "engine" in cmd:
        return "pop"
    if "runtime.cli" in cmd and " dev" in cmd:
        return "runtime"
    return "other"


def process_sample(pid: int) -> dict[str, int] | None:
    """RSS bytes, open files and threads of one process (None once it is gone)."""
    try:
        import psutil

        p = psutil.Process(pid)
        with p.oneshot():
            return {"rss": p.memory_info().rss, "files": p.num_fds(), "threads": p.num_threads()}
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - psutil.NoSuchProcess and friends: it exited
        return None
    try:
        statm = Path(f"/proc/{pid}/statm").read_text().split()
        files = len(os.listdir(f"/proc/{pid}/fd"))
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None
    return {"rss": int(statm[1]) * PAGE, "files": files, "threads": threads}


def sample(root: int, at_s: float) -> dict:
    """One sample of `root` and everything under it, summed per role."""
    by_role: dict[str, dict[str, int]] = {}
    for pid in [root, *children(root)]:
        values = process_sample(pid)
        if values is None:
            continue
        name = "runtime" if pid == root else role(pid)
        total = by_role.setdefault(name, {"rss": 0, "files": 0, "threads": 0, "processes": 0})
        for k, v in values.items():
            total[k] += v
        total["processes"] += 1
    return {"t": at_s, "roles": by_role}


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per hour (0 for fewer than two)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mx) * (v - my) for t, v in points) / var * 3600.0


def summary(samples: list[dict], failed: int, completed: int) -> str:
    """Per role and measure: first, last and slope per hour; then the requests served and failed."""
    roles = sorted({r for s in samples for r in s["roles"]})
    lines = [f"{'role':8} {'measure':8} {'first':>10} {'last':>10} {'slope/hour':>11}"]
    for r in roles:
        for k, unit in (("rss", 2**20), ("files", 1), ("threads", 1), ("processes", 1)):
            pts = [(s["t"], s["roles"][r][k] / unit) for s in samples if r in s["roles"]]
            label = "RSS MiB" if k == "rss" else k
            lines.append(f"{r:8} {label:8} {pts[0][1]:10.1f} {pts[-1][1]:10.1f} {slope_per_hour(pts):+11.1f}")
    lines.append(f"requests: {completed} completed, {failed} failed")
    return "\n".join(lines)


def plot(samples: list[dict], path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"--plot {path}: matplotlib is not installed; no plot drawn"
    roles = sorted({r for s in samples for r in s["roles"]})
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    for ax, (k, label, unit) in zip(
        axes,
        (("rss", "RSS (MiB)", 2**20), ("files", "open files", 1), ("threads", "threads", 1)),
        strict=True,
    ):
        for r in roles:
            pts = [(s["t"] / 60, s["roles"][r][k] / unit) for s in samples if r in s["roles"]]
            ax.plot([t for t, _ in pts], [v for _, v in pts], "-o", markersize=3, label=r)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    axes[-1].set_xlabel("minutes")
    fig.suptitle("soak: the runtime, its isolates and PoP engines")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def knee_rate(target, tenant, dataset, log) -> float:
    """70% of the knee a short sweep finds (or of the highest rate swept when none shows)."""
    from runtime.bench.serve import Load, benchmark
    from runtime.bench.sweep import find_knee, format_sweep, run_sweep

    def run_at(rate: float):
        out = benchmark(target, [tenant], dataset, Load(request_rate=rate), [50.0, 99.0], {}, False)
        return out.metrics, out.duration_s

    points = run_sweep(run_at, 1.0, 32.0, 300.0, log)
    knee = find_knee(points)
    print(format_sweep(points, knee))
    base = points[knee].rate if knee is not None else points[-1].rate
    return 0.7 * base


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=float, help="req/s (default: 70%% of the --sweep knee)")
    p.add_argument("--sweep", action="store_true", help="find the knee first (the default without --rate)")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--round-prompts", type=int, default=20, help="requests per round of load")
    p.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    p.add_argument("--plot", help="draw the lines to this PNG")
    p.add_argument(
        "--rpm", type=int, default=1_000_000, help="requests per minute the soak's own account may send"
    )
    p.add_argument("--url", help="a running edge dev (default: start one)")
    p.add_argument("--pid", type=int, help="with --url: the runtime's process id, to sample")
    args = p.parse_args()
    from runtime.bench.devserver import start_dev, write_project

    proc = None
    with tempfile.TemporaryDirectory(prefix="edge-soak-") as tmp:
        if args.url:
            if args.pid is None:
                p.error("--url needs --pid (the runtime's process to sample)")
            url, root, folder = args.url, args.pid, None
        else:
            folder = Path(tmp)
            # the account's rate limit (300 rpm by default) would refuse a soak's load with 3036:
            # the soak measures the runtime, so its own account is given room for it
            write_project(folder, "soak", f"[edge.accounts.local]\nrpm = {args.rpm}\n")
            (folder / "soak.toml").write_text(
                f'name = "soak"\n[prompt]\ndist = "fixed"\nmean = 48\n[output]\ndist = "fixed"\n'
                f"mean = {args.max_tokens}\n"
            )
            proc, url = start_dev(folder, {"OMP_NUM_THREADS": "1"})
            root = proc.pid
        try:
            return soak(args, url, root, folder)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=60)


def soak(args, url: str, root: int, folder: Path | None) -> int:
    from runtime.bench.clients import Target
    from runtime.bench.dataset import load_dataset
    from runtime.bench.devserver import MODEL
    from runtime.bench.serve import Load, benchmark
    from runtime.bench.tenants import default_tenant

    config = str(folder / "wrangler-like.toml") if folder else None
    tenant = default_tenant(None, None, config)
    target = Target(backend="workers-ai", base_url=url, model=MODEL)
    spec = str(folder / "soak.toml") if folder else "chat"
    dataset = load_dataset(spec, args.round_prompts, 0, 2048, "Seoul")
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    rate = args.rate or knee_rate(target, tenant, dataset, log)
    print(f"soak: {args.minutes:g} min at {rate:.2f} req/s, a sample every {args.interval:g} s")
    stop, counts = threading.Event(), {"completed": 0, "failed": 0, "codes": {}}

    def drive() -> None:
        seed = 0
        while not stop.is_set():
            seed += 1
            out = benchmark(target, [tenant], dataset, Load(request_rate=rate, seed=seed), [99.0], {}, False)
            counts["completed"] += out.metrics.completed
            counts["failed"] += out.metrics.failed
            for code, n in out.metrics.failures_by_code.items():
                counts["codes"][code] = counts["codes"].get(code, 0) + n

    loader = threading.Thread(target=drive, daemon=True)
    started = time.monotonic()
    loader.start()
    samples = []
    while True:
        s = sample(root, time.monotonic() - started)
        samples.append(s)
        cells = "  ".join(
            f"{r}: {v['rss'] / 2**20:.0f} MiB {v['files']} files {v['threads']} thr"
            for r, v in s["roles"].items()
        )
        print(f"{s['t']:7.0f} s  {cells}", flush=True)
        if s["t"] >= args.minutes * 60:
            break
        time.sleep(max(0.0, args.interval - (time.monotonic() - started - s["t"])))
    stop.set()
    loader.join(timeout=120)
    print(summary(samples, counts["failed"], counts["completed"]))
    if counts["codes"]:
        print("failures by code: " + ", ".join(f"{c}: {n}" for c, n in counts["codes"].items()))
    if args.plot:
        print(plot(samples, args.plot))
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
