"""The fleet on paper: the shipped topology with every GPU PoP serving full-size Kimi K2 and
GLM-4.5 in `edge plan`'s layout, for the chat, rag, code and agent workloads at 1x, 2x, 5x and
10x load, then the roofline against published serving numbers.

    python bench/fleet.py [--duration 120] [--seed 1] [--models kimi-k2:fp8,kimi-k2:int4,glm-4.5:fp8]
                          [--workloads chat,rag,code,agent] [--loads 1,2,5,10] [--concurrency 32]
                          [--kv fp8] [--json out.json] [--no-crosscheck]

Prints Markdown (the tables in BENCHMARKS.md "Fleet on paper"); `edge sim --fleet` runs the same
simulation from the command line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals per run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--models", default="kimi-k2:fp8,kimi-k2:int4,glm-4.5:fp8")
    ap.add_argument("--workloads", default="chat,rag,code,agent")
    ap.add_argument("--loads", default="1,2,5,10")
    ap.add_argument(
        "--concurrency", type=int, default=32, help="sequences per replica the layout is planned for"
    )
    ap.add_argument("--kv", default="fp8")
    ap.add_argument("--json", help="also write the fleet report as JSON here")
    ap.add_argument("--no-crosscheck", action="store_true")
    args = ap.parse_args()

    import msgspec

    from capacity.crosscheck import cross_check, format_cross_check
    from capacity.fleet import parse_models, run_fleet
    from capacity.report import _clean, to_json
    from capacity.report_fleet import format_fleet

    started = time.perf_counter()
    report = run_fleet(
        parse_models(args.models),
        [w.strip() for w in args.workloads.split(",") if w.strip()],
        [float(x) for x in args.loads.split(",") if x.strip()],
        duration_s=args.duration,
        seed=args.seed,
        kv=args.kv,
        concurrency=args.concurrency,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )
    wall = time.perf_counter() - started
    native = "interpreted (EDGE_NATIVE=0)" if os.environ.get("EDGE_NATIVE") == "0" else "native if built"
    print(f"<!-- bench/fleet.py: {len(report.rows)} runs in {wall:.0f} s wall, simulator {native} -->")
    print(format_fleet(report))
    if args.json:
        Path(args.json).write_text(to_json(_clean(msgspec.to_builtins(report))) + "\n")
    if not args.no_crosscheck:
        print("")
        print("roofline against published serving numbers (ours / theirs):")
        print("")
        print(format_cross_check(cross_check()))


if __name__ == "__main__":
    main()
