"""The simulated world: PoPs (points of presence), their places and the GPUs they hold.

The default topology is a compact literal table of real cities that host Cloudflare data
centres, each under the IATA code Cloudflare uses for the colo. About a dozen of them hold
GPU nodes, spread over all six inhabited continents, so routing has real choices to make.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable

import msgspec

from edge_sim.upstream_config import UpstreamConfig, check_upstream

__all__ = [
    "CONTINENTS",
    "EARTH_RADIUS_KM",
    "GPU_TYPES",
    "GPUType",
    "Location",
    "PoP",
    "Topology",
    "TopologyError",
    "UnknownLocationError",
    "great_circle_km",
]

# Mean Earth radius (IUGG). Defined here rather than in edge_sim.network because resolving a
# "lat,lon" location needs distances and network already depends on this module; network
# re-exports both names, so either import works.
EARTH_RADIUS_KM = 6371.0088

# A "lat,lon" location takes its city/country/continent/timezone from the nearest PoP only
# when that PoP is this close; farther away the PoP's place would be a guess.
NEAREST_PLACE_KM = 300.0

# Cloudflare's request.cf.continent codes ("AN" is Antarctica; no PoP there by default).
CONTINENTS: frozenset[str] = frozenset({"AF", "AN", "AS", "EU", "NA", "OC", "SA"})


def great_circle_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance in km on a spherical Earth (haversine)."""
    phi1, phi2 = math.radians(lat1), math.radians(lat2)
    dphi = phi2 - phi1
    dlmb = math.radians(lon2 - lon1)
    h = math.sin(dphi / 2) ** 2 + math.cos(phi1) * math.cos(phi2) * math.sin(dlmb / 2) ** 2
    # min() guards asin against rounding just above 1 for antipodal points.
    return 2.0 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


class GPUType(msgspec.Struct, frozen=True):
    name: str
    memory_gib: float  # datasheet memory
    hbm_bandwidth_gbs: float  # GB/s, datasheet
    bf16_tflops: float  # dense (no sparsity), datasheet
    fp8_tflops: float  # dense (no sparsity), datasheet
    price_per_hour: float  # USD on-demand, a typical cloud price; config may override


# Datasheet figures (dense, i.e. the "with sparsity" numbers halved). Prices are typical
# on-demand per-GPU cloud prices and only defaults.
GPU_TYPES: dict[str, GPUType] = {
    g.name: g
    for g in (
        GPUType("H100-SXM", 80.0, 3350.0, 989.0, 1979.0, 2.99),
        GPUType("H200", 141.0, 4800.0, 989.0, 1979.0, 3.79),
        GPUType("L40S", 48.0, 864.0, 362.0, 733.0, 1.25),
        GPUType("L4", 24.0, 300.0, 121.0, 242.0, 0.70),
        # A100 has no FP8 tensor cores: FP8 checkpoints run weight-only (dequantized to BF16)
        # there, so the rate an FP8 model actually gets is the BF16 one (312), not INT8's 624.
        GPUType("A100-80G", 80.0, 2039.0, 312.0, 312.0, 1.79),
    )
}


class PoP(msgspec.Struct, frozen=True):
    code: str  # IATA code, upper case
    city: str
    country: str  # ISO 3166-1 alpha-2
    continent: str  # one of CONTINENTS
    lat: float
    lon: float
    timezone: str  # IANA
    gpus: dict[str, int] = {}  # GPU type name -> count; empty = no GPU here
    url: str | None = None  # remote PoP node URL; None = in-process
    # an OpenAI-compatible server (vLLM, SGLang, ...) this PoP forwards to (edge_sim.upstream)
    upstream: UpstreamConfig | None = None

    @property
    def has_gpu(self) -> bool:
        return any(n > 0 for n in self.gpus.values())


class Location(msgspec.Struct, frozen=True):
    name: str  # normalised: a city name, or "lat,lon"
    lat: float
    lon: float
    city: str | None = None
    country: str | None = None
    continent: str | None = None
    timezone: str | None = None


class TopologyError(ValueError):
    """A bad topology entry or an unknown PoP; the message names the entry."""


class UnknownLocationError(TopologyError):
    """A location that is neither a PoP city, a PoP code nor valid "lat,lon"."""


