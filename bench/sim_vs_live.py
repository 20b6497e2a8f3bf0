"""Does the capacity simulator agree with the real thing? The same request trace is sent live to
`edge dev` (our engine, network in account mode, through the Workers AI REST API) and replayed
in `edge sim`'s simulator; prints the relative error of p50 and p90 TTFT, TPOT and end-to-end
latency, for two cost models of our engine on this machine:

* profiled: the engine measured alone (`ProfiledCostModel.profile`);
* fitted to serving: the same formulas fitted to the steps `edge dev` recorded (EDGE_STEP_LOG)
  while it served a *different* trace first (a calibration run with another seed), so the replayed
  trace is never the one the step times were fitted to.

    python bench/sim_vs_live.py [--rate 4] [--duration 60] [--threads 1] [--seed 1] [--slow]
    python bench/sim_vs_live.py --two-tenant [--rate 2] [--duration 60]   # light at rate, heavy at 10x
    python bench/sim_vs_live.py --keep DIR ...    # save the traces, live answers and step logs
    python bench/sim_vs_live.py --replay DIR      # fit and replay what --keep saved, no live run
    python bench/sim_vs_live.py --bracket ...     # calibrate before and after the live run, fit to both

`--slow` emulates a slower host: the whole bench (profile, calibration and live runs) runs beside a
process that keeps one core busy (bounded: it ends itself after the bench's longest possible run and
is killed when the bench ends), with the engine on one torch thread.

`--two-tenant`: the workload is capacity's two-tenant one (a light account at --rate and a heavy one
at 10x, as bench/fairness.py sends them, both at the PoP), served live under fair shares by two real
accounts, and the simulator's per-account TTFT (the server part: queue + prefill, as fairness.py
reports it) is compared with live, the light account's p99 first (goal: within 15%).

Goal: within 10% (the fitted cost model). The trace is drawn from a workload (Poisson arrivals,
log-normal prompts of about 300 tokens, 16-96 output tokens, clients around the world); what the
live run actually produced (prompt and output token counts per request) is what the simulator replays, so both
sides serve exactly the same requests at exactly the same times. One GPU PoP (ICN) serves: on a
2-core machine the in-process PoPs of `edge dev` would share the CPU, which simulated PoPs, each
with its own GPUs, do not. The engine and the profile use `--threads` torch threads, leaving the
other core to the HTTP server and the load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.dev_project import MODEL, start_dev, wait_compiled, write_project  # noqa: E402
from capacity.profile import ProfiledCostModel  # noqa: E402
from capacity.report import percentile  # noqa: E402
from capacity.sampling import sample_requests  # noqa: E402
from capacity.serving_fit import charged_ms, describe_fit, fit_serving_steps, load_step_log  # noqa: E402
from capacity.simulator import SERVED, refusals, simulate  # noqa: E402
from capacity.workload import (  # noqa: E402
    TopologySetup,
    WorkloadSample,
    check_workload,
    load_workload,
    two_tenant_workload,
)
from edge_sim.network import NetworkModel  # noqa: E402
from edge_sim.topology import Topology  # noqa: E402
from runtime.control.state import State  # noqa: E402

MODEL_DIR = REPO / "models" / "kimi-k2-mini"
CLIENTS = {"Seoul": 4, "Tokyo": 3, "Singapore": 2, "Frankfurt": 1, "New York": 1}
TWO_TENANT_RATIO = 10.0
ACCOUNTS = """
[edge.accounts.heavy]
rpm = 1000000
[edge.accounts.light]
rpm = 1000000
"""

WORKLOAD = """
name = "fidelity"
[arrivals]
process = "poisson"
rate = {rate}
[prompt]
dist = "lognormal"
mean = 300
sigma = 0.6
min = 32
max = 1500
[output]
dist = "uniform"
min = 16
max = 96
[clients]
{clients}
"""


class Burner:
    """The slower host's other load: a process that keeps one core busy. Bounded: it ends itself
    after `limit_s` whatever happens to this one, and `stop` ends it at once."""

    def __init__(self, limit_s: float):
        code = f"import time\nend = time.monotonic() + {limit_s:.0f}\nwhile time.monotonic() < end: pass\n"
        self.proc = subprocess.Popen([sys.executable, "-c", code])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def prompt_of(tokenizer, ids: list[int], n: int, offset: int) -> str:
    """Held-out text of about `n` tokens (the live run reports the exact count)."""
    start = offset % max(1, len(ids) - n)
    return tokenizer.decode(ids[start : start + n])


async def run_live(
    url: str, tokens: dict[str, str], sample: WorkloadSample, prompts: list[str]
) -> list[dict | None]:
    """Send each request at its time (as its tenant, when the sample has them); return each answer's
    timing and usage (None if it failed)."""
    results: list[dict | None] = [None] * len(prompts)
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:

        async def one(i: int, at: float) -> None:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
            loc = sample.locations[sample.clients[i]]
            account = sample.tenants[i] if sample.tenants else "local"
            r = await client.post(
                f"{url}/client/v4/accounts/{account}/ai/run/{MODEL}",
                headers={"authorization": f"Bearer {tokens[account]}", "x-edge-client-location": loc.name},
                json={"prompt": prompts[i], "max_tokens": sample.outputs[i], "temperature": 0},
            )
            if r.status_code == 200:
                body = r.json()["result"]
                results[i] = {**body["timing"], **body["usage"]}
            else:
                print(f"request {i}: HTTP {r.status_code} {r.text[:200]}", file=sys.stderr)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i, t) for i, t in enumerate(sample.times)))
    return results


def start(
    tmp: Path, threads: int, step_log: Path | None, two_tenant: bool
) -> tuple[subprocess.Popen, str, dict[str, str]]:
    write_project(tmp, "fidelity", ACCOUNTS if two_tenant else "")
    tokens = {}
    if two_tenant:  # real accounts in its database (fair shares between them), rate limits lifted
        state = State(tmp / ".edge" / "state.db")
        tokens = {name: state.create_token(name, "bench") for name in ("heavy", "light")}
        state.close()
    env = {"OMP_NUM_THREADS": str(threads)}
    if step_log is not None:
        env["EDGE_STEP_LOG"] = str(step_log)
    proc, url = start_dev(tmp, env)
    print(f"  live edge: {wait_compiled(url, tmp)}", flush=True)  # (steps timed before it: compiles)
    tokens["local"] = (tmp / ".edge" / "api-token").read_text().strip()
    return proc, url, tokens


def error_row(name: str, live: list[float], sim: list[float], qs=(50, 90)) -> tuple[str, list[str], float]:
    live, sim = sorted(live), sorted(sim)
    cells, worst = [], 0.0
    for q in qs:
        lv, sv = percentile(live, q), percentile(sim, q)
        err = (sv - lv) / lv if lv else math.nan
        worst = max(worst, abs(err)) if not math.isnan(err) else math.inf
        cells += [f"{lv:.1f}", f"{sv:.1f}", f"{err * 100:+.1f}%"]
    return name, cells, worst


def live_run(tmp: Path, args, trace: WorkloadSample, prompts: list[str], step_log: Path | None):
    proc, url, tokens = start(tmp, args.threads, step_log, args.two_tenant)
    try:
        return asyncio.run(run_live(url, tokens, trace, prompts))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def replay_of(trace: WorkloadSample, live: list[dict | None]) -> tuple[list[int], WorkloadSample]:
    """What was served live (same times, clients, tenants and actual token counts), as a sample."""
    ok = [i for i, r in enumerate(live) if r is not None]
    replay = WorkloadSample(
        [trace.times[i] for i in ok],
        [live[i]["prompt_tokens"] for i in ok],
        [live[i]["completion_tokens"] for i in ok],
        [trace.clients[i] for i in ok],
        trace.locations,
        tenants=[trace.tenants[i] for i in ok] if trace.tenants else None,
    )
    return ok, replay


def replay_errors(workload, cost, args, setup, trace, live) -> tuple[list, float, str]:
    """Replay what was served live in the simulator, with the live edge's admission (none: the
    bench's project takes every request), so every request is served or the reason is printed."""
    ok, replay = replay_of(trace, live)
    started = time.perf_counter()
    sim = simulate(
        workload, cost, "auto", duration_s=args.duration, seed=args.seed, setup=setup, sample=replay,
        max_queue_ms=math.inf,
    )  # fmt: skip
    sim_wall = time.perf_counter() - started
    served = [j for j, s in enumerate(sim.status) if s == SERVED]
    refused = refusals(sim)
    if refused:
        print(f"the simulator did not serve {len(ok) - len(served)} of {len(ok)} requests: {refused}")
    max_running = max(r.max_running for r in sim.replicas)

    def live_of(key: str, idx=None) -> list[float]:
        idx = ok if idx is None else idx
        return [live[i][key] for i in idx if not (key == "tpot_ms" and live[i]["completion_tokens"] < 2)]

    def sim_of(values: list[float], idx=None) -> list[float]:
        return [values[j] for j in (served if idx is None else idx) if not math.isnan(values[j])]

    if args.two_tenant:  # per account, the server part of TTFT (queue + prefill), as fairness.py
        rows, worst = [], math.inf
        for tenant in ("light", "heavy"):
            mine = [j for j in served if replay.tenants[j] == tenant]
            lv = [live[ok[j]]["queue_ms"] + live[ok[j]]["prefill_ms"] for j in mine]
            sv = [sim.ttft_ms[j] - sim.network_ms[j] for j in mine]
            rows.append(error_row(f"{tenant}: TTFT (queue + prefill), p50 / p99", lv, sv, (50, 99)))
            if tenant == "light":  # the goal: the light account's p99 (within 15%)
                worst = abs(percentile(sorted(sv), 99) / percentile(sorted(lv), 99) - 1.0)
        rows.append(error_row("(all: TPOT)", live_of("tpot_ms"), sim_of(sim.tpot_ms), (50, 99)))
    else:
        server_ttft_live = [live[i]["queue_ms"] + live[i]["prefill_ms"] for i in ok]
        server_ttft_sim = [sim.ttft_ms[j] - sim.network_ms[j] for j in served]
        rows = [
            error_row("TTFT (network + queue + prefill)", live_of("ttft_ms"), sim_of(sim.ttft_ms)),
            error_row("(server part of TTFT: queue + prefill)", server_ttft_live, server_ttft_sim),
            error_row("TPOT", live_of("tpot_ms"), sim_of(sim.tpot_ms)),
            error_row("end-to-end", live_of("total_ms"), sim_of(sim.e2e_ms)),
        ]
        # the goal covers what a client sees; the server part is a view
        worst = max(w for name, _, w in rows if not name.startswith("("))
    if len(served) != len(ok):
        worst = math.inf  # a replay that lost requests is no agreement, whatever its percentiles
    what = (
        f"{len(ok)} requests ({len(live) - len(ok)} failed live), {len(served)} served by the simulator, "
        f"simulated in {sim_wall * 1000:.0f} ms, at most {max_running} running"
    )
    return rows, worst, what


