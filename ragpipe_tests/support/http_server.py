"""A real uvicorn server on 127.0.0.1 (a free port) in a background thread, for the server tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn


@contextmanager
def running(app, ready_timeout: float = 60.0) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL once ``/healthz`` answers. The
    server ``ragpipe serve`` runs (``Observed``) gets exactly its configuration — deadlines,
    connection cap, no proxy headers (``ragpipe.server.connections.uvicorn_config``)."""
    from ragpipe.server.app import Observed
    from ragpipe.server.connections import uvicorn_config

    if isinstance(app, Observed):
        config = uvicorn_config(app)
    else:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    with serving(config, ready_timeout) as base:
        yield base


@contextmanager
def serving(config: uvicorn.Config, ready_timeout: float = 60.0) -> Iterator[str]:
    """Run a uvicorn server of ``config`` in a thread until the block ends; yields its base URL
    once it listens (polled, bounded by ``ready_timeout``; a dead thread fails at once)."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), timeout=ready_timeout, interval=0.02)
    if not server.started:
        raise RuntimeError("uvicorn did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.05):
    """Poll ``predicate()`` until it returns a truthy value (returned) or ``timeout`` passes (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)


def release_of(base: str) -> str | None:
    release = httpx.get(f"{base}/v1/release", timeout=10).json()["release"]
    return release["release_id"] if release else None
