"""Workloads for the capacity simulator: named profiles, a TOML/JSON workload file format, and
the draws a workload's requests are sampled with (capacity.sampling.sample_requests samples them;
the topology file lives in capacity.topology_file).

A workload file has the profile's fields (every one optional; a file can start from a profile
with `profile = "chat"`):

```toml
name = "support-bot"
profile = "chat"              # start from a named profile, then override

[arrivals]
process = "gamma"             # "poisson" or "gamma"
rate = 12.5                   # requests per second, all clients together
cv = 2.0                      # gamma: coefficient of variation of the gaps (1 = Poisson)

[prompt]                      # tokens; "lognormal" (mean, sigma of ln), "fixed" (mean), "uniform" (min..max)
dist = "lognormal"
mean = 1200
sigma = 0.7
min = 16
max = 16384

[output]
dist = "fixed"
mean = 300

[clients]                     # location (topology city, PoP code or "lat,lon") = weight
Seoul = 3
"New York" = 2
"-33.9,18.4" = 1

[slo]
ttft_ms = 2000
tpot_ms = 100

[tenants]                     # accounts sharing the arrivals, weight = share of the rate (optional)
light = 1
heavy = 10

[sessions]                    # multi-turn sessions with shared system prompts (the `agent` profile)
tenants = 4                   # accounts, each with its own system prompt
system_prompt = 3000          # tokens every request of a tenant starts with
turns = { dist = "fixed", mean = 4 }
think_s = 5.0                 # mean time from sending a turn to sending the next (exponential)
window = 4096                 # a session ends before a turn that would not fit
```

With `[sessions]`, `prompt` is each turn's new user message and `output` its reply; a turn's
prompt is the system prompt, the conversation so far and the new message, and `arrivals.rate`
counts requests (turns), sessions starting at rate / mean turns (capacity.sessions).

With `[tenants]`, each request is one account's, drawn by weight: the accounts' arrivals are then
independent processes at rate x weight / total (for Poisson arrivals, independent Poisson ones), as
bench/fairness.py sends a light and a heavy account; the simulator schedules them by fair shares
and the report gives each account's latency (`two_tenant_workload` builds that pair).

Unknown keys are reported as warnings and ignored; a wrong type fails with the key's path
(`arrivals.rate: expected float, got str`); a negative rate or length fails naming the key.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Literal

import msgspec

from capacity.draws import lognormal_lengths, poisson_times
from capacity.spec_files import convert_spec, read_spec_file
from capacity.topology_file import TopologySetup, load_topology  # re-exported: callers import them here
from edge_sim.roofline import SimulationError
from edge_sim.topology import Location, Topology, TopologyError

__all__ = [
    "PROFILES",
    "WORLD_CLIENTS",
    "Arrivals",
    "Lengths",
    "SLO",
    "Sessions",
    "SimulationError",
    "TopologySetup",
    "Workload",
    "WorkloadSample",
    "load_topology",
    "load_workload",
    "two_tenant_workload",
]


class Arrivals(msgspec.Struct, kw_only=True):
    process: Literal["poisson", "gamma"] = "poisson"
    rate: float = 10.0  # requests per second, all clients together
    cv: float = 1.0  # gamma only: coefficient of variation of inter-arrival gaps


class Lengths(msgspec.Struct, kw_only=True):
    dist: Literal["lognormal", "fixed", "uniform"] = "lognormal"
    mean: float = 256.0  # lognormal and fixed
    sigma: float = 0.6  # lognormal: standard deviation of ln(length)
    min: int = 1
    max: int = 32768


class SLO(msgspec.Struct, kw_only=True):
    ttft_ms: float = 2000.0
    tpot_ms: float = 100.0


class Sessions(msgspec.Struct, kw_only=True):
    """Multi-turn sessions over per-tenant shared system prompts (capacity.sessions samples them)."""

    tenants: int = 4
    system_prompt: int = 3000
    turns: Lengths = msgspec.field(default_factory=lambda: Lengths(dist="fixed", mean=4.0, min=1, max=64))
    think_s: float = 5.0
    window: int = 4096


class Workload(msgspec.Struct, kw_only=True):
    name: str = "custom"
    profile: str | None = None
    arrivals: Arrivals = msgspec.field(default_factory=Arrivals)
    prompt: Lengths = msgspec.field(default_factory=lambda: Lengths(mean=500.0))
    output: Lengths = msgspec.field(default_factory=lambda: Lengths(mean=250.0))
    clients: dict[str, float] = {}  # empty: WORLD_CLIENTS
    slo: SLO = msgspec.field(default_factory=SLO)
    sessions: Sessions | None = None  # None: independent requests
    tenants: dict[str, float] = {}  # account = weight of the arrival rate; empty: one account

    @property
    def max_context(self) -> int:
        """The longest prompt plus the longest output this workload can draw."""
        if self.sessions is not None:
            return self.sessions.window
        return _longest(self.prompt) + _longest(self.output)

    def describe(self) -> str:
        a = self.arrivals
        proc = "Poisson" if a.process == "poisson" else f"gamma cv {a.cv:g}"
        if self.sessions is not None:
            x = self.sessions
            return (
                f"{self.name}: {proc} {a.rate:g} req/s in sessions of {_describe(x.turns)} turns, "
                f"{x.tenants} tenants with {x.system_prompt}-token system prompts, user messages "
                f"{_describe(self.prompt)}, replies {_describe(self.output)}, think {x.think_s:g} s"
            )
        accounts = ""
        if self.tenants:
            total = sum(self.tenants.values())
            accounts = " (" + ", ".join(f"{k} {a.rate * w / total:g}" for k, w in self.tenants.items()) + ")"
        return (
            f"{self.name}: {proc} {a.rate:g} req/s{accounts}, prompt {_describe(self.prompt)}, "
            f"output {_describe(self.output)}"
        )


def _longest(x: Lengths) -> int:
    return min(x.max, max(x.min, int(round(x.mean)))) if x.dist == "fixed" else x.max


def _describe(x: Lengths) -> str:
    if x.dist == "fixed":
        return f"{int(x.mean)}"
    if x.dist == "uniform":
        return f"uniform {x.min}-{x.max}"
    return f"~{x.mean:g} (lognormal, {x.min}-{x.max})"


# Client mix weighted roughly by internet users per continent (ITU / DataReportal 2024 order of
# magnitude: Asia ~53%, Europe ~14%, Africa ~12%, North America ~11% (with Mexico), South
# America ~9%, Oceania ~1%), spread over large cities of each.
WORLD_CLIENTS: dict[str, float] = {
    # Asia 0.53
    "New Delhi": 0.10, "Mumbai": 0.08, "Chennai": 0.04, "Jakarta": 0.06, "Tokyo": 0.06,
    "Seoul": 0.03, "Manila": 0.03, "Bangkok": 0.03, "Hong Kong": 0.03, "Taipei": 0.02,
    "Singapore": 0.02, "Dubai": 0.02, "Kuala Lumpur": 0.01,
    # Europe 0.14
    "London": 0.025, "Paris": 0.02, "Frankfurt": 0.025, "Madrid": 0.015, "Milan": 0.015,
    "Warsaw": 0.01, "Istanbul": 0.02, "Stockholm": 0.01,
    # Africa 0.12
    "Lagos": 0.04, "Cairo": 0.03, "Nairobi": 0.02, "Johannesburg": 0.02, "Casablanca": 0.01,
    # North America 0.11
    "New York": 0.025, "Los Angeles": 0.02, "Chicago": 0.015, "Dallas": 0.015, "Toronto": 0.01,
    "Mexico City": 0.025,
    # South America 0.09
    "São Paulo": 0.04, "Buenos Aires": 0.015, "Bogotá": 0.015, "Lima": 0.01, "Santiago": 0.01,
    # Oceania 0.01
    "Sydney": 0.006, "Auckland": 0.002, "Perth": 0.002,
}  # fmt: skip

PROFILES: dict[str, Workload] = {
    # Conversational turns: short prompts, medium answers.
    "chat": Workload(
        name="chat",
        arrivals=Arrivals(rate=40.0),
        prompt=Lengths(mean=500.0, sigma=0.8, min=16, max=8192),
        output=Lengths(mean=250.0, sigma=0.6, min=1, max=2048),
    ),
    # Retrieval-augmented answers: long contexts of retrieved documents, short answers.
    "rag": Workload(
        name="rag",
        arrivals=Arrivals(rate=4.0),
        prompt=Lengths(mean=16000.0, sigma=0.4, min=8192, max=32768),
        output=Lengths(mean=300.0, sigma=0.5, min=1, max=2048),
    ),
    # Code completion and edits: a few files of context, longer outputs.
    "code": Workload(
        name="code",
        arrivals=Arrivals(rate=12.0),
        prompt=Lengths(mean=2000.0, sigma=0.6, min=64, max=16384),
        output=Lengths(mean=600.0, sigma=0.6, min=1, max=4096),
    ),
    # Agents: tenants' long shared system prompts, multi-turn sessions (the prefix cache's case),
    # sized for the miniatures' 4,096-token window.
    "agent": Workload(
        name="agent",
        arrivals=Arrivals(rate=8.0),
        prompt=Lengths(mean=60.0, sigma=0.5, min=8, max=160),
        output=Lengths(mean=80.0, sigma=0.5, min=1, max=160),
        sessions=Sessions(),
    ),
}


# --- checking and loading ---------------------------------------------------------------------


def _check_lengths(x: Lengths, key: str, source: str) -> None:
    def bad(field: str, value: Any, want: str) -> None:
        raise SimulationError(f"{source}: {key}.{field}: {want}, got {value!r}")

    if x.min < 1:
        bad("min", x.min, "must be at least 1 token")
    if x.max < x.min:
        bad("max", x.max, f"must be at least min ({x.min})")
    if x.dist in ("lognormal", "fixed") and not (x.mean > 0 and math.isfinite(x.mean)):
        bad("mean", x.mean, "must be a positive number of tokens")
    if x.dist == "lognormal" and not (x.sigma >= 0 and math.isfinite(x.sigma)):
        bad("sigma", x.sigma, "must be >= 0")


def _check_sessions(x: Sessions, source: str) -> None:
    for field in ("tenants", "window"):
        if getattr(x, field) < 1:
            raise SimulationError(
                f"{source}: sessions.{field}: must be at least 1, got {getattr(x, field)!r}"
            )
    if not 0 <= x.system_prompt < x.window:
        raise SimulationError(
            f"{source}: sessions.system_prompt: must be from 0 to below window ({x.window}), "
            f"got {x.system_prompt!r}"
        )
    if not (x.think_s >= 0 and math.isfinite(x.think_s)):
        raise SimulationError(f"{source}: sessions.think_s: must be >= 0 seconds, got {x.think_s!r}")
    _check_lengths(x.turns, "sessions.turns", source)


def check_workload(w: Workload, source: str = "workload") -> Workload:
    """Semantic checks; raises SimulationError naming the key."""
    a = w.arrivals
    if not (a.rate > 0 and math.isfinite(a.rate)):
        raise SimulationError(
            f"{source}: arrivals.rate: must be a positive number of requests/s, got {a.rate!r}"
        )
    if not (a.cv > 0 and math.isfinite(a.cv)):
        raise SimulationError(f"{source}: arrivals.cv: must be > 0, got {a.cv!r}")
    _check_lengths(w.prompt, "prompt", source)
    _check_lengths(w.output, "output", source)
    for loc, weight in w.clients.items():
        if not (weight >= 0 and math.isfinite(weight)):
            raise SimulationError(f"{source}: clients.{loc}: weight must be >= 0, got {weight!r}")
    if w.clients and sum(w.clients.values()) <= 0:
        raise SimulationError(f"{source}: clients: at least one weight must be > 0")
    if w.sessions is not None:
        _check_sessions(w.sessions, source)
        if w.tenants:
            raise SimulationError(f"{source}: tenants: sessions draw their own tenants (sessions.tenants)")
    for name, weight in w.tenants.items():
        if not (weight > 0 and math.isfinite(weight)):
            raise SimulationError(f"{source}: tenants.{name}: weight must be > 0, got {weight!r}")
    for field in ("ttft_ms", "tpot_ms"):
        value = getattr(w.slo, field)
        if not (value > 0 and math.isfinite(value)):
            raise SimulationError(f"{source}: slo.{field}: must be a positive number of ms, got {value!r}")
    return w


TWO_TENANT_PROMPT = Lengths(dist="uniform", min=40, max=160)  # bench/fairness.py's 40-120 words
TWO_TENANT_OUTPUT = Lengths(dist="fixed", mean=96.0, min=1, max=96)  # and its max_tokens


def two_tenant_workload(light_rate: float = 2.0, ratio: float = 10.0) -> Workload:
    """A light account at `light_rate` req/s and a heavy one at `ratio` times that, both sending
    from the PoP's city, short prompts and 96-token answers: bench/fairness.py's workload, whose
    figure of merit is the light account's p99 TTFT under the heavy neighbour."""
    return check_workload(
        Workload(
            name="two-tenant",
            arrivals=Arrivals(rate=light_rate * (1.0 + ratio)),
            prompt=TWO_TENANT_PROMPT,
            output=TWO_TENANT_OUTPUT,
            clients={"Seoul": 1.0},
            tenants={"light": 1.0, "heavy": ratio},
        ),
        "two-tenant workload",
    )


