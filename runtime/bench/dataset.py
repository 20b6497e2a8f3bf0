"""What each benchmark request asks: a prompt of about N tokens and `max_tokens`.

`--dataset chat|rag|code|agent` (or a TOML/JSON workload file) draws prompt and output lengths
exactly as the capacity simulator does (capacity.sampling.sample_requests, with the same seed), so
`--compare-sim` can replay the very same requests; a `.jsonl` file gives them literally, one
{"prompt": ..., "max_tokens": ...} a line.

Tokens to text: a drawn length of N tokens becomes N words drawn from a list of short identifiers
that the shipped tokenizers (kimi-k2-mini's and glm-4.5-mini's, trained on Python sources) each
encode as one token, so a prompt measures N tokens plus the chat template's few; the counts
reported are the answers' own `usage`. The agent profile's turns share text as the simulator's
block identities say: the tenant's system prompt is the same words for every request of that
tenant, and a session's turns each extend the previous turn's text.

Lengths are clipped to `max_context` (the model's window, less a margin for the template): the
prompt to leave room for one output token, then the output to what is left."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import NamedTuple

import msgspec

from capacity.sampling import sample_requests
from capacity.workload import Workload, WorkloadSample, load_workload
from edge_sim.topology import Topology

PROFILE_NAMES = ("chat", "rag", "code", "agent")
TEMPLATE_MARGIN = 32  # tokens a chat template adds around the prompt
WORDS = (
    "self return None import value def for in if else name data result list dict key item line "
    "path file text args kwargs print range len True False class error type index start end count size"
).split()


class BenchRequest(NamedTuple):
    prompt: str
    prompt_len: int  # tokens drawn (a file's: its words); the answer's usage says what was served
    output_len: int  # sent as max_tokens
    session: str | None = None  # sent as x-session-affinity (a rollout's sticky split)


class Dataset(NamedTuple):
    name: str
    requests: list[BenchRequest]
    workload: Workload | None  # None for a JSONL file (no lengths to simulate)
    sample: WorkloadSample | None  # the simulator's draw the requests came from


def words(seed: object, n: int) -> str:
    """The first `n` words of the stream seeded by `seed`: the same seed's longer text starts
    with its shorter one."""
    rng = random.Random(str(seed))
    return " ".join(rng.choice(WORDS) for _ in range(n))


def clip(prompt: int, output: int, max_context: int) -> tuple[int, int]:
    if max_context <= 0:
        return prompt, output
    room = max(2, max_context - TEMPLATE_MARGIN)
    prompt = max(1, min(prompt, room - 1))
    return prompt, max(1, min(output, room - prompt))


def load_dataset(spec: str, n: int, seed: int, max_context: int, client_location: str) -> Dataset:
    """`n` requests of a profile or workload file (seeded), or the first `n` of a JSONL file."""
    if n < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {n}")
    if spec.endswith(".jsonl"):
        return Dataset(Path(spec).stem, _jsonl(Path(spec), n), None, None)
    workload = load_workload(spec)  # SimulationError names a bad profile or file
    workload = msgspec.structs.replace(workload, clients={client_location: 1.0})
    sample = draw(workload, n, seed)
    requests = []
    for i in range(n):
        p, o = clip(sample.prompts[i], sample.outputs[i], max_context)
        requests.append(BenchRequest(_text(sample, i, p, workload), p, o))
    return Dataset(workload.name, requests, workload, sample)


def draw(workload: Workload, n: int, seed: int) -> WorkloadSample:
    """The first `n` requests the simulator draws for this workload and seed."""
    topology = Topology.default()
    duration = 2.0 * n / workload.arrivals.rate + 10.0
    for _ in range(20):
        sample = sample_requests(workload, topology, duration, seed)
        if len(sample.times) >= n:
            return _first(sample, n)
        duration *= 2
    raise ValueError(f"the workload {workload.name!r} drew only {len(sample.times)} of {n} requests")


def _first(sample: WorkloadSample, n: int) -> WorkloadSample:
    cut = {
        f: (v[:n] if isinstance(v, list) and f != "locations" else v)
        for f, v in msgspec.structs.asdict(sample).items()
    }
    return WorkloadSample(**cut)


def _text(sample: WorkloadSample, i: int, tokens: int, workload: Workload) -> str:
    if sample.sessions is None or workload.sessions is None or sample.tenants is None:
        return words(("request", i), tokens)
    system = min(tokens, workload.sessions.system_prompt)
    own = words(("session", sample.sessions[i]), tokens - system)
    return (words(("system", sample.tenants[i]), system) + " " + own).strip()


def _jsonl(path: Path, n: int) -> list[BenchRequest]:
    if not path.is_file():
        raise ValueError(f"--dataset {path}: no such file")
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt, max_tokens = row["prompt"], int(row["max_tokens"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f'{path}:{number}: expected {{"prompt": "...", "max_tokens": N}} ({exc})'
            ) from None
        if not isinstance(prompt, str) or max_tokens < 1:
            raise ValueError(f"{path}:{number}: prompt must be a string and max_tokens at least 1")
        out.append(BenchRequest(prompt, len(prompt.split()), max_tokens))
        if len(out) == n:
            return out
    if not out:
        raise ValueError(f"{path}: no requests")
    return [out[i % len(out)] for i in range(n)]  # fewer lines than --num-prompts: cycled
