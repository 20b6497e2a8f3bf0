import math

import msgspec
import pytest

from edge_sim.network import (
    EARTH_RADIUS_KM,
    FIBRE_KM_PER_MS,
    NetworkModel,
    great_circle_km,
)
from edge_sim.topology import Location, PoP, Topology, TopologyError

SEOUL = (37.57, 126.98)
TOKYO = (35.68, 139.69)
LONDON = (51.51, -0.13)
NEW_YORK = (40.71, -74.01)


@pytest.fixture(scope="module")
def topo() -> Topology:
    return Topology.default()


def _pop(code: str, lat: float, lon: float) -> PoP:
    return PoP(code, f"City {code}", "US", "NA", lat, lon, "America/New_York")


# --- great circle --------------------------------------------------------------------------------


def test_constants() -> None:
    assert EARTH_RADIUS_KM == 6371.0088
    assert FIBRE_KM_PER_MS == 204.0


def test_great_circle_known_distances() -> None:
    assert 1150 <= great_circle_km(*SEOUL, *TOKYO) <= 1170
    assert great_circle_km(*LONDON, *NEW_YORK) == pytest.approx(5570, rel=0.01)


def test_great_circle_zero_symmetric_and_extremes() -> None:
    assert great_circle_km(*SEOUL, *SEOUL) == 0.0
    assert great_circle_km(*SEOUL, *TOKYO) == great_circle_km(*TOKYO, *SEOUL)
    half_circumference = math.pi * EARTH_RADIUS_KM
    assert great_circle_km(0, 0, 0, 180) == pytest.approx(half_circumference)
    assert great_circle_km(90, 0, -90, 0) == pytest.approx(half_circumference)
    # Across the antimeridian is short, not the long way round.
    assert great_circle_km(0, 179.5, 0, -179.5) == pytest.approx(half_circumference / 180, rel=1e-9)


# --- RTT formula ---------------------------------------------------------------------------------


def test_rtt_exact_for_known_distance() -> None:
    # One degree of longitude on the equator is 2*pi*R/360 km.
    km = 2 * math.pi * EARTH_RADIUS_KM / 360
    model = NetworkModel(base_ms=1.5, inflation=1.7)
    assert model.rtt_ms(0, 0, 0, 1) == pytest.approx(1.5 + 2 * km * 1.7 / 204.0, rel=1e-12)
    backbone = NetworkModel(backbone_base_ms=0.25, backbone_inflation=1.1)
    assert backbone.rtt_ms(0, 0, 0, 1, backbone=True) == pytest.approx(0.25 + 2 * km * 1.1 / 204.0, rel=1e-12)


def test_rtt_same_point_is_base() -> None:
    assert NetworkModel().rtt_ms(*SEOUL, *SEOUL) == 2.0
    assert NetworkModel().rtt_ms(*SEOUL, *SEOUL, backbone=True) == 0.5


def test_default_rtt_is_plausible() -> None:
    # London <-> New York: real internet RTTs are ~70-80 ms.
    assert 60 <= NetworkModel().rtt_ms(*LONDON, *NEW_YORK) <= 120


def test_backbone_faster_than_client_path(topo: Topology) -> None:
    model = NetworkModel()
    icn, fra = topo.pop("ICN"), topo.pop("FRA")
    as_client = Location("Seoul", icn.lat, icn.lon)
    assert model.backbone_rtt_ms(icn, fra) < model.client_rtt_ms(as_client, fra)
    assert model.backbone_rtt_ms(icn, fra) == model.rtt_ms(icn.lat, icn.lon, fra.lat, fra.lon, backbone=True)
    assert model.backbone_rtt_ms(icn, fra) == model.backbone_rtt_ms(fra, icn)


def test_backbone_same_pop_is_zero(topo: Topology) -> None:
    assert NetworkModel(jitter_ms=5.0).backbone_rtt_ms(topo.pop("ICN"), topo.pop("ICN")) == 0.0


def test_client_rtt_uses_locations(topo: Topology) -> None:
    model = NetworkModel()
    seoul = topo.resolve_location("Seoul")
    fra = topo.pop("FRA")
    assert model.client_rtt_ms(seoul, fra) == model.rtt_ms(seoul.lat, seoul.lon, fra.lat, fra.lon)
    assert model.client_rtt_ms(seoul, topo.pop("ICN")) == model.base_ms


# --- jitter --------------------------------------------------------------------------------------


def _samples(model: NetworkModel, n: int = 50) -> list[float]:
    return [model.rtt_ms(*SEOUL, *TOKYO) for _ in range(n)]


def test_jitter_zero_is_deterministic() -> None:
    values = _samples(NetworkModel(seed=1))
    assert len(set(values)) == 1


def test_jitter_same_seed_same_sequence() -> None:
    a = _samples(NetworkModel(jitter_ms=3.0, seed=7))
    b = _samples(NetworkModel(jitter_ms=3.0, seed=7))
    assert a == b
    assert len(set(a)) > 1  # it does vary


def test_jitter_different_seed_different_sequence() -> None:
    assert _samples(NetworkModel(jitter_ms=3.0, seed=1)) != _samples(NetworkModel(jitter_ms=3.0, seed=2))


def test_jitter_is_per_instance() -> None:
    a, b = NetworkModel(jitter_ms=3.0, seed=7), NetworkModel(jitter_ms=3.0, seed=7)
    first = a.rtt_ms(*SEOUL, *TOKYO)
    _samples(a)  # advancing a must not advance b
    assert b.rtt_ms(*SEOUL, *TOKYO) == first