PROFILES["two-tenant"] = two_tenant_workload()


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in ("clients", "tenants"):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_workload(spec: str | Path) -> Workload:
    """A named profile (chat, rag, code, agent) or a TOML/JSON workload file."""
    text = str(spec)
    if text in PROFILES:
        return PROFILES[text]
    path = Path(text)
    if not path.exists():
        raise SimulationError(
            f"workload {text!r} is neither a profile ({', '.join(PROFILES)}) nor an existing TOML/JSON file"
        )
    data = read_spec_file(path)
    profile = data.get("profile")
    if profile is not None:
        if profile not in PROFILES:
            raise SimulationError(
                f"{path}: profile: unknown profile {profile!r}; use one of {', '.join(PROFILES)}"
            )
        data = _merge(msgspec.to_builtins(PROFILES[profile]), data)
        data.setdefault("name", profile)
    elif "name" not in data:
        data["name"] = path.stem
    return check_workload(convert_spec(data, Workload, str(path)), str(path))


# --- sampling: what capacity.sampling (independent requests) and capacity.sessions draw with -----


class WorkloadSample(msgspec.Struct):
    """Requests in arrival order: send time (s), prompt and output tokens, client index; with
    sessions, per request its session and turn and its prompt's block identities (the prefix
    cache's engine.sched.block_counts.BlockIds; None: not cached)."""

    times: list[float]
    prompts: list[int]
    outputs: list[int]
    clients: list[int]
    locations: list[Location]
    tenants: list[str] | None = None  # whose each request is (the policy's fair shares); None: one
    sessions: list[int] | None = None
    turns: list[int] | None = None  # 0 for a session's first
    block_ids: list[Any] | None = None  # None: no prefix cache modelled


