"""The topology file `edge sim --topology FILE` reads: PoPs, GPUs per PoP, the network, GPU prices."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import msgspec

from capacity.spec_files import convert_spec, read_spec_file
from edge_sim.network import NetworkModel
from edge_sim.roofline import SimulationError, gpu_type
from edge_sim.topology import PoP, Topology, TopologyError


class TopologyFile(msgspec.Struct, kw_only=True):
    base: Literal["default", "empty"] = "default"
    pops: list[PoP] = []  # added, or replacing a PoP with the same code
    gpu_pops: dict[str, dict[str, int]] | None = None  # GPUs exactly at these PoPs
    network: NetworkModel = msgspec.field(default_factory=NetworkModel)
    prices: dict[str, float] = {}  # GPU type -> USD per GPU-hour


class TopologySetup(msgspec.Struct):
    topology: Topology
    network: NetworkModel
    prices: dict[str, float]


def load_topology(path: str | Path | None) -> TopologySetup:
    """The default world, or a TOML/JSON topology file:

    ```toml
    base = "default"                # or "empty" (only the PoPs listed below)
    [gpu_pops]                      # GPUs exactly at these PoPs, none elsewhere
    ICN = { H200 = 16 }
    FRA = { H200 = 8 }
    [[pops]]                        # extra PoPs (or replacements by code)
    code = "WLG"
    city = "Wellington"
    country = "NZ"
    continent = "OC"
    lat = -41.29
    lon = 174.78
    timezone = "Pacific/Auckland"
    gpus = { L40S = 8 }
    [network]
    base_ms = 2.0
    [prices]
    H200 = 3.20
    ```
    """
    if path is None:
        return TopologySetup(Topology.default(), NetworkModel(), {})
    p = Path(path)
    data = read_spec_file(p)
    spec: TopologyFile = convert_spec(data, TopologyFile, str(p))  # NetworkModel checks its own ranges
    for name, price in spec.prices.items():
        gpu_type(name)
        if not (price >= 0 and math.isfinite(price)):
            raise SimulationError(f"{p}: prices.{name}: must be >= 0 USD per GPU-hour, got {price!r}")
    try:
        if spec.base == "default":
            topo = Topology.default().with_overrides(gpu_pops=spec.gpu_pops, extra=spec.pops)
        else:
            topo = Topology(spec.pops)
            if spec.gpu_pops is not None:
                topo = topo.with_overrides(gpu_pops=spec.gpu_pops)
    except TopologyError as exc:
        raise SimulationError(f"{p}: {exc}") from None
    return TopologySetup(topo, spec.network, {gpu_type(k).name: v for k, v in spec.prices.items()})