def print_table(title: str, rows: list, worst: float, goal: float, two_tenant: bool) -> None:
    print(f"\n{title}\n")
    q = "p99" if two_tenant else "p90"
    print(f"| metric (ms) | live p50 | sim p50 | error | live {q} | sim {q} | error |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, cells, _ in rows:
        print(f"| {name} | " + " | ".join(cells) + " |")
    what = "the light account's p99 TTFT" if two_tenant else "TTFT, TPOT and end-to-end"
    print(f"\nlargest |error| of {what}: {worst * 100:.1f}% (goal <= {goal * 100:.0f}%)")


def live_step_summary(steps: list[dict]) -> str:
    """What the live engine's steps were: how many, their batch sizes and durations."""
    if not steps:
        return "no steps logged"
    batches = sorted(s["decode_tokens"] for s in steps)
    ms = sorted(s["duration_ms"] for s in steps)
    return (
        f"{len(steps)} steps, decoders p50 {percentile(batches, 50):.0f} / p99 {percentile(batches, 99):.0f} "
        f"/ max {batches[-1]}, step ms p50 {percentile(ms, 50):.1f} / p99 {percentile(ms, 99):.1f}"
    )


def steps_error(cost, steps: list[dict]) -> str:
    """The cost model's total for the live run's own steps against what they took: the step model's
    share of a replay's error (the rest is the queueing that a step time's error feeds)."""
    if not steps:
        return "-"
    fit = cost.fits["auto"]
    pred = sum(
        fit.step_ms(s["prefill_tokens"], s["prefill_pairs"], 0, s["decode_tokens"], s["decode_context"])
        for s in steps
    )
    return f"{pred / sum(charged_ms(steps)) - 1:+.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rate", type=float, default=None, help="req/s (4; --two-tenant: the light one's, 2)"
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the engine and the profile")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", default=None, help="profile file (default: a fresh one in a temp dir)")
    parser.add_argument("--slow", action="store_true", help="emulate a slower host (a core kept busy beside)")
    parser.add_argument("--two-tenant", action="store_true", help="a light account and a heavy one at 10x")
    parser.add_argument("--keep", default=None, help="save traces, live answers and step logs in this folder")
    parser.add_argument(
        "--bracket", action="store_true", help="fit to calibration runs before and after the live one"
    )
    parser.add_argument("--replay", default=None, help="no live run: fit and replay what --keep saved here")
    args = parser.parse_args()
    if args.replay:
        saved = json.loads((Path(args.replay) / "run.json").read_text())
        for key in ("rate", "duration", "seed", "two_tenant", "slow", "threads", "bracket"):
            setattr(args, key, saved["args"].get(key, False))
    if args.rate is None:
        args.rate = 2.0 if args.two_tenant else 4.0
    if args.slow:
        args.threads = 1

    keep = Path(args.replay or args.keep or tempfile.mkdtemp(prefix="sim-vs-live-"))
    keep.mkdir(parents=True, exist_ok=True)
    if args.two_tenant:
        workload = two_tenant_workload(args.rate, TWO_TENANT_RATIO)
    else:
        clients = "\n".join(f'"{k}" = {v}' for k, v in CLIENTS.items())
        (keep / "workload.toml").write_text(WORKLOAD.format(rate=args.rate, clients=clients))
        workload = check_workload(load_workload(keep / "workload.toml"))
    topology = Topology.default().with_overrides(gpu_pops={"ICN": {"H200": 1}})
    network = NetworkModel()  # the same defaults as edge dev's [edge.network]
    setup = TopologySetup(topology, network, {})
    calibration = sample_requests(workload, topology, args.duration, args.seed + 1000)
    trace = sample_requests(workload, topology, args.duration, args.seed)
    step_log, live_log = keep / "calibration-steps.jsonl", keep / "live-steps.jsonl"
    profile_path = Path(args.profile) if args.profile else keep / "profile.json"

    if args.replay:
        profiled = ProfiledCostModel.load(profile_path)
        live = saved["live"]
    else:
        burner = Burner(limit_s=60 + 6 * args.duration + 900) if args.slow else None
        try:
            live = measure(args, workload, calibration, trace, profile_path, step_log, live_log, keep)
        finally:
            if burner is not None:
                burner.stop()
        profiled = ProfiledCostModel.load(profile_path)
        (keep / "run.json").write_text(json.dumps({"args": vars(args), "live": live}))
    calibration_steps = load_step_log(step_log)
    after_log = keep / "calibration-after-steps.jsonl"
    if args.bracket and after_log.is_file():  # its own engine name: its clock is another process's
        calibration_steps += [
            {**s, "engine": f"{s.get('engine', '')}, after"} for s in load_step_log(after_log)
        ]
    fitted = fit_serving_steps(calibration_steps, profiled)

    host = f"engine on {profiled.device}" + (", beside a core kept busy (--slow)" if args.slow else "")
    kind = (
        f"two tenants (light {args.rate:g} req/s, heavy {TWO_TENANT_RATIO:g}x)"
        if args.two_tenant
        else (f"{args.rate:g} req/s")
    )
    print(
        f"\n{kind} for {args.duration:.0f} s, one PoP (ICN), {host}; "
        f"calibration trace seed {args.seed + 1000}, replayed trace seed {args.seed}; saved in {keep}"
    )
    print(f"calibration steps: {live_step_summary(calibration_steps)}")
    if live_log.is_file():
        print(f"live steps: {live_step_summary(load_step_log(live_log))}")
    goal_fit = 0.15 if args.two_tenant else 0.10
    for title, cost, goal in (
        ("profiled (engine alone)", profiled, goal_fit if args.two_tenant else 0.25),
        ("fitted to serving steps", fitted, goal_fit),
    ):
        rows, worst, what = replay_errors(workload, cost, args, setup, trace, live)
        if live_log.is_file():
            what += f"; its total for the live run's own steps {steps_error(cost, load_step_log(live_log))}"
        print_table(f"{title}: {what}; {describe_fit(cost.fits['auto'])}", rows, worst, goal, args.two_tenant)


