"""A workload's requests, drawn: `sample_requests` gives independent requests here and hands a
workload with `[sessions]` to capacity.sessions.

It is a module of its own, above both capacity.workload (the workload and the draws) and
capacity.sessions (which draws with capacity.workload's pieces), so that neither of those has to
import the other back: the choice between the two kinds of sample is made here, once.
"""

from __future__ import annotations

import math
import random

from capacity.sessions import sample_sessions
from capacity.workload import (
    Workload,
    WorkloadSample,
    arrival_times,
    draw_lengths,
    pick_clients,
    resolve_clients,
)
from edge_sim.roofline import SimulationError
from edge_sim.topology import Topology


def sample_requests(
    w: Workload, topology: Topology, duration_s: float, seed: int, rate_multiplier: float = 1.0
) -> WorkloadSample:
    """Arrivals over [0, duration_s) with their lengths and clients, deterministic for a seed."""
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise SimulationError(f"duration must be a positive number of seconds, got {duration_s!r}")
    if not rate_multiplier > 0:
        raise SimulationError(f"rate multiplier must be > 0, got {rate_multiplier!r}")
    if w.sessions is not None:
        return sample_sessions(w, topology, duration_s, seed, rate_multiplier)
    locations, weights = resolve_clients(w, topology)
    rng = random.Random(seed)
    times = arrival_times(rng, w.arrivals, w.arrivals.rate * rate_multiplier, duration_s)
    n = len(times)
    prompts = draw_lengths(rng, w.prompt, n)
    outputs = draw_lengths(rng, w.output, n)
    clients = pick_clients(rng, weights, n)
    tenants = None
    if w.tenants:  # drawn after everything else, so a sample's other draws do not depend on them
        names = list(w.tenants)
        tenants = [names[k] for k in pick_clients(rng, list(w.tenants.values()), n)]
    return WorkloadSample(times, prompts, outputs, clients, locations, tenants=tenants)
