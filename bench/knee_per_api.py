"""The load each API holds on this machine: a `--sweep` of `edge bench serve` per API against one
`edge dev`, with the knee and the goodput at issue 18's SLO (not in CI).

    python bench/knee_per_api.py [--num-prompts 40] [--max-rate 16] [--apis workers-ai,openai-chat,worker]

One `edge dev` (one PoP, kimi-k2-mini) serves the three APIs in turn: the Workers AI REST API and the
OpenAI API (streamed, goodput at TTFT 500 ms and TPOT 50 ms), and a worker that calls
`env.AI.run` (POSTed the prompt; timed end to end only, so its goodput is at an E2EL SLO of
500 ms + 50 ms per output token of --worker-tokens). Each sweep doubles the rate from --start-rate
until throughput stops growing or a rate fails (runtime.bench.sweep); the table gives, per API,
the knee (latency grows non-linearly with load), the best goodput over the sweep (req/s meeting the
SLO) and its rate, and the P99 E2EL at the knee.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runtime.bench.devserver import MODEL, start_dev, write_project  # noqa: E402

WORKER = (
    "from workers import WorkerEntrypoint, Response\n\n"
    "class Default(WorkerEntrypoint):\n"
    "    async def fetch(self, request):\n"
    "        prompt = await request.text()\n"
    f"        out = await self.env.AI.run({MODEL!r}, {{'prompt': prompt, 'max_tokens': TOKENS}})\n"
    "        return Response(out['response'])\n"
)
TTFT_MS, TPOT_MS = 500, 50


def sweep(url: str, folder: Path, api: str, args: argparse.Namespace) -> dict:
    out = folder / f"sweep-{api}.json"
    cmd = [sys.executable, "-m", "runtime.cli", "bench", "serve", "--backend", api, "--base-url", url]
    cmd += ["--config", str(folder / "wrangler-like.toml"), "--dataset", args.dataset]
    cmd += ["--num-prompts", str(args.num_prompts), "--seed", "1", "--sweep", "--disable-tqdm"]
    cmd += ["--sweep-start-rate", str(args.start_rate), "--sweep-max-rate", str(args.max_rate)]
    cmd += ["--save-result", str(out), "--max-context", "1024"]
    if api == "worker":
        e2el = TTFT_MS + TPOT_MS * args.worker_tokens
        cmd += ["--method", "POST", "--goodput", f"e2el:{e2el}", "--no-stream"]
    else:
        cmd += ["--goodput", f"ttft:{TTFT_MS}", f"tpot:{TPOT_MS}"]
    subprocess.run(cmd, cwd=folder, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(out.read_text())


def p99_e2el(row: dict) -> float | None:
    return dict(map(tuple, row["stats"]["e2el"]["percentiles"])).get(99.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apis", default="workers-ai,openai-chat,worker")
    parser.add_argument("--dataset", default="chat")
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--start-rate", type=float, default=0.5)
    parser.add_argument("--max-rate", type=float, default=16.0)
    parser.add_argument("--worker-tokens", type=int, default=32, help="max_tokens the worker asks for")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_project(folder, "knee", worker=WORKER.replace("TOKENS", str(args.worker_tokens)))
        proc, url = start_dev(folder, {})
        try:
            for api in args.apis.split(","):
                body = sweep(url, folder, api, args)
                points = body["sweep"]
                best = max(points, key=lambda r: r["request_goodput"] or 0.0)
                knee = body["knee_rate"]
                at_knee = next((r for r in points if r["request_rate"] == knee), None)
                rows.append((api, knee, best, at_knee, points[-1]["request_rate"]))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print("\n| API | knee (req/s) | best goodput (req/s) | at rate | P99 E2EL at the knee (ms) | swept to |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for api, knee, best, at_knee, last in rows:
        p99 = f"{p99_e2el(at_knee):.0f}" if at_knee and p99_e2el(at_knee) is not None else "-"
        knee_text = f"{knee:g}" if knee is not None else f"none up to {last:g}"
        good, rate = best["request_goodput"], best["request_rate"]
        print(f"| {api} | {knee_text} | {good:.2f} | {rate:g} | {p99} | {last:g} |")


if __name__ == "__main__":
    main()
