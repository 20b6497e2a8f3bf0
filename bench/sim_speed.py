"""Capacity simulator speed: simulated requests per second of wall time.

    python bench/sim_speed.py [--duration 600] [--repeats 3] [--workloads chat,code,rag] [--loads 1,4]

Each workload profile runs on the default world topology with Kimi K2 (fp8 weights, roofline cost
model) for `--duration` simulated seconds of arrivals, at each load multiplier and KV dtype; the
best of `--repeats` runs counts (the first run in a process also pays one-off imports, so one
warm-up run comes first). The baseline is the goal: 50,000 simulated requests per second of wall
time on a 2-core CPU; the last column is the ratio to it. The hot paths run compiled when their
build is current (engine.native: `make native`; the header says which); EDGE_NATIVE=0 runs them
interpreted, for comparison.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL = 50_000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", default="chat,code,rag")
    ap.add_argument("--loads", default="1,4")
    ap.add_argument("--kv", default="auto,int4")
    args = ap.parse_args()

    from capacity.costmodel import RooflineCostModel
    from capacity.report import summarize
    from capacity.simulator import simulate
    from capacity.workload import PROFILES
    from engine import native

    cost = RooflineCostModel("kimi-k2", "fp8")
    simulate(PROFILES["chat"], cost, "auto", duration_s=10, seed=0)  # warm-up: imports, caches

    cpu = platform.processor() or platform.machine()
    print(
        f"CPU: {cpu}, {os.cpu_count()} cores; python {platform.python_version()}; hot paths {native.status()}"
    )
    print(f"Kimi K2 fp8, default world, roofline; {args.duration:g} s of arrivals, best of {args.repeats}")
    print()
    print("| workload | load | KV | requests | wall s | simulated req/s | goal (baseline) | ratio |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name in args.workloads.split(","):
        workload = PROFILES[name]
        for load in (float(x) for x in args.loads.split(",")):
            for kv in args.kv.split(","):
                best = None
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    r = simulate(workload, cost, kv, duration_s=args.duration, seed=1, rate_multiplier=load)
                    wall = time.perf_counter() - started
                    best = wall if best is None or wall < best else best
                n = len(r.send_ms)
                rate = n / best
                o = summarize(r)["overall"]
                label = f"{load:g}x ({workload.arrivals.rate * load:g} req/s, {o['served']} served)"
                print(
                    f"| {name} | {label} | {kv} | {n:,} | {best:.3f} | {rate:,.0f} | {GOAL:,.0f} | "
                    f"{rate / GOAL:.2f} |"
                )


if __name__ == "__main__":
    main()
