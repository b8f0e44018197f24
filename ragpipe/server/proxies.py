"""Who the client is: the peer address, unless the peer is a configured proxy.

A client's address is what anonymous callers' rate limits, failed-key throttling and evidence
ledgers count against, so a header the client writes itself must never change it. ``ForwardedClient``
(outermost ASGI layer) therefore believes a forwarded header only when the TCP peer is one of
``trusted_proxies`` (addresses or CIDR networks; none by default), and only the one header the
config names (``forwarded_header``): ``x-forwarded-for`` or RFC 7239 ``forwarded`` — a proxy that sets
one passes the other through from the client untouched, so reading both would let a client choose.

Proxies append the address they received the request from, so the header lists the hops oldest
first and only its right end is written by proxies we trust. The client is the **rightmost hop that
is not a trusted proxy** (everything left of it may be the client's invention); if every hop is a
trusted proxy, the leftmost. A hop that is not an IP address (``unknown``, an obfuscated
``_name``, garbage) leaves the peer address in place. The proxy's scheme (``X-Forwarded-Proto``, or
``proto=`` of the chosen ``Forwarded`` element) is taken too when it is ``http`` or ``https``.

uvicorn's own proxy-header handling is turned off (``ragpipe.server.connections``): it trusts
127.0.0.1 by default and knows only ``X-Forwarded-For``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_address(text: str) -> Address | None:
    """The IP address in a forwarded hop: ``1.2.3.4``, ``1.2.3.4:80``, ``2001:db8::1``, ``[2001:db8::1]:80``
    (quotes already removed); None for anything else. IPv4-mapped IPv6 addresses become IPv4."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end == -1:
            return None
        text = text[1:end]
    elif text.count(":") == 1:  # IPv4 with a port (an IPv6 address has at least two colons)
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _split_outside_quotes(text: str, separator: str) -> list[str]:
    parts, current, quoted, escaped = [], [], False, False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\" and quoted:
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return parts


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value


def forwarded_hops(values: Iterable[str]) -> list[tuple[str | None, str | None]]:
    """``(for, proto)`` of each element of RFC 7239 ``Forwarded`` header values, oldest first (None
    where an element lacks the parameter)."""
    hops: list[tuple[str | None, str | None]] = []
    for value in values:
        for element in _split_outside_quotes(value, ","):
            if not element.strip():
                continue
            params: dict[str, str] = {}
            for pair in _split_outside_quotes(element, ";"):
                name, sep, raw = pair.partition("=")
                if sep:
                    params.setdefault(name.strip().lower(), _unquote(raw))
            hops.append((params.get("for"), params.get("proto")))
    return hops


class TrustedProxies:
    """The configured proxies: ``trusts(address)`` for a peer or a hop."""

    def __init__(self, entries: Iterable[str]):
        self.networks = [ipaddress.ip_network(entry, strict=False) for entry in entries]

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, address: Address | None) -> bool:
        return address is not None and any(address in network for network in self.networks)


class ForwardedClient:
    """ASGI layer: set ``scope["client"]`` (and ``scope["scheme"]``) from the configured forwarded
    header when the peer is a trusted proxy; otherwise leave the peer address (see the module docstring)."""

    def __init__(self, app, trusted: Iterable[str], header: str):
        self.app = app
        self.proxies = TrustedProxies(trusted)
        self.header = header.encode("latin-1")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self.proxies:
            client = scope.get("client")
            if client and self.proxies.trusts(parse_address(client[0])):
                scope = self._forwarded(scope)
        await self.app(scope, receive, send)

    def _forwarded(self, scope) -> dict:
        values = [v.decode("latin-1") for k, v in scope.get("headers", []) if k == self.header]
        if not values:
            return scope
        if self.header == b"forwarded":
            hops = forwarded_hops(values)
        else:
            protos = [v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"x-forwarded-proto"]
            proto = protos[-1].split(",")[-1].strip() if protos else None
            hops = [(hop, proto) for value in values for hop in value.split(",") if hop.strip()]
        if not hops:
            return scope
        chosen = hops[0]
        for hop in reversed(hops):
            if not self.proxies.trusts(parse_address(hop[0] or "")):
                chosen = hop
                break
        address = parse_address(chosen[0] or "")
        if address is None:  # unknown or obfuscated: the proxy's own address is all we know
            return scope
        changed = {**scope, "client": (str(address), 0)}
        proto = (chosen[1] or "").strip().lower()
        if proto in ("http", "https"):
            changed["scheme"] = proto
        return changed