def resolve_clients(w: Workload, topology: Topology) -> tuple[list[Location], list[float]]:
    mix = w.clients or WORLD_CLIENTS
    locations, weights = [], []
    for name, weight in mix.items():
        try:
            locations.append(topology.resolve_location(name))
        except TopologyError as exc:
            raise SimulationError(f"workload {w.name!r}: clients.{name}: {exc}") from None
        weights.append(float(weight))
    return locations, weights


def draw_lengths(rng: random.Random, x: Lengths, n: int) -> list[int]:
    lo, hi = x.min, x.max
    if x.dist == "fixed":
        v = min(hi, max(lo, int(round(x.mean))))
        return [v] * n
    if x.dist == "uniform":
        return [rng.randint(lo, hi) for _ in range(n)]
    mu = math.log(x.mean) - x.sigma * x.sigma / 2  # so that the mean before clipping is `mean`
    return lognormal_lengths(rng, mu, x.sigma, lo, hi, n)


def pick_clients(rng: random.Random, weights: list[float], n: int) -> list[int]:
    cum, total = [], 0.0
    for weight in weights:
        total += weight
        cum.append(total)
    return rng.choices(range(len(weights)), cum_weights=cum, k=n)


def arrival_times(rng: random.Random, arrivals: Arrivals, rate: float, duration_s: float) -> list[float]:
    """Send times over [0, duration_s) of the arrival process at `rate` per second."""
    if arrivals.process == "poisson":
        return poisson_times(rng, rate, duration_s)
    shape = 1.0 / (arrivals.cv * arrivals.cv)
    scale = 1.0 / (rate * shape)
    gv = rng.gammavariate
    times: list[float] = []
    t = 0.0
    while True:
        t += gv(shape, scale)
        if t >= duration_s:
            return times
        times.append(t)
