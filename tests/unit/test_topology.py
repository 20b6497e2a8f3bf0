import re
import zoneinfo

import msgspec
import pytest

from edge_sim.topology import (
    GPU_TYPES,
    GPUType,
    Location,
    PoP,
    Topology,
    TopologyError,
    UnknownLocationError,
)

SIX_CONTINENTS = {"AF", "AS", "EU", "NA", "SA", "OC"}


@pytest.fixture(scope="module")
def topo() -> Topology:
    return Topology.default()


def _pop(code: str = "TST", **kw: object) -> PoP:
    fields: dict[str, object] = {"code": code, "city": "Testville", "country": "KR", "continent": "AS"}
    fields |= {"lat": 10.0, "lon": 20.0, "timezone": "Asia/Seoul"}
    fields.update(kw)
    return PoP(**fields)  # type: ignore[arg-type]


# --- GPU types -------------------------------------------------------------------------------


def test_gpu_types_cover_the_named_parts_with_sane_figures() -> None:
    assert {"H100-SXM", "H200", "L40S", "L4", "A100-80G"} <= set(GPU_TYPES)
    for name, gpu in GPU_TYPES.items():
        assert isinstance(gpu, GPUType) and gpu.name == name
        assert gpu.memory_gib > 0 and gpu.hbm_bandwidth_gbs > 0 and gpu.price_per_hour > 0
        assert gpu.fp8_tflops >= gpu.bf16_tflops > 0
    # Dense datasheet figures, not the "with sparsity" ones.
    assert GPU_TYPES["H100-SXM"].bf16_tflops == pytest.approx(989, rel=0.01)
    assert GPU_TYPES["H200"].memory_gib > GPU_TYPES["H100-SXM"].memory_gib
    assert GPU_TYPES["H200"].hbm_bandwidth_gbs > GPU_TYPES["H100-SXM"].hbm_bandwidth_gbs


# --- default topology ----------------------------------------------------------------------------


def test_default_topology_size_and_continents(topo: Topology) -> None:
    assert len(topo.pops) >= 45
    assert {p.continent for p in topo.pops.values()} >= SIX_CONTINENTS


def test_default_topology_gpu_pops_are_spread(topo: Topology) -> None:
    gpu_pops = topo.gpu_pops()
    assert len(gpu_pops) >= 10
    assert len({p.continent for p in gpu_pops}) >= 5
    assert all(p.has_gpu for p in gpu_pops)
    assert not any(p.has_gpu for p in topo.pops.values() if p not in gpu_pops)
    assert topo.pop("ICN").gpus == {"H200": 8}


def test_default_topology_entries_are_well_formed(topo: Topology) -> None:
    codes = [p.code for p in topo.pops.values()]
    assert len(codes) == len(set(codes))
    assert list(topo.pops) == codes  # keyed by code
    cities = [p.city.casefold() for p in topo.pops.values()]
    assert len(cities) == len(set(cities)), "each city should resolve to exactly one PoP"
    for pop in topo.pops.values():
        assert re.fullmatch(r"[A-Z]{3}", pop.code), pop.code
        assert re.fullmatch(r"[A-Z]{2}", pop.country), pop
        assert pop.continent in SIX_CONTINENTS, pop
        assert -90 <= pop.lat <= 90 and -180 <= pop.lon <= 180, pop
        zoneinfo.ZoneInfo(pop.timezone)  # raises for an unknown zone
        assert all(gpu in GPU_TYPES and n >= 1 for gpu, n in pop.gpus.items()), pop
        assert pop.url is None


