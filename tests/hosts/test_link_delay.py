"""Link delay across test hosts. Where the kernel has tc netem, a delay put on a host's link shows in
the latency a client measures; where it has not (checked at run time: `tc qdisc ... netem` answers
"Specified qdisc kind is unknown" on some kernels), that test is skipped saying so, and the
runtime's own `--network emulate` (the RTT model's delays really waited) is tested instead.

Only lower bounds on elapsed time are asserted: a delay can make a call slower, never faster."""

from __future__ import annotations

import shutil
import time

import pytest

from tests.hosts import netns

NETEM_DELAY_MS = 150


def netem_problem() -> str | None:
    """Why a netem delay cannot be put on a test host's link here, or None."""
    if shutil.which("tc") is None:
        return "tc netem is not available: iproute2's tc is not installed"
    hosts = netns.Hosts(1)
    try:
        why = hosts[0].netem_delay(1)
    finally:
        hosts.close()
    return None if why is None else f"tc netem is not available on this kernel ({why})"


def test_a_netem_delay_on_a_link_shows_in_the_latency_measured(make_cluster, can_make_hosts):
    if (why := netem_problem()) is not None:
        pytest.skip(why)
    cluster = make_cluster(codes=("FRA",))
    assert cluster.served_by("Paris") == "FRA"
    assert cluster.host["FRA"].netem_delay(NETEM_DELAY_MS) is None
    start = time.monotonic()
    assert cluster.node_health("FRA").status_code == 200  # straight over the delayed link
    assert time.monotonic() - start >= NETEM_DELAY_MS / 1000
    start = time.monotonic()
    r = cluster.run("Paris")  # edge dev -> the node crosses it too
    assert r.status_code == 200 and r.json()["result"]["timing"]["pop"] == "FRA", r.text
    assert time.monotonic() - start >= NETEM_DELAY_MS / 1000


def test_network_emulate_waits_the_modeled_backbone_rtt_to_a_remote_host(make_cluster):
    cluster = make_cluster(codes=("ICN",), dev_args=("--network", "emulate"))
    start = time.monotonic()
    r = cluster.run("Paris")  # ingress at CDG, the only GPU PoP is ICN's host: a long way round
    elapsed = time.monotonic() - start
    assert r.status_code == 200, r.text
    timing = r.json()["result"]["timing"]
    assert timing["pop"] == "ICN" and timing["ingress"] != "ICN"
    assert timing["backbone_rtt_ms"] > 100  # Paris to Seoul, by the RTT model
    assert elapsed >= timing["backbone_rtt_ms"] / 1000  # waited, not only reported
