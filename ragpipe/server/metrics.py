"""The server's Prometheus metrics (``prometheus_client``), one registry per app.

- ``ragpipe_requests_total{route, status}``: requests answered, by route template and HTTP status;
- ``ragpipe_request_duration_seconds{route, mode}``: latency (``mode``: hybrid, lexical, vector,
  or ``-`` for routes without one);
- ``ragpipe_release_generation{target}``: the pointer generation of the release being served
  (0 while nothing is);
- ``ragpipe_release_swaps_total{target}`` / ``ragpipe_release_swaps_refused_total{target}``: releases
  swapped in, and pointer changes refused (the refusal's reason is in ``/readyz``);
- ``ragpipe_requests_in_flight``: requests computing now;
- ``ragpipe_connections_open``: HTTP connections open now;
- ``ragpipe_connections_closed_total{reason}``: connections the server closed or refused on its own
  (``header_timeout``: no whole request head in ``header_timeout_s``; ``evicted``: closed while
  waiting, to make room at ``max_connections``; ``refused``: answered 503 at ``max_connections``,
  every connection busy) — ``ragpipe.server.connections``;
- ``ragpipe_mcp_sessions_refused_total{reason}``: MCP sessions not opened (``per_key``: the key holds
  ``mcp_sessions_per_key``; ``total``: ``mcp_sessions`` are open) — ``ragpipe.server.sessions``.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Query latencies are milliseconds in process; HTTP adds about one; answers with an LLM take seconds.
BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ServerMetrics:
    def __init__(self, target: str):
        self.registry = CollectorRegistry()
        self.target = target
        self.requests = Counter("ragpipe_requests", "Requests answered.", ["route", "status"], registry=self.registry)
        self.latency = Histogram(
            "ragpipe_request_duration_seconds",
            "Request latency.",
            ["route", "mode"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.generation = Gauge(
            "ragpipe_release_generation", "Generation of the release served.", ["target"], registry=self.registry
        )
        self.swaps = Counter("ragpipe_release_swaps", "Releases swapped in.", ["target"], registry=self.registry)
        self.refused = Counter(
            "ragpipe_release_swaps_refused", "Pointer changes refused.", ["target"], registry=self.registry
        )
        self.in_flight = Gauge("ragpipe_requests_in_flight", "Requests computing now.", registry=self.registry)
        self.connections_open = Gauge("ragpipe_connections_open", "HTTP connections open.", registry=self.registry)
        self.connections_closed = Counter(
            "ragpipe_connections_closed",
            "Connections closed or refused by the server.",
            ["reason"],
            registry=self.registry,
        )
        self.sessions_refused = Counter(
            "ragpipe_mcp_sessions_refused", "MCP sessions not opened.", ["reason"], registry=self.registry
        )
        for reason in ("header_timeout", "evicted", "refused"):
            self.connections_closed.labels(reason)
        for reason in ("per_key", "total"):
            self.sessions_refused.labels(reason)
        self.generation.labels(target).set(0)
        self.swaps.labels(target)
        self.refused.labels(target)

    def observe(self, route: str, status: int, mode: str | None, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route, mode or "-").observe(seconds)

    def closed(self, reason: str) -> None:
        """A connection closed or refused by the server (called on the event loop)."""
        self.connections_closed.labels(reason).inc()

    def swapped(self, generation: int | None) -> None:
        self.swaps.labels(self.target).inc()
        self.generation.labels(self.target).set(generation or 0)

    def refusal(self) -> None:
        self.refused.labels(self.target).inc()

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
