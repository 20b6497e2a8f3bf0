"""An edge spanning two test hosts (network namespaces joined to the root namespace by veth links):
FRA and ICN each run `edge pop serve` in their own host, `edge dev` runs in the root namespace.
Requests are routed by the RTT model to the host nearest the client, stream back incrementally
over the link, and a node refuses whoever lacks its node token."""

from __future__ import annotations

import time

import httpx
import msgspec

from tests.faults.project import events, outcome


def test_each_client_is_served_by_the_host_nearest_it(two_hosts):
    before = {code: two_hosts.generated_tokens(code) for code in ("FRA", "ICN")}
    paris = two_hosts.run("Paris", max_tokens=5)
    assert paris.status_code == 200, paris.text
    assert paris.json()["result"]["timing"]["pop"] == "FRA"
    after_paris = {code: two_hosts.generated_tokens(code) for code in ("FRA", "ICN")}
    # the FRA host's own engine did the work, not ICN's and not edge dev (which loads no engine)
    assert after_paris["FRA"] - before["FRA"] == 5 and after_paris["ICN"] == before["ICN"]

    seoul = two_hosts.run("Seoul", max_tokens=5)
    assert seoul.status_code == 200, seoul.text
    assert seoul.json()["result"]["timing"]["pop"] == "ICN"
    after_seoul = {code: two_hosts.generated_tokens(code) for code in ("FRA", "ICN")}
    assert after_seoul["ICN"] - after_paris["ICN"] == 5 and after_seoul["FRA"] == after_paris["FRA"]

    pops = two_hosts.pops()  # the runtime reaches each PoP at its host's own address
    for code in ("FRA", "ICN"):
        assert pops[code]["remote"] == two_hosts.url[code] and pops[code]["reachable"], pops[code]
        assert (
            f"GPU PoP {code} ({two_hosts.city(code)}) at {two_hosts.url[code]}"
            in two_hosts.dev.log.read_text()
        )


def test_tokens_stream_while_the_remote_host_is_still_generating(two_hosts):
    with two_hosts.stream("Seoul", max_tokens=1500) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        # the first token is here and the ICN host still has the request in flight
        status = msgspec.msgpack.decode(two_hosts.node_health("ICN").content)
        rest = list(lines)
        assert status["in_flight"] == 1, (first, len(rest), rest[-6:])
    body = first + "\n\n" + "\n".join(rest)
    assert outcome(200, body) == ("completed", "ICN"), body[-300:]
    tokens = [e for e in events(body) if isinstance(e, dict) and e.get("response")]
    assert len(tokens) > 100  # one event per token, not one at the end


def test_a_node_refuses_requests_without_its_node_token(two_hosts):
    url = two_hosts.url["FRA"]
    body = {"content": b"\x80", "headers": {"content-type": "application/vnd.msgpack"}}
    # over the veth, from the root namespace: no token, a wrong one, the other host's
    assert httpx.post(url + "/v1/generate", timeout=10, **body).status_code == 401
    wrong = {"authorization": "Bearer not-the-token"}
    assert httpx.post(url + "/v1/generate", timeout=10, content=b"\x80", headers=wrong).status_code == 403
    other = {"authorization": f"Bearer {two_hosts.tokens['ICN']}"}
    assert httpx.post(url + "/v1/down", timeout=10, headers=other).status_code == 403
    # the right token gets past the check (this body is then refused as malformed)
    right = {"authorization": f"Bearer {two_hosts.tokens['FRA']}"}
    assert httpx.post(url + "/v1/generate", timeout=10, content=b"\x80", headers=right).status_code == 400
    # without it, health says only whether the node is up
    assert msgspec.msgpack.decode(httpx.get(url + "/v1/health", timeout=10).content) == {"up": True}
    assert "models" in msgspec.msgpack.decode(two_hosts.node_health("FRA").content)
    assert two_hosts.served_by("Paris") == "FRA"  # /v1/down with the wrong token did nothing


def test_a_client_that_hangs_up_frees_its_place_at_the_remote_host(two_hosts):
    with two_hosts.stream("Seoul", max_tokens=3000) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        assert msgspec.msgpack.decode(two_hosts.node_health("ICN").content)["in_flight"] == 1
    # closed after one token: edge dev drops the request, and so does the ICN host
    deadline = time.monotonic() + 30
    while msgspec.msgpack.decode(two_hosts.node_health("ICN").content)["in_flight"]:
        assert time.monotonic() < deadline, "the ICN host kept generating for a client that left"
        time.sleep(0.05)
