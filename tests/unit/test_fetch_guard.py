"""runtime.host.fetch_guard: a worker's outbound fetch is decided by the address it connects to.

Each reproduced bypass of the old string check is its own case; a real HTTP server on loopback
(allowlisted, as an operator would for a dev server) echoes what arrives and redirects on request.
"""

import asyncio
import ipaddress
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from runtime.control.config import ConfigError, parse_config
from runtime.host.fetch_guard import (
    FetchError,
    FetchGuard,
    FetchRefused,
    belongs_to_this_machine,
    parse_fetch_url,
    parse_host_port,
    refusal_reason,
)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _answer(self):
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        if parts.path == "/redirect":
            self.send_response(int(query.get("code", "302")))
            self.send_header("location", query["to"])
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if parts.path == "/loop":
            self.send_response(302)
            self.send_header("location", "/loop")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if parts.path == "/big":
            data = b"x" * int(query["n"])
            self.send_response(200)
            if query.get("declare") == "1":
                self.send_header("content-length", str(len(data)))
            else:  # no length: the body runs until the connection closes
                self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True
            return
        data = json.dumps(
            {
                "method": self.command,
                "path": self.path,
                "body": body.decode(),
                "headers": [[k.lower(), v] for k, v in self.headers.items()],
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_HEAD = _answer


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def other_port():
    """A loopback port nothing allowlists (and nothing need listen on)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = srv.server_address[1]
    srv.server_close()
    return port


def run(coro):
    return asyncio.run(coro)


def refused(guard: FetchGuard, url: str, **kw) -> str:
    with pytest.raises(FetchRefused) as info:
        run(guard.fetch("GET", url, [], b"", **kw))
    return str(info.value)


def fake_resolver(table: dict[str, list[str]], calls: list[str] | None = None):
    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        if host in table:
            return table[host]
        return [str(ipaddress.ip_address(host))]  # IP literals, as getaddrinfo returns them

    return resolve


# --- the reproduced bypasses, each against the runtime's own port ----------------------------------

BYPASSES = [
    "http://127.1:{port}/client/v4/accounts/local/workers/scripts",
    "http://0.0.0.0:{port}/cdn-cgi/edge/health",
    "http://2130706433:{port}/cdn-cgi/edge/health",
    "http://[::ffff:127.0.0.1]:{port}/cdn-cgi/edge/health",
    "http://127.0.0.1:{port}/%63dn-cgi/edge/pop/ICN/down",
    "http://127.0.0.1:{port}//cdn-cgi/edge/pop/ICN/down",
    "http://localhost:{port}/cdn-cgi/edge/health",
    "http://0x7f.1:{port}/",
    "http://017700000001:{port}/",
    "http://0x7f000001:{port}/",
    "http://0:{port}/",
    "http://127.0.0.2:{port}/",
]


@pytest.mark.parametrize("template", BYPASSES)
def test_the_runtimes_own_port_is_refused_in_every_spelling(template, server):
    url = template.format(port=server)
    # even allowlisted: the runtime's own port stays refused
    guard = FetchGuard(allow=[f"127.0.0.1:{server}"])
    message = refused(guard, url, runtime_origin=f"http://127.0.0.1:{server}")
    assert "this runtime's own address" in message and "control API" in message


@pytest.mark.parametrize("template", BYPASSES)
def test_every_spelling_of_loopback_is_refused_without_an_allowlist(template, server):
    message = refused(FetchGuard(), template.format(port=server))
    assert "refused" in message
    assert "loopback" in message or "unspecified" in message


def test_a_dotted_octal_address_is_refused_before_any_lookup(server):
    # httpx rejects a dotted quad with leading zeros itself (it cannot be sent), so it never resolves
    assert "not a valid URL" in refused(
        FetchGuard(allow=[f"127.0.0.1:{server}"]), f"http://0177.0.0.1:{server}/"
    )


def test_the_runtime_port_given_at_construction_counts_too(server):
    assert "own address" in refused(FetchGuard(runtime_ports=[server]), f"http://127.1:{server}/")


def test_a_routing_header_never_reaches_the_server(server):
    guard = FetchGuard(allow=[f"127.0.0.1:{server}"])
    headers = [
        ("x-edge-worker", "b/victim"),
        ("X-Edge-Client-Location", "Frankfurt"),
        ("Host", "victim.b.edge.localhost"),
        ("content-length", "999"),
        ("x-kept", "yes"),
    ]
    r = run(guard.fetch("POST", f"http://127.0.0.1:{server}/echo", headers, b"hi"))
    seen = json.loads(r.body)
    names = [k for k, _ in seen["headers"]]
    assert not [n for n in names if n.startswith("x-edge-")]
    assert dict(seen["headers"])["host"] == f"127.0.0.1:{server}"
    assert dict(seen["headers"])["x-kept"] == "yes"
    assert (seen["method"], seen["body"]) == ("POST", "hi")


# --- PoP node URLs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "http://127.0.0.1:{p}/v1/down",
        "http://localhost:{p}/v1/down",
        "http://127.1:{p}/v1/up",
        "http://[::ffff:127.0.0.1]:{p}/v1/down",
    ],
)
def test_a_local_pop_node_is_refused_even_when_allowlisted(template, server):
    guard = FetchGuard(allow=[f"127.0.0.1:{server}"], pop_urls={"FRA": f"http://localhost:{server}"})
    assert "GPU PoP FRA" in refused(guard, template.format(p=server))


def test_a_remote_pop_node_is_refused_by_address_whatever_name_reaches_it():
    resolver = fake_resolver({"pop-fra.example": ["93.184.216.34"], "alias.example": ["93.184.216.34"]})
    guard = FetchGuard(pop_urls={"FRA": "http://pop-fra.example:9000"}, resolver=resolver)
    for url in ("http://alias.example:9000/v1/down", "http://93.184.216.34:9000/v1/down"):
        assert "GPU PoP FRA" in refused(guard, url)
    # the same host at another port is just a public server
    checked = run(guard.check("http://alias.example:9001/"))
    assert checked.addresses == (ipaddress.ip_address("93.184.216.34"),)


# --- which addresses ---------------------------------------------------------------------------------

REFUSED = {
    "10.0.0.1": "private",
    "172.16.5.4": "private",
    "192.168.1.1": "private",
    "169.254.169.254": "link-local",
    "100.64.0.1": "CGNAT",
    "100.127.255.254": "CGNAT",
    "224.0.0.1": "multicast",
    "239.255.255.250": "multicast",
    "240.0.0.1": "reserved",
    "255.255.255.255": "reserved",
    "192.0.2.1": "private",
    "127.0.0.1": "loopback",
    "0.0.0.0": "unspecified",
    "::1": "loopback",
    "::": "unspecified",
    "fc00::1": "unique local",
    "fd12:3456::1": "unique local",
    "fe80::1": "link-local",
    "ff02::1": "multicast",
    "fec0::1": "site-local",
    "2001:db8::1": "not globally routable",
    "::ffff:127.0.0.1": "embeds 127.0.0.1",
    "::ffff:10.0.0.1": "embeds 10.0.0.1",
    "::ffff:169.254.169.254": "link-local",
    "2002:7f00:1::1": "embeds 127.0.0.1",  # 6to4
    "2002:a00:1::1": "embeds 10.0.0.1",
    "64:ff9b::7f00:1": "embeds 127.0.0.1",  # NAT64
    "64:ff9b::a9fe:a9fe": "embeds 169.254.169.254",
    "64:ff9b:1::a00:1": "embeds 10.0.0.1",
    "::127.0.0.1": "embeds 127.0.0.1",  # IPv4-compatible
    "::8.8.8.8": "IPv4-compatible",
    "::ffff:0:127.0.0.1": "embeds 127.0.0.1",  # IPv4-translated
}


@pytest.mark.parametrize(("address", "why"), REFUSED.items())
def test_non_public_addresses_are_refused(address, why):
    reason = refusal_reason(ipaddress.ip_address(address))
    assert reason is not None and why in reason


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:808:808::1", "64:ff9b::808:808"],
)
def test_public_addresses_pass(address):
    assert refusal_reason(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("address", ["10.0.0.1", "169.254.169.254", "fd00::5", "100.64.1.1"])
def test_a_name_is_refused_if_any_of_its_addresses_is(address):
    guard = FetchGuard(resolver=fake_resolver({"mixed.example": ["93.184.216.34", address]}))
    message = refused(guard, "http://mixed.example/")
    assert f"mixed.example ({address}) refused" in message


def test_an_address_of_this_machine_is_refused_even_if_public_looking(monkeypatch):
    import runtime.host.fetch_guard as fg

    monkeypatch.setattr(fg, "belongs_to_this_machine", lambda ip: str(ip) == "93.184.216.34")
    guard = FetchGuard(resolver=fake_resolver({}))
    assert "belongs to this machine" in refused(guard, "http://93.184.216.34:8080/")


def test_belongs_to_this_machine_by_binding():
    assert belongs_to_this_machine(ipaddress.ip_address("127.0.0.1"))
    assert belongs_to_this_machine(ipaddress.ip_address("127.0.0.53"))
    assert belongs_to_this_machine(ipaddress.ip_address("0.0.0.0"))
    assert not belongs_to_this_machine(ipaddress.ip_address("93.184.216.34"))
    assert not belongs_to_this_machine(ipaddress.ip_address("2606:4700:4700::1111"))


# --- the URL itself ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://example.com/", "only http:// and https://"),
        ("file:///etc/passwd", "only http:// and https://"),
        ("/relative", "only http:// and https://"),
        ("http://user:pw@example.com/", "user@ part"),
        ("http://example.com@127.0.0.1/", "user@ part"),
        ("http:///path", "no host"),
        ("http://:80/", "no host"),
        ("http://example.com:0/", "out of range"),
        ("http://example.com:99999/", "out of range"),
        ("http://example.com:80:90/", "not a valid URL"),
        ("http://exa mple.com/", "whitespace"),
        ("http://example.com\\@127.0.0.1/", "backslash"),
        ("http://example.com/\r\nx-edge-worker: b/victim", "control character"),
        ("http://[fe80::1%25eth0]/", "zone id"),
        ("http://exa_mple$.com/", "characters"),
    ],
)
def test_malformed_urls_are_refused_saying_what_to_change(url, why):
    with pytest.raises(FetchRefused) as info:
        parse_fetch_url(url)
    assert why in str(info.value)


def test_a_url_splits_with_its_default_port_and_idna_host():
    checked = parse_fetch_url("https://Bücher.example/a?b")
    assert (checked.host, checked.port) == ("xn--bcher-kva.example", 443)


# --- the allowlist -------------------------------------------------------------------------------------


def test_an_allowlisted_dev_server_is_reachable(server):
    r = run(FetchGuard(allow=[f"127.0.0.1:{server}"]).fetch("GET", f"http://127.0.0.1:{server}/x", [], b""))
    assert r.status == 200 and json.loads(r.body)["path"] == "/x"


def test_an_allowlist_name_covers_the_addresses_it_resolves_to(server):
    guard = FetchGuard(allow=[f"localhost:{server}"])
    for host in ("localhost", "127.0.0.1"):
        assert run(guard.fetch("GET", f"http://{host}:{server}/", [], b"")).status == 200


def test_the_allowlist_is_per_port(server, other_port):
    guard = FetchGuard(allow=[f"127.0.0.1:{server}"])
    assert "loopback" in refused(guard, f"http://127.0.0.1:{other_port}/")


@pytest.mark.parametrize(
    ("entry", "parsed"),
    [("127.0.0.1:8123", ("127.0.0.1", 8123)), ("[::1]:80", ("::1", 80)), ("DevBox.lan:9", ("devbox.lan", 9))],
)
def test_allowlist_entries_parse(entry, parsed):
    assert parse_host_port(entry) == parsed


@pytest.mark.parametrize("entry", ["127.0.0.1", "::1:80", "[nope]:80", "host:0", "host:65536", ":80", "h:8a"])
def test_bad_allowlist_entries_fail(entry):
    with pytest.raises(ValueError):
        parse_host_port(entry)


CONFIG = 'name = "n"\nmain = "w.py"\ncompatibility_date = "2026-11-01"\n[edge]\nfetch_allow = {}\n'


def test_fetch_allow_is_an_operator_config_key():
    assert parse_config(CONFIG.format('["127.0.0.1:8123"]')).edge.fetch_allow == ["127.0.0.1:8123"]
    assert parse_config(CONFIG.replace("fetch_allow = {}\n", "")).edge.fetch_allow == []
    with pytest.raises(ConfigError, match=r"edge\.fetch_allow\.1: .*HOST:PORT"):
        parse_config(CONFIG.format('["127.0.0.1:8123", "localhost"]'))


# --- redirects -----------------------------------------------------------------------------------------


def redirect(server: int, to: str, code: int = 302) -> str:
    return str(httpx.URL(f"http://127.0.0.1:{server}/redirect", params={"to": to, "code": code}))


@pytest.mark.parametrize(
    ("to", "why"),
    [
        ("http://127.0.0.1:{other}/", "loopback"),
        ("http://2130706433:{other}/", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.0.0.1/", "private"),
        ("http://127.1:{runtime}/cdn-cgi/edge/pop/ICN/down", "own address"),
        ("file:///etc/passwd", "only http://"),
    ],
)
def test_a_redirect_to_a_refused_address_is_refused(to, why, server, other_port):
    guard = FetchGuard(allow=[f"127.0.0.1:{server}"], runtime_ports=[other_port + 1])
    target = to.format(other=other_port, runtime=other_port + 1)
    assert why in refused(guard, redirect(server, target))


def test_a_redirect_to_another_accounts_worker_is_refused_by_name(server):
    def refuse_host(host):
        return (
            "fetch to another account's worker is not allowed" if host.endswith(".b.edge.localhost") else None
        )

    guard = FetchGuard(allow=[f"127.0.0.1:{server}"])
    message = refused(guard, redirect(server, "http://victim.b.edge.localhost:1/"), refuse_host=refuse_host)
    assert "another account" in message


def test_redirects_within_allowed_servers_are_followed(server):
    guard = FetchGuard(allow=[f"127.0.0.1:{server}"])
    r = run(guard.fetch("POST", redirect(server, "/echo", 303), [("authorization", "t")], b"data"))
    seen = json.loads(r.body)
    assert (r.status, r.url, seen["method"], seen["body"]) == (
        200,
        f"http://127.0.0.1:{server}/echo",
        "GET",
        "",
    )
    assert dict(seen["headers"])["authorization"] == "t"  # same origin: kept
    r = run(guard.fetch("PUT", redirect(server, "/echo", 307), [], b"data"))
    assert (json.loads(r.body)["method"], json.loads(r.body)["body"]) == ("PUT", "data")


def test_a_cross_origin_redirect_drops_authorization(server):
    guard = FetchGuard(allow=[f"127.0.0.1:{server}", f"localhost:{server}"])
    r = run(
        guard.fetch("GET", redirect(server, f"http://localhost:{server}/echo"), [("authorization", "t")], b"")
    )
    assert "authorization" not in dict(json.loads(r.body)["headers"])


def test_redirects_stop_after_ten(server):
    guard = FetchGuard(allow=[f"127.0.0.1:{server}"])
    with pytest.raises(FetchError, match="more than 10 redirects"):
        run(guard.fetch("GET", f"http://127.0.0.1:{server}/loop", [], b""))


# --- pinned to the checked address -------------------------------------------------------------------


def test_the_connection_goes_to_the_address_that_was_checked(server):
    """DNS rebinding: the name answers 127.0.0.1 (allowlisted) once, then a refused address; the
    guard resolves once per hop and connects to what it checked, keeping the name in Host."""
    calls: list[str] = []
    answers = iter([["127.0.0.1"]])

    async def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        if host == "rebind.example":
            return next(answers, ["10.9.9.9"])
        return [host]

    guard = FetchGuard(allow=[f"127.0.0.1:{server}"], resolver=rebinding)
    r = run(guard.fetch("GET", f"http://rebind.example:{server}/echo", [], b""))
    assert r.status == 200
    assert dict(json.loads(r.body)["headers"])["host"] == f"rebind.example:{server}"
    assert calls.count("rebind.example") == 1


def test_https_is_pinned_with_the_name_as_tls_server_name():
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text="ok")

    guard = FetchGuard(
        resolver=fake_resolver({"api.example": ["93.184.216.34"]}), transport=httpx.MockTransport(answer)
    )
    r = run(guard.fetch("GET", "https://api.example/v1?q=1", [("Host", "evil.example")], b""))
    assert (r.status, r.body) == (200, b"ok")
    (request,) = seen
    assert str(request.url) == "https://93.184.216.34/v1?q=1"
    assert request.headers["host"] == "api.example"
    assert request.extensions["sni_hostname"] == "api.example"


def test_the_next_checked_address_is_tried_when_one_does_not_connect(server):
    tried: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        tried.append(request.url.host)
        if request.url.host == "93.184.216.34":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200)

    resolver = fake_resolver({"two.example": ["93.184.216.34", "93.184.216.35"]})
    guard = FetchGuard(resolver=resolver, transport=httpx.MockTransport(answer))
    assert run(guard.fetch("GET", "http://two.example/", [], b"")).status == 200
    assert tried == ["93.184.216.34", "93.184.216.35"]


# --- what the runtime reads -----------------------------------------------------------------------------


@pytest.mark.parametrize("declare", ["1", "0"])
def test_the_response_body_is_capped(declare, server):
    guard = FetchGuard(allow=[f"127.0.0.1:{server}"], max_body=1024)
    ok = run(guard.fetch("GET", f"http://127.0.0.1:{server}/big?n=1024&declare={declare}", [], b""))
    assert len(ok.body) == 1024
    with pytest.raises(FetchError, match="response body is over 1024 bytes"):
        run(guard.fetch("GET", f"http://127.0.0.1:{server}/big?n=4096&declare={declare}", [], b""))


def test_a_name_that_does_not_resolve_says_so():
    with pytest.raises(FetchError, match="does not resolve"):
        run(FetchGuard().fetch("GET", "http://x.local.edge.localhost.invalid/", [], b""))