def test_default_topology_spot_checks(topo: Topology) -> None:
    icn = topo.pop("ICN")
    assert (icn.city, icn.country, icn.continent, icn.timezone) == ("Seoul", "KR", "AS", "Asia/Seoul")
    assert icn.lat == pytest.approx(37.57, abs=0.2) and icn.lon == pytest.approx(126.98, abs=0.2)
    assert topo.pop("JFK").city == "New York"
    assert topo.pop("EWR").city == "Newark"
    assert topo.pop("GRU").timezone == "America/Sao_Paulo"
    assert topo.pop("AKL").country == "NZ" and topo.pop("AKL").continent == "OC"
    assert topo.pop("JNB").continent == "AF" and topo.pop("JNB").has_gpu


def test_default_returns_independent_copies() -> None:
    a, b = Topology.default(), Topology.default()
    a.pop("ICN").gpus["H200"] = 99
    assert b.pop("ICN").gpus == {"H200": 8}


def test_pop_lookup_is_case_insensitive_and_names_unknown_code(topo: Topology) -> None:
    assert topo.pop("icn") is topo.pop("ICN")
    assert topo.pop(" nrt ").city == "Tokyo"
    with pytest.raises(TopologyError, match="unknown PoP code 'XYZ'") as info:
        topo.pop("XYZ")
    assert "ICN" in str(info.value)


def test_pop_is_a_msgspec_struct_that_round_trips() -> None:
    pop = _pop(gpus={"L4": 2})
    assert msgspec.json.decode(msgspec.json.encode(pop), type=PoP) == pop
    assert not _pop().has_gpu and _pop(gpus={"L4": 1}).has_gpu


# --- validation ----------------------------------------------------------------------------------