# code, city, country, continent, lat, lon, timezone, gpus
_DEFAULT_POPS: tuple[tuple[str, str, str, str, float, float, str, dict[str, int]], ...] = (
    # Asia
    ("ICN", "Seoul", "KR", "AS", 37.57, 126.98, "Asia/Seoul", {"H200": 8}),
    ("NRT", "Tokyo", "JP", "AS", 35.68, 139.69, "Asia/Tokyo", {"H100-SXM": 8}),
    ("KIX", "Osaka", "JP", "AS", 34.69, 135.50, "Asia/Tokyo", {}),
    ("HKG", "Hong Kong", "HK", "AS", 22.32, 114.17, "Asia/Hong_Kong", {}),
    ("TPE", "Taipei", "TW", "AS", 25.03, 121.57, "Asia/Taipei", {}),
    ("SIN", "Singapore", "SG", "AS", 1.35, 103.82, "Asia/Singapore", {"H100-SXM": 8}),
    ("KUL", "Kuala Lumpur", "MY", "AS", 3.14, 101.69, "Asia/Kuala_Lumpur", {}),
    ("BKK", "Bangkok", "TH", "AS", 13.76, 100.50, "Asia/Bangkok", {}),
    ("CGK", "Jakarta", "ID", "AS", -6.21, 106.85, "Asia/Jakarta", {}),
    ("MNL", "Manila", "PH", "AS", 14.60, 120.98, "Asia/Manila", {}),
    ("BOM", "Mumbai", "IN", "AS", 19.08, 72.88, "Asia/Kolkata", {"L4": 8}),
    ("DEL", "New Delhi", "IN", "AS", 28.61, 77.21, "Asia/Kolkata", {}),
    ("MAA", "Chennai", "IN", "AS", 13.08, 80.27, "Asia/Kolkata", {}),
    ("DXB", "Dubai", "AE", "AS", 25.20, 55.27, "Asia/Dubai", {}),
    ("TLV", "Tel Aviv", "IL", "AS", 32.09, 34.78, "Asia/Jerusalem", {}),
    # Europe (Istanbul listed under Europe, as Cloudflare's own region list does)
    ("FRA", "Frankfurt", "DE", "EU", 50.11, 8.68, "Europe/Berlin", {"H200": 8}),
    ("AMS", "Amsterdam", "NL", "EU", 52.37, 4.90, "Europe/Amsterdam", {"H100-SXM": 8}),
    ("LHR", "London", "GB", "EU", 51.51, -0.13, "Europe/London", {"L40S": 8}),
    ("CDG", "Paris", "FR", "EU", 48.86, 2.35, "Europe/Paris", {}),
    ("MRS", "Marseille", "FR", "EU", 43.30, 5.37, "Europe/Paris", {}),
    ("MAD", "Madrid", "ES", "EU", 40.42, -3.70, "Europe/Madrid", {}),
    ("MXP", "Milan", "IT", "EU", 45.46, 9.19, "Europe/Rome", {}),
    ("ZRH", "Zurich", "CH", "EU", 47.38, 8.54, "Europe/Zurich", {}),
    ("VIE", "Vienna", "AT", "EU", 48.21, 16.37, "Europe/Vienna", {}),
    ("PRG", "Prague", "CZ", "EU", 50.08, 14.44, "Europe/Prague", {}),
    # Cloudflare still names its Berlin colo after the closed Tegel airport.
    ("TXL", "Berlin", "DE", "EU", 52.52, 13.40, "Europe/Berlin", {}),
    ("CPH", "Copenhagen", "DK", "EU", 55.68, 12.57, "Europe/Copenhagen", {}),
    ("ARN", "Stockholm", "SE", "EU", 59.33, 18.07, "Europe/Stockholm", {}),
    ("HEL", "Helsinki", "FI", "EU", 60.17, 24.94, "Europe/Helsinki", {}),
    ("WAW", "Warsaw", "PL", "EU", 52.23, 21.01, "Europe/Warsaw", {}),
    ("DUB", "Dublin", "IE", "EU", 53.35, -6.26, "Europe/Dublin", {}),
    ("IST", "Istanbul", "TR", "EU", 41.01, 28.98, "Europe/Istanbul", {}),
    # Africa
    ("JNB", "Johannesburg", "ZA", "AF", -26.20, 28.05, "Africa/Johannesburg", {"L4": 8}),
    ("CPT", "Cape Town", "ZA", "AF", -33.92, 18.42, "Africa/Johannesburg", {}),
    ("LOS", "Lagos", "NG", "AF", 6.52, 3.38, "Africa/Lagos", {}),
    ("ACC", "Accra", "GH", "AF", 5.60, -0.19, "Africa/Accra", {}),
    ("NBO", "Nairobi", "KE", "AF", -1.29, 36.82, "Africa/Nairobi", {}),
    ("CAI", "Cairo", "EG", "AF", 30.04, 31.24, "Africa/Cairo", {}),
    ("CMN", "Casablanca", "MA", "AF", 33.57, -7.59, "Africa/Casablanca", {}),
    # North America
    ("IAD", "Ashburn", "US", "NA", 39.04, -77.49, "America/New_York", {"H200": 16}),
    ("EWR", "Newark", "US", "NA", 40.74, -74.17, "America/New_York", {}),
    ("JFK", "New York", "US", "NA", 40.71, -74.01, "America/New_York", {}),
    ("BOS", "Boston", "US", "NA", 42.36, -71.06, "America/New_York", {}),
    ("ATL", "Atlanta", "US", "NA", 33.75, -84.39, "America/New_York", {}),
    ("MIA", "Miami", "US", "NA", 25.76, -80.19, "America/New_York", {}),
    ("ORD", "Chicago", "US", "NA", 41.88, -87.63, "America/Chicago", {"L40S": 8}),
    ("DFW", "Dallas", "US", "NA", 32.78, -96.80, "America/Chicago", {}),
    ("DEN", "Denver", "US", "NA", 39.74, -104.99, "America/Denver", {}),
    ("LAX", "Los Angeles", "US", "NA", 34.05, -118.24, "America/Los_Angeles", {}),
    ("SJC", "San Jose", "US", "NA", 37.34, -121.89, "America/Los_Angeles", {"H100-SXM": 8}),
    ("SEA", "Seattle", "US", "NA", 47.61, -122.33, "America/Los_Angeles", {}),
    ("YYZ", "Toronto", "CA", "NA", 43.65, -79.38, "America/Toronto", {}),
    ("YUL", "Montreal", "CA", "NA", 45.50, -73.57, "America/Toronto", {}),
    ("YVR", "Vancouver", "CA", "NA", 49.28, -123.12, "America/Vancouver", {}),
    ("MEX", "Mexico City", "MX", "NA", 19.43, -99.13, "America/Mexico_City", {}),
    # South America
    ("GRU", "São Paulo", "BR", "SA", -23.55, -46.63, "America/Sao_Paulo", {"L40S": 4}),
    ("GIG", "Rio de Janeiro", "BR", "SA", -22.91, -43.17, "America/Sao_Paulo", {}),
    ("EZE", "Buenos Aires", "AR", "SA", -34.60, -58.38, "America/Argentina/Buenos_Aires", {}),
    ("SCL", "Santiago", "CL", "SA", -33.45, -70.67, "America/Santiago", {}),
    ("BOG", "Bogotá", "CO", "SA", 4.71, -74.07, "America/Bogota", {}),
    ("LIM", "Lima", "PE", "SA", -12.05, -77.04, "America/Lima", {}),
    # Oceania
    ("SYD", "Sydney", "AU", "OC", -33.87, 151.21, "Australia/Sydney", {"L40S": 8}),
    ("MEL", "Melbourne", "AU", "OC", -37.81, 144.96, "Australia/Melbourne", {}),
    ("BNE", "Brisbane", "AU", "OC", -27.47, 153.03, "Australia/Brisbane", {}),
    ("PER", "Perth", "AU", "OC", -31.95, 115.86, "Australia/Perth", {}),
    ("AKL", "Auckland", "NZ", "OC", -36.85, 174.76, "Pacific/Auckland", {}),
)