def test_jitter_centred_on_formula() -> None:
    exact = NetworkModel().rtt_ms(*SEOUL, *TOKYO)
    values = _samples(NetworkModel(jitter_ms=1.0, seed=3), n=2000)
    assert sum(values) / len(values) == pytest.approx(exact, abs=0.1)


def test_jitter_never_below_base() -> None:
    # Large jitter on a short path: many samples would dip under base without the clip.
    model = NetworkModel(base_ms=2.0, jitter_ms=50.0, seed=11)
    client = [model.rtt_ms(*SEOUL, 37.6, 127.0) for _ in range(500)]
    backbone = [model.rtt_ms(*SEOUL, 37.6, 127.0, backbone=True) for _ in range(500)]
    assert min(client) == 2.0
    assert min(backbone) == 0.5
    assert max(client) > 50


def test_replace_and_decode_start_a_fresh_sequence() -> None:
    model = NetworkModel(jitter_ms=3.0, seed=5)
    reference = _samples(NetworkModel(jitter_ms=3.0, seed=5), 5)
    _samples(model)
    assert _samples(msgspec.structs.replace(model), 5) == reference
    decoded = msgspec.json.decode(msgspec.json.encode(model), type=NetworkModel)
    assert decoded == model
    assert _samples(decoded, 5) == reference


def test_model_equality_ignores_rng_state() -> None:
    a, b = NetworkModel(jitter_ms=1.0), NetworkModel(jitter_ms=1.0)
    _samples(a)
    assert a == b and hash(a) == hash(b)
    assert msgspec.json.encode(a) == msgspec.json.encode(b)


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("base_ms", -0.1),
        ("inflation", 0.99),
        ("backbone_inflation", 0.5),
        ("backbone_base_ms", -1.0),
        ("jitter_ms", -1.0),
        ("jitter_ms", float("nan")),
        ("inflation", float("inf")),
    ],
)
def test_validation_names_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"NetworkModel\.{field} must be"):
        NetworkModel(**{field: value})


def test_validation_accepts_the_limits() -> None:
    model = NetworkModel(base_ms=0.0, inflation=1.0, backbone_inflation=1.0, backbone_base_ms=0.0)
    assert model.rtt_ms(0, 0, 0, 0) == 0.0


def test_validation_on_decode() -> None:
    with pytest.raises(ValueError, match="inflation"):
        msgspec.json.decode(b'{"inflation": 0.5}', type=NetworkModel)


# --- nearest PoP ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("city", "code"), [("Seoul", "ICN"), ("Paris", "CDG"), ("New York", "JFK")])
def test_nearest_pop_spot_checks(topo: Topology, city: str, code: str) -> None:
    pop, rtt = NetworkModel().nearest_pop(topo.resolve_location(city), topo.pops.values())
    assert pop.code == code
    assert rtt == pytest.approx(2.0)  # client in the PoP's own city


@pytest.mark.parametrize("where", ["Seoul", "Paris", "New York", "52.52,13.40", "-1.0,36.0", "60,-100"])
def test_nearest_pop_is_the_minimum_distance(topo: Topology, where: str) -> None:
    client = topo.resolve_location(where)
    pop, rtt = NetworkModel().nearest_pop(client, topo.pops.values())
    distances = {p.code: great_circle_km(client.lat, client.lon, p.lat, p.lon) for p in topo.pops.values()}
    assert distances[pop.code] == min(distances.values())
    assert rtt == pytest.approx(NetworkModel().client_rtt_ms(client, pop))


@pytest.mark.parametrize(
    ("where", "codes"),
    [("Seoul", {"ICN"}), ("52.52,13.40", {"FRA", "AMS"}), ("New York", {"IAD"}), ("Tokyo", {"NRT"})],
)
def test_nearest_gpu_pop(topo: Topology, where: str, codes: set[str]) -> None:
    pop, _ = NetworkModel().nearest_pop(topo.resolve_location(where), topo.gpu_pops())
    assert pop.code in codes


def test_nearest_pop_ignores_jitter_and_keeps_sequence() -> None:
    model = NetworkModel(jitter_ms=100.0, seed=1)
    reference = NetworkModel(jitter_ms=100.0, seed=1)
    near, far = _pop("AAA", 40.0, -74.0), _pop("BBB", 41.0, -74.0)
    client = Location("x", 40.1, -74.0)
    for _ in range(20):
        pop, rtt = model.nearest_pop(client, [far, near])
        assert pop.code == "AAA"
        assert rtt == NetworkModel().client_rtt_ms(client, near)
    assert model.rtt_ms(0, 0, 1, 1) == reference.rtt_ms(0, 0, 1, 1)


def test_nearest_pop_tie_broken_by_code() -> None:
    client = Location("0.0,0.0", 0.0, 0.0)
    east, west = _pop("ZZZ", 0.0, 1.0), _pop("MMM", 0.0, -1.0)
    assert NetworkModel().nearest_pop(client, [east, west])[0].code == "MMM"
    assert NetworkModel().nearest_pop(client, iter([west, east]))[0].code == "MMM"


def test_nearest_pop_empty_raises() -> None:
    with pytest.raises(TopologyError):
        NetworkModel().nearest_pop(Location("0.0,0.0", 0.0, 0.0), [])
