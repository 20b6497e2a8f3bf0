"""Network latency model: round-trip times from geography.

RTT = base + 2 * distance * inflation / FIBRE_KM_PER_MS, optionally with seeded gaussian
jitter. Client <-> PoP paths go over the public internet (more detour, higher inflation);
PoP <-> PoP paths use the private backbone (straighter, smaller base).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import msgspec

# The distance function lives in topology (resolving "lat,lon" needs it, and topology must
# not import this module); re-exported here as part of the network API.
from edge_sim.topology import EARTH_RADIUS_KM, Location, PoP, TopologyError, great_circle_km

__all__ = ["EARTH_RADIUS_KM", "FIBRE_KM_PER_MS", "NetworkModel", "great_circle_km"]

FIBRE_KM_PER_MS = 204.0  # light in fibre (refractive index ~1.47), one way


class NetworkModel(msgspec.Struct, frozen=True, dict=True):
    """RTT model. Equal settings compare equal; each instance owns its jitter RNG.

    The RNG lives in the instance ``__dict__`` (enabled by ``dict=True``), not in a field: so it is
    never encoded, compared or hashed, and is freed with the instance (a module-level dict keyed by
    id() would leak and could hand a stale RNG to a new object at a reused address). Frozen
    structs refuse ``setattr`` but their ``__dict__`` can still be written.
    """

    base_ms: float = 2.0  # per-RTT fixed cost (last mile, switching); why short paths inflate more
    inflation: float = 2.0  # client <-> PoP fibre path length over the great circle
    backbone_inflation: float = 1.4  # PoP <-> PoP over the private backbone, straighter
    backbone_base_ms: float = 0.5
    jitter_ms: float = 0.0  # std-dev of gaussian jitter; 0 = deterministic
    seed: int = 0

    def __post_init__(self) -> None:
        checks = (
            ("base_ms", self.base_ms, 0.0, ">= 0"),
            ("inflation", self.inflation, 1.0, ">= 1"),
            ("backbone_inflation", self.backbone_inflation, 1.0, ">= 1"),
            ("backbone_base_ms", self.backbone_base_ms, 0.0, ">= 0"),
            ("jitter_ms", self.jitter_ms, 0.0, ">= 0"),
        )
        for name, value, low, accepted in checks:
            # `not value >= low` also rejects NaN; infinities would make every RTT infinite.
            if not value >= low or value == float("inf"):
                raise ValueError(f"NetworkModel.{name} must be finite and {accepted}, got {value!r}")
        # A fresh RNG per instance, also for msgspec.structs.replace() and decoded copies.
        self.__dict__["_rng"] = random.Random(self.seed)

    def _random(self) -> random.Random:
        rng = self.__dict__.get("_rng")
        if rng is None:  # copy.copy() skips __post_init__ and leaves __dict__ empty
            rng = self.__dict__["_rng"] = random.Random(self.seed)
        return rng

    def _base_rtt_ms(self, distance_km: float, backbone: bool) -> float:
        base, inflation = (
            (self.backbone_base_ms, self.backbone_inflation) if backbone else (self.base_ms, self.inflation)
        )
        return base + 2.0 * distance_km * inflation / FIBRE_KM_PER_MS

    def _jittered(self, rtt: float, backbone: bool) -> float:
        if self.jitter_ms == 0.0:
            return rtt
        floor = self.backbone_base_ms if backbone else self.base_ms
        # Clipped at the base: jitter may cancel propagation delay in a sample, never the fixed cost.
        return max(floor, rtt + self._random().gauss(0.0, self.jitter_ms))

    def rtt_ms(self, lat1: float, lon1: float, lat2: float, lon2: float, *, backbone: bool = False) -> float:
        """Round-trip time in ms between two points, with jitter when jitter_ms > 0."""
        rtt = self._base_rtt_ms(great_circle_km(lat1, lon1, lat2, lon2), backbone)
        return self._jittered(rtt, backbone)

    def client_rtt_ms(self, client: Location, pop: PoP) -> float:
        return self.rtt_ms(client.lat, client.lon, pop.lat, pop.lon)

    def backbone_rtt_ms(self, a: PoP, b: PoP) -> float:
        if a.code == b.code:
            return 0.0
        return self.rtt_ms(a.lat, a.lon, b.lat, b.lon, backbone=True)

    def nearest_pop(self, client: Location, pops: Iterable[PoP]) -> tuple[PoP, float]:
        """The PoP with the lowest jitter-free client RTT (ties: lowest code) and that RTT.

        Jitter-free so that routing is stable and does not consume the jitter sequence.
        """
        best: tuple[float, str, PoP] | None = None
        for pop in pops:
            distance = great_circle_km(client.lat, client.lon, pop.lat, pop.lon)
            candidate = (self._base_rtt_ms(distance, backbone=False), pop.code, pop)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        if best is None:
            raise TopologyError(f"no PoP to choose from for client at {client.name!r}")
        return best[2], best[0]