def test_duplicate_code_rejected() -> None:
    with pytest.raises(TopologyError, match="duplicate PoP code 'TST'"):
        Topology([_pop("TST"), _pop("TST", city="Other")])


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"lat": 91.0}, "lat 91.0"),
        ({"lat": -90.5}, "lat -90.5"),
        ({"lat": float("nan")}, "lat nan"),
        ({"lon": 180.5}, "lon 180.5"),
        ({"gpus": {"B200X": 8}}, "unknown GPU type 'B200X'"),
        ({"gpus": {"L4": 0}}, "GPU count for L4"),
        ({"continent": "XX"}, "unknown continent code 'XX'"),
        ({"code": "tst"}, "'tst'"),
    ],
)
def test_bad_pop_rejected_naming_the_entry(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(TopologyError, match=re.escape(needle)):
        Topology([_pop(**kw)])


def test_valid_edges_accepted() -> None:
    topo = Topology([_pop("AAA", lat=90.0, lon=-180.0), _pop("BBB", city="B", lat=-90.0, lon=180.0)])
    assert list(topo.pops) == ["AAA", "BBB"]


# --- with_overrides ------------------------------------------------------------------------------


def test_with_overrides_sets_exactly_the_given_gpu_pops(topo: Topology) -> None:
    new = topo.with_overrides(gpu_pops={"CDG": {"A100-80G": 4}, "nrt": {"H200": 2}})
    assert {p.code for p in new.gpu_pops()} == {"CDG", "NRT"}
    assert new.pop("CDG").gpus == {"A100-80G": 4}
    assert new.pop("NRT").gpus == {"H200": 2}
    assert list(new.pops) == list(topo.pops)  # order kept
    assert topo.pop("ICN").has_gpu  # the original is untouched
    assert len(topo.gpu_pops()) >= 10


def test_with_overrides_without_gpu_pops_keeps_gpus(topo: Topology) -> None:
    new = topo.with_overrides()
    assert [p.code for p in new.gpu_pops()] == [p.code for p in topo.gpu_pops()]
    assert new is not topo


def test_with_overrides_extra_adds_and_replaces(topo: Topology) -> None:
    remote = msgspec.structs.replace(topo.pop("ICN"), url="http://10.0.0.5:8787")
    extra = _pop("TST", gpus={"L4": 1})
    new = topo.with_overrides(extra=[remote, extra])
    assert new.pop("ICN").url == "http://10.0.0.5:8787"
    assert next(iter(new.pops)) == "ICN"  # replaced in place
    assert list(new.pops)[-1] == "TST"
    assert new.pop("TST").has_gpu
    assert len(new.pops) == len(topo.pops) + 1


def test_with_overrides_gpu_pops_applies_to_extra_too(topo: Topology) -> None:
    new = topo.with_overrides(gpu_pops={"TST": {"L4": 2}}, extra=[_pop("TST")])
    assert [p.code for p in new.gpu_pops()] == ["TST"]


def test_with_overrides_unknown_code_named(topo: Topology) -> None:
    with pytest.raises(TopologyError, match="QQQ"):
        topo.with_overrides(gpu_pops={"ICN": {"H200": 8}, "QQQ": {"L4": 1}})


def test_with_overrides_validates_gpu_entries(topo: Topology) -> None:
    with pytest.raises(TopologyError, match="unknown GPU type 'TPU'"):
        topo.with_overrides(gpu_pops={"ICN": {"TPU": 8}})


# --- resolve_location ----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["Seoul", "seoul", "  SEOUL ", "ICN", "icn"])
def test_resolve_city_or_code(topo: Topology, text: str) -> None:
    loc = topo.resolve_location(text)
    assert loc == Location("Seoul", 37.57, 126.98, "Seoul", "KR", "AS", "Asia/Seoul")


@pytest.mark.parametrize("text", ["São Paulo", "Sao Paulo", "sao  paulo", "SÃO PAULO", "GRU"])
def test_resolve_accented_city_in_any_form(topo: Topology, text: str) -> None:
    loc = topo.resolve_location(text)
    assert (loc.name, loc.city, loc.country, loc.timezone) == (
        "São Paulo",
        "São Paulo",
        "BR",
        "America/Sao_Paulo",
    )


def test_resolve_multi_word_cities(topo: Topology) -> None:
    assert topo.resolve_location("new york").city == "New York"
    assert topo.resolve_location("Bogota").country == "CO"
    assert topo.resolve_location("newark").city == "Newark"


@pytest.mark.parametrize("text", ["37.5,127.0", "37.5, 127.0", " 37.5 ,127 ", "+37.5,127.00"])
def test_resolve_lat_lon_near_a_pop(topo: Topology, text: str) -> None:
    loc = topo.resolve_location(text)
    assert (loc.lat, loc.lon) == (37.5, 127.0)
    assert loc.name == "37.5,127.0"
    assert (loc.city, loc.country, loc.continent, loc.timezone) == ("Seoul", "KR", "AS", "Asia/Seoul")


def test_resolve_lat_lon_far_from_every_pop(topo: Topology) -> None:
    loc = topo.resolve_location("-48.88,-123.39")  # Point Nemo, South Pacific
    assert (loc.lat, loc.lon) == (-48.88, -123.39)
    assert loc.city is loc.country is loc.continent is loc.timezone is None


def test_resolve_lat_lon_negative_and_boundaries(topo: Topology) -> None:
    loc = topo.resolve_location("-33.9,151.2")
    assert loc.city == "Sydney"
    assert topo.resolve_location("90,-180").lat == 90.0


@pytest.mark.parametrize(("text", "needle"), [("91,0", "91"), ("-95.5, 10", "-95.5"), ("10, 181", "181")])
def test_resolve_lat_lon_out_of_range(topo: Topology, text: str, needle: str) -> None:
    with pytest.raises(UnknownLocationError, match=re.escape(needle)):
        topo.resolve_location(text)


@pytest.mark.parametrize("text", ["Atlantis", "", "nan,nan", "1e3,5", "37.5;127"])
def test_resolve_unknown_location_explains_what_is_accepted(topo: Topology, text: str) -> None:
    with pytest.raises(UnknownLocationError) as info:
        topo.resolve_location(text)
    message = str(info.value)
    assert repr(text) in message
    assert "lat,lon" in message
    assert "Seoul" in message  # an example city
    assert isinstance(info.value, TopologyError) and isinstance(info.value, ValueError)
