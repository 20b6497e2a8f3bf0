"""Whether a worker's outbound fetch may go out, decided by the address it would connect to.

A string check of the URL loses to other spellings of the same address (127.1, 2130706433, 0x7f.1,
[::ffff:127.0.0.1], 0.0.0.0) and to DNS names that point inside. So the host is resolved, every
address it resolves to is checked with `ipaddress`, and the connection goes to a checked address
(pinned: a second DNS answer cannot swap in another). Redirects are followed here, each hop checked
again, and the response body is read up to a cap.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import httpx

from runtime.control.addresses import parse_host_port

MAX_REDIRECTS = 10
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
FETCH_TIMEOUT_S = 30.0  # the whole fetch, redirects included

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]

_REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
# Set by httpx from the pinned request itself; a worker's copies could only contradict it.
_FRAMING_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade"}
)
_ROUTING_PREFIX = "x-edge-"  # the runtime routes on these (x-edge-worker: account/name): never forwarded
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-_")
_DEV_HINT = "; to reach a development server, the operator can list it in [edge] fetch_allow"


class FetchError(Exception):
    """A fetch that did not happen or did not finish; the message says why."""


class FetchRefused(FetchError):
    """The guard will not let this fetch out; the message says why and what to change."""


@dataclass(frozen=True)
class FetchResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    url: str  # after redirects


@dataclass(frozen=True)
class CheckedURL:
    url: httpx.URL
    host: str  # as sent (IDNA-encoded): the Host header and the TLS server name
    port: int
    addresses: tuple[IPAddress, ...]  # every one checked; connect only to these


def parse_fetch_url(raw: str) -> CheckedURL:
    """The URL split strictly (addresses not yet resolved), or FetchRefused saying what to change."""

    def refuse(why: str) -> FetchRefused:
        return FetchRefused(f"fetch {raw[:200]!r} refused: {why}")

    if any(c.isspace() or c == "\\" or ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise refuse("the URL contains whitespace, a control character or a backslash; percent-encode it")
    try:
        url = httpx.URL(raw)
    except httpx.InvalidURL as exc:
        raise refuse(f"not a valid URL ({exc})") from None
    if url.scheme not in ("http", "https"):
        raise refuse(f"only http:// and https:// URLs can be fetched, not {url.scheme or 'a relative'} URLs")
    if url.userinfo:  # http://expected.host@other.host/ tricks people (and naive checks) reading it
        raise refuse("the URL has a user@ part; send credentials in an Authorization header instead")
    host = url.raw_host.decode("ascii").lower()
    if not host:
        raise refuse("the URL has no host")
    if "%" in host:  # a zone id (fe80::1%eth0) picks an interface of this machine
        raise refuse(f"the host {host!r} has a zone id or percent-encoding; write the plain address or name")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise refuse(f"{host!r} is not an IPv6 address") from None
    elif not set(host) <= _HOST_CHARS:
        raise refuse(f"the host {host!r} has characters a host name cannot have")
    port = url.port if url.port is not None else (443 if url.scheme == "https" else 80)
    if not 1 <= port <= 65535:
        raise refuse(f"port {port} is out of range; use 1 to 65535")
    return CheckedURL(url, host, port, ())


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, NAT64, compatible, translated), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    low = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    high = int(ip) >> 32
    if any(ip in net for net in _NAT64) or high == 0xFFFF0000 or (high == 0 and int(ip) > 1):
        return low  # NAT64, IPv4-translated ::ffff:0:a.b.c.d, IPv4-compatible ::a.b.c.d
    return None


def refusal_reason(ip: IPAddress) -> str | None:
    """Why a worker may not connect to `ip` (None: it is a public unicast address)."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            why = refusal_reason(inner)
            if why:
                return f"it embeds {inner}, and {why}"
            if ip.ipv4_mapped or ip.sixtofour or any(ip in net for net in _NAT64):
                return None  # a route to a public IPv4 address (Python calls some of these reserved)
            return "IPv4-compatible and IPv4-translated IPv6 addresses are not reachable from a worker"
    if ip.is_loopback:
        return "loopback addresses are not reachable from a worker" + _DEV_HINT
    if ip.is_unspecified:
        return "the unspecified address means this machine and is not reachable from a worker"
    if ip.is_link_local:  # 169.254.169.254 is the cloud metadata service
        return "link-local addresses are not reachable from a worker"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "shared (CGNAT, 100.64.0.0/10) addresses are not reachable from a worker"
    if ip.is_multicast:
        return "multicast addresses are not reachable from a worker"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "site-local (fec0::/10) addresses are not reachable from a worker"
    if isinstance(ip, ipaddress.IPv6Address) and ip in ipaddress.IPv6Network("fc00::/7"):
        return "unique local (fc00::/7) addresses are private and not reachable from a worker" + _DEV_HINT
    if ip.is_private and isinstance(ip, ipaddress.IPv4Address) and not ip.is_reserved:
        return "private addresses are not reachable from a worker" + _DEV_HINT
    if ip.is_reserved:
        return "reserved addresses are not reachable from a worker"
    if not ip.is_global:
        return "addresses that are not globally routable are not reachable from a worker"
    return None