# Decimal degrees only: no exponents, nan or inf, which float() would otherwise accept.
_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_LAT_LON = re.compile(rf"\s*({_NUMBER})\s*,\s*({_NUMBER})\s*")


def _fold(text: str) -> str:
    """Case- and accent-insensitive key: "  São  Paulo " and "sao paulo" fold alike."""
    decomposed = unicodedata.normalize("NFKD", text)
    stripped = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(stripped.casefold().split())


def _validate(pop: PoP) -> None:
    code = pop.code
    if not code or code != code.strip().upper():
        raise TopologyError(f"PoP code {code!r} must be a non-empty upper-case code such as 'ICN'")
    # `not (a <= x <= b)` also rejects NaN.
    if not (-90.0 <= pop.lat <= 90.0):
        raise TopologyError(f"PoP {code}: lat {pop.lat} is outside [-90, 90]")
    if not (-180.0 <= pop.lon <= 180.0):
        raise TopologyError(f"PoP {code}: lon {pop.lon} is outside [-180, 180]")
    if pop.continent not in CONTINENTS:
        raise TopologyError(
            f"PoP {code}: unknown continent code {pop.continent!r}; known: {', '.join(sorted(CONTINENTS))}"
        )
    if pop.upstream is not None:
        if pop.url is not None:
            raise TopologyError(f"PoP {code}: give url (an `edge pop serve` node) or upstream, not both")
        if not pop.has_gpu:
            raise TopologyError(f"PoP {code}: upstream needs gpus, the GPUs it runs on (e.g. H200 = 8)")
        try:
            check_upstream(code, pop.upstream)
        except ValueError as exc:
            raise TopologyError(str(exc)) from None
    for gpu, count in pop.gpus.items():
        if gpu not in GPU_TYPES:
            raise TopologyError(f"PoP {code}: unknown GPU type {gpu!r}; known types: {', '.join(GPU_TYPES)}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise TopologyError(f"PoP {code}: GPU count for {gpu} must be an integer >= 1, got {count!r}")


class Topology:
    """A validated set of PoPs, looked up by code or by place."""

    def __init__(self, pops: Iterable[PoP]) -> None:
        self.pops: dict[str, PoP] = {}
        for pop in pops:
            _validate(pop)
            if pop.code in self.pops:
                raise TopologyError(f"duplicate PoP code {pop.code!r}")
            self.pops[pop.code] = pop
        # Two PoPs in one city: the first listed answers for the city name.
        self._by_city: dict[str, PoP] = {}
        for pop in self.pops.values():
            self._by_city.setdefault(_fold(pop.city), pop)

    def __repr__(self) -> str:
        return f"Topology({len(self.pops)} PoPs, {len(self.gpu_pops())} with GPUs)"

    @classmethod
    def default(cls) -> Topology:
        """The embedded world topology."""
        return cls(
            PoP(code, city, country, continent, lat, lon, tz, dict(gpus))
            for code, city, country, continent, lat, lon, tz, gpus in _DEFAULT_POPS
        )

    def pop(self, code: str) -> PoP:
        """The PoP with this code (case-insensitive)."""
        try:
            return self.pops[code.strip().upper()]
        except KeyError:
            raise TopologyError(f"unknown PoP code {code!r}; known codes: {', '.join(self.pops)}") from None

    def gpu_pops(self) -> list[PoP]:
        return [p for p in self.pops.values() if p.has_gpu]

    def with_overrides(
        self, gpu_pops: dict[str, dict[str, int]] | None = None, extra: Iterable[PoP] = ()
    ) -> Topology:
        """A new topology with `extra` PoPs added (replacing any with the same code, in place)
        and, when `gpu_pops` is given, GPUs at exactly those PoPs and none elsewhere."""
        merged = dict(self.pops)
        for pop in extra:
            merged[pop.code] = pop
        if gpu_pops is not None:
            wanted = {code.strip().upper(): dict(gpus) for code, gpus in gpu_pops.items()}
            unknown = [code for code in wanted if code not in merged]
            if unknown:
                raise TopologyError(
                    f"gpu_pops names unknown PoP code(s) {', '.join(unknown)}; "
                    f"known codes: {', '.join(merged)}"
                )
            merged = {
                code: msgspec.structs.replace(pop, gpus=wanted.get(code, {})) for code, pop in merged.items()
            }
        return Topology(merged.values())

    def resolve_location(self, text: str) -> Location:
        """A client location from a PoP city name, a PoP code or "lat,lon" in decimal degrees."""
        match = _LAT_LON.fullmatch(text)
        if match:
            return self._location_at(float(match[1]), float(match[2]))
        key = _fold(text)
        pop = self._by_city.get(key) or self.pops.get(key.upper())
        if pop is None:
            # One example city per continent shows the breadth of what is accepted.
            firsts: dict[str, str] = {}
            for p in self.pops.values():
                firsts.setdefault(p.continent, p.city)
            examples = ", ".join(firsts.values())
            raise UnknownLocationError(
                f"unknown location {text!r}; give a PoP city (e.g. {examples}), a PoP code (e.g. "
                f"{next(iter(self.pops), 'ICN')}) or 'lat,lon' in decimal degrees (e.g. '37.57,126.98')"
            )
        return Location(pop.city, pop.lat, pop.lon, pop.city, pop.country, pop.continent, pop.timezone)

    def _location_at(self, lat: float, lon: float) -> Location:
        if not -90.0 <= lat <= 90.0:
            raise UnknownLocationError(f"latitude {lat} is outside [-90, 90] in 'lat,lon'")
        if not -180.0 <= lon <= 180.0:
            raise UnknownLocationError(f"longitude {lon} is outside [-180, 180] in 'lat,lon'")
        lat, lon = lat + 0.0, lon + 0.0  # turns -0.0 into 0.0 so the name reads "0.0"
        name = f"{lat!r},{lon!r}"
        nearest = min(
            self.pops.values(),
            key=lambda p: (great_circle_km(lat, lon, p.lat, p.lon), p.code),
            default=None,
        )
        if nearest is None or great_circle_km(lat, lon, nearest.lat, nearest.lon) > NEAREST_PLACE_KM:
            return Location(name, lat, lon)
        return Location(name, lat, lon, nearest.city, nearest.country, nearest.continent, nearest.timezone)
