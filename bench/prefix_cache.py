"""The prefix cache on an agent-style workload: a long shared system prompt, multi-turn sessions.

    python bench/prefix_cache.py [--model models/kimi-k2-mini] [--system 1024] [--sessions 4] [--turns 3]

Each turn's prompt is the system prompt, the session's conversation so far (its earlier messages
and the engine's replies) and a new user message. The turns run one at a time, the sessions round
robin, on one engine (float32 on the CPU), once with the prefix cache and once without, in the same
run. Reported: TTFT p50 (arrival to first token, as the engine measures it) and the prefill tokens
the steps counted; the ratio is without / with. One account sends everything: N accounts sharing
the system prompt would each compute it once (N-fold duplicate prefill).

The simulator's side: the same trace (the prompts and replies the engine served, one request at a
time, in the same order) replayed in `capacity.simulator.simulate` with the `agent` profile's block
identities (the system prompt's blocks shared, then the session's own), on a replica with the
engine's cache and limits and step times fitted to the steps of a calibration run first (the same
shape of workload, with and without the cache, cut from other text with another seed), so the
measured runs are predicted, not fitted. Reported: TTFT p50 and prefill tokens live against
simulated, and the relative error (goal within 10%). On a shared CPU the live step times are
noisy; the prefill tokens are exact or not.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def workload(ids: list[int], system: int, sessions: int, turns: int, user: int, seed: int):
    """The system prompt and, per session, its user messages (token ids cut from held-out text)."""
    rng = random.Random(seed)

    def cut(n: int) -> list[int]:
        start = rng.randrange(len(ids) - n)
        return ids[start : start + n]

    return cut(system), [[cut(user) for _ in range(turns)] for _ in range(sessions)]


def run(model: Path, caching: bool, system: list[int], messages, reply: int) -> dict:
    from engine import LLM, SamplingParams

    llm = LLM(model, device="cpu", prefix_caching=caching)
    eng = llm.engine
    params = SamplingParams(max_tokens=reply, temperature=0, ignore_eos=True)
    history = [list(system) for _ in messages]
    ttft, prefill, steps, trace = [], 0, [], []
    for turn in range(len(messages[0])):
        for s, session in enumerate(messages):
            prompt = history[s] + session[turn]
            rid = eng.add_request(prompt, params, tenant="agent")
            out, last = [], None
            while eng.has_unfinished():
                events = eng.step()
                steps.append(eng.steps[-1])
                prefill += eng.steps[-1].prefill_tokens
                for e in events:
                    if e.request_id == rid:
                        out.append(e.token_id)
                        last = e
            ttft.append(last.metrics.ttft_ms)
            trace.append((s, turn, len(prompt), len(out)))
            history[s] = prompt + out
    return {
        "ttft_p50_ms": statistics.median(ttft), "prefill_tokens": prefill, "requests": len(ttft),
        "steps": steps, "trace": trace, "engine": eng,
    }  # fmt: skip


class FittedSteps:
    """A replica that is the bench's engine (its blocks and limits) with step times fitted to steps
    it ran: ms = [decode only] a + [prefill] a' + b * prefill tokens + c * prefill pairs
    + d * decoders + e * their context."""

    name = model_name = "fitted"

    def __init__(self, engine, steps):
        from capacity.profile_fit import least_squares

        self.engine = engine
        rows = [
            [float(not s.prefill_tokens), float(bool(s.prefill_tokens)), s.prefill_tokens,
             s.prefill_pairs / 1e6, s.decode_tokens, s.decode_context / 1e3]
            for s in steps
        ]  # fmt: skip
        self.coef = least_squares(rows, [s.duration_ms for s in steps])

    def describe(self) -> str:
        return "step times fitted to a calibration run"

    def step_ms(self, prefill, pairs, prefill_kv, decoders, context) -> float:
        a, a_prefill, b, c, d, e = self.coef
        return (
            (a_prefill if prefill else a) + b * prefill + c * pairs / 1e6 + d * decoders + e * context / 1e3
        )

    def plan_pop(self, gpus, kv, min_kv_tokens):
        from capacity.costmodel import ReplicaPlan

        eng, cfg = self.engine, self.engine.scheduler.config
        return ReplicaPlan(
            "CPU", 1, 1, num_blocks=eng.cache.num_blocks, staging_blocks=eng.cache.staging_blocks,
            max_num_seqs=cfg.max_num_seqs, max_batched_tokens=cfg.max_num_batched_tokens,
            max_context=eng.context_window, step_ms=self.step_ms,
            decode_ms=lambda seqs, kv: self.step_ms(0, 0, 0, seqs, kv),
        )  # fmt: skip


def simulated(live: dict, cost: FittedSteps, system: int, caching: bool) -> dict:
    """The live trace replayed in the simulator, each request alone as it ran live."""
    from capacity.simulator import simulate
    from capacity.workload import TopologySetup, Workload, WorkloadSample, resolve_clients
    from edge_sim.network import NetworkModel
    from edge_sim.topology import Topology
    from engine.sched.block_counts import BlockIds
    from engine.sched.policy_types import BLOCK_TOKENS

    trace = live["trace"]
    topology = Topology.default().with_overrides(gpu_pops={"ICN": {"H200": 1}})
    workload = Workload(name="agent-replay", clients={"Seoul": 1})
    seoul, _ = resolve_clients(workload, topology)
    shared = [("agent", "system", i) for i in range(system // BLOCK_TOKENS)]
    n = len(trace)
    sample = WorkloadSample(
        [1000.0 * i for i in range(n)], [p for _, _, p, _ in trace], [o for _, _, _, o in trace],
        [0] * n, seoul, ["agent"] * n, sessions=[s for s, _, _, _ in trace],
        turns=[t for _, t, _, _ in trace],
        block_ids=[BlockIds(shared, ("agent", s)) for s, _, _, _ in trace] if caching else None,
    )  # fmt: skip
    r = simulate(
        workload, cost, duration_s=1000.0 * n, setup=TopologySetup(topology, NetworkModel(), {}),
        sample=sample, max_queue_ms=1e12,
    )  # fmt: skip
    ttft = [r.ttft_ms[i] - r.network_ms[i] for i in range(n)]  # the engine's: arrival to first token
    return {
        "ttft_p50_ms": statistics.median(ttft),
        "prefill_tokens": sum(p - c for p, c in zip(r.prompt, r.cached, strict=True)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=REPO / "models" / "kimi-k2-mini")
    parser.add_argument("--system", type=int, default=1024, help="system prompt tokens")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--user", type=int, default=48, help="tokens per user message")
    parser.add_argument("--reply", type=int, default=16, help="tokens per reply")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from engine.tokenizer import TextTokenizer

    ids = TextTokenizer(args.model).encode((REPO / "models" / "eval" / "heldout.txt").read_text())
    system, messages = workload(ids, args.system, args.sessions, args.turns, args.user, args.seed)
    off = run(args.model, False, system, messages, args.reply)
    on = run(args.model, True, system, messages, args.reply)
    print(
        f"model {args.model.name}, {args.system}-token system prompt, {args.sessions} sessions x "
        f"{args.turns} turns, {args.user}-token messages, {args.reply}-token replies, float32 CPU\n"
    )
    print("| prefix cache | TTFT p50 (ms) | prefill tokens |")
    print("| --- | --- | --- |")
    for name, r in (("off (baseline)", off), ("on", on)):
        print(f"| {name} | {r['ttft_p50_ms']:.1f} | {r['prefill_tokens']} |")
    print(
        f"\nratio off / on: TTFT p50 {off['ttft_p50_ms'] / on['ttft_p50_ms']:.2f}x, "
        f"prefill tokens {off['prefill_tokens'] / max(1, on['prefill_tokens']):.2f}x"
    )
    cal_system, cal_messages = workload(ids, args.system, args.sessions, args.turns, args.user, args.seed + 1)
    steps = [
        s
        for caching in (False, True)
        for s in run(args.model, caching, cal_system, cal_messages, args.reply)["steps"]
    ]
    cost = FittedSteps(off["engine"], steps)
    print("\nsimulator (`simulate()`, the same trace, step times fitted to a calibration run):\n")
    print("| prefix cache | TTFT p50 live / sim (ms) | error | prefill tokens live / sim | error |")
    print("| --- | --- | --- | --- | --- |")
    for name, r, caching in (("off", off, False), ("on", on, True)):
        sim = simulated(r, cost, args.system, caching)
        t_err = sim["ttft_p50_ms"] / r["ttft_p50_ms"] - 1
        p_err = sim["prefill_tokens"] / r["prefill_tokens"] - 1
        print(
            f"| {name} | {r['ttft_p50_ms']:.1f} / {sim['ttft_p50_ms']:.1f} | {100 * t_err:+.1f}% | "
            f"{r['prefill_tokens']} / {sim['prefill_tokens']} | {100 * p_err:+.1f}% |"
        )


if __name__ == "__main__":
    main()