def belongs_to_this_machine(ip: IPAddress) -> bool:
    """True when `ip` is one of this machine's own addresses (a public one included): binding a
    socket to it succeeds only then. Fails closed on an unexpected error."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # connecting to ::ffff:a.b.c.d reaches a.b.c.d
    family = socket.AF_INET if isinstance(ip, ipaddress.IPv4Address) else socket.AF_INET6
    try:
        sock = socket.socket(family, socket.SOCK_DGRAM)
    except OSError:
        return False  # no such address family here: nothing local to reach by it either
    with sock:
        try:
            sock.bind((str(ip), 0))
        except OSError as exc:
            return exc.errno != errno.EADDRNOTAVAIL
    return True


async def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, in the resolver's order (IP literals in any spelling too)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text.split("%", 1)[0])  # a link-local answer may carry a zone id


class FetchGuard:
    """Outbound fetches for workers, only to public addresses (plus the operator's allowlist), never
    to the runtime itself or a PoP node.

    `allow`: HOST:PORT entries from the operator's [edge] fetch_allow (never a worker's); private
    and loopback addresses they resolve to become reachable at that port. `pop_urls`: PoP code ->
    node URL, refused even if allowlisted, as are `runtime_ports` on this machine's addresses.
    """

    def __init__(
        self,
        allow: Iterable[str] = (),
        pop_urls: Mapping[str, str] | None = None,
        runtime_ports: Iterable[int] = (),
        *,
        resolver: Resolver = resolve,
        transport: httpx.AsyncBaseTransport | None = None,  # tests: httpx.MockTransport
        timeout_s: float = FETCH_TIMEOUT_S,
        max_body: int = MAX_RESPONSE_BYTES,
        max_redirects: int = MAX_REDIRECTS,
    ):
        self.allow = [parse_host_port(entry) for entry in allow]
        self.pop_urls = dict(pop_urls or {})
        self.runtime_ports = set(runtime_ports)
        self._resolve = resolver
        self._transport = transport
        self.timeout_s = timeout_s
        self.max_body = max_body
        self.max_redirects = max_redirects

    async def _addresses(self, host: str, port: int) -> list[IPAddress]:
        try:
            return [_ip(a) for a in await self._resolve(host, port)]
        except (OSError, UnicodeError, ValueError) as exc:
            raise FetchError(f"fetch to {host} failed: the name does not resolve ({exc})") from None

    async def _pop_endpoints(self) -> dict[tuple[IPAddress, int], str]:
        found = {}
        for code, url in self.pop_urls.items():
            try:
                node = parse_fetch_url(url)
                for ip in await self._addresses(node.host, node.port):
                    found[(ip, node.port)] = code
            except FetchError:
                pass  # a node URL that does not parse or resolve cannot be reached by it either
        return found

    async def _allowed(self) -> set[tuple[IPAddress, int]]:
        allowed = set()
        for host, port in self.allow:  # resolved every time: an entry is a name, not a past answer
            try:
                allowed.update((ip, port) for ip in await self._addresses(host, port))
            except FetchError:
                pass
        return allowed

    async def check(self, raw_url: str, runtime_ports: Iterable[int] = ()) -> CheckedURL:
        """The URL with the addresses it may connect to, or FetchRefused naming the first refused one."""
        target = parse_fetch_url(raw_url)
        addresses = await self._addresses(target.host, target.port)
        if not addresses:
            raise FetchError(f"fetch to {target.host} failed: the name has no addresses")
        own_ports = self.runtime_ports | set(runtime_ports)
        pops = await self._pop_endpoints() if self.pop_urls else {}
        # a node on this machine answers at its port on every local address
        local_pops = {port: code for (ip, port), code in pops.items() if belongs_to_this_machine(ip)}
        allowed = await self._allowed() if self.allow else set()
        for ip in addresses:
            shown = target.host if target.host == str(ip) else f"{target.host} ({ip})"
            local = belongs_to_this_machine(ip)
            if local and target.port in own_ports:
                raise FetchRefused(
                    f"fetch to {shown}:{target.port} refused: that is this runtime's own address; its "
                    f"control API (/client/v4, /cdn-cgi) and workers are not reachable by fetch "
                    f"(use a [[services]] binding to call another worker of your account)"
                )
            code = pops.get((ip, target.port)) or (local_pops.get(target.port) if local else None)
            if code:
                raise FetchRefused(
                    f"fetch to {shown}:{target.port} refused: that is GPU PoP {code}'s node, "
                    f"which only the runtime talks to"
                )
            if (ip, target.port) in allowed:
                continue
            why = refusal_reason(ip)
            if why is None and local:  # a public address of this machine reaches its own services
                why = "that address belongs to this machine" + _DEV_HINT
            if why:
                raise FetchRefused(f"fetch to {shown} refused: {why}")
        return CheckedURL(target.url, target.host, target.port, tuple(addresses))

    async def fetch(
        self,
        method: str,
        url: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        *,
        runtime_origin: str = "",
        refuse_host: Callable[[str], str | None] | None = None,
    ) -> FetchResponse:
        """Do the fetch a worker asked for, checking every hop. `runtime_origin`: the scheme://host:port
        the request reached the runtime at (its port counts as the runtime's own); `refuse_host`: a
        further check by host name (another account's worker) that returns why, or None."""
        ports = set()
        try:
            origin = httpx.URL(runtime_origin) if runtime_origin else None
            if origin is not None:
                ports.add(origin.port or (443 if origin.scheme == "https" else 80))
        except httpx.InvalidURL:
            pass
        sent = [(k, v) for k, v in headers if not _dropped(k)]
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._follow(method.upper(), url, sent, body, ports, refuse_host)
        except TimeoutError:
            raise FetchError(f"fetch {url} failed: no answer within {self.timeout_s:g} s") from None

    async def _follow(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes,
        runtime_ports: set[int],
        refuse_host: Callable[[str], str | None] | None,
    ) -> FetchResponse:
        for _ in range(self.max_redirects + 1):
            target = parse_fetch_url(url)
            why = refuse_host(target.host) if refuse_host else None
            if why:
                raise FetchRefused(why)
            target = await self.check(url, runtime_ports)
            async with httpx.AsyncClient(  # one per hop: no pooled connection carries another SNI
                timeout=self.timeout_s, follow_redirects=False, trust_env=False, transport=self._transport
            ) as client:
                response = await self._send_pinned(client, target, method, headers, body)
                try:
                    location = response.headers.get("location")
                    if response.status_code not in _REDIRECT_CODES or not location:
                        return FetchResponse(
                            response.status_code,
                            list(response.headers.items()),
                            await self._read_capped(response, url),
                            url,
                        )
                finally:
                    await response.aclose()
            next_url = str(target.url.join(location))
            if (response.status_code == 303 and method != "HEAD") or (
                response.status_code in (301, 302) and method == "POST"
            ):
                method, body = "GET", b""  # as browsers (and httpx) do
            following = parse_fetch_url(next_url)
            if (following.url.scheme, following.host, following.port) != (
                target.url.scheme,
                target.host,
                target.port,
            ):  # another origin: the credentials were meant for this one
                headers = [(k, v) for k, v in headers if k.lower() != "authorization"]
            url = next_url
        raise FetchError(f"fetch {url} failed: more than {self.max_redirects} redirects")

    async def _send_pinned(
        self,
        client: httpx.AsyncClient,
        target: CheckedURL,
        method: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> httpx.Response:
        """Connect to the checked addresses in order (the next only if one cannot be reached)."""
        netloc = target.url.netloc.decode("ascii")
        extensions = {"sni_hostname": target.host} if target.url.scheme == "https" else {}
        error: httpx.HTTPError | None = None
        for ip in target.addresses:
            request = client.build_request(
                method,
                target.url.copy_with(host=str(ip)),
                headers=[*headers, ("host", netloc)],
                content=body or None,
                extensions=extensions,
            )
            try:
                return await client.send(request, stream=True)
            except httpx.ConnectError as exc:
                error = exc
            except httpx.HTTPError as exc:
                raise FetchError(f"fetch {target.url} failed: {type(exc).__name__}: {exc}") from None
        raise FetchError(f"fetch {target.url} failed: cannot connect ({error})")

    async def _read_capped(self, response: httpx.Response, url: str) -> bytes:
        too_big = FetchError(
            f"fetch {url} failed: the response body is over {_size(self.max_body)}, "
            f"the most the runtime reads for a worker"
        )
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            raise too_big
        chunks, size = [], 0
        try:
            async for chunk in response.aiter_bytes():  # decoded: a small gzip bomb counts in full
                size += len(chunk)
                if size > self.max_body:
                    raise too_big
                chunks.append(chunk)
        except httpx.HTTPError as exc:
            raise FetchError(f"fetch {url} failed: {type(exc).__name__}: {exc}") from None
        return b"".join(chunks)


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"


def _dropped(name: str) -> bool:
    name = name.lower()
    return name in _FRAMING_HEADERS or name.startswith(_ROUTING_PREFIX)
