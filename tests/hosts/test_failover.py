"""Failover across test hosts: FRA's host loses its link (`ip link set <root-side veth> down`) or
its `edge pop serve` is SIGKILLed while it streams an answer to a client in Paris. The stream ends
with an error event that names a code, within STREAM_END_S (a cut link sends no reset: the runtime
gives up once a health check fails, which takes at most the check's 5 s timeout plus its 2 s
interval); health checks mark FRA down, so Paris is served by ICN; with the link (or the process)
back, health checks bring FRA back and Paris is served there again. Each test leaves the hosts as it
found them (FRA back and serving Paris, asserted at its end), so the two share one cluster."""

from __future__ import annotations

import threading
import time

from tests.faults.project import outcome

STREAM_END_S = 30.0  # the hang guard: the runtime's bound is about 8 s after the cut


def stream_in_background(cluster, location: str) -> tuple[threading.Thread, threading.Event, dict]:
    """A long streamed answer to `location`, read on a thread; `first` is set at its first token."""
    got, first = {}, threading.Event()

    def read() -> None:
        try:
            with cluster.stream(location, max_tokens=3000) as r:
                parts = []
                for text in r.iter_text():
                    parts.append(text)
                    first.set()
                got["body"] = "".join(parts)
        except Exception as exc:  # shown by the test: a broken connection is not an error event
            got["body"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, first, got


def ended_with_an_error(thread: threading.Thread, got: dict) -> None:
    thread.join(timeout=STREAM_END_S)
    assert not thread.is_alive(), f"the stream did not end within {STREAM_END_S} s of its PoP going away"
    ended, code = outcome(200, got["body"])
    assert ended == "failed" and code.isdigit(), got["body"][-400:]


def until_unreachable(cluster, code: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while cluster.pops()[code]["reachable"] and time.monotonic() < deadline:
        time.sleep(0.2)
    return not cluster.pops()[code]["reachable"]


def test_a_cut_link_ends_the_stream_and_traffic_moves_until_it_is_back(two_hosts):
    cluster = two_hosts
    assert cluster.served_by("Paris") == "FRA"
    thread, first, got = stream_in_background(cluster, "Paris")
    assert first.wait(60), "the stream never started"
    cluster.host["FRA"].cut()
    ended_with_an_error(thread, got)

    assert until_unreachable(cluster, "FRA"), "health checks never marked FRA down"
    assert cluster.served_by("Paris") == "ICN"  # the next PoP by RTT
    cluster.host["FRA"].restore()
    assert cluster.until_served_by("Paris", "FRA") == "FRA", "health checks never brought FRA back"
    assert cluster.pops()["FRA"]["reachable"]


def test_a_killed_node_ends_the_stream_and_traffic_returns_when_it_restarts(two_hosts):
    cluster = two_hosts
    assert cluster.served_by("Paris") == "FRA"
    thread, first, got = stream_in_background(cluster, "Paris")
    assert first.wait(60), "the stream never started"
    cluster.kill_node("FRA")
    ended_with_an_error(thread, got)

    assert until_unreachable(cluster, "FRA"), "health checks never marked FRA down"
    assert cluster.served_by("Paris") == "ICN"
    cluster.start_node("FRA")  # same host, same address and port
    assert cluster.until_served_by("Paris", "FRA") == "FRA", "health checks never brought FRA back"