def measure(args, workload, calibration, trace, profile_path, step_log, live_log, keep) -> list[dict | None]:
    """Profile the engine, serve the calibration trace (logging its steps), then the trace."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    heldout = tokenizer.encode((REPO / "models" / "eval" / "heldout.txt").read_text()).ids

    def prompts_of(sample: WorkloadSample, salt: int) -> list[str]:
        return [prompt_of(tokenizer, heldout, n, 7919 * i + salt) for i, n in enumerate(sample.prompts)]

    existing = ProfiledCostModel.load(profile_path) if profile_path.is_file() else None
    print(f"profiling the engine ({args.threads} thread(s)) ...", file=sys.stderr)
    ProfiledCostModel.ensure(profile_path, MODEL_DIR, ["auto"], existing=existing, threads=args.threads)
    for log in (step_log, live_log):
        log.unlink(missing_ok=True)
    print(f"calibration: {len(calibration.times)} requests over {args.duration:.0f} s ...", file=sys.stderr)
    (keep / "calibration").mkdir(exist_ok=True)
    live_run(keep / "calibration", args, calibration, prompts_of(calibration, 104729), step_log)
    print(
        f"live: {len(trace.times)} requests over {args.duration:.0f} s against edge dev ...", file=sys.stderr
    )
    (keep / "live").mkdir(exist_ok=True)
    live = live_run(keep / "live", args, trace, prompts_of(trace, 0), live_log)
    if args.bracket:  # a second calibration trace after the live run: a host's drift averages out
        after = sample_requests(workload, Topology.default(), args.duration, args.seed + 2000)
        print(
            f"calibration after: {len(after.times)} requests over {args.duration:.0f} s ...", file=sys.stderr
        )
        (keep / "calibration-after").mkdir(exist_ok=True)
        after_log = keep / "calibration-after-steps.jsonl"
        after_log.unlink(missing_ok=True)
        live_run(keep / "calibration-after", args, after, prompts_of(after, 15485863), after_log)
    return live


if __name__ == "__main__":
    main()
