"""Forwarded headers count only from configured proxies (``ragpipe.server.proxies``), against the
server as ``ragpipe serve`` runs it on 127.0.0.1: per-address rate limits (anonymous callers, failed
keys) are what a forged header would escape."""

from __future__ import annotations

import ipaddress

import httpx
import pytest

from ragpipe.server.app import app_from
from ragpipe.server.proxies import forwarded_hops, parse_address
from ragpipe_tests.support.served_http import served
from ragpipe_tests.support.serving import Serving, config_for

LIMITED = {
    "code": "rate_limited",
    "message": "rate limit of 2 requests a minute reached",
    "field": None,
}


def server(serving: Serving, **config):
    config = {"anonymous": True, "limits": {"requests_per_minute": 2}, **config}
    return served(app_from(serving.ws.home, config_for(serving, **config), "staging", serving.targets))


def ask(base: str, headers: dict[str, str]) -> httpx.Response:
    """An anonymous request that is rate-limited by address (its status is not_ready's 503 — no
    release is active — or 429 once the address has used its two requests)."""
    return httpx.post(f"{base}/v1/query", json={"query": "keys"}, headers=headers, timeout=30)


def test_a_local_client_forging_forwarded_headers_cannot_escape_its_address_limit(serving: Serving):
    """No proxy configured (the default): every request from 127.0.0.1 counts against 127.0.0.1,
    whatever X-Forwarded-For or Forwarded says — for anonymous callers and for failed keys alike."""
    forged = [
        {"X-Forwarded-For": "203.0.113.1"},
        {"Forwarded": "for=203.0.113.2"},
        {"X-Forwarded-For": "203.0.113.3", "Forwarded": 'for="[2001:db8::3]"', "X-Real-IP": "203.0.113.4"},
    ]
    with server(serving) as base:
        statuses = [ask(base, headers).status_code for headers in forged]
        limited = ask(base, {"X-Forwarded-For": "198.51.100.7"})
    assert statuses == [503, 503, 429]
    assert limited.status_code == 429 and limited.json() == LIMITED
    with server(serving, anonymous=False) as base:
        bad_key = {"Authorization": "Bearer rpk_mallory_" + "x" * 43}
        guesses = [ask(base, {**bad_key, "X-Forwarded-For": f"203.0.113.{i}"}).status_code for i in range(3)]
    assert guesses == [401, 401, 429]


def test_a_configured_proxys_x_forwarded_for_names_the_client(serving: Serving):
    """With 127.0.0.1 a trusted proxy, the client is the rightmost X-Forwarded-For hop that is not a
    trusted proxy: each client has its own limit, a client cannot escape it by prepending hops of
    its own, and the Forwarded header (not the one configured) is ignored."""
    with server(serving, trusted_proxies=["127.0.0.1", "10.0.0.0/8"]) as base:
        first = [ask(base, {"X-Forwarded-For": "203.0.113.1"}).status_code for _ in range(2)]
        # the client wrote "198.51.100.9"; the proxies appended 203.0.113.1 and then 10.1.2.3 (trusted)
        escaped = ask(base, {"X-Forwarded-For": "198.51.100.9, 203.0.113.1, 10.1.2.3"})
        other = ask(base, {"X-Forwarded-For": "203.0.113.2"})
        # no X-Forwarded-For: the peer is the client; a Forwarded header changes nothing
        peer = [ask(base, {"Forwarded": f"for=192.0.2.{i}"}).status_code for i in range(3)]
    assert first == [503, 503]
    assert escaped.status_code == 429 and escaped.json() == LIMITED
    assert other.status_code == 503
    assert peer == [503, 503, 429]


def test_a_configured_proxys_forwarded_header_names_the_client(serving: Serving):
    with server(serving, trusted_proxies=["127.0.0.1"], forwarded_header="forwarded") as base:
        v6 = [ask(base, {"Forwarded": 'for="[2001:db8:cafe::17]:4711";proto=https'}).status_code for _ in range(3)]
        # a client-written element first, then the proxy's own
        escaped = ask(base, {"Forwarded": 'for=198.51.100.9, for="[2001:db8:cafe::17]"'})
        other = ask(base, {"Forwarded": "for=192.0.2.43;by=203.0.113.60"})
        # X-Forwarded-For is not the configured header: ignored (the peer's own limit)
        ignored = [ask(base, {"X-Forwarded-For": f"203.0.113.{i}"}).status_code for i in range(3)]
    assert v6 == [503, 503, 429]
    assert escaped.status_code == 429
    assert other.status_code == 503
    assert ignored == [503, 503, 429]


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("203.0.113.1", "203.0.113.1"),
        (" 203.0.113.1:8080 ", "203.0.113.1"),
        ("2001:db8::1", "2001:db8::1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("::ffff:192.0.2.5", "192.0.2.5"),
        ("unknown", None),
        ("_hidden", None),
        ("[2001:db8::1", None),
        ("", None),
    ],
)
def test_hops_are_ip_addresses_or_nothing(text: str, address: str | None):
    parsed = parse_address(text)
    assert parsed == (ipaddress.ip_address(address) if address else None)


def test_forwarded_elements_are_read_with_quotes_and_case():
    header = 'For="[2001:db8::1]:4711";Proto=https, for=192.0.2.1;by=x, by=y, for="a,b;c"'
    assert forwarded_hops([header, "for=unknown"]) == [
        ("[2001:db8::1]:4711", "https"),
        ("192.0.2.1", None),
        (None, None),
        ("a,b;c", None),
        ("unknown", None),
    ]
